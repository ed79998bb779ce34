"""An auditor of the invariants a user relies on while elastic TrainJobs run under chaos.

- Never two live pods for one (TrainJob, completion index): live = not Succeeded/Failed and not
  being deleted. Checked on every pod watch event (the API server's order), for the whole run.
- At the end: every TrainJob Complete or Failed, with a non-empty reason; no PodGroup left for a
  finished TrainJob; no pod of a finished TrainJob still Pending/Running (not being deleted).

`PodAuditor.check_event` is pure bookkeeping on pod dicts (unit-testable); `run` feeds it from a watch.
"""
from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field

from gangctl.api.resources import JOBS, PODS, POD_GROUPS, TRAINJOBS
from gangctl.kube.client import Kube
from gangctl.kube.informer import Informer
from gangctl.model.names import COMPLETION_INDEX_ANNOTATION, REPLICATED_JOB, TRAINJOB_NAME

TERMINAL = ("Succeeded", "Failed")


def live(pod: dict) -> bool:
    return not pod["metadata"].get("deletionTimestamp") and (pod.get("status") or {}).get("phase") not in TERMINAL


def exit_code(pod: dict) -> int | None:
    for cs in (pod.get("status") or {}).get("containerStatuses") or []:
        term = (cs.get("state") or {}).get("terminated")
        if term and term.get("exitCode"):
            return int(term["exitCode"])
    return None


def slot(pod: dict) -> tuple[str, str, int] | None:
    """(namespace, TrainJob, completion index) of a node-job worker pod; None for other pods."""
    meta = pod["metadata"]
    labels, index = meta.get("labels") or {}, (meta.get("annotations") or {}).get(COMPLETION_INDEX_ANNOTATION)
    if labels.get(REPLICATED_JOB) != "node" or TRAINJOB_NAME not in labels or index is None or not index.isdigit():
        return None
    return meta.get("namespace", ""), labels[TRAINJOB_NAME], int(index)


@dataclass
class PodAuditor:
    """Tracks live pods per (TrainJob, index) from pod events and records every double."""

    live_by_slot: dict[tuple[str, str, int], set[str]] = field(default_factory=dict)
    slot_of: dict[str, tuple[str, str, int]] = field(default_factory=dict)
    violations: list[dict] = field(default_factory=list)
    disrupted: set[str] = field(default_factory=set)   # worker pods that got DisruptionTarget (node loss)
    failed_exit: set[str] = field(default_factory=set)  # worker pods that exited non-zero, not disrupted
    events: int = 0
    live_pods: int = 0
    max_live_pods: int = 0

    def check_event(self, kind: str, pod: dict) -> None:
        self.events += 1
        uid = pod["metadata"].get("uid") or pod["metadata"]["name"]
        key = slot(pod)
        if key is None:
            return
        conds = {c.get("type"): c.get("status") for c in (pod.get("status") or {}).get("conditions") or []}
        if conds.get("DisruptionTarget") == "True":
            self.disrupted.add(uid)
        elif (pod.get("status") or {}).get("phase") == "Failed" and exit_code(pod):
            self.failed_exit.add(uid)
        pods = self.live_by_slot.setdefault(key, set())
        before = len(pods)
        if kind != "DELETED" and live(pod):
            pods.add(uid)
            self.slot_of[uid] = key
        else:
            pods.discard(uid)
        self.live_pods += len(pods) - before
        self.max_live_pods = max(self.max_live_pods, self.live_pods)
        if len(pods) > 1:
            self.violations.append({"trainjob": f"{key[0]}/{key[1]}", "index": key[2], "pods": sorted(pods),
                                    "at": time.time()})

    async def run(self, kube: Kube, namespace: str | None = None) -> None:
        """Watch pods (re-listing on expiry, through the informer) until cancelled."""
        informer = Informer(kube, PODS, namespace=namespace, handlers=[self.check_event])
        await informer.run()


@dataclass
class FinalAudit:
    trainjobs: int = 0
    outcomes: dict[str, int] = field(default_factory=dict)   # "Complete/<reason>" or "Failed/<reason>" -> count
    unfinished: list[str] = field(default_factory=list)      # no Complete/Failed, or an empty reason
    leaked_pod_groups: list[str] = field(default_factory=list)
    running_pods: list[str] = field(default_factory=list)
    terminating_pods: list[str] = field(default_factory=list)  # deleting but never finished (hold their GPUs)
    active_jobs: list[str] = field(default_factory=list)  # child Jobs of finished TrainJobs still running (make pods)
    restarts: dict[str, int] = field(default_factory=dict)   # user / infrastructure / ignored, summed
    resizes: int = 0                                         # status.elastic.resizes, summed
    by_job: dict[str, dict] = field(default_factory=dict)    # name -> {outcome, reason, restarts}

    @property
    def ok(self) -> bool:
        return not (self.unfinished or self.leaked_pod_groups or self.running_pods or self.terminating_pods or self.active_jobs)


def outcome(trainjob: dict) -> tuple[str, str] | None:
    """("Complete"|"Failed", reason) of a finished TrainJob, None while it runs."""
    for cond in (trainjob.get("status") or {}).get("conditions") or []:
        if cond.get("type") in ("Complete", "Failed") and cond.get("status") == "True":
            return cond["type"], cond.get("reason") or ""
    return None


async def finished(kube: Kube, namespace: str) -> tuple[int, int]:
    """(finished, total) TrainJobs in the namespace."""
    items = (await kube.get(TRAINJOBS.path(namespace)))["items"]
    return sum(1 for tj in items if outcome(tj) is not None), len(items)


async def final_audit(kube: Kube, namespace: str) -> FinalAudit:
    """The end state: outcomes, reasons, leaked PodGroups and pods still running."""
    out = FinalAudit()
    items = (await kube.get(TRAINJOBS.path(namespace)))["items"]
    out.trainjobs = len(items)
    done: set[str] = set()
    for tj in items:
        name = tj["metadata"]["name"]
        status = tj.get("status") or {}
        result = outcome(tj)
        restarts = {k: int((status.get("restarts") or {}).get(k) or 0) for k in ("user", "infrastructure", "ignored")}
        for k, v in restarts.items():
            out.restarts[k] = out.restarts.get(k, 0) + v
        out.resizes += int((status.get("elastic") or {}).get("resizes") or 0)
        out.by_job[name] = {"outcome": result[0] if result else None, "reason": result[1] if result else None,
                            "restarts": restarts, "elastic": status.get("elastic") or {}}
        if result is None or not result[1]:
            out.unfinished.append(name)
            continue
        done.add(name)
        key = f"{result[0]}/{result[1]}"
        out.outcomes[key] = out.outcomes.get(key, 0) + 1
    for group in (await kube.get(POD_GROUPS.path(namespace)))["items"]:
        if group["metadata"]["name"] in done:
            out.leaked_pod_groups.append(group["metadata"]["name"])
    for job in (await kube.get(JOBS.path(namespace)))["items"]:
        owner = (job["metadata"].get("labels") or {}).get(TRAINJOB_NAME)
        over = any(c.get("type") in ("Complete", "Failed") and c.get("status") == "True"
                   for c in (job.get("status") or {}).get("conditions") or [])
        if owner in done and not over and not (job.get("spec") or {}).get("suspend") \
                and not job["metadata"].get("deletionTimestamp"):
            out.active_jobs.append(job["metadata"]["name"])
    for pod in (await kube.get(PODS.path(namespace)))["items"]:
        owner = (pod["metadata"].get("labels") or {}).get(TRAINJOB_NAME)
        if owner not in done:
            continue
        where = f"{pod['metadata']['name']} ({pod['status'].get('phase')} on {pod['spec'].get('nodeName')})"
        if live(pod):
            out.running_pods.append(where)
        elif pod["metadata"].get("deletionTimestamp") and pod["status"].get("phase") not in TERMINAL:
            out.terminating_pods.append(where)
    return out


async def settled_audit(kube: Kube, namespace: str, grace: float = 15.0) -> FinalAudit:
    """The final audit, re-taken for up to `grace` seconds until it is clean (the controller deletes
    a finished job's PodGroup and store pod, and the Job controller its pods, a moment after)."""
    deadline = time.monotonic() + grace
    while True:
        audit = await final_audit(kube, namespace)
        if audit.ok or time.monotonic() > deadline:
            return audit
        await asyncio.sleep(1.0)
