"""Hang detection (issue 38 item 2): a runtime's stall timeout restarts a running TrainJob whose
progress reports stopped, charged as infrastructure and at most failurePolicy.maxRestarts times; a
job that never reported, or is not running, is left alone."""
from __future__ import annotations

from datetime import timedelta

import pytest

from gangctl.api.resources import JOBS
from gangctl.model.progress import STALL_TIMEOUT_ANNOTATION, stall_timeout
from gangctl.policy import status as st
from gangctl.policy.decide import Delete, Event, decide
from tests.unit.test_decide import NOW, child, condition, runtime, snap, trainjob


def stalling_runtime(timeout: str = "300s", max_restarts: int | None = 2) -> dict:
    rt = runtime(failure_policy={"maxRestarts": max_restarts} if max_restarts is not None else None)
    rt["metadata"].setdefault("annotations", {})[STALL_TIMEOUT_ANNOTATION] = timeout
    return rt


def running(reported_ago: float | None, restarts: dict | None = None) -> dict:
    """A TrainJob whose gang runs since 20 minutes ago, last reporting `reported_ago` seconds ago."""
    status: dict = {"gang": {"state": st.RUNNING, "reason": "GangScheduled",
                             "boundAt": st.timestamp(NOW - timedelta(minutes=20))}}
    if reported_ago is not None:
        status["trainerStatus"] = {"progressPercentage": 40,
                                   "lastUpdatedTime": st.timestamp(NOW - timedelta(seconds=reported_ago))}
    if restarts:
        status["restarts"] = restarts
    return trainjob(status=status)


def attempt() -> dict:
    job = child()
    job["metadata"]["creationTimestamp"] = st.timestamp(NOW - timedelta(minutes=21))
    return job


@pytest.mark.parametrize("raw,seconds", [("300s", 300), ("10m", 600), ("1h30m", 5400), ("45", 45)])
def test_the_stall_timeout_reads_durations(raw, seconds):
    assert stall_timeout({STALL_TIMEOUT_ANNOTATION: raw}) == seconds
    assert stall_timeout({}) is None


def test_a_bad_stall_timeout_fails_the_trainjob_naming_the_annotation():
    plan = decide(snap(running(10), rt=stalling_runtime("soon"), node_job=attempt()))
    failed = condition(plan.status, "Failed")
    assert failed["reason"] == "InvalidRuntime" and STALL_TIMEOUT_ANNOTATION in failed["message"], failed


def test_a_silent_running_job_is_restarted_as_a_stall_charged_as_infrastructure():
    plan = decide(snap(running(400), rt=stalling_runtime(), node_job=attempt()))
    restarts = plan.status["restarts"]
    assert (restarts["user"], restarts["infrastructure"], restarts["stalled"]) == (0, 1, 1)
    assert (restarts["lastFailure"]["kind"], restarts["lastFailure"]["reason"]) == ("infrastructure", "Stalled")
    assert "no progress report for 400s (stall timeout 300s" in restarts["lastFailure"]["message"]
    assert [(d.resource, d.name) for d in plan.of(Delete)] == [(JOBS, "llm-node-0")]
    assert any(e.reason == "Restarting" and "Stalled" in e.message for e in plan.of(Event))


def test_stall_restarts_stop_at_max_restarts_and_the_job_fails_stalled():
    used = {"user": 0, "infrastructure": 3, "ignored": 0, "stalled": 2}
    plan = decide(snap(running(400, restarts=used), rt=stalling_runtime(max_restarts=2), node_job=attempt()))
    failed = condition(plan.status, "Failed")
    assert failed["reason"] == "Stalled" and "2/2 stall restarts used" in failed["message"], failed


def test_reporting_jobs_and_jobs_that_never_report_are_left_alone_until_the_timeout_would_pass():
    fine = decide(snap(running(100), rt=stalling_runtime(), node_job=attempt()))
    assert not fine.of(Delete) and 195 <= fine.requeue_after <= 205, fine.requeue_after
    shown = [m for m in fine.metrics if m.name == "last_progress"]
    assert [(m.labels, m.value) for m in shown] == [(("team-a", "llm"), (NOW - timedelta(seconds=100)).timestamp())]
    never = decide(snap(running(None), rt=stalling_runtime(), node_job=attempt()))
    assert not never.of(Delete), "a job that never reported is never judged stalled"
    untimed = decide(snap(running(4000), rt=runtime(), node_job=attempt()))
    assert not untimed.of(Delete), "no stall timeout, no stall"


def test_a_restarted_attempt_gets_the_whole_timeout_from_its_start():
    tj = running(4000)
    tj["status"]["gang"]["boundAt"] = st.timestamp(NOW - timedelta(seconds=60))   # the new attempt's gang
    plan = decide(snap(tj, rt=stalling_runtime(), node_job=attempt()))
    assert not plan.of(Delete) and plan.requeue_after is not None and plan.requeue_after > 200


def test_explain_says_how_long_a_watched_job_has_been_silent():
    from gangctl.policy.explain import Diagnosis, with_progress

    d = with_progress(Diagnosis("GangScheduled", "running: all 2 pods of the gang are bound"),
                      running(100)["status"], 300, NOW)
    assert d.message.endswith("; last progress report 100s ago (stalled after 300s without one)"), d.message
    assert with_progress(Diagnosis("GangScheduled", "running"), running(None)["status"], 300, NOW).message == (
        "running; it has not reported progress yet (never judged stalled until it does)")
    assert with_progress(Diagnosis("GangScheduled", "running"), running(100)["status"], None, NOW).message == "running"
