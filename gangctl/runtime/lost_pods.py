"""The lost-pod reaper's I/O: sweeps the pod and node caches with `gangctl.policy.lost_pods` (the
pure decision, and why the reaper exists) and marks each pod it picks Failed, then force-deletes it."""
from __future__ import annotations

import asyncio
import logging
from datetime import datetime, timedelta, timezone
from typing import Callable, Iterable

from gangctl.api.resources import PODS
from gangctl.kube.client import ApiError, Kube
from gangctl.policy.lost_pods import LostPod, failed_status, lost_pods

log = logging.getLogger(__name__)


class LostPodReaper:
    """Every `interval` s, reaps what `lost_pods` picks from the pod and node caches.

    `pods()` and `nodes()` return the cached objects (the controller's pod informer, which selects
    gangctl's pods, and a node informer); `on_reaped(pod)` lets the controller requeue the TrainJob."""

    def __init__(self, kube: Kube, pods: Callable[[], Iterable[dict]], nodes: Callable[[], Iterable[dict]], *,
                 after_seconds: float, field_manager: str = "gangctl", interval: float = 5.0,
                 clock: Callable[[], datetime] | None = None, on_reaped: Callable[[LostPod], None] = lambda p: None):
        self.kube, self.pods, self.nodes = kube, pods, nodes
        self.after = timedelta(seconds=after_seconds)
        self.field_manager, self.interval = field_manager, interval
        self.clock = clock or (lambda: datetime.now(timezone.utc))
        self.on_reaped = on_reaped
        self.reaped: list[LostPod] = []

    async def sweep(self) -> list[LostPod]:
        now = self.clock()
        nodes = {n["metadata"]["name"]: n for n in self.nodes()}
        done = []
        for pod in lost_pods(self.pods(), nodes, now, self.after):
            try:
                await self.kube.apply(PODS.path(pod.namespace, pod.name, "status"), {
                    "apiVersion": "v1", "kind": "Pod", "metadata": {"name": pod.name, "namespace": pod.namespace},
                    "status": failed_status(pod, now)}, self.field_manager)
                await self.kube.request("DELETE", PODS.path(pod.namespace, pod.name),
                                        body={"gracePeriodSeconds": 0, "preconditions": {"uid": pod.uid}})
            except ApiError as err:
                if err.not_found or err.conflict:  # gone, or replaced by a pod of the same name
                    continue
                raise
            log.warning("force-deleted pod %s/%s: terminating since %s on NotReady node %s",
                        pod.namespace, pod.name, pod.terminating_since.isoformat(), pod.node)
            self.reaped.append(pod)
            self.on_reaped(pod)
            done.append(pod)
        return done

    async def run(self) -> None:
        while True:
            try:
                await self.sweep()
            except asyncio.CancelledError:
                raise
            except Exception:  # an API hiccup: try again next round
                log.exception("lost-pod sweep failed")
            await asyncio.sleep(self.interval)
