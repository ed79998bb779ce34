"""TrainJob status derivation: conditions, gang timing, and stability across reconciles."""
from __future__ import annotations

from datetime import datetime, timedelta, timezone

from gangctl.policy import status as st

T0 = datetime(2026, 1, 1, 12, 0, 0, tzinfo=timezone.utc)


def job(**kw) -> st.ChildJob:
    return st.ChildJob(name="tj-node-0", replicated_job="node", parallelism=4, **kw)


def cond(status: dict, ctype: str) -> dict:
    return next(c for c in status["conditions"] if c["type"] == ctype)


def state(status: dict) -> tuple[str, str]:
    return status["gang"]["state"], status["gang"]["reason"]


def test_waiting_then_running_records_gang_wait():
    waiting = st.derive_status(None, [job(active=4)], st.GangObservation(4, 1), False, T0)
    assert state(waiting) == ("Waiting", "WaitingForGang")
    assert "1/4" in waiting["gang"]["message"]
    assert st.waiting_for_gang(waiting)
    running = st.derive_status(waiting, [job(active=4, ready=4)], st.GangObservation(4, 4), False,
                               T0 + timedelta(seconds=2.5))
    assert state(running) == ("Running", "GangScheduled")
    assert running["gang"]["lastTransitionTime"] == "2026-01-01T12:00:02Z"
    assert running["gang"]["waitSeconds"] == 2.5
    assert st.phase(running) == "Running"
    assert "conditions" not in waiting and "conditions" not in running, \
        "Trainer writes no condition while a job waits or runs: the kubeflow SDK then says Running"


def test_conditions_an_older_gangctl_wrote_go():
    old = {"conditions": [{"type": "Created", "status": "True", "reason": "JobsCreated", "message": "",
                           "lastTransitionTime": "2026-01-01T11:00:00Z"},
                          {"type": "Running", "status": "True", "reason": "GangScheduled", "message": "",
                           "lastTransitionTime": "2026-01-01T11:00:00Z"}]}
    status = st.derive_status(old, [job(active=4)], st.GangObservation(4, 4), False, T0)
    assert "conditions" not in status and state(status) == ("Running", "GangScheduled")


def test_the_backends_reason_replaces_waiting_for_gang():
    status = st.derive_status(None, [job(suspended=True)], st.GangObservation(4, 0), False, T0,
                              waiting=("WaitingForQuota", "Kueue: insufficient unused quota"))
    assert state(status) == ("Waiting", "WaitingForQuota")
    assert status["gang"]["message"].startswith("Kueue: insufficient") and "0/4" in status["gang"]["message"]
    assert not st.waiting_for_gang(status), "only a gang the scheduler is trying is nudged"


def test_unchanged_observation_gives_identical_status():
    first = st.derive_status(None, [job(active=4, ready=4)], st.GangObservation(4, 4), False, T0)
    again = st.derive_status(first, [job(active=4, ready=4)], st.GangObservation(4, 4), False, T0 + timedelta(minutes=5))
    assert again == first


def test_job_failure_fails_the_trainjob_with_its_reason():
    failed = st.derive_status(None, [job(failed=1, failure=("BackoffLimitExceeded", "Job has reached the specified backoff limit"))],
                              st.GangObservation(4, 4), False, T0)
    assert st.finished(failed)
    assert cond(failed, "Failed")["reason"] == "BackoffLimitExceeded"
    assert "backoff limit" in cond(failed, "Failed")["message"]
    assert st.phase(failed) == "Failed"


def test_completion_and_jobs_status():
    done = st.derive_status(None, [job(succeeded=4, complete=("CompletionsReached", ""))], None, False, T0)
    assert st.phase(done) == "Complete"
    assert done["jobsStatus"] == [{"name": "node", "active": 0, "ready": 0, "succeeded": 4, "failed": 0, "suspended": 0}]


def test_suspend_and_resume_restart_the_gang_clock():
    running = st.derive_status(None, [job(active=4)], st.GangObservation(4, 4), False, T0)
    suspended = st.derive_status(running, [job(suspended=True)], st.GangObservation(4, 0), True, T0 + timedelta(seconds=10))
    assert st.phase(suspended) == "Suspended"
    assert "gang" not in suspended or "boundAt" not in suspended["gang"]
    resumed = st.derive_status(suspended, [job(active=4)], st.GangObservation(4, 0), False, T0 + timedelta(seconds=20))
    assert cond(suspended, "Suspended")["status"] == "True" and state(suspended) == ("Suspended", "Suspended")
    # Trainer would leave Suspended=False/Resumed, and the kubeflow SDK would say Created for good.
    assert "conditions" not in resumed, "the resumed job shows no condition, as a never-suspended one"
    assert resumed["gang"]["resumedAt"] == "2026-01-01T12:00:20Z"
    assert resumed["gang"]["createdAt"].startswith("2026-01-01T12:00:20")


def test_failed_status_keeps_other_conditions():
    previous = st.derive_status(None, [job(active=4)], st.GangObservation(4, 4), False, T0)
    failed = st.failed_status(previous, "InvalidSpec", "spec.trainer.numNodes: must be ≥ 1", T0)
    assert cond(failed, "Failed")["message"].startswith("spec.trainer.numNodes")
    assert state(failed) == ("Failed", "InvalidSpec")
    assert failed["gang"]["boundAt"] == previous["gang"]["boundAt"], "the gang timing stays"


def test_bound_progress_is_exact_for_small_gangs_and_in_quarters_for_large_ones():
    from gangctl.policy.status import bound_progress
    assert bound_progress(3, 4) == "3/4 pods of the gang are bound"
    shown = {bound_progress(k, 1024) for k in range(1024)}
    assert len(shown) == 4, "a 1,024-pod gang's message changes four times while it binds"
    assert bound_progress(1000, 1024) == "at least 768/1024 pods of the gang are bound"
    assert bound_progress(255, 1024) == "at least 0/1024 pods of the gang are bound"


def test_the_crd_schema_allows_every_state():
    from typing import get_args

    from gangctl.api.trainjob import GangState
    assert set(get_args(GangState)) == set(st.STATES)


def test_a_stuck_job_is_told_why_with_a_long_api_message_cut_in_the_middle():
    refused = ('Job.batch "x-worker" is invalid: spec.template: Invalid value: core.PodTemplateSpec{'
               + "Labels: map[...] " * 300 + "}: field is immutable")
    reason, message = st.stuck("PyTorchJob", "Invalid", refused, "")
    assert reason == "Invalid" and len(message) < 1024, "fits an event's message"
    assert 'Job.batch "x-worker" is invalid: spec.template' in message and "field is immutable" in message
    assert "suspend the PyTorchJob and resume it" in message
    assert st.stuck("TrainJob", None, None, "KeyError: 'x'")[0] == "InternalError"


def test_a_waiting_gangs_counters_are_written_with_its_progress_not_pod_by_pod():
    created = st.derive_status(None, [job(active=100)], st.GangObservation(1024, 0), False, T0)
    more = st.derive_status(created, [job(active=900, ready=3)], st.GangObservation(1024, 50), False, T0)
    assert more == created, "no new status (no write) for counters alone while the gang waits"
    step = st.derive_status(more, [job(active=1024, ready=200)], st.GangObservation(1024, 300), False, T0)
    assert step["gang"]["message"] != created["gang"]["message"]
    assert step["jobsStatus"][0]["active"] == 1024 and step["jobsStatus"][0]["ready"] == 200, "written with progress"
    bound = st.derive_status(step, [job(active=1024, ready=1024)], st.GangObservation(1024, 1024), False, T0)
    assert st.phase(bound) == "Running" and bound["jobsStatus"][0]["ready"] == 1024
