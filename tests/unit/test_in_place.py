"""In-place gang restarts (issue 38 item 1): the runtime's opt-in puts a RestartAllContainers rule on
the trainer container, and each episode the pods went through is charged to the budget exactly once."""
from __future__ import annotations

import pytest

from gangctl.api.resources import JOBS
from gangctl.model.resolve import RESTART_ANNOTATION, ResolvedJob, resolve
from gangctl.policy.decide import Apply, Delete, Event, Patch, WriteStatus, decide
from gangctl.plugins.workload import IN_PLACE_FEATURE
from gangctl.policy import restart_mode
from gangctl.policy.cached import node_view
from gangctl.policy.failure import FailurePolicy, InPlace, Restarts, charge_in_place, most_restarted
from gangctl.sim import objects
from tests.unit.test_decide import child, condition, runtime, snap, trainjob


def in_place_runtime(max_restarts: int = 2, mode: str = "InPlace") -> dict:
    rt = runtime(failure_policy={"maxRestarts": max_restarts})
    rt["metadata"].setdefault("annotations", {})[RESTART_ANNOTATION] = mode
    return rt


def pods(*counts: int, code: int = 1) -> tuple[dict, ...]:
    """The attempt's pods, pod i's trainer container restarted counts[i] times (last exit `code`)."""
    job = {"metadata": {"name": "llm-node-0", "namespace": "team-a", "uid": "job-1"}}
    out = []
    for i, n in enumerate(counts):
        pod = objects.job_pod(job, i, node=f"n{i}")
        pod["status"]["containerStatuses"] = [{"name": "node", "restartCount": n, "lastState": (
            {"terminated": {"exitCode": code}} if n else {})}]
        out.append(pod)
    return tuple(out)


def test_the_trainer_container_gets_the_restart_all_rule_only_when_the_runtime_asks():
    plan = decide(snap(trainjob(), rt=in_place_runtime()))
    job = next(s.obj for s in plan.steps if isinstance(s, Apply) and s.resource == JOBS)
    trainer = job["spec"]["template"]["spec"]["containers"][0]
    assert trainer["restartPolicy"] == "Never"
    assert trainer["restartPolicyRules"] == [{"action": "RestartAllContainers",
                                              "exitCodes": {"operator": "NotIn", "values": [0]}}]
    plain = decide(snap(trainjob(), rt=runtime()))
    job = next(s.obj for s in plain.steps if isinstance(s, Apply) and s.resource == JOBS)
    assert "restartPolicyRules" not in job["spec"]["template"]["spec"]["containers"][0]


def test_an_unknown_restart_mode_fails_naming_the_annotation():
    plan = decide(snap(trainjob(), rt=in_place_runtime(mode="Sometimes")))
    failed = condition(plan.status, "Failed")
    assert failed["reason"] == "InvalidRuntime" and RESTART_ANNOTATION in failed["message"], failed


def test_an_episode_is_charged_once_as_a_user_restart_and_nothing_is_deleted():
    plan = decide(snap(trainjob(), rt=in_place_runtime(), node_job=child(), pods=pods(1, 1, 0, code=3)))
    status = plan.status
    assert status["restarts"]["user"] == 1 and status["restartCount"] == 1
    last = status["restarts"]["lastFailure"]
    assert (last["action"], last["attemptRestarts"], last["exitCode"], last["jobUID"]) == ("RestartInPlace", 1, 3, "job-1")
    assert not plan.of(Delete), "the pods stay"
    assert [e.reason for e in plan.of(Event)] == ["RestartedInPlace"]
    again = decide(snap(trainjob(status=status), rt=in_place_runtime(), node_job=child(), pods=pods(1, 1, 1)))
    assert not [s for s in again.steps if isinstance(s, WriteStatus) and s.status.get("restarts") != status["restarts"]]


def test_past_the_budget_the_job_fails_and_its_gang_goes():
    used = {"user": 2, "infrastructure": 0, "ignored": 0,
            "lastFailure": {"kind": "user", "reason": "RestartedInPlace", "jobUID": "job-1",
                            "action": "RestartInPlace", "attemptRestarts": 2}}
    plan = decide(snap(trainjob(status={"restarts": used}), rt=in_place_runtime(max_restarts=2), node_job=child(),
                       pods=pods(3, 3, 2)))
    failed = condition(plan.status, "Failed")
    assert failed["reason"] == "MaxRestartsExceeded" and "2/2 restarts used" in failed["message"], failed
    assert [(p.resource, p.patch["spec"]) for p in plan.of(Patch)] == [(JOBS, {"suspend": True})], "its pods stop"


@pytest.mark.parametrize("most,seen,charged", [(1, 0, 1), (3, 1, 2), (1, 1, None), (0, 0, None)])
def test_charge_in_place_counts_only_new_episodes(most, seen, charged):
    restarts = Restarts(user=seen, last_failure={"jobUID": "u", "action": "RestartInPlace", "attemptRestarts": seen})
    out = charge_in_place(FailurePolicy(max_restarts=5), restarts, "a", "u", InPlace(most, "p", 1), "2026-11-28T12:00:00Z")
    assert (out[1].user - seen if out else None) == charged
    other = charge_in_place(FailurePolicy(max_restarts=5), restarts, "a", "another-attempt", InPlace(1, "p", 1), "t")
    assert other is not None and other[1].user == seen + 1, "a new attempt's count starts at zero"


def test_episodes_seen_at_once_past_the_budget_charge_what_it_allowed_then_fail():
    decision, after = charge_in_place(FailurePolicy(max_restarts=1), Restarts(), "a", "u", InPlace(3, "p", 3), "t")
    assert (decision.action, decision.reason, after.user) == ("Fail", "MaxRestartsExceeded", 1)
    assert "(1/1 restarts used)" in decision.message and after.last_failure["exitCode"] == 3, decision.message


def test_the_most_restarted_pod_names_the_episode():
    def pod(name, count, code=None):
        last = {"terminated": {"exitCode": code}} if code is not None else {}
        return {"metadata": {"name": name}, "status": {"containerStatuses": [
            {"name": "sidecar", "restartCount": 9}, {"name": "pytorch", "restartCount": count, "lastState": last}]}}
    assert most_restarted([pod("a", 1, 3), pod("b", 2, 137), pod("c", 0)], "pytorch") == InPlace(2, "b", 137)
    assert most_restarted([], "pytorch") is None


# --- the default: in place where the nodes can (gangctl.policy.restart_mode) ----------------------
FEATURE = "RestartAllContainersOnContainerExits"
KWOK_TAINT = {"key": "kwok.x-k8s.io/node", "value": "fake", "effect": "NoSchedule"}


def declaring(name: str, **kw) -> dict:
    return node_view(objects.node(name, declared_features=[FEATURE], **kw))


def lacking(name: str, **kw) -> dict:
    return node_view(objects.node(name, **kw))


def node_job_of(plan) -> dict:
    return next(s.obj for s in plan.steps if isinstance(s, Apply) and s.resource == JOBS)


def restarts_in_place(job: dict) -> bool:
    return "restartPolicyRules" in job["spec"]["template"]["spec"]["containers"][0]


def resolved(rt: dict | None = None) -> ResolvedJob:
    return resolve(trainjob(), rt or runtime(failure_policy={"maxRestarts": 2}))


RESTARTABLE = runtime(failure_policy={"maxRestarts": 2})


@pytest.mark.parametrize("nodes,expected", [
    ((declaring("p0"), declaring("p1")), True),
    ((declaring("p0"), lacking("p1")), False),                 # the rule would keep the gang off p1
    ((declaring("p0"), lacking("k0", taints=[KWOK_TAINT])), True),   # k0: no pod of it lands there anyway
    ((declaring("p0"), lacking("p1", ready="False")), True),   # not Ready: not a node the pods may use now
    ((lacking("k0", taints=[KWOK_TAINT]), declaring("p0")), True),   # the order of the nodes does not matter
    ((declaring("p0"), declaring("p1"), lacking("p2")), False),
    ((lacking("p1", ready="False"), declaring("p0"), lacking("k0", taints=[KWOK_TAINT])), True),
    ((lacking("k0", taints=[KWOK_TAINT]),), False),            # no node the pods may use
    ((), False),
    (None, False),                                             # the nodes not known
])
def test_unset_restarts_in_place_only_when_every_node_the_pods_may_use_declares_the_feature(nodes, expected):
    assert restart_mode.in_place(resolved(), None, nodes) is expected


@pytest.mark.parametrize("failure_policy,job_fields", [
    (None, {}),                                                   # no restart allowed: nothing to restart for
    ({"maxRestarts": 0}, {}),
    ({"maxRestarts": 2, "rules": [{"action": "FailJobSet", "onJobFailureReasons": ["PodFailurePolicy"]}]}, {}),
    ({"maxRestarts": 2}, {"podFailurePolicy": {"rules": [
        {"action": "FailJob", "onExitCodes": {"operator": "In", "values": [42]}}]}}),
])
def test_unset_recreates_when_the_runtime_allows_no_restart_or_judges_failures_by_its_rules(failure_policy, job_fields):
    """The kubelet restarts the containers before a JobSet rule or the Job's podFailurePolicy could see
    the failure: such a runtime keeps recreation unless it asks for InPlace itself."""
    rt = runtime(failure_policy=failure_policy)
    rt["spec"]["template"]["spec"]["replicatedJobs"][0]["template"]["spec"].update(job_fields)
    assert restart_mode.in_place(resolved(rt), None, (declaring("p0"),)) is False


def test_the_node_jobs_own_template_decides_once_it_exists():
    made_in_place = node_job_of(decide(snap(trainjob(), rt=RESTARTABLE, nodes=(declaring("p0"),))))
    assert restart_mode.in_place(resolved(), made_in_place, (lacking("p1"),)) is True
    made_plain = node_job_of(decide(snap(trainjob(), rt=RESTARTABLE, nodes=(lacking("p1"),))))
    assert restart_mode.in_place(resolved(), made_plain, (declaring("p0"),)) is False


def test_a_runtime_that_does_not_say_restarts_in_place_on_nodes_that_declare_the_feature():
    nodes = (declaring("p0"), declaring("p1"), lacking("k0", taints=[KWOK_TAINT]))
    assert restarts_in_place(node_job_of(decide(snap(trainjob(), rt=RESTARTABLE, nodes=nodes))))
    assert not restarts_in_place(node_job_of(decide(snap(trainjob(), rt=RESTARTABLE, nodes=nodes[1:] + (lacking("p2"),)))))
    # the runtime's word wins either way
    assert not restarts_in_place(node_job_of(decide(snap(trainjob(), rt=in_place_runtime(mode="Recreate"), nodes=nodes))))
    assert restarts_in_place(node_job_of(decide(snap(trainjob(), rt=in_place_runtime(), nodes=(lacking("p2"),)))))


def test_an_unset_mode_charges_an_episode_of_a_node_job_made_in_place():
    """The pass after the Job was made has no nodes in its snapshot: the Job's rule says in place."""
    made = node_job_of(decide(snap(trainjob(), rt=RESTARTABLE, nodes=(declaring("p0"),))))
    observed = {**child(), "spec": made["spec"]}
    plan = decide(snap(trainjob(), rt=RESTARTABLE, node_job=observed, pods=pods(1, 1, 0, code=3)))
    assert plan.status["restarts"]["user"] == 1 and plan.status["restarts"]["lastFailure"]["action"] == "RestartInPlace"
    assert not plan.of(Delete), "the pods stay"


def test_an_elastic_job_keeps_torchruns_elastic_restarts():
    rt = runtime(failure_policy={"maxRestarts": 2}, elastic={"minNodes": 1, "maxNodes": 3})
    job = node_job_of(decide(snap(trainjob(), rt=rt, nodes=(declaring("p0"),))))
    assert not restarts_in_place(job)


def test_the_node_cache_keeps_what_the_choice_reads():
    view = declaring("p0", taints=[KWOK_TAINT], unschedulable=True, labels={"a": "b"})
    assert view["status"]["declaredFeatures"] == [FEATURE]
    assert view["spec"] == {"taints": [KWOK_TAINT], "unschedulable": True} and view["metadata"]["labels"] == {"a": "b"}


def test_process_nodes_declare_what_the_rule_needs():
    from gangctl.nodeagent.spec import DECLARED_FEATURES
    assert IN_PLACE_FEATURE in DECLARED_FEATURES
