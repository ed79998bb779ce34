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

This module is the pure decision (pods, nodes, now in; what to reap out); `gangctl.runtime.lost_pods`
does the I/O.
"""
from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Iterable

from gangctl.model.names import MANAGED_BY, MANAGER

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
