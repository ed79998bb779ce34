"""Elastic sizing of a TrainJob's node Job between minNodes and maxNodes (and of a PyTorchJob's Worker Job
between elasticPolicy.minReplicas and its replicas).

Pure: the caller passes what the current attempt's pods show, the Job's current size and `now`.

The child is an elastic Indexed Job whose size is its parallelism; its completions are a pool of
indexes each tried once (`gangctl.plugins.workload.elastic_job_spec`), so a lost worker is replaced at
once by a pod of a fresh index, with none of the Job controller's pod-failure backoff. torchrun runs
with `--nnodes=min:max` and re-rendezvouses whenever membership changes, so the job's effective world
size is the number of *healthy* workers (bound to a node, not lost, not deleting).

- **Shrink instead of waiting.** A worker that cannot be placed (its pod unschedulable for
  `shrink_after`: a lost worker's replacement, or a probe) is given up: the size drops by the number
  of such pods (never below minNodes). Lowering parallelism makes the Job controller delete pods in
  its ActivePods order, unscheduled ones first, so a shrink never kills a healthy worker while a
  waiting one is left.
- **Grow back.** While size < maxNodes and every worker is healthy, the size grows by one (a probe);
  it joins when it is scheduled, and the next one is added. A probe that stays unschedulable is cut
  again, and probing waits `grow_backoff` after such a shrink.
- Never more live pods than the size: the Job controller keeps at most `parallelism` pods running.
"""
from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Iterable, Mapping

from gangctl.policy.failure import PodFailure, pod_index
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
    deleting: bool = False         # on its way out (a shrink's victim, or lost)


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
        index = pod_index(meta)
        if index is None:
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
            index=index, bound=bound,
            healthy=bound and not deleting and not disrupted and phase in ("Pending", "Running"),
            lost=disrupted or (deleting and bound and phase not in ("Succeeded",)),
            unschedulable_since=since, succeeded=phase == "Succeeded", deleting=deleting))
    return out


def healthy_count(workers: list[Worker]) -> int:
    return sum(1 for w in workers if w.healthy)


def plan(size: int, min_nodes: int, max_nodes: int, workers: list[Worker], now: datetime,
         last_shrink: datetime | None = None, *, shrink_after: timedelta = SHRINK_AFTER,
         grow_backoff: timedelta = GROW_BACKOFF, lost_unseen: bool = False) -> Resize | None:
    """The next size of the Job, or None to keep it."""
    if any(w.succeeded for w in workers):
        return None  # training is finishing: the Job's successPolicy ends it
    live = [w for w in workers if not w.lost and not w.deleting]
    # Pods beyond the size (a shrink the Job controller has not carried out yet) go first, and it
    # takes the waiting ones first: those are given up already.
    waiting = sum(1 for w in live if not w.bound and w.unschedulable_since is not None
                  and now - w.unschedulable_since >= shrink_after) - max(0, len(live) - size)
    cut = min(waiting, size - min_nodes)
    if cut > 0:
        # lost_unseen: the Job counted a failed pod that is already gone (a lost node's pod is
        # evicted and deleted within seconds, possibly between two looks at the cache).
        lost = lost_unseen or any(w.lost for w in workers)
        cause = "NodeLost" if lost else "Unschedulable"
        return Resize(size - cut, cause,
                      f"shrink {size} -> {size - cut}: {waiting} worker(s) cannot be placed "
                      f"({'a node was lost' if lost else 'no capacity'}); {healthy_count(workers)} workers healthy")
    settled = healthy_count(live) == len(live) == size   # every worker placed, none waiting or extra
    if size < max_nodes and settled and (last_shrink is None or now - last_shrink >= grow_backoff):
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


def failed_worker_pod(pods: Iterable[dict], container: str) -> tuple[dict, PodFailure] | None:
    """The first of `pods` that exited non-zero without a disruption and was not deleted (a shrink's
    or a deletion's victim), with its failure."""
    for pod in pods:
        failed = PodFailure.from_pod(pod, container=container)
        if (failed is not None and failed.disruption is None and failed.index is not None
                and not pod["metadata"].get("deletionTimestamp") and (pod.get("status") or {}).get("phase") == "Failed"):
            return pod, failed
    return None


def worker_failure(namespace: str, failed: PodFailure) -> tuple[str, str]:
    """The attempt's failure (reason, message) for a worker that failed on its own."""
    code = f" with exit code {failed.exit_code}" if failed.exit_code is not None else ""
    return "PodFailed", f"worker {namespace}/{failed.name} failed{code}"


def failed_worker(job: dict, pods: Iterable[dict], container: str) -> tuple[str, str] | None:
    """An elastic Job never fails on its own (huge backoffLimit): a worker (`pods`: the Job's) that
    exited non-zero without a disruption, and was not deleted (a shrink's or a deletion's victim), is
    the attempt's failure, judged by the failure policy."""
    found = failed_worker_pod(pods, container)
    return None if found is None else worker_failure(job["metadata"]["namespace"], found[1])
