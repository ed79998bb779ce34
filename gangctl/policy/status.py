"""A TrainJob's status from what its children show: conditions, jobsStatus and gang timing.

Pure: the caller passes the previous status, a summary of the observed children, and `now`.
A condition keeps its lastTransitionTime until its status flips, so repeated reconciles of an
unchanged job produce an identical status (and no write).
"""
from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timezone

from gangctl.policy.failure import succeeded

CREATED, RUNNING, SUSPENDED, COMPLETE, FAILED = "Created", "Running", "Suspended", "Complete", "Failed"
CONDITION_ORDER = (CREATED, SUSPENDED, RUNNING, COMPLETE, FAILED)


@dataclass(frozen=True)
class ChildJob:
    """The parts of one child batch/v1 Job that decide the TrainJob's state."""

    name: str
    replicated_job: str
    parallelism: int
    active: int = 0
    ready: int = 0
    succeeded: int = 0
    failed: int = 0
    suspended: bool = False
    complete: tuple[str, str] | None = None   # (reason, message) of a true Complete condition
    failure: tuple[str, str] | None = None    # (reason, message) of a true Failed condition

    @property
    def finished(self) -> bool:
        return self.complete is not None or self.failure is not None

    @classmethod
    def from_job(cls, job: dict, replicated_job: str) -> "ChildJob":
        spec, st = job.get("spec") or {}, job.get("status") or {}
        conds = {c["type"]: c for c in st.get("conditions") or [] if c.get("status") == "True"}
        pick = lambda t: (conds[t].get("reason", t), conds[t].get("message", "")) if t in conds else None  # noqa: E731
        return cls(name=job["metadata"]["name"], replicated_job=replicated_job,
                   parallelism=int(spec.get("parallelism") or 0), active=int(st.get("active") or 0),
                   ready=int(st.get("ready") or 0), succeeded=int(st.get("succeeded") or 0),
                   failed=int(st.get("failed") or 0), suspended=bool(spec.get("suspend")),
                   # The Job controller decides first (SuccessCriteriaMet / FailureTarget) and sets
                   # Complete / Failed once every pod has terminated; the decision is what counts.
                   complete=pick("Complete") or pick("SuccessCriteriaMet"),
                   failure=pick("Failed") or pick("FailureTarget"))


@dataclass(frozen=True)
class GangObservation:
    min_member: int
    bound: int          # pods of the current attempt with a node


def timestamp(now: datetime) -> str:
    return now.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def precise_timestamp(now: datetime) -> str:
    """Millisecond RFC 3339, for gang timing where whole seconds hide the figure."""
    return now.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


def parse_time(value: str) -> datetime:
    return datetime.fromisoformat(value.replace("Z", "+00:00"))


def set_condition(conditions: list[dict], ctype: str, status: bool, reason: str, message: str,
                  now: datetime, generation: int | None = None) -> list[dict]:
    """`conditions` with `ctype` set; lastTransitionTime changes only when the status flips."""
    value = "True" if status else "False"
    out = [c for c in conditions if c["type"] != ctype]
    old = next((c for c in conditions if c["type"] == ctype), None)
    since = old["lastTransitionTime"] if old and old.get("status") == value else timestamp(now)
    cond = {"type": ctype, "status": value, "reason": reason, "message": message, "lastTransitionTime": since}
    if generation is not None:
        cond["observedGeneration"] = generation
    out.append(cond)
    # True conditions last, so the printer column (the last condition) shows the current state.
    return sorted(out, key=lambda c: (c["status"] == "True",
                                      CONDITION_ORDER.index(c["type"]) if c["type"] in CONDITION_ORDER else 99))


def bound_progress(bound: int, size: int) -> str:
    """How much of a gang is bound, in tenths for gangs over ten pods: the message changes (and the
    status is written) at most ten times while a 1,024-pod gang binds, not once per pod."""
    if size <= 10:
        return f"{bound}/{size} pods of the gang are bound"
    step = -(-size // 10)
    return f"at least {bound // step * step}/{size} pods of the gang are bound"


def is_true(status: dict | None, ctype: str) -> bool:
    return any(c["type"] == ctype and c["status"] == "True" for c in (status or {}).get("conditions") or [])


def waiting_for_gang(status: dict | None) -> bool:
    return any(c["type"] == RUNNING and c["status"] == "False" and c.get("reason") == "WaitingForGang"
               for c in (status or {}).get("conditions") or [])


def finished(status: dict | None) -> bool:
    """Complete or Failed is final: nothing is recreated after it."""
    return is_true(status, COMPLETE) or is_true(status, FAILED)


def failed_status(previous: dict | None, reason: str, message: str, now: datetime) -> dict:
    status = dict(previous or {})
    conds = list(status.get("conditions") or [])
    if is_true(status, RUNNING):
        conds = set_condition(conds, RUNNING, False, reason, "the TrainJob failed", now)
    status["conditions"] = set_condition(conds, FAILED, True, reason, message, now)
    return status


def derive_status(previous: dict | None, jobs: list[ChildJob], gang: GangObservation | None,
                  suspend: bool, now: datetime, generation: int | None = None,
                  success_policy: dict | None = None, waiting: tuple[str, str] | None = None) -> dict:
    """`waiting`: the backend's (reason, message) for a gang not bound yet (queue full, evicted, …);
    without it a gang short of pods is WaitingForGang."""
    status = dict(previous or {})
    conds: list[dict] = list(status.get("conditions") or [])
    gen = generation
    if jobs:
        names = ", ".join(j.name for j in jobs)
        conds = set_condition(conds, CREATED, True, "JobsCreated", f"created Job {names}", now, gen)

    if suspend:
        conds = set_condition(conds, SUSPENDED, True, "Suspended", "spec.suspend is true; no pods run", now, gen)
    elif any(c["type"] == SUSPENDED for c in conds):
        conds = set_condition(conds, SUSPENDED, False, "Resumed", "spec.suspend is false", now, gen)

    failure = next((j for j in jobs if j.failure), None)
    complete = succeeded(success_policy, {j.replicated_job: bool(j.complete) for j in jobs})
    gang_status = dict(status.get("gang") or {})
    if failure:
        reason, message = failure.failure  # type: ignore[misc]
        conds = set_condition(conds, FAILED, True, reason, f"Job {failure.name}: {message}", now, gen)
        conds = set_condition(conds, RUNNING, False, "Failed", "the TrainJob failed", now, gen)
    elif complete:
        reason, message = jobs[0].complete  # type: ignore[misc]
        conds = set_condition(conds, COMPLETE, True, "JobsCompleted", f"all Jobs completed: {message or reason}", now, gen)
        conds = set_condition(conds, RUNNING, False, "Completed", "the TrainJob completed", now, gen)
    elif suspend:
        if any(c["type"] == RUNNING for c in conds):
            conds = set_condition(conds, RUNNING, False, "Suspended", "suspended", now, gen)
        for key in ("createdAt", "boundAt", "waitSeconds"):
            gang_status.pop(key, None)  # the gang is measured again from the resume
    elif gang is not None and jobs:
        if gang.bound >= gang.min_member:
            conds = set_condition(conds, RUNNING, True, "GangScheduled",
                                  f"all {gang.min_member} pods of the gang are bound", now, gen)
            gang_status.setdefault("boundAt", precise_timestamp(now))
        else:
            bound = bound_progress(gang.bound, gang.min_member)
            reason, message = waiting if waiting else ("WaitingForGang", bound)
            conds = set_condition(conds, RUNNING, False, reason, message if not waiting else f"{message} ({bound})",
                                  now, gen)
    if jobs and not suspend:
        gang_status.setdefault("createdAt", precise_timestamp(now))
    if "boundAt" in gang_status and "createdAt" in gang_status:
        wait = parse_time(gang_status["boundAt"]) - parse_time(gang_status["createdAt"])
        gang_status["waitSeconds"] = round(wait.total_seconds(), 3)
    if gang_status:
        status["gang"] = gang_status
    else:
        status.pop("gang", None)
    status["conditions"] = conds
    status["jobsStatus"] = [
        {"name": j.replicated_job, "active": j.active, "ready": j.ready, "succeeded": j.succeeded,
         "failed": j.failed, "suspended": j.parallelism if j.suspended else 0}
        for j in jobs
    ]
    return status


def phase(status: dict | None) -> str:
    """One word for a TrainJob's state (metrics and CLI)."""
    for ctype in (FAILED, COMPLETE, SUSPENDED, RUNNING, CREATED):
        if is_true(status, ctype):
            return ctype
    return "Pending"


SYNCED = "Synced"

def stuck_hint(reason: str | None, message: str) -> str:
    """What to do next, for a change the API server keeps refusing (gangctl keeps retrying)."""
    if "immutable" in message:
        return ("The running child Job cannot take this change (its pod template is immutable): suspend "
                "the TrainJob and resume it, or delete and recreate it, to start from the new spec.")
    if reason == "Forbidden":
        return "gangctl's ServiceAccount lacks a permission, or an admission policy refused it: check its RBAC."
    return "gangctl keeps retrying with a growing delay; fix the TrainJob or its runtime."


def drop_condition(status: dict, ctype: str) -> dict:
    """`status` without the `ctype` condition (the same dict when it has none)."""
    conds = status.get("conditions") or []
    if not any(c["type"] == ctype for c in conds):
        return status
    return {**status, "conditions": [c for c in conds if c["type"] != ctype]}
