"""Elastic sizing of a TrainJob's node Job between minNodes and maxNodes (and of a PyTorchJob's Worker Job
between elasticPolicy.minReplicas and its replicas).

Pure: the caller passes what the current attempt's pods show, the Job's current size and `now`.

The child is an elastic Indexed Job (completions = parallelism = size, changed together); torchrun
runs with `--nnodes=min:max` and re-rendezvouses whenever membership changes, so the job's
effective world size is the number of *healthy* workers (bound to a node, not lost, not deleting).

- **Shrink instead of waiting.** After a node loss the Job controller replaces the lost pod; when the
  replacement cannot be scheduled, the trailing indexes that have no healthy pod are cut off the Job
  (never below minNodes). Only indexes without a running worker are removed, so a shrink never kills
  a healthy worker (an Indexed Job always removes its highest indexes). A lost low index (say the
  rank-0 pod) keeps its pending replacement, which is the probe for capacity: torchrun carries on with
  the survivors meanwhile.
- **Grow back.** While size < maxNodes and no pod is waiting for capacity, one index is added at a
  time (a probe); it joins when it is scheduled, and the next one is added. A probe that stays
  unschedulable is cut again, and probing waits `grow_backoff` after such a shrink.
- Never more live pods than the size: the Job controller keeps at most `parallelism` pods per index
  range, and a shrink only removes indexes with no live pod.
"""
from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Iterable, Mapping

from gangctl.policy.failure import PodFailure
from gangctl.policy.status import parse_time

SHRINK_AFTER = timedelta(seconds=3)    # a replacement unschedulable this long is given up
GROW_BACKOFF = timedelta(seconds=30)   # after giving up a probe, wait this long before the next


@dataclass(frozen=True)
class Worker:
    """One pod of the current attempt, as the sizing sees it."""

    index: int
    bound: bool                    # has a node
    healthy: bool                  # bound, node Ready, not deleting, not Failed/disrupted
    lost: bool = False             # DisruptionTarget, or deleting on a lost node
    unschedulable_since: datetime | None = None   # PodScheduled=False/Unschedulable since
    succeeded: bool = False


@dataclass(frozen=True)
class Resize:
    size: int
    cause: str       # NodeLost, Unschedulable, CapacityProbe
    message: str

    @property
    def direction(self) -> str:
        return "grow" if self.cause == "CapacityProbe" else "shrink"


def workers_of(pods: Iterable[dict], hints: Mapping[str, PodFailure] = {}) -> list[Worker]:  # noqa: B006 - read only
    """The current attempt's pods as the sizing sees them. `hints`: pods seen disrupted before, by name;
    those already gone count as lost workers of their index (a lost node's pod is deleted within seconds)."""
    pods = list(pods)
    present = {p["metadata"]["name"] for p in pods}
    out = [Worker(index=seen.index, bound=True, healthy=False, lost=True)
           for seen in hints.values() if seen.index is not None and seen.name not in present]
    for pod in pods:
        meta, status = pod["metadata"], pod.get("status") or {}
        index = (meta.get("annotations") or {}).get("batch.kubernetes.io/job-completion-index")
        if index is None or not index.isdigit():
            continue
        conds = {c.get("type"): c for c in status.get("conditions") or []}
        disrupted = (conds.get("DisruptionTarget") or {}).get("status") == "True"
        deleting = bool(meta.get("deletionTimestamp"))
        bound = bool((pod.get("spec") or {}).get("nodeName"))
        phase = status.get("phase")
        sched = conds.get("PodScheduled") or {}
        since = (parse_time(sched["lastTransitionTime"])
                 if sched.get("status") == "False" and sched.get("reason") == "Unschedulable"
                 and sched.get("lastTransitionTime") else None)
        out.append(Worker(
            index=int(index), bound=bound,
            healthy=bound and not deleting and not disrupted and phase in ("Pending", "Running"),
            lost=disrupted or (deleting and bound and phase not in ("Succeeded",)),
            unschedulable_since=since, succeeded=phase == "Succeeded"))
    return out


def healthy_count(workers: list[Worker]) -> int:
    return sum(1 for w in workers if w.healthy)


def plan(size: int, min_nodes: int, max_nodes: int, workers: list[Worker], now: datetime,
         last_shrink: datetime | None = None, *, shrink_after: timedelta = SHRINK_AFTER,
         grow_backoff: timedelta = GROW_BACKOFF, lost_unseen: bool = False) -> Resize | None:
    """The next size of the Job, or None to keep it."""
    if any(w.succeeded for w in workers):
        return None  # training is finishing: the Job's successPolicy ends it
    by_index: dict[int, list[Worker]] = {}
    for w in workers:
        by_index.setdefault(w.index, []).append(w)

    def waiting(index: int) -> bool:
        """No healthy pod for this index, and its pod (if any) has waited for a node long enough."""
        pods = by_index.get(index, [])
        if any(p.healthy for p in pods):
            return False
        pending = [p for p in pods if not p.bound and not p.lost]
        if not pending:
            return any(p.lost for p in pods)  # lost and not replaced yet
        return all(p.unschedulable_since is not None and now - p.unschedulable_since >= shrink_after
                   for p in pending)

    cut = 0
    while size - cut > min_nodes and waiting(size - 1 - cut):
        cut += 1
    if cut:
        # lost_unseen: the Job counted a failed pod that is already gone (a lost node's pod is
        # evicted and deleted within seconds, possibly between two looks at the cache).
        lost = lost_unseen or any(w.lost and w.index >= size - cut for w in workers)
        cause = "NodeLost" if lost else "Unschedulable"
        return Resize(size - cut, cause,
                      f"shrink {size} -> {size - cut}: index(es) {size - cut}-{size - 1} have no node "
                      f"({'a node was lost' if lost else 'no capacity'}); {healthy_count(workers)} workers healthy")

    if size < max_nodes:
        in_range = [w for w in workers if w.index < size]
        all_placed = len({w.index for w in in_range if w.healthy}) == size
        if all_placed and (last_shrink is None or now - last_shrink >= grow_backoff):
            return Resize(size + 1, "CapacityProbe",
                          f"grow {size} -> {size + 1}: all {size} workers healthy, trying for one more "
                          f"(max {max_nodes})")
    return None


def size_step(size: int, floor: int, top: int, job: dict, pods: list[dict], memo: Mapping, now: datetime,
              hints: Mapping[str, PodFailure] = {}) -> tuple[Resize | None, list[Worker], int]:  # noqa: B006 - read only
    """One sizing look at an elastic Job (either kind): (the resize, or None; its workers; how many
    failed pods the Job counted that are already gone). `memo`: the job's sizing memory (TrainJob
    status.elastic, a PyTorchJob's annotation), read for lastShrinkTime and lostAccounted."""
    found = workers_of(pods, hints)
    gone = int((job.get("status") or {}).get("failed") or 0) - sum(
        1 for p in pods if (p.get("status") or {}).get("phase") == "Failed")
    last = memo.get("lastShrinkTime")
    resize = plan(size, floor, top, found, now, parse_time(last) if last else None,
                  lost_unseen=gone > int(memo.get("lostAccounted") or 0))
    return resize, found, gone


def noted(memo: Mapping, resize: Resize, stamp: str, gone: int) -> dict:
    """The sizing memory after `resize` (at `stamp`; `gone`: as size_step counted it)."""
    out = {**memo, "resizes": int(memo.get("resizes") or 0) + 1, "lastResizeReason": resize.cause,
           "lastResizeTime": stamp}
    if resize.direction == "shrink":
        out["lastShrinkTime"] = stamp
    if resize.cause == "NodeLost":
        out["lostAccounted"] = max(int(memo.get("lostAccounted") or 0), gone)
    return out


def failed_worker(job: dict, pods: Iterable[dict], container: str) -> tuple[str, str] | None:
    """An elastic Job never fails on its own (huge backoffLimit): a worker in range (`pods`: the Job's)
    that exited non-zero without a disruption is the attempt's failure, judged by the failure policy."""
    meta = job["metadata"]
    size = int((job.get("spec") or {}).get("parallelism") or 0)
    for pod in pods:
        failed = PodFailure.from_pod(pod, container=container)
        if (failed is not None and failed.disruption is None and failed.index is not None
                and failed.index < size and (pod.get("status") or {}).get("phase") == "Failed"):
            code = f" with exit code {failed.exit_code}" if failed.exit_code is not None else ""
            return "PodFailed", f"worker {meta['namespace']}/{failed.name} failed{code}"
    return None
