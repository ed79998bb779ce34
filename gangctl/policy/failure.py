"""Failure and success policies of a TrainJob: classify a failed child Job, decide fail or restart.

Pure: the caller passes the failed Job's reason, what its pods showed, the runtime's JobSet-style
`failurePolicy` and the restart counters so far; nothing here reads the clock or talks to the API.

Two layers, as in Kubeflow Trainer on JobSet:

- batch/v1 `podFailurePolicy` / `successPolicy` / `backoffLimit` of the runtime's node job are passed
  through to the child Job, so kube-controller-manager's Job controller decides *whether the Job
  fails* (a `FailJob` rule on an exit code gives reason `PodFailurePolicy`; an `Ignore` rule on
  `DisruptionTarget` replaces the pod and the Job never fails).
- JobSet's `failurePolicy {maxRestarts, rules[{name, action, onJobFailureReasons, onJobFailureMessagePatterns,
  targetReplicatedJobs}]}` decides *what a failed Job means for the TrainJob*: fail it, or restart
  it (recreate the child Job) charged to `maxRestarts` or not. As in JobSet, the first matching rule
  wins and with no match the action is `RestartJobSet`; with no failurePolicy `maxRestarts` is 0.

gangctl adds one rule JobSet lacks: a failure caused by the infrastructure (the first failed pod
carries the `DisruptionTarget` condition: node loss, eviction, preemption) always restarts the job
and is never charged to the user's budget; it is counted apart (`status.restarts.infrastructure`).
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Iterable, Literal

from gangctl.model.progress import STALLED   # progress reports stopped (the runtime's stall timeout)

FAIL_JOBSET = "FailJobSet"
RESTART_JOBSET = "RestartJobSet"
RESTART_IGNORE_MAX = "RestartJobSetAndIgnoreMaxRestarts"
ACTIONS = (FAIL_JOBSET, RESTART_JOBSET, RESTART_IGNORE_MAX)

USER, INFRASTRUCTURE = "user", "infrastructure"
# Failed-condition reasons of the TrainJob.
REASON_RULE = "FailurePolicyRule"
REASON_BUDGET = "MaxRestartsExceeded"
# A runtime with gangctl.io/restart: InPlace: a failed rank's pod and its peers restart their
# containers where they are; the episode is charged like a restart, recorded with this action.
RESTART_IN_PLACE = "RestartInPlace"
REASON_IN_PLACE = "RestartedInPlace"

# Recreating a gang that keeps failing soon after it starts is paced as the kubelet paces a
# crash-looping container (CrashLoopBackOff's numbers): the first restart at once, then 10 s doubling
# up to 5 min while attempts keep failing within 10 min of their start; an attempt that ran 10 min
# starts the count again. Bounds what a crash loop costs the API and the scheduler, also where no
# budget does (infrastructure failures, RestartJobSetAndIgnoreMaxRestarts rules).
PACE_FIRST_SECONDS, PACE_MAX_SECONDS, PACE_RESET_SECONDS = 10, 300, 600


def pace(streak: int) -> int:
    """Seconds from the `streak`-th failure in a row of an attempt that failed soon after it started
    to the next attempt."""
    return 0 if streak <= 1 else min(PACE_MAX_SECONDS, PACE_FIRST_SECONDS * 2 ** min(streak - 2, 30))


def recreate_wait(last_failure: dict, now: datetime) -> float:
    """Seconds left before the next attempt after a restart judged in `last_failure` may be created."""
    backoff = int(last_failure.get("backoffSeconds") or 0)
    if last_failure.get("action") != "Restart" or backoff <= 0 or not last_failure.get("time"):
        return 0.0
    at = datetime.fromisoformat(str(last_failure["time"]).replace("Z", "+00:00"))
    return max(0.0, backoff - (now - at).total_seconds())


@dataclass(frozen=True)
class FailureRule:
    action: str
    name: str | None = None
    on_job_failure_reasons: tuple[str, ...] = ()
    target_replicated_jobs: tuple[str, ...] = ()
    on_job_failure_message_patterns: tuple[str, ...] = ()

    def matches(self, job_reason: str, replicated_job: str, job_message: str = "") -> bool:
        if self.on_job_failure_reasons and job_reason not in self.on_job_failure_reasons:
            return False
        # JobSet: at least one pattern must match (search, not full match) the Job's failure message.
        if self.on_job_failure_message_patterns and not any(
                re.search(p, job_message) for p in self.on_job_failure_message_patterns):
            return False
        return not self.target_replicated_jobs or replicated_job in self.target_replicated_jobs


@dataclass(frozen=True)
class FailurePolicy:
    max_restarts: int = 0
    rules: tuple[FailureRule, ...] = ()


def parse_failure_policy(obj: dict | None) -> FailurePolicy:
    """JobSet's spec.failurePolicy (already validated by the API server) as a FailurePolicy."""
    obj = obj or {}
    rules = tuple(
        FailureRule(action=r.get("action", RESTART_JOBSET), name=r.get("name"),
                    on_job_failure_reasons=tuple(r.get("onJobFailureReasons") or ()),
                    target_replicated_jobs=tuple(r.get("targetReplicatedJobs") or ()),
                    on_job_failure_message_patterns=tuple(r.get("onJobFailureMessagePatterns") or ()))
        for r in obj.get("rules") or [])
    return FailurePolicy(max_restarts=int(obj.get("maxRestarts") or 0), rules=rules)


def pod_index(meta: dict) -> int | None:
    """A pod's index in its group: the Job controller's completion index (a TrainJob's pods), else
    v1's replica-index label (the pods gangctl makes for a PyTorchJob)."""
    value = (meta.get("annotations") or {}).get("batch.kubernetes.io/job-completion-index")
    if value is None:
        value = (meta.get("labels") or {}).get("training.kubeflow.org/replica-index")
    return int(value) if value is not None and str(value).isdigit() else None


@dataclass(frozen=True)
class PodFailure:
    """One pod of the failed Job that ended badly (or was disrupted while the Job ran)."""

    name: str
    at: str = ""                                  # RFC 3339: when it failed or was disrupted
    index: int | None = None
    exit_code: int | None = None
    reason: str = ""                              # container terminated reason, or the pod's
    disruption: tuple[str, str] | None = None     # (reason, message) of DisruptionTarget=True

    @classmethod
    def from_pod(cls, pod: dict, container: str = "node") -> PodFailure | None:
        """The failure a pod shows: Failed phase or a DisruptionTarget condition; None otherwise."""
        meta, status = pod["metadata"], pod.get("status") or {}
        disruption = next(((c.get("reason", ""), c.get("message", ""), c.get("lastTransitionTime", ""))
                           for c in status.get("conditions") or []
                           if c.get("type") == "DisruptionTarget" and c.get("status") == "True"), None)
        if status.get("phase") != "Failed" and disruption is None:
            return None
        statuses = status.get("containerStatuses") or []
        cs = next((c for c in statuses if c.get("name") == container), statuses[0] if statuses else {})
        term = (cs.get("state") or {}).get("terminated") or (cs.get("lastState") or {}).get("terminated") or {}
        at = disruption[2] if disruption else term.get("finishedAt") or ""
        return cls(name=meta["name"], at=at, index=pod_index(meta),
                   exit_code=term.get("exitCode"), reason=term.get("reason") or status.get("reason") or "",
                   disruption=disruption[:2] if disruption else None)


@dataclass(frozen=True)
class Failure:
    """A classified failure of one attempt of the child Job."""

    kind: Literal["user", "infrastructure"]
    job_reason: str
    job_message: str
    pod: str | None = None
    exit_code: int | None = None
    detail: str = ""

    def describe(self) -> str:
        """One line naming the culprit: pod, exit code or disruption, and the Job's reason."""
        if self.pod is None:
            what = "no failed pod observed"
        elif self.kind == INFRASTRUCTURE:
            what = f"pod {self.pod} disrupted ({self.detail})"
        elif self.exit_code is not None:
            what = f"pod {self.pod} exited with code {self.exit_code}" + (f" ({self.detail})" if self.detail else "")
        else:
            what = f"pod {self.pod} failed" + (f" ({self.detail})" if self.detail else "")
        return f"{what}; Job failed: {self.job_reason}" + (f": {self.job_message}" if self.job_message else "")


def classify(job_reason: str, job_message: str, pods: list[PodFailure]) -> Failure:
    """Who is to blame: the first pod to fail (ties: a disrupted one, as the cause of the others).

    The pod a PodFailurePolicy message names is the culprit whatever the order (the Job controller
    quotes it: "Container node for pod ns/name failed with exit code 42 matching FailJob rule").
    """
    if job_reason == STALLED:   # the job hung (no pod failed): the infrastructure's to restart
        return Failure(INFRASTRUCTURE, job_reason, job_message)
    named = next((p for p in pods if f"/{p.name} " in job_message or job_message.endswith(f"/{p.name}")), None)
    ordered = sorted(pods, key=lambda p: (p.at or "9999", p.disruption is None, p.name))
    culprit = named or (ordered[0] if ordered else None)
    if culprit is None:
        return Failure(USER, job_reason, job_message)
    if culprit.disruption is not None and named is None:
        reason, message = culprit.disruption
        return Failure(INFRASTRUCTURE, job_reason, job_message, culprit.name, culprit.exit_code,
                       f"{reason}: {message}" if message else reason)
    return Failure(USER, job_reason, job_message, culprit.name, culprit.exit_code, culprit.reason)


@dataclass(frozen=True)
class Decision:
    action: Literal["Fail", "Restart"]
    charged: bool                 # counts against maxRestarts
    counter: str                  # which status.restarts counter grows: user, infrastructure, ignored
    reason: str                   # Failed reason of the TrainJob, or why it restarts
    message: str
    rule: str | None = None


@dataclass(frozen=True)
class Restarts:
    """status.restarts: monotonic counters, never reset (sticky across controller restarts)."""

    user: int = 0
    infrastructure: int = 0
    ignored: int = 0
    last_failure: dict = field(default_factory=dict)
    stalled: int = 0             # of the infrastructure restarts, those for a stall (capped by maxRestarts)

    @classmethod
    def from_status(cls, status: dict | None) -> Restarts:
        r = (status or {}).get("restarts") or {}
        return cls(int(r.get("user") or 0), int(r.get("infrastructure") or 0), int(r.get("ignored") or 0),
                   dict(r.get("lastFailure") or {}), int(r.get("stalled") or 0))

    @property
    def total(self) -> int:
        return self.user + self.infrastructure + self.ignored

    def newest(self, other: Restarts | None) -> Restarts:
        """The later of two views of the same counters (they only grow): guards against a stale cache."""
        return other if other is not None and other.total > self.total else self

    def after(self, decision: Decision, failure: Failure, job_name: str, job_uid: str, at: str,
              ran_seconds: float = float("inf")) -> Restarts:
        """The counters once `decision` on `failure` of Job `job_uid` (which ran `ran_seconds`) is
        recorded. A restart records how many attempts in a row failed soon after they started
        (`streak`) and how long the next one waits (`backoffSeconds`, `pace`)."""
        grow = decision.action == "Restart"
        last = {"kind": failure.kind, "reason": failure.job_reason, "message": failure.describe(),
                "job": job_name, "jobUID": job_uid, "action": decision.action, "time": at}
        if grow:
            streak = 1 if ran_seconds >= PACE_RESET_SECONDS else int(self.last_failure.get("streak") or 0) + 1
            last["streak"] = streak
            if pace(streak):
                last["backoffSeconds"] = pace(streak)
        if failure.pod:
            last["pod"] = failure.pod
        if failure.exit_code is not None:
            last["exitCode"] = failure.exit_code
        return Restarts(user=self.user + (grow and decision.counter == USER),
                        infrastructure=self.infrastructure + (grow and decision.counter == INFRASTRUCTURE),
                        ignored=self.ignored + (grow and decision.counter == "ignored"),
                        last_failure=last, stalled=self.stalled + (grow and failure.job_reason == STALLED))

    def to_status(self) -> dict:
        out: dict = {"user": self.user, "infrastructure": self.infrastructure, "ignored": self.ignored}
        if self.stalled:
            out["stalled"] = self.stalled
        if self.last_failure:
            out["lastFailure"] = dict(self.last_failure)
        return out


def paced(decision: Decision, after: Restarts) -> Decision:
    """The decision's message with the wait before the next attempt, when there is one."""
    backoff = int(after.last_failure.get("backoffSeconds") or 0)
    if decision.action != "Restart" or not backoff:
        return decision
    return replace(decision, message=f"{decision.message}; next attempt in {backoff}s "
                                     f"({after.last_failure.get('streak')} attempts in a row failed within "
                                     f"{PACE_RESET_SECONDS // 60} min of starting)")


def decide(policy: FailurePolicy | None, failure: Failure, restarts: Restarts,
           replicated_job: str = "node") -> Decision:
    """Fail the TrainJob or restart its child Job, and whether the restart is charged to the user."""
    what = failure.describe()
    if failure.job_reason == STALLED:   # charged as infrastructure, at most maxRestarts times
        allowed = policy.max_restarts if policy is not None else 0
        if restarts.stalled >= allowed:
            return Decision("Fail", False, INFRASTRUCTURE, STALLED,
                            f"{what}; not restarted: {restarts.stalled}/{allowed} stall restarts used "
                            "(failurePolicy.maxRestarts)")
        return Decision("Restart", False, INFRASTRUCTURE, STALLED,
                        f"stall restart {restarts.stalled + 1}/{allowed}, not charged to the restart budget: {what}")
    if failure.kind == INFRASTRUCTURE:
        return Decision("Restart", False, INFRASTRUCTURE, "InfrastructureFailure",
                        f"restarting, not charged to the restart budget: {what}")
    if policy is None:
        # No failurePolicy: the child Job's own failure is the TrainJob's (JobSet: maxRestarts 0).
        return Decision("Fail", False, USER, failure.job_reason, what)
    rule = next((r for r in policy.rules if r.matches(failure.job_reason, replicated_job, failure.job_message)), None)
    action = rule.action if rule else RESTART_JOBSET
    named = f"rule {rule.name or policy.rules.index(rule)} ({action})" if rule else None
    if action == FAIL_JOBSET:
        return Decision("Fail", False, USER, REASON_RULE, f"failurePolicy {named} matched {failure.job_reason}: {what}",
                        rule.name if rule else None)
    if action == RESTART_IGNORE_MAX:
        return Decision("Restart", False, "ignored", "RestartIgnoringMaxRestarts",
                        f"restarting, not counted ({named}): {what}", rule.name if rule else None)
    if restarts.user >= policy.max_restarts:
        return Decision("Fail", True, USER, REASON_BUDGET,
                        f"restart budget exhausted ({restarts.user}/{policy.max_restarts} restarts used); "
                        f"last failure: {what}", rule.name if rule else None)
    return Decision("Restart", True, USER, "UserFailure",
                    f"restart {restarts.user + 1}/{policy.max_restarts}: {what}", rule.name if rule else None)


@dataclass(frozen=True)
class InPlace:
    """The most restarted pod of an attempt whose containers restart in place."""

    restarts: int                 # its container's restart count
    pod: str
    exit_code: int | None         # how the container's last run ended


def most_restarted(pods: Iterable[dict], container: str) -> InPlace | None:
    """The pod whose `container` (else its first) restarted most often; None without pods."""
    def status_of(pod: dict) -> dict:
        statuses = (pod.get("status") or {}).get("containerStatuses") or []
        return next((c for c in statuses if c.get("name") == container), statuses[0] if statuses else {})
    found = [(int(status_of(p).get("restartCount") or 0), p) for p in pods]
    if not found:
        return None
    count, pod = max(found, key=lambda f: f[0])
    code = ((status_of(pod).get("lastState") or {}).get("terminated") or {}).get("exitCode")
    return InPlace(count, pod["metadata"]["name"], int(code) if code is not None else None)


def charge_in_place(policy: FailurePolicy | None, restarts: Restarts, attempt: str, uid: str, seen_now: InPlace,
                    at: str) -> tuple[Decision, Restarts] | None:
    """The in-place restarts of attempt `uid` not charged yet, charged: `seen_now` is its most restarted
    pod (every pod of the gang restarts once per episode, so the highest count is the number of
    episodes; a pod the Job replaced starts again at 0 and lowers nothing). Restart while the budget
    allows, else Fail (MaxRestartsExceeded) with the episodes the budget allowed charged (as a gang
    restarted by recreation would be); None when every episode is charged already. The count charged
    so far lives in lastFailure, written before anything else, so an episode is charged once across
    controller restarts."""
    most, pod, exit_code = seen_now.restarts, seen_now.pod, seen_now.exit_code
    last = restarts.last_failure
    seen = int(last.get("attemptRestarts") or 0) if (last.get("jobUID") == uid
                                                     and "attemptRestarts" in last) else 0
    if most <= seen:
        return None
    allowed = policy.max_restarts if policy is not None else 0
    failure = Failure(USER, REASON_IN_PLACE, f"the gang restarted in place {most} time(s)", pod, exit_code)
    what = failure.describe()
    if restarts.user + (most - seen) > allowed:
        used = max(restarts.user, allowed)   # the episodes the budget allowed happened: charged
        decision = Decision("Fail", True, USER, REASON_BUDGET,
                            f"restart budget exhausted ({used}/{allowed} restarts used); last failure: {what}")
    else:
        decision = Decision("Restart", True, USER, REASON_IN_PLACE,
                            f"restart {restarts.user + most - seen}/{allowed}, in place (same pods, same nodes): {what}")
    restart = decision.action == "Restart"
    record = {"kind": USER, "reason": REASON_IN_PLACE, "message": what, "job": attempt, "jobUID": uid, "pod": pod,
              "action": RESTART_IN_PLACE if restart else "Fail", "attemptRestarts": most, "time": at}
    if exit_code is not None:
        record["exitCode"] = exit_code
    user = restarts.user + most - seen if restart else max(restarts.user, allowed)
    return decision, Restarts(user, restarts.infrastructure, restarts.ignored, record, restarts.stalled)


def succeeded(policy: dict | None, complete: dict[str, bool]) -> bool:
    """JobSet successPolicy {operator: All|Any, targetReplicatedJobs}: is the TrainJob complete?

    `complete` maps each replicated job gangctl runs to whether its Job completed (the Job's own
    batch/v1 successPolicy, e.g. succeededIndexes "0", already decided that).
    """
    if not complete:
        return False
    policy = policy or {}
    targets = [name for name in policy.get("targetReplicatedJobs") or complete if name in complete] or list(complete)
    done = [complete[name] for name in targets]
    return any(done) if policy.get("operator") == "Any" else all(done)
