"""The pods of one PyTorchJob replica type, which gangctl makes itself as Training Operator v1 did:
which indexes to create and which pods to delete. Pure: the caller passes the group's pods (owned by
the job, of this replica type) as observed.

- A **rigid** group runs pods `<job>-<type>-0` .. `-<n-1>`. An index with no pod gets one; a pod that
  failed is the attempt's failure (the caller judges it before this runs: the gang restarts or the
  job fails), so its index is not made again here, and no name is ever taken twice.
- An **elastic** Worker group keeps `size` live pods (not finished, not deleting, not disrupted). A
  worker lost with its node may stay Terminating there as long as the node is away, holding its name,
  so its replacement takes the lowest index no pod holds at once; one deleted on a healthy node (by
  hand) is made again under its own name once it is gone, seconds later. Live pods above the size go: unscheduled
  ones first (the sizing gave them up, `gangctl.policy.elastic`), then the highest indexes. Once a
  worker has succeeded the training is finishing: nothing is added.
"""
from __future__ import annotations

from typing import Iterable

from gangctl.policy.failure import pod_index


def index_of(pod: dict) -> int | None:
    return pod_index(pod.get("metadata") or {})


def finished(pod: dict) -> bool:
    return (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed")


def _disrupted(pod: dict) -> bool:
    conds = (pod.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "DisruptionTarget" and c.get("status") == "True" for c in conds)


def live(pod: dict) -> bool:
    """Running or on its way to: not finished, not being deleted, not disrupted."""
    return not (finished(pod) or pod["metadata"].get("deletionTimestamp") or _disrupted(pod))


def going(pod: dict) -> bool:
    """Being deleted on a healthy node (by hand, or a shrink): its name is free in seconds, and a pod
    made for it takes that name. (One disrupted, e.g. on a lost node, may hold it as long as the node
    is away: it is replaced under another index at once.)"""
    return bool(pod["metadata"].get("deletionTimestamp")) and not finished(pod) and not _disrupted(pod)


def _bound(pod: dict) -> bool:
    return bool((pod.get("spec") or {}).get("nodeName"))


def missing(count: int, pods: Iterable[dict]) -> list[int]:
    """A rigid group's indexes below `count` that no pod holds."""
    taken = {index_of(p) for p in pods}
    return [i for i in range(count) if i not in taken]


def elastic_changes(size: int, pods: Iterable[dict]) -> tuple[list[int], list[dict]]:
    """(indexes to create, pods to delete) for an elastic group of `size` live pods."""
    pods = list(pods)
    alive = [p for p in pods if live(p)]
    if len(alive) > size:
        unscheduled = [p for p in alive if not _bound(p)]
        scheduled = sorted((p for p in alive if _bound(p)), key=lambda p: index_of(p) or 0, reverse=True)
        return [], (unscheduled + scheduled)[:len(alive) - size]
    need = size - len(alive) - sum(1 for p in pods if going(p))
    if need <= 0 or any((p.get("status") or {}).get("phase") == "Succeeded" for p in pods):
        return [], []
    taken = {index_of(p) for p in pods}
    free: list[int] = []
    i = 0
    while len(free) < need:
        if i not in taken:
            free.append(i)
        i += 1
    return free, []
