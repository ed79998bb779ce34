"""Failure classification and the JobSet-style failure/success policy decisions."""
from __future__ import annotations

from datetime import datetime, timedelta, timezone

from gangctl.policy import failure as f
from gangctl.sim import objects


def pod(name, at, code=None, disruption=None, phase="Failed", index="0"):
    """A pod that ended at `at`: its container exited with `code`, or it was disrupted (`disruption`:
    the condition's reason and message)."""
    return objects.pod(
        name, index=index, phase=phase,
        conditions=[objects.disruption(disruption[0], message=disruption[1], at=at)] if disruption else [],
        container_statuses=[objects.terminated(code, reason="Error", at=at)] if code is not None else [])


POLICY = f.parse_failure_policy({"maxRestarts": 2, "rules": [
    {"name": "fatal", "action": "FailJobSet", "onJobFailureReasons": ["PodFailurePolicy"]},
    {"name": "deadline", "action": "RestartJobSetAndIgnoreMaxRestarts", "onJobFailureReasons": ["DeadlineExceeded"]},
]})


def test_pod_failure_reads_exit_code_index_and_disruption():
    p = f.PodFailure.from_pod(pod("tj-node-0-1", "2026-01-01T00:00:05Z", code=42, index="1"))
    assert (p.name, p.exit_code, p.index, p.disruption) == ("tj-node-0-1", 42, 1, None)
    d = f.PodFailure.from_pod(pod("x", "t", disruption=("DeletionByTaintManager", "node lost"), phase="Running"))
    assert d.disruption == ("DeletionByTaintManager", "node lost")
    assert f.PodFailure.from_pod(pod("ok", "t", phase="Running")) is None


def test_first_failed_pod_is_the_culprit_and_a_disruption_makes_it_infrastructure():
    pods = [f.PodFailure.from_pod(pod("b", "2026-01-01T00:00:09Z", code=143)),
            f.PodFailure.from_pod(pod("a", "2026-01-01T00:00:05Z", disruption=("EvictionByEvictionAPI", "")))]
    failure = f.classify("BackoffLimitExceeded", "Job has reached the specified backoff limit", pods)
    assert failure.kind == "infrastructure" and failure.pod == "a"
    user = f.classify("BackoffLimitExceeded", "", [f.PodFailure.from_pod(pod("c", "2026-01-01T00:00:01Z", code=1))] + pods)
    assert user.kind == "user" and user.exit_code == 1 and "pod c exited with code 1" in user.describe()


def test_pod_named_by_pod_failure_policy_wins():
    pods = [f.PodFailure.from_pod(pod("a", "2026-01-01T00:00:01Z", disruption=("PreemptionByScheduler", ""))),
            f.PodFailure.from_pod(pod("tj-node-0-2", "2026-01-01T00:00:09Z", code=42))]
    msg = "Container node for pod ns/tj-node-0-2 failed with exit code 42 matching FailJob rule at index 1"
    failure = f.classify("PodFailurePolicy", msg, pods)
    assert (failure.kind, failure.pod, failure.exit_code) == ("user", "tj-node-0-2", 42)


def test_rules_budget_and_infrastructure():
    user = f.Failure("user", "BackoffLimitExceeded", "", "p", 1)
    r0 = f.Restarts()
    d = f.decide(POLICY, user, r0)
    assert (d.action, d.charged, d.counter) == ("Restart", True, "user")
    r2 = f.Restarts(user=2)
    d = f.decide(POLICY, user, r2)
    assert d.action == "Fail" and d.reason == f.REASON_BUDGET and "pod p exited with code 1" in d.message
    fatal = f.decide(POLICY, f.Failure("user", "PodFailurePolicy", "", "p", 42), r0)
    assert fatal.action == "Fail" and fatal.reason == f.REASON_RULE and "fatal" in fatal.message
    ignored = f.decide(POLICY, f.Failure("user", "DeadlineExceeded", ""), r2)
    assert (ignored.action, ignored.counter) == ("Restart", "ignored")
    infra = f.decide(POLICY, f.Failure("infrastructure", "BackoffLimitExceeded", "", "p"), r2)
    assert (infra.action, infra.charged, infra.counter) == ("Restart", False, "infrastructure")
    # No failurePolicy: a user failure fails the TrainJob with the Job's reason; infrastructure still restarts.
    assert f.decide(None, user, r0).reason == "BackoffLimitExceeded"
    assert f.decide(None, f.Failure("infrastructure", "BackoffLimitExceeded", ""), r0).action == "Restart"


def test_message_patterns_narrow_a_rule_to_the_failure_messages_they_find():
    policy = f.parse_failure_policy({"maxRestarts": 3, "rules": [
        {"name": "oom", "action": "FailJobSet", "onJobFailureReasons": ["PodFailurePolicy"],
         "onJobFailureMessagePatterns": ["exit code 137", "^OOM"]}]})
    oom = f.Failure("user", "PodFailurePolicy", "Container node for pod ns/p failed with exit code 137", "p", 137)
    assert f.decide(policy, oom, f.Restarts()).action == "Fail"
    other = f.Failure("user", "PodFailurePolicy", "Container node for pod ns/p failed with exit code 1", "p", 1)
    assert f.decide(policy, other, f.Restarts()).action == "Restart", "no pattern found: the rule does not match"


def test_restart_counters_are_monotonic_and_newest_wins():
    user = f.Failure("user", "BackoffLimitExceeded", "", "p", 1)
    d = f.decide(POLICY, user, f.Restarts())
    after = f.Restarts().after(d, user, "tj-node-0", "uid-1", "2026-01-01T00:00:00Z")
    assert after.to_status()["user"] == 1 and after.last_failure["jobUID"] == "uid-1"
    assert after.last_failure["exitCode"] == 1 and after.last_failure["action"] == "Restart"
    stale = f.Restarts.from_status({})
    assert stale.newest(after) is after and after.newest(stale) is after
    assert f.Restarts.from_status({"restarts": after.to_status()}) == after


def test_success_policy():
    assert f.succeeded(None, {"node": True})
    assert not f.succeeded(None, {"node": False})
    assert not f.succeeded(None, {})
    assert f.succeeded({"operator": "Any"}, {"node": True, "launcher": False})
    assert not f.succeeded({"operator": "All"}, {"node": True, "launcher": False})
    assert f.succeeded({"operator": "All", "targetReplicatedJobs": ["node"]}, {"node": True, "launcher": False})


def test_a_gang_that_keeps_failing_soon_after_it_starts_is_paced_as_a_crash_loop():
    assert [f.pace(n) for n in range(1, 8)] == [0, 10, 20, 40, 80, 160, 300]
    assert f.pace(40) == f.PACE_MAX_SECONDS
    user = f.Failure("user", "BackoffLimitExceeded", "", "p", 1)
    policy = f.parse_failure_policy({"maxRestarts": 9})
    restarts = f.Restarts()
    backoffs = []
    for ran in (5.0, 30.0, 60.0, f.PACE_RESET_SECONDS, 1.0):
        d = f.decide(policy, user, restarts)
        restarts = restarts.after(d, user, "tj-node-0", f"uid-{ran}", "2026-01-01T00:00:00Z", ran)
        backoffs.append((restarts.last_failure["streak"], restarts.last_failure.get("backoffSeconds")))
    # the first failure restarts at once; an attempt that ran 10 min starts the count again
    assert backoffs == [(1, None), (2, 10), (3, 20), (1, None), (2, 10)]
    message = f.paced(f.decide(policy, user, restarts), restarts).message
    assert message.endswith("; next attempt in 10s (2 attempts in a row failed within 10 min of starting)")
    at = datetime(2026, 1, 1, tzinfo=timezone.utc)
    assert f.recreate_wait(restarts.last_failure, at + timedelta(seconds=4)) == 6
    assert f.recreate_wait(restarts.last_failure, at + timedelta(seconds=11)) == 0
    failed = {**restarts.last_failure, "action": "Fail"}
    assert f.recreate_wait(failed, at) == 0, "only a restart waits"
