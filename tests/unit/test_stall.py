"""Hang detection (issue 38 item 2): a runtime's stall timeout restarts a running TrainJob whose
progress reports stopped, charged as infrastructure and at most failurePolicy.maxRestarts times; a
job that never reported, or is not running, is left alone."""
from __future__ import annotations

from datetime import timedelta

import pytest

from gangctl.api.resources import JOBS, PODS
from gangctl.model.progress import STALL_TIMEOUT_ANNOTATION, stall_timeout
from gangctl.policy import status as st
from gangctl.model.resolve import RESTART_ANNOTATION
from gangctl.plugins.workload import RESTART_ATTEMPT_ANNOTATION, RESTART_ATTEMPT_ENV, watches_restart_attempt
from gangctl.policy.decide import Apply, Delete, Event, Patch, Snapshot, WriteStatus, decide
from gangctl.sim import objects
from tests.unit.test_decide import ALL_BACKENDS, FAILED, NOW, child, condition, kinds, runtime, snap, trainjob


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
    from gangctl.model.progress import reported
    from gangctl.policy.explain import Diagnosis, with_progress

    d = with_progress(Diagnosis("GangScheduled", "running: all 2 pods of the gang are bound"),
                      reported(running(100)), 300, NOW)
    assert d.message.endswith("; last progress report 100s ago (stalled after 300s without one)"), d.message
    assert with_progress(Diagnosis("GangScheduled", "running"), reported(running(None)), 300, NOW).message == (
        "running; it has not reported progress yet (never judged stalled until it does)")
    assert with_progress(Diagnosis("GangScheduled", "running"), reported(running(100)), None, NOW).message == "running"


# --- restarted in place (a runtime with gangctl.io/restart: InPlace) --------------------------------

def in_place_stalling_runtime(max_restarts: int = 2) -> dict:
    rt = stalling_runtime(max_restarts=max_restarts)
    rt["metadata"]["annotations"][RESTART_ANNOTATION] = "InPlace"
    return rt


def watching_attempt(rt: dict) -> dict:
    """The node Job decide makes for `rt` (its trainer watching the restart attempt), as created."""
    made = next(s.obj for s in decide(snap(trainjob(), rt=rt)).steps if isinstance(s, Apply) and s.resource == JOBS)
    job = attempt()
    job["spec"]["template"] = made["spec"]["template"]
    return job


def gang_pods(restarts: int = 0, annotated: str | None = None, count: int = 2) -> tuple[dict, ...]:
    job = {"metadata": {"name": "llm-node-0", "namespace": "team-a", "uid": "job-1"}}
    out = []
    for i in range(count):
        p = objects.job_pod(job, i, node=f"n{i}")
        p["metadata"].update(uid=f"pod-{i}", creationTimestamp=st.timestamp(NOW - timedelta(minutes=20)))
        if annotated is not None:
            p["metadata"]["annotations"][RESTART_ATTEMPT_ANNOTATION] = annotated
        p["status"]["containerStatuses"] = [{"name": "node", "restartCount": restarts}]
        out.append(p)
    return tuple(out)


def test_a_runtime_that_restarts_in_place_and_watches_stalls_gets_the_attempt_probe():
    job = watching_attempt(in_place_stalling_runtime())
    spec = job["spec"]["template"]["spec"]
    trainer = spec["containers"][0]
    assert watches_restart_attempt(job)
    assert {"name": RESTART_ATTEMPT_ENV, "valueFrom": {"fieldRef": {
        "fieldPath": f"metadata.annotations['{RESTART_ATTEMPT_ANNOTATION}']"}}} in trainer["env"]
    assert trainer["livenessProbe"]["exec"]["command"][:2] == ["sh", "-c"]
    (mount,) = [m for m in trainer["volumeMounts"] if m["name"] == "gangctl-restart-attempt"]
    (volume,) = [v for v in spec["volumes"] if v["name"] == mount["name"]]
    assert volume["projected"]["sources"][0]["downwardAPI"]["items"][0]["path"] == "attempt"
    assert not watches_restart_attempt(watching_attempt(stalling_runtime())), "recreate: no probe"
    rt = in_place_stalling_runtime()
    rt["spec"]["template"]["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]["containers"][0][
        "livenessProbe"] = {"httpGet": {"path": "/healthz", "port": 8080}}
    own = watching_attempt(rt)
    assert not watches_restart_attempt(own), "a trainer's own liveness probe is kept"
    assert own["spec"]["template"]["spec"]["containers"][0]["livenessProbe"] == {"httpGet": {"path": "/healthz", "port": 8080}}


def test_a_stalled_gang_that_watches_its_attempt_restarts_in_place_once():
    rt = in_place_stalling_runtime()
    plan = decide(snap(running(400), rt=rt, node_job=watching_attempt(rt), pods=gang_pods(restarts=0)))
    restarts = plan.status["restarts"]
    assert (restarts["user"], restarts["infrastructure"], restarts["stalled"]) == (0, 1, 1)
    last = restarts["lastFailure"]
    assert (last["reason"], last["action"], last["restartAttempt"], last["attemptRestarts"], last["jobUID"]) == (
        "Stalled", "RestartInPlace", 1, 1, "job-1")
    assert not plan.of(Delete), "same pods, same Job"
    assert [(p.name, p.patch) for p in plan.of(Patch)] == [
        (f"llm-node-0-{i}", {"metadata": {"uid": f"pod-{i}", "annotations": {RESTART_ATTEMPT_ANNOTATION: "1"}}})
        for i in range(2)]
    assert kinds(plan)[0] == "WriteStatus", "judged in status before any pod is touched"
    assert any(e.reason == "Restarting" and "in place" in e.message for e in plan.of(Event))
    # The restart it caused (each trainer once) is not charged as the user's; nor is it a new stall.
    after = trainjob(status={**running(400)["status"], "restarts": restarts})
    again = decide(snap(after, rt=rt, node_job=watching_attempt(rt), pods=gang_pods(restarts=1, annotated="1")))
    assert not [s for s in again.of(WriteStatus) if s.status.get("restarts") != restarts]
    assert not again.of(Patch) and not again.of(Delete)


def test_a_pass_that_stopped_after_the_status_raises_the_pods_next_time():
    rt = in_place_stalling_runtime()
    first = decide(snap(running(400), rt=rt, node_job=watching_attempt(rt), pods=gang_pods()))
    after = trainjob(status={**running(400)["status"], "restarts": first.status["restarts"]})
    pods = gang_pods(annotated="1")
    pods[1]["metadata"]["annotations"].pop(RESTART_ATTEMPT_ANNOTATION)
    plan = decide(snap(after, rt=rt, node_job=watching_attempt(rt), pods=pods))
    assert [p.name for p in plan.of(Patch)] == ["llm-node-0-1"] and not plan.of(Delete)
    late = gang_pods(count=1)[0]
    late["metadata"].update(name="llm-node-0-1-new", creationTimestamp=st.timestamp(NOW))
    plan = decide(snap(after, rt=rt, node_job=watching_attempt(rt), pods=(pods[0], late)))
    assert not plan.of(Patch), "a pod made after the restart started with the new attempt's env"


def test_a_stalled_gang_missing_a_pod_or_past_its_stall_budget_is_not_restarted_in_place():
    rt = in_place_stalling_runtime()
    short = decide(snap(running(400), rt=rt, node_job=watching_attempt(rt), pods=gang_pods(count=1)))
    assert short.of(Delete) and not short.of(Patch), "a rank is missing: the gang is made anew"
    used = {"user": 0, "infrastructure": 2, "ignored": 0, "stalled": 2}
    spent = decide(snap(running(400, restarts=used), rt=rt, node_job=watching_attempt(rt), pods=gang_pods()))
    assert condition(spent.status, "Failed")["reason"] == "Stalled"
    assert not [p for p in spent.of(Patch) if p.resource == PODS], "no pod is raised"


def test_after_an_in_place_restart_the_silence_counts_from_it_and_a_real_failure_is_still_judged():
    rt = in_place_stalling_runtime()
    first = decide(snap(running(400), rt=rt, node_job=watching_attempt(rt), pods=gang_pods()))
    restarts = first.status["restarts"]
    later = NOW + timedelta(seconds=200)   # 600 s since the last report, 200 s since the restart
    status = {**running(400)["status"], "restarts": restarts}
    quiet = decide(Snapshot("team-a/llm", later, trainjob(status=status), runtime=rt, groups=ALL_BACKENDS,
                            node_job=watching_attempt(rt), pods=gang_pods(restarts=1, annotated="1")))
    assert not quiet.of(WriteStatus) or quiet.status["restarts"] == restarts
    assert 95 <= quiet.requeue_after <= 105, quiet.requeue_after
    failed_job = watching_attempt(rt)
    failed_job["status"] = {"conditions": FAILED, "failed": 1}
    judged = decide(snap(trainjob(status=status), rt=rt, node_job=failed_job, pods=gang_pods(restarts=1, annotated="1")))
    assert judged.of(Delete) or condition(judged.status, "Failed"), "the failed Job is judged, not taken as judged"


def test_a_users_in_place_restart_not_charged_yet_is_charged_before_a_stall_restarts_the_gang():
    rt = in_place_stalling_runtime()
    first = decide(snap(running(400), rt=rt, node_job=watching_attempt(rt), pods=gang_pods(restarts=1)))
    restarts = first.status["restarts"]
    assert (restarts["user"], restarts.get("stalled", 0)) == (1, 0) and not first.of(Patch), restarts
    after = trainjob(status={**running(400)["status"], "restarts": restarts})
    fresh = decide(snap(after, rt=rt, node_job=watching_attempt(rt), pods=gang_pods(restarts=1)))
    assert not [w for w in fresh.of(WriteStatus) if w.status.get("restarts") != restarts], "a new start: not stalled"
    later = NOW + timedelta(seconds=301)   # still silent, a whole timeout after the user's restart
    stalled = decide(Snapshot("team-a/llm", later, after, runtime=rt, groups=ALL_BACKENDS,
                              node_job=watching_attempt(rt), pods=gang_pods(restarts=1)))
    last = stalled.status["restarts"]["lastFailure"]
    assert (stalled.status["restarts"]["user"], last["reason"], last["attemptRestarts"]) == (1, "Stalled", 2), last
