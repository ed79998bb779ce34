"""A TrainJob's status from what its children show: conditions, jobsStatus and status.gang.

`status.conditions` holds only what Kubeflow Trainer v2.3 writes, with Trainer's meaning: Suspended
(True while spec.suspend is), Complete, Failed. A job that runs has no condition, as under Trainer,
so the kubeflow SDK reports it Running. gangctl's own state (Pending, Waiting with the reason,
Running, Suspended, Restarting, Complete, Failed) is `status.gang`, with its gang timing.

Pure: the caller passes the previous status, a summary of the observed children, and `now`.
A condition keeps its lastTransitionTime until its status flips, and status.gang until its state
changes, so repeated reconciles of an unchanged job produce an identical status (and no write).
"""
from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timezone

from gangctl.policy.failure import succeeded

# Trainer v2.3's condition types: the only ones in status.conditions.
SUSPENDED, COMPLETE, FAILED = "Suspended", "Complete", "Failed"
CONDITION_ORDER = (SUSPENDED, COMPLETE, FAILED)
# status.gang.state: gangctl's view, every phase (the State printer column).
PENDING, WAITING, RUNNING, RESTARTING = "Pending", "Waiting", "Running", "Restarting"
STATES = (PENDING, WAITING, RUNNING, SUSPENDED, RESTARTING, COMPLETE, FAILED)
GANG_TIMING = ("createdAt", "boundAt", "waitSeconds")


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
    return sorted(out, key=lambda c: CONDITION_ORDER.index(c["type"]) if c["type"] in CONDITION_ORDER else 99)


def gang_state(status: dict | None) -> dict:
    """status.gang: state, reason, message, lastTransitionTime (and the gang timing)."""
    return (status or {}).get("gang") or {}


def set_state(status: dict | None, state: str, reason: str, message: str, now: datetime) -> dict:
    """`status` with status.gang's state, reason and message; lastTransitionTime changes only when
    the state does."""
    gang = dict(gang_state(status))
    if gang.get("state") != state or "lastTransitionTime" not in gang:
        gang["lastTransitionTime"] = timestamp(now)
    gang.update(state=state, reason=reason, message=message)
    return {**(status or {}), "gang": gang}


LEGACY_CONDITIONS = ("Created", "Running", "Synced")


def trainer_conditions(status: dict | None) -> list[dict]:
    """The conditions, without those an older gangctl wrote beside Trainer's (now in status.gang)."""
    return [c for c in (status or {}).get("conditions") or [] if c["type"] not in LEGACY_CONDITIONS]


def bound_progress(bound: int, size: int) -> str:
    """How much of a gang is bound, in quarters for gangs over ten pods: the message changes (and the
    status is written) at most four times while a 1,024-pod gang binds, not once per pod."""
    if size <= 10:
        return f"{bound}/{size} pods of the gang are bound"
    step = -(-size // 4)
    return f"at least {bound // step * step}/{size} pods of the gang are bound"


def is_true(status: dict | None, ctype: str) -> bool:
    return any(c["type"] == ctype and c["status"] == "True" for c in (status or {}).get("conditions") or [])


def waiting_for_gang(status: dict | None) -> bool:
    gang = gang_state(status)
    return gang.get("state") == WAITING and gang.get("reason") == "WaitingForGang"


def finished(status: dict | None) -> bool:
    """Complete or Failed is final: nothing is recreated after it."""
    return is_true(status, COMPLETE) or is_true(status, FAILED)


def failed_status(previous: dict | None, reason: str, message: str, now: datetime) -> dict:
    status = set_state(previous, FAILED, reason, message, now)
    status["conditions"] = set_condition(trainer_conditions(status), FAILED, True, reason, message, now)
    return status


def _suspension(conds: list[dict], gang_status: dict, suspend: bool, now: datetime,
                gen: int | None) -> list[dict]:
    """The conditions with spec.suspend's Suspended condition. Trainer leaves Suspended=False/"Resumed"
    on resume, which makes the kubeflow SDK say "Created" for good: gangctl drops the condition and
    keeps the resume time (the deadline's start) in `gang_status`."""
    was_suspended = next((c for c in conds if c["type"] == SUSPENDED), None)
    if suspend:
        return set_condition(conds, SUSPENDED, True, "Suspended", "TrainJob is suspended", now, gen)
    if was_suspended is not None:
        gang_status["resumedAt"] = (timestamp(now) if was_suspended["status"] == "True"
                                    else was_suspended.get("lastTransitionTime") or timestamp(now))
        return [c for c in conds if c["type"] != SUSPENDED]
    return conds


def derive_status(previous: dict | None, jobs: list[ChildJob], gang: GangObservation | None,
                  suspend: bool, now: datetime, generation: int | None = None,
                  success_policy: dict | None = None, waiting: tuple[str, str] | None = None) -> dict:
    """`waiting`: the backend's (reason, message) for a gang not bound yet (queue full, evicted, …);
    without it a gang short of pods is WaitingForGang."""
    status = dict(previous or {})
    conds = trainer_conditions(status)
    gen = generation
    gang_status = dict(gang_state(status))
    conds = _suspension(conds, gang_status, suspend, now, gen)
    failure = next(((j.name, j.failure) for j in jobs if j.failure), None)
    complete = succeeded(success_policy, {j.replicated_job: bool(j.complete) for j in jobs})
    state: tuple[str, str, str] | None = None
    if failure:
        name, (reason, message) = failure
        conds = set_condition(conds, FAILED, True, reason, f"Job {name}: {message}", now, gen)
        state = (FAILED, reason, f"Job {name}: {message}")
    elif complete:
        words = jobs[0].complete
        assert words is not None, "the success policy is met only by a complete trainer Job"
        reason, message = words
        conds = set_condition(conds, COMPLETE, True, "JobsCompleted", f"all Jobs completed: {message or reason}", now, gen)
        state = (COMPLETE, "JobsCompleted", f"all Jobs completed: {message or reason}")
    elif suspend:
        state = (SUSPENDED, "Suspended", "spec.suspend is true: it holds no gang and no node")
        for key in GANG_TIMING:
            gang_status.pop(key, None)  # the gang is measured again from the resume
    elif gang is not None and jobs:
        if gang.bound >= gang.min_member:
            state = (RUNNING, "GangScheduled", f"all {gang.min_member} pods of the gang are bound")
            gang_status.setdefault("boundAt", precise_timestamp(now))
        else:
            bound = bound_progress(gang.bound, gang.min_member)
            reason, message = waiting if waiting else ("WaitingForGang", bound)
            state = (WAITING, reason, message if not waiting else f"{message} ({bound})")
    elif not jobs and gang is not None:
        state = (PENDING, "Creating", "gangctl is creating the child Jobs")
    if jobs and not suspend:
        gang_status.setdefault("createdAt", precise_timestamp(now))
    if "boundAt" in gang_status and "createdAt" in gang_status:
        wait = parse_time(gang_status["boundAt"]) - parse_time(gang_status["createdAt"])
        gang_status["waitSeconds"] = round(wait.total_seconds(), 3)
    status["gang"] = gang_status
    if state is not None:
        status = set_state(status, *state, now)
    if not status["gang"]:
        status.pop("gang")
    if conds:
        status["conditions"] = conds
    else:
        status.pop("conditions", None)  # a running job has none, as under Trainer
    counts = [
        {"name": j.replicated_job, "active": j.active, "ready": j.ready, "succeeded": j.succeeded,
         "failed": j.failed, "suspended": j.parallelism if j.suspended else 0}
        for j in jobs
    ]
    status["jobsStatus"] = previous["jobsStatus"] if _coalesced(previous, status, counts) else counts
    return status


def _coalesced(previous: dict | None, status: dict, counts: list[dict]) -> bool:
    """True when a waiting gang's new Job counters wait for its next progress step: while the gang is
    not bound and status.gang is unchanged, the counters alone (the Job controller moves them pod by
    pod while it creates a 1,024-pod gang) are not worth a status write each. They are written with
    the next change of the gang's progress (quarters of the gang bound) or state."""
    before = (previous or {}).get("jobsStatus")
    gang, was = status.get("gang") or {}, gang_state(previous)
    return (gang.get("state") == WAITING and was.get("state") == WAITING and gang.get("message") == was.get("message")
            and isinstance(before, list) and [c.get("name") for c in before] == [c["name"] for c in counts])


def phase(status: dict | None) -> str:
    """One word for a TrainJob's state (metrics and CLI): status.gang.state, Trainer's conditions
    for a status without it."""
    for ctype in (FAILED, COMPLETE):
        if is_true(status, ctype):
            return ctype
    return gang_state(status).get("state") or (SUSPENDED if is_true(status, SUSPENDED) else PENDING)


def stuck_hint(reason: str | None, message: str, kind: str = "TrainJob") -> str:
    """What to do next, for a change the API server keeps refusing (gangctl keeps retrying)."""
    if "immutable" in message:
        return ("The running child Job cannot take this change (its pod template is immutable): suspend "
                f"the {kind} and resume it, or delete and recreate it, to start from the new spec.")
    if reason == "Forbidden":
        return "gangctl's ServiceAccount lacks a permission, or an admission policy refused it: check its RBAC."
    return f"gangctl keeps retrying with a growing delay; fix the {kind}" + (" or its runtime." if kind == "TrainJob" else ".")


def _elide(message: str, keep: int = 240) -> str:
    """A long API message (a 422 quotes the whole object it refused) cut in the middle: its head names
    the object and field, its tail says why (e.g. "field is immutable")."""
    return message if len(message) <= 2 * keep else f"{message[:keep]} … {message[-keep:]}"


def stuck(kind: str, error_reason: str | None, error_message: str | None, error: str) -> tuple[str, str]:
    """(reason, message) for a job whose reconcile keeps failing: the API server's refusal with what to
    do next (`error_reason`/`error_message` from its Status), or else gangctl's own error."""
    if error_message is not None:
        return (error_reason or "Invalid",
                f"the API server refused gangctl's change: {_elide(error_message)}. "
                f"{stuck_hint(error_reason, error_message, kind)}")
    return ("InternalError", f"gangctl failed on this {kind}: {error}. It keeps retrying; please report it with "
                             f"the {kind}" + (" and its runtime" if kind == "TrainJob" else ""))
