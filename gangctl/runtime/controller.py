"""The controller: informers feed one work queue, workers run the TrainJob and PyTorchJob reconcilers."""
from __future__ import annotations

import asyncio
import faulthandler
import functools
import logging
import signal
import sys
import time
from collections import Counter

from prometheus_client import CollectorRegistry

from gangctl.api.resources import (CLUSTER_TRAINING_RUNTIMES, JOBS, NODES, PERSISTENT_VOLUME_CLAIMS, PODS,
                                   PRIORITY_CLASSES, PYTORCHJOBS, SERVICES, TRAINING_RUNTIMES, TRAINJOBS)
from gangctl.config import ControllerSettings
from gangctl.kube.access_review import AccessReviewer, Reviews, may_list_and_watch
from gangctl.kube.client import UNREACHABLE, ApiError, Kube, until_answered
from gangctl.kube.events import EventRecorder
from gangctl.kube.informer import Informer
from gangctl.kube.leader import LeaderElector, identity
from gangctl.obs.metrics import Metrics
from gangctl.obs.server import make_app, serve
from gangctl.plugins import base
from gangctl.model.names import JOBSET_NAME, MANAGED_BY, MANAGER, TRAINJOB_NAME
from gangctl.plugins.registry import BACKENDS
from gangctl.kube import host_controller, serving_cert
from gangctl.model import progress
from gangctl.policy.cached import node_view, pod_view
from gangctl.policy.leader import LeaseTimings
from gangctl.policy.status import phase
from gangctl.runtime import progress_server
from gangctl.runtime.cluster_view import ClusterLister, TopologySource
from gangctl.runtime.kinds import JobKey, JobKind, PyTorchJobKind, TrainJobKind
from gangctl.runtime.quota_gate import QuotaGate, policy_informer
from gangctl.runtime.reconciler import Caches, Reconciler
from gangctl.runtime.volcano_preemptor import VolcanoPreemptor
from gangctl.runtime.lost_pods import LostPodReaper
from gangctl.runtime.workqueue import WorkQueue

log = logging.getLogger(__name__)

# A key whose reconcile the API refuses this many times in a row, for a reason a retry will not
# change (400 Bad Request, 403 Forbidden, 422 Invalid), gets its reason and message in status.gang saying why.
STUCK_AFTER_FAILURES = 3
PERMANENT_STATUSES = frozenset({400, 403, 422})

# The object each backend's gang is watched through. Kueue's Workloads are Kueue's, not labelled by
# gangctl: they are watched whole and mapped to their TrainJob through the child Job they belong to.
GANG_RESOURCES = {name: backend.watch for name, backend in BACKENDS.items()}


def _name_only(obj: dict) -> dict:
    """What the priority-class cache keeps of a PriorityClass: its name."""
    return {"metadata": {"name": obj["metadata"]["name"], "resourceVersion": obj["metadata"].get("resourceVersion")}}


async def served_backends(kube: Kube, namespace: str | None = None) -> set[str]:
    """The backends whose API this cluster serves and this controller may read (a backend whose CRDs
    are missing is not watched: its TrainJobs are told so instead of the controller failing to start;
    one whose objects RBAC does not let it list and watch, e.g. disabled in the Helm values, is skipped
    with one log line instead of an informer refused for ever)."""
    out = set()
    for name, resource in GANG_RESOURCES.items():
        try:
            listing = await kube.get(f"/apis/{resource.group}/{resource.version}")
        except ApiError as err:
            if err.not_found:
                continue
            raise
        if not any(r.get("name") == resource.plural for r in listing.get("resources") or []):
            continue
        if await may_list_and_watch(kube, resource, namespace):
            out.add(name)
        else:
            log.warning("gang backend %s skipped: this cluster serves %s.%s, but this controller may not list and "
                        "watch them (RBAC; the Helm value backends.%s.enabled); its TrainJobs wait with "
                        "BackendNotInstalled", name, resource.plural, resource.group, name)
    return out


async def serves_pytorchjobs(kube: Kube) -> bool:
    """Whether the PyTorchJob CRD (kubeflow.org/v1) is installed: without it, its informer is not run."""
    try:
        listing = await kube.get(f"/apis/{PYTORCHJOBS.group}/{PYTORCHJOBS.version}")
    except ApiError as err:
        if err.not_found:
            return False
        raise
    return any(r.get("name") == PYTORCHJOBS.plural for r in listing.get("resources") or [])


class Controller:
    def __init__(self, kube: Kube, settings: ControllerSettings, registry: CollectorRegistry | None = None,
                 backends: set[str] | frozenset[str] = frozenset(GANG_RESOURCES), pytorchjobs: bool = True):
        self.kube = kube
        self.settings = settings
        self.metrics = Metrics(registry or CollectorRegistry())
        self.queue = WorkQueue(settings.backoff_base_seconds, settings.backoff_max_seconds)
        kube.set_rate_limit(settings.qps, settings.burst)
        self.caches = self._caches(kube, settings.namespace, backends, pytorchjobs)
        events = EventRecorder(kube)
        # gangctl's own quota admission for coscheduling (which has none): the policy that
        # `gangctl policy apply --backend coscheduling|volcano` stores in a ConfigMap of gangctl-system.
        self.policy_configmaps = policy_informer(kube)
        # The job kinds this cluster serves, each by its adapter (gangctl.runtime.kinds).
        kinds: list[JobKind] = [TrainJobKind(), PyTorchJobKind(settings.pytorchjob_gang_scheduler,
                                                                     settings.pytorchjob_scheduler_name)]
        self.kinds = {k.resource.kind: k for k in kinds if k.cache(self.caches) is not None}
        self.gate = QuotaGate(kube, [k.cache(self.caches) for k in self.kinds.values()], self.policy_configmaps,
                              self.metrics, events, on_change=lambda gate_id: self.queue.add(JobKey.parse(gate_id)))
        # Volcano v1.10 will not preempt for priority into a full queue: gangctl does, per the policy
        # that `gangctl policy apply --backend volcano` stores next to the Queues.
        # Opt-in (GANGCTL_LOST_POD_SECONDS): gangctl's pods stuck Terminating on a node NotReady that
        # long are marked Failed (a disruption) and force-deleted, as PodGC does for an out-of-service
        # node, so a lost node cannot block a restart or an elastic regrow forever.
        self.reaper: LostPodReaper | None = None
        if settings.lost_pod_seconds:
            self.reaper = LostPodReaper(kube, lambda: self.caches.pods.cache.values(),
                                        lambda: self.caches.node_list() or (), after_seconds=settings.lost_pod_seconds,
                                        field_manager=settings.field_manager)
        if "volcano" in self.caches.groups:
            self.volcano_preemptor = VolcanoPreemptor(kube, self.caches.groups["volcano"], self.caches.jobs,
                                                      self.caches.trainjobs, self.gate, self.metrics, events)
        self.reconciler = Reconciler(kube, self.caches, self.metrics, events, kinds=self.kinds,
                                     field_manager=settings.field_manager, scheduler_name=settings.scheduler_name)
        self.reconciler.gate = self.gate
        self.reconciler.topology = TopologySource(self.policy_configmaps)
        self.cluster_lister = ClusterLister(kube)
        self.reconciler.list_cluster = self.cluster_lister
        self.reconciler.on_capacity_freed = self.capacity_changed
        self.reconciler.requeue_after = self.queue.add_after
        self._retry_timer: asyncio.TimerHandle | None = None

    def _caches(self, kube: Kube, ns: str | None, backends: set[str] | frozenset[str], pytorchjobs: bool) -> Caches:
        """The informers: the jobs of each kind, their runtimes, and the children gangctl labels."""
        managed = f"{MANAGED_BY}={MANAGER}"
        return Caches(
            pytorchjobs=(Informer(kube, PYTORCHJOBS, namespace=ns, handlers=[self._on_job])
                         if pytorchjobs else None),
            trainjobs=Informer(kube, TRAINJOBS, namespace=ns, handlers=[self._on_job]),
            runtimes=Informer(kube, TRAINING_RUNTIMES, namespace=ns, handlers=[self._on_runtime]),
            cluster_runtimes=Informer(kube, CLUSTER_TRAINING_RUNTIMES, handlers=[self._on_runtime]),
            jobs=Informer(kube, JOBS, namespace=ns, label_selector=managed, handlers=[self._on_child],
                          index_label=TRAINJOB_NAME),
            pods=Informer(kube, PODS, namespace=ns, label_selector=managed, handlers=[self._on_child],
                          index_label=TRAINJOB_NAME, transform=pod_view),
            services=Informer(kube, SERVICES, namespace=ns, label_selector=managed, handlers=[self._on_child],
                              index_label=TRAINJOB_NAME),
            groups={name: self._gang_informer(kube, name, resource, ns, managed)
                    for name, resource in GANG_RESOURCES.items() if name in backends},
            # A child Job whose template names a PriorityClass that does not exist is created, and
            # then none of its pods is: gangctl checks the name before it creates the Job.
            priority_classes=Informer(kube, PRIORITY_CLASSES, transform=_name_only),
            # The runtime's volumeClaimPolicies PVCs (labelled with their TrainJob's name): at
            # ttlSecondsAfterFinished those the TrainJob owns are deleted, by uid.
            claims=Informer(kube, PERSISTENT_VOLUME_CLAIMS, namespace=ns, label_selector=JOBSET_NAME,
                            index_label=JOBSET_NAME),
            # Which nodes restart a pod's containers in place (a runtime's default restart mode), and
            # which are lost (the opt-in lost-pod reaper); kept small (`node_view`).
            nodes=Informer(kube, NODES, transform=node_view),
        )

    def _gang_informer(self, kube: Kube, name: str, resource, ns: str | None, managed: str) -> Informer:
        """What a backend's gangs are watched through. gangctl's own group objects carry its label and
        its job's name; an object the backend makes from a job (Kueue's Workload, see
        `base.watched_selector`) carries neither, so all of them are watched, indexed by the label
        that names the job's uid, and an event maps back to the job through its owner (`_on_workload`)."""
        from_job = base.watched_selector(BACKENDS[name], "")
        if from_job is None:
            return Informer(kube, resource, namespace=ns, label_selector=managed, handlers=[self._on_child])
        label = next(iter(from_job))
        return Informer(kube, resource, namespace=ns, handlers=[functools.partial(self._on_workload, label)],
                        index_label=label)

    # --- event handlers: only enqueue keys -------------------------------------------------------

    def _on_job(self, event: str, obj: dict) -> None:
        key = JobKey.of(obj)
        if event == "DELETED":
            # Nothing about a deleted job stays in memory or in the metrics.
            self.reconciler.forget(key)
            self.gate.forget(str(key))
            self.queue.forget(key)
        self.queue.add(key)

    def _add_owners(self, namespace: str, labels: dict) -> None:
        """Queue the job(s) a child names by its kind's label."""
        for kind_name, kind in self.kinds.items():
            if labels.get(kind.name_label):
                self.queue.add(JobKey(kind_name, namespace, labels[kind.name_label]))

    def _on_child(self, event: str, obj: dict) -> None:
        meta = obj["metadata"]
        if event == "DELETED" and obj.get("kind") in ("Pod", "PodGroup"):
            self.capacity_changed()
        elif obj.get("kind") == "Pod" and (obj.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
            self.cluster_lister.forget()   # its node's room is free (its gang retries when its job is released)
        if event == "DELETED" and obj.get("kind") == "Job":
            self.reconciler.forget_job(meta.get("uid", ""))
        self._add_owners(meta["namespace"], meta.get("labels") or {})

    def _on_workload(self, uid_label: str, event: str, obj: dict) -> None:
        """An object a backend made from a job (Kueue's Workload, its owner's uid in `uid_label`): requeue
        that job: one Kueue admits itself (a PyTorchJob) directly, a TrainJob through its child Job."""
        meta = obj["metadata"]
        if event == "DELETED":
            self.capacity_changed()
        uid = (meta.get("labels") or {}).get(uid_label)
        for ref in meta.get("ownerReferences") or []:
            if uid and ref.get("uid") != uid:
                continue
            kind = self.kinds.get(ref.get("kind", ""))
            if kind is not None and ref.get("apiVersion") == kind.resource.api_version:
                self.queue.add(JobKey(kind.resource.kind, meta["namespace"], ref["name"]))
            elif ref.get("kind") == "Job":
                job = self.caches.jobs.get(f"{meta['namespace']}/{ref['name']}")
                self._add_owners(meta["namespace"], (job or {}).get("metadata", {}).get("labels") or {})

    def _on_runtime(self, _: str, obj: dict) -> None:
        name = obj["metadata"]["name"]
        kind = obj.get("kind")
        for tj in self.caches.trainjobs.cache.values():
            ref = (tj.get("spec") or {}).get("runtimeRef") or {}
            if ref.get("name") == name and ref.get("kind", "ClusterTrainingRuntime") == kind:
                self.queue.add(JobKey.of(tj))

    def capacity_changed(self) -> None:
        """Retry waiting gangs shortly; a burst of deletions leads to one retry. The nodes listed for
        gangctl's own placement are stale from now on."""
        self.cluster_lister.forget()
        if self._retry_timer is None:
            def fire() -> None:
                self._retry_timer = None
                self.retry_waiting_gangs()
            self._retry_timer = asyncio.get_running_loop().call_later(1.0, fire)

    def retry_waiting_gangs(self) -> None:
        """Ask every waiting gang's scheduler to try again (capacity changed, or periodically)."""
        for key, obj in self._jobs():
            if self.kinds[key.kind].waiting_for_gang(obj):
                self.reconciler.nudge.add(key)
                self.queue.add(key)

    def _jobs(self) -> list[tuple[JobKey, dict]]:
        """Every job of every kind served, from the caches."""
        return [(JobKey(kind_name, *cache_key.split("/", 1)), obj) for kind_name, kind in self.kinds.items()
                for cache_key, obj in list(kind.cache(self.caches).cache.items())]

    # --- running -------------------------------------------------------------------------------
    def informers(self) -> list[Informer]:
        return [*self.caches.all(), self.policy_configmaps]

    def problems(self) -> list[str]:
        """Why this replica's caches cannot be trusted now (empty: ready)."""
        return [p for inf in self.informers() if (p := inf.problem()) is not None]

    async def run(self, leading: asyncio.Event | None = None) -> None:
        informers = [asyncio.create_task(inf.run(), name=f"informer-{inf.resource.plural}")
                     for inf in self.informers()]
        workers: list[asyncio.Task] = []
        housekeeping: list[asyncio.Task] = []
        try:   # stopped at any point (a standby too), none of the tasks it started outlives it
            # The policy is read before any worker runs, or jobs would start ungated.
            await asyncio.gather(*(inf.synced.wait() for inf in self.informers()))
            log.info("caches synced: %d TrainJobs", len(self.caches.trainjobs.cache))
            if leading is not None:  # a standby keeps its caches warm and starts no worker until it leads
                await leading.wait()
            workers = [asyncio.create_task(self._worker(), name=f"worker-{i}") for i in range(self.settings.workers)]
            housekeeping = [asyncio.create_task(self._resync()), asyncio.create_task(self._gauges()),
                            asyncio.create_task(self._retry_waiting()),
                            asyncio.create_task(self.gate.run(), name="quota-gate"),
                            *([asyncio.create_task(self.reaper.run(), name="lost-pod-reaper")] if self.reaper else [])]
            await asyncio.gather(*informers, *workers, *housekeeping)
        finally:
            self.queue.shutdown()
            for task in informers + workers + housekeeping:
                task.cancel()

    async def _worker(self) -> None:
        while (key := await self.queue.get()) is not None:
            started = time.perf_counter()
            try:
                epoch = self.gate.epoch
                await self.reconciler.reconcile(key)
                self.gate.reconciled(str(key), epoch)   # a starting gate decides once it has heard of every job
                self.queue.forget(key)
            except ApiError as err:
                reason = "Conflict" if err.conflict else err.reason or str(err.status)
                self.metrics.reconcile_errors.labels(reason).inc()
                delay = self.queue.add_rate_limited(key)
                log.info("reconcile %s: %s; retry in %.1fs", key, err, delay)
                if self.queue.failures(key) == STUCK_AFTER_FAILURES and err.status in PERMANENT_STATUSES:
                    await self._report_stuck(key, err)
            except UNREACHABLE as err:  # no answer from the API server: never the job's fault, only a retry
                self.metrics.reconcile_errors.labels("Unreachable").inc()
                delay = self.queue.add_rate_limited(key)
                log.info("reconcile %s: the API server did not answer (%r); retry in %.1fs", key, err, delay)
            except Exception as err:  # a bug for one job must not stop the others
                self.metrics.reconcile_errors.labels("Exception").inc()
                delay = self.queue.add_rate_limited(key)
                log.exception("reconcile %s failed; retry in %.1fs", key, delay)
                if self.queue.failures(key) == STUCK_AFTER_FAILURES:
                    await self._report_stuck(key, err)
            finally:
                self.queue.done(key)
                self.metrics.reconcile_seconds.observe(time.perf_counter() - started)

    async def _report_stuck(self, key: JobKey, err: Exception) -> None:
        try:
            await self.reconciler.report_stuck(key, err)
        except Exception as again:  # noqa: BLE001 - reporting must never take a worker down
            log.info("could not record the error on %s: %s", key, again)

    async def _resync(self) -> None:
        while True:
            await asyncio.sleep(self.settings.resync_seconds)
            for key, _ in self._jobs():
                self.queue.add(key)

    async def _retry_waiting(self) -> None:
        # Capacity can also appear from pods and nodes gangctl does not manage.
        while True:
            await asyncio.sleep(self.settings.gang_retry_seconds)
            self.retry_waiting_gangs()

    async def _gauges(self) -> None:
        throttled = 0
        while True:
            self.metrics.api_throttled.inc(self.kube.throttled - throttled)
            throttled = self.kube.throttled
            self.metrics.queue_depth.set(len(self.queue))
            self.metrics.set_phases(Counter(phase(tj.get("status")) for tj in self.caches.trainjobs.cache.values()))
            await asyncio.sleep(1.0)


async def run_controller(settings: ControllerSettings) -> int:
    """Serve until SIGTERM or SIGINT (exit code 0) or until the leader Lease is lost (1).

    With leader election, every replica keeps its informers warm and answers /readyz; only the
    Lease holder runs workers and the quota gate, and its client refuses writes once its renew
    deadline passes (`kube.write_fence`; a write's timeout is capped at the time the fence stays open,
    so none lands after a takeover). A transport fault anywhere (refused, reset, a response cut
    mid-body) is retried, at start too: only a lost Lease or a signal ends the process. A replica that loses the Lease exits at once (as client-go
    does), and its Deployment restarts it as a standby. On SIGTERM the queue stops handing out keys
    beyond those already queued, in-flight reconciles get `shutdown_grace_seconds`, and the Lease is
    released so a standby takes over within its retry period.
    """
    me = settings.leader_elect_identity or identity()
    kube, control, lease_kube = await _clients(settings, me)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    tasks: list[asyncio.Task] = []
    background: list[asyncio.Task] = []   # loops that never end the controller (they catch their errors)
    runner, closing = None, []
    try:
        backends = await until_answered(lambda: served_backends(kube, settings.namespace), "discovery")
        log.info("gang backends served by this cluster: %s", ", ".join(sorted(backends)) or "none")
        controller = Controller(kube, settings, backends=backends,
                                pytorchjobs=await until_answered(lambda: serves_pytorchjobs(kube), "discovery"))
        runner = await _serve_endpoints(controller, control, settings, closing, background)
        elector = _elector(settings, lease_kube, kube, me)
        elector_task = asyncio.create_task(elector.run(), name="leader-elector") if elector else None
        tasks += [elector_task] if elector_task else []
        run = asyncio.create_task(controller.run(elector.leading if elector else None), name="controller")
        tasks += [run, asyncio.create_task(stop.wait(), name="stop-signal")]
        # The elector's task ends when leadership is lost; the controller's only on a crash.
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        if run.done():
            run.result()  # a crash of the controller propagates
            return 1
        if elector_task is not None and elector_task.done() and not stop.is_set():
            if not elector_task.cancelled() and elector_task.exception():
                log.error("leader election failed", exc_info=elector_task.exception())
            log.error("leadership lost: exiting so that a standby leads (writes are refused from now on)")
            return 1
        await _stop(controller, settings.shutdown_grace_seconds, elector, elector_task)
        return 0
    finally:
        for task in tasks + background:
            task.cancel()
        await asyncio.gather(*tasks, *background, return_exceptions=True)
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)
        for close in closing:
            await close()
        if runner is not None:
            await runner.cleanup()
        for client in (lease_kube, control, kube):
            await client.close()


async def _clients(settings: ControllerSettings, me: str) -> tuple[Kube, Kube, Kube]:
    """The controller's three API sessions: its own (rate-limited, behind the write fence); one for
    token reviews and progress reports, which is neither (a standby answers its callers too, and the
    reviews are capped and cached by gangctl.policy.review_gate, so callers with invented tokens cannot
    crowd it); and one for the Lease alone, so that no burst of reconciles, reviews or reports queues a
    renewal behind it (deploy/'s FlowSchema gives it its own APF level too). Each names its replica
    and role in its user agent, which tells replicas apart in the audit log."""
    clients = (await Kube.connect(settings.kubeconfig), await Kube.connect(settings.kubeconfig),
               await Kube.connect(settings.kubeconfig))
    for client, role in zip(clients, ("controller", "reviews", "leader-election")):
        client.user_agent = f"{client.user_agent} ({me}; {role})"
    return clients


async def _serve_endpoints(controller: Controller, control: Kube, settings: ControllerSettings,
                           closing: list, background: list[asyncio.Task]):
    """Start the progress endpoint (if any) and the /metrics /healthz /readyz server; return the
    latter's runner. What must be closed or cancelled at the end is appended to `closing`/`background`."""
    reviews = Reviews(control, on_review=lambda kind: controller.metrics.access_reviews.labels(kind).inc(),
                      on_refused=lambda limit: controller.metrics.access_reviews_refused.labels(limit).inc())
    authorize = AccessReviewer(reviews).check if settings.metrics_auth else None
    endpoint = await progress_endpoint(control, reviews, controller, settings)
    if endpoint is not None:
        await endpoint.refresh()
        closing.append(endpoint.close)
        background.append(asyncio.create_task(endpoint.run(), name="progress-endpoint"))

    def degraded() -> list[str]:
        return [p] if endpoint and (p := endpoint.problem()) else []
    runner = await serve(make_app(controller.metrics.registry, controller.problems, authorize, degraded),
                         settings.metrics_host, settings.metrics_port)
    log.info("serving /metrics%s /healthz /readyz on http://%s:%d", " (token-reviewed)" if authorize else "",
             settings.metrics_host, settings.metrics_port)
    return runner


def _elector(settings: ControllerSettings, lease_kube: Kube, kube: Kube, me: str) -> LeaderElector | None:
    """The Lease campaigner when leader election is on; the controller's writes are fenced by it."""
    if not settings.leader_elect:
        return None
    elector = LeaderElector(lease_kube, settings.leader_elect_namespace, settings.leader_elect_lease_name, me,
                            LeaseTimings(settings.lease_duration_seconds, settings.renew_deadline_seconds,
                                         settings.retry_period_seconds))
    kube.write_fence = elector.fence_left
    log.info("leader election: %s campaigning for lease %s/%s", elector.identity, elector.namespace, elector.name)
    return elector


async def progress_endpoint(control: Kube, reviews: Reviews, controller: Controller,
                            settings: ControllerSettings) -> progress_server.ProgressEndpoint | None:
    """The progress endpoint (gangctl.runtime.progress_server) when a URL is set or the local cluster
    has its host Service; once it serves, the reconciler gives new trainer pods its URL and CA."""
    base_url, host, port = settings.trainer_status_url, settings.trainer_status_host, settings.trainer_status_port
    if not base_url:
        local = await until_answered(lambda: local_progress_service(control), "progress endpoint discovery")
        if local is None:
            log.info("progress endpoint off (no --trainer-status-url): status.trainerStatus is not served")
            return None
        base_url, port = local
    server = progress_server.ProgressServer(
        control, reviews, controller.caches, rate=settings.trainer_status_rate,
        on_answer=lambda code: controller.metrics.trainer_status_reports.labels(str(code)).inc())

    def served(cert: serving_cert.ServingCert) -> None:
        controller.reconciler.progress = progress.Endpoint(base_url, cert.ca_pem)
    log.info("progress endpoint: trainer pods report to %s", base_url)
    return progress_server.ProgressEndpoint(server, control, settings.trainer_status_secret,
                                            progress.url_hosts(base_url), host, port, served,
                                            check_seconds=settings.trainer_status_check_seconds)


async def local_progress_service(kube: Kube) -> tuple[str, int] | None:
    """(base URL, host port) from the Service `gangctl cluster up` makes for a controller on the host."""
    try:
        async for page in kube.list_pages(SERVICES.path(host_controller.NAMESPACE),
                                          label_selector="=".join(host_controller.LABEL)):
            for svc in page.get("items") or []:
                port = (svc["metadata"].get("annotations") or {}).get(host_controller.HOST_PORT_ANNOTATION)
                if svc["metadata"]["name"] == host_controller.SERVICE and port:
                    return host_controller.url(), int(port)
    except ApiError as err:
        if not (err.not_found or err.status == 403):
            raise
    return None


# What a stop usually takes after the drain (the Lease's release, closing the servers, cancelling the
# tasks) is well under a second; 4 s more and the watchdog says where it is stuck, before a pod's
# grace period (or a test harness) ends it with SIGKILL.
STOP_SECONDS = 4.0


def stuck_stop_watchdog(after: float) -> None:
    """If stopping takes longer than `after` seconds, log what every task and thread is doing (once),
    so a stop that would end in SIGKILL says where it was stuck. Armed until the process exits (it
    never fires if the process ends first)."""
    def dump() -> None:
        log.error("still stopping after %.0fs; its tasks follow", after)
        for task in asyncio.all_tasks():
            task.print_stack(limit=8, file=sys.stderr)
    # The threads' stacks from a thread of faulthandler's own: printed even if the event loop is blocked.
    faulthandler.dump_traceback_later(after, file=sys.stderr)
    asyncio.get_running_loop().call_later(after, dump)


async def _stop(controller: Controller, grace: float, elector: LeaderElector | None,
                elector_task: asyncio.Task | None) -> None:
    """Drain the in-flight reconciles, then give the Lease up."""
    log.info("stopping: draining in-flight reconciles (up to %.0fs)", grace)
    stuck_stop_watchdog(grace + STOP_SECONDS)
    await _drain(controller, grace)
    if elector is not None and elector_task is not None:
        # Its last attempt may still win the Lease (a standby stopped while it acquires): let that
        # attempt end first, so that a Lease won at the last moment is released too.
        elector_task.cancel()
        await asyncio.gather(elector_task, return_exceptions=True)
        await elector.release()


async def _drain(controller: Controller, grace: float) -> None:
    """Stop the queue (workers finish the keys already queued, then return) and wait for the workers,
    at most `grace` seconds."""
    controller.queue.shutdown()
    workers = [t for t in asyncio.all_tasks() if t.get_name().startswith("worker-")]
    if workers:
        _, pending = await asyncio.wait(workers, timeout=grace)
        if pending:
            log.warning("%d reconciles still running after %.0fs: cancelled", len(pending), grace)
