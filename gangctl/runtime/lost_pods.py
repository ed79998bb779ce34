"""Bounded regrow: finish gangctl's pods that are stuck Terminating on a lost node (opt-in).

When a node is lost, the taint manager evicts its pods (gangctl's tolerate not-ready/unreachable for
5 s): they get a deletionTimestamp and DisruptionTarget, but only the node's kubelet can report them
finished, and a lost kubelet never does. Such a pod keeps its phase (Running), keeps the Job's
tracking finalizer, and so the Job controller does not replace its completion index when the Job
waits for terminal pods (`podReplacementPolicy: Failed`, implied by a `podFailurePolicy`): an elastic
job cannot grow back to that index until the node comes back, however long that takes.

Kubernetes' own answer is the `node.kubernetes.io/out-of-service` taint: an admin (or an operator
that knows the machine is really off) taints the node, and kube-controller-manager's PodGC
(`gcTerminating`, every 20 s) marks every terminating pod on that NotReady node Failed with
DisruptionTarget (reason DeletionByPodGC) and deletes it with grace period 0. It is never automatic,
because a node that is only partitioned may still run the containers: deleting the pod lets a
replacement start while the old process may still be alive (two workers for one rank, or a volume
attached twice). gangctl's reaper makes the same trade-off, narrowed to its own pods and only after a
timeout: `GANGCTL_LOST_POD_SECONDS` (unset: off) — a gangctl-managed pod that has been Terminating
for that long on a node that has been NotReady for that long is marked Failed (DisruptionTarget,
reason `DeletionByGangctl`, so it counts as a disruption, never as the user's failure) and deleted
with gracePeriodSeconds=0, exactly what PodGC does for an out-of-service node. For training workers
the risk is small (torchrun's rendezvous drops a member that stops its keep-alives, and a partitioned
worker cannot reach the store either), but it is the admin's call, hence opt-in.

`lost_pods` is the pure decision (pods, nodes, now in; what to reap out); `LostPodReaper` does the I/O.
"""
from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Callable, Iterable

from gangctl.api.resources import PODS
from gangctl.kube.client import ApiError, Kube
from gangctl.plugins.names import MANAGED_BY, MANAGER

log = logging.getLogger(__name__)

REASON = "DeletionByGangctl"
TERMINAL = ("Succeeded", "Failed")


@dataclass(frozen=True)
class LostPod:
    namespace: str
    name: str
    uid: str
    node: str
    terminating_since: datetime
    has_disruption: bool   # DisruptionTarget already set (by the taint manager's eviction)


def _time(value: str) -> datetime:
    return datetime.fromisoformat(value.replace("Z", "+00:00"))


def not_ready_since(node: dict) -> datetime | None:
    """When the node's Ready condition last left True; None while it is Ready (or never reported)."""
    for cond in (node.get("status") or {}).get("conditions") or []:
        if cond.get("type") == "Ready":
            if cond.get("status") == "True":
                return None
            stamp = cond.get("lastTransitionTime")
            return _time(stamp) if stamp else None
    return None


def terminating_since(pod: dict) -> datetime | None:
    """When the pod was deleted: deletionTimestamp is the deletion time plus the grace period."""
    meta = pod["metadata"]
    stamp = meta.get("deletionTimestamp")
    if not stamp:
        return None
    return _time(stamp) - timedelta(seconds=int(meta.get("deletionGracePeriodSeconds") or 0))


def lost_pods(pods: Iterable[dict], nodes: dict[str, dict], now: datetime, after: timedelta) -> list[LostPod]:
    """gangctl's pods Terminating for at least `after` on a node NotReady for at least `after`.

    A pod on a node that no longer exists is left to PodGC (it deletes orphaned pods itself); a pod
    that already reached a terminal phase is only waiting for its finalizers (the Job controller)."""
    out = []
    for pod in pods:
        meta, status = pod["metadata"], pod.get("status") or {}
        if (meta.get("labels") or {}).get(MANAGED_BY) != MANAGER or status.get("phase") in TERMINAL:
            continue
        since = terminating_since(pod)
        node_name = (pod.get("spec") or {}).get("nodeName")
        if since is None or not node_name or node_name not in nodes:
            continue
        down = not_ready_since(nodes[node_name])
        if down is None or now - down < after or now - since < after:
            continue
        disrupted = any(c.get("type") == "DisruptionTarget" and c.get("status") == "True"
                        for c in status.get("conditions") or [])
        out.append(LostPod(meta.get("namespace", ""), meta["name"], meta.get("uid", ""), node_name, since, disrupted))
    return out


def failed_status(pod: LostPod, now: datetime) -> dict:
    """The status gangctl writes before the force delete (as PodGC does): phase Failed and, unless the
    eviction already set it, DisruptionTarget, so the failure is a disruption and not the user's."""
    status: dict = {"phase": "Failed"}
    if not pod.has_disruption:
        status["conditions"] = [{
            "type": "DisruptionTarget", "status": "True", "reason": REASON,
            "message": f"gangctl: the pod was terminating on NotReady node {pod.node} past the lost-pod timeout",
            "lastTransitionTime": now.strftime("%Y-%m-%dT%H:%M:%SZ")}]
    return status


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
