"""The TrainJob controller: informers feed a work queue, workers run the reconciler."""
from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter

from prometheus_client import CollectorRegistry

from gangctl.api.resources import (CLUSTER_TRAINING_RUNTIMES, JOBS, PODS, POD_GROUPS, SERVICES, TRAINING_RUNTIMES,
                                   TRAINJOBS)
from gangctl.config import ControllerSettings
from gangctl.kube.client import ApiError, Kube
from gangctl.kube.events import EventRecorder
from gangctl.kube.informer import Informer, object_key
from gangctl.obs.metrics import Metrics
from gangctl.obs.server import make_app, serve
from gangctl.plugins.names import MANAGED_BY, MANAGER, TRAINJOB_NAME
from gangctl.policy.status import phase, waiting_for_gang
from gangctl.runtime.reconciler import Caches, Reconciler
from gangctl.runtime.workqueue import WorkQueue

log = logging.getLogger(__name__)


class Controller:
    def __init__(self, kube: Kube, settings: ControllerSettings, registry: CollectorRegistry | None = None):
        self.kube = kube
        self.settings = settings
        self.metrics = Metrics(registry or CollectorRegistry())
        self.queue = WorkQueue(settings.backoff_base_seconds, settings.backoff_max_seconds)
        ns = settings.namespace
        managed = f"{MANAGED_BY}={MANAGER}"
        self.caches = Caches(
            trainjobs=Informer(kube, TRAINJOBS, namespace=ns, handlers=[self._on_trainjob]),
            runtimes=Informer(kube, TRAINING_RUNTIMES, namespace=ns, handlers=[self._on_runtime]),
            cluster_runtimes=Informer(kube, CLUSTER_TRAINING_RUNTIMES, handlers=[self._on_runtime]),
            jobs=Informer(kube, JOBS, namespace=ns, label_selector=managed, handlers=[self._on_child]),
            pods=Informer(kube, PODS, namespace=ns, label_selector=managed, handlers=[self._on_child]),
            pod_groups=Informer(kube, POD_GROUPS, namespace=ns, label_selector=managed, handlers=[self._on_child]),
            services=Informer(kube, SERVICES, namespace=ns, label_selector=managed, handlers=[self._on_child]),
        )
        self.reconciler = Reconciler(kube, self.caches, self.metrics, EventRecorder(kube),
                                     field_manager=settings.field_manager, scheduler_name=settings.scheduler_name)
        self.reconciler.on_capacity_freed = self.capacity_changed
        self.reconciler.requeue_after = self.queue.add_after
        self._retry_timer: asyncio.TimerHandle | None = None

    # --- event handlers: only enqueue keys -------------------------------------------------------
    def _on_trainjob(self, _: str, obj: dict) -> None:
        self.queue.add(object_key(obj))

    def _on_child(self, event: str, obj: dict) -> None:
        meta = obj["metadata"]
        if event == "DELETED" and obj.get("kind") in ("Pod", "PodGroup"):
            self.capacity_changed()
        owner = (meta.get("labels") or {}).get(TRAINJOB_NAME)
        if owner:
            self.queue.add(f"{meta['namespace']}/{owner}")

    def _on_runtime(self, _: str, obj: dict) -> None:
        name = obj["metadata"]["name"]
        kind = obj.get("kind")
        for tj in self.caches.trainjobs.cache.values():
            ref = (tj.get("spec") or {}).get("runtimeRef") or {}
            if ref.get("name") == name and ref.get("kind", "ClusterTrainingRuntime") == kind:
                self.queue.add(object_key(tj))

    def capacity_changed(self) -> None:
        """Retry waiting gangs shortly; a burst of deletions leads to one retry."""
        if self._retry_timer is None:
            def fire() -> None:
                self._retry_timer = None
                self.retry_waiting_gangs()
            self._retry_timer = asyncio.get_running_loop().call_later(1.0, fire)

    def retry_waiting_gangs(self) -> None:
        """Ask every waiting gang's scheduler to try again (capacity changed, or periodically)."""
        for key, tj in self.caches.trainjobs.cache.items():
            if waiting_for_gang(tj.get("status")):
                self.reconciler.nudge.add(key)
                self.queue.add(key)

    # --- running -------------------------------------------------------------------------------
    def ready(self) -> bool:
        return all(inf.synced.is_set() for inf in self.caches.all())

    async def run(self) -> None:
        informers = [asyncio.create_task(inf.run(), name=f"informer-{inf.resource.plural}")
                     for inf in self.caches.all()]
        await asyncio.gather(*(inf.synced.wait() for inf in self.caches.all()))
        log.info("caches synced: %d TrainJobs", len(self.caches.trainjobs.cache))
        workers = [asyncio.create_task(self._worker(), name=f"worker-{i}") for i in range(self.settings.workers)]
        housekeeping = [asyncio.create_task(self._resync()), asyncio.create_task(self._gauges()),
                        asyncio.create_task(self._retry_waiting())]
        try:
            await asyncio.gather(*informers, *workers, *housekeeping)
        finally:
            self.queue.shutdown()
            for task in informers + workers + housekeeping:
                task.cancel()

    async def _worker(self) -> None:
        while (key := await self.queue.get()) is not None:
            started = time.perf_counter()
            try:
                await self.reconciler.reconcile(key)
                self.queue.forget(key)
            except ApiError as err:
                reason = "Conflict" if err.conflict else err.reason or str(err.status)
                self.metrics.reconcile_errors.labels(reason).inc()
                delay = self.queue.add_rate_limited(key)
                log.info("reconcile %s: %s; retry in %.1fs", key, err, delay)
            except Exception:  # a bug for one job must not stop the others
                self.metrics.reconcile_errors.labels("Exception").inc()
                delay = self.queue.add_rate_limited(key)
                log.exception("reconcile %s failed; retry in %.1fs", key, delay)
            finally:
                self.queue.done(key)
                self.metrics.reconcile_seconds.observe(time.perf_counter() - started)

    async def _resync(self) -> None:
        while True:
            await asyncio.sleep(self.settings.resync_seconds)
            for key in list(self.caches.trainjobs.cache):
                self.queue.add(key)

    async def _retry_waiting(self) -> None:
        # Capacity can also appear from pods and nodes gangctl does not manage.
        while True:
            await asyncio.sleep(self.settings.gang_retry_seconds)
            self.retry_waiting_gangs()

    async def _gauges(self) -> None:
        while True:
            self.metrics.queue_depth.set(len(self.queue))
            self.metrics.set_phases(Counter(phase(tj.get("status")) for tj in self.caches.trainjobs.cache.values()))
            await asyncio.sleep(1.0)


async def run_controller(settings: ControllerSettings) -> None:
    kube = await Kube.connect(settings.kubeconfig)
    controller = Controller(kube, settings)
    runner = await serve(make_app(controller.metrics.registry, controller.ready),
                         settings.metrics_host, settings.metrics_port)
    log.info("serving /metrics /healthz /readyz on http://%s:%d", settings.metrics_host, settings.metrics_port)
    try:
        await controller.run()
    finally:
        await runner.cleanup()
        await kube.close()
