"""The pure half of gangctl's coscheduling quota admission (gangctl.policy.quota_gate, gangctl.model.quota_plan, gangctl.plugins.coscheduling)."""
from __future__ import annotations

from datetime import datetime, timezone
from fractions import Fraction
from functools import partial
from pathlib import Path

import yaml

from gangctl.model.admission import GPU, Verdict
from gangctl.model.quota import QUANTITY_UNITS, QuotaPolicy
from gangctl.plugins.quota_objects import POLICY_CONFIGMAP, POLICY_KEY, POLICY_NAMESPACE
from gangctl.model.quota_plan import grow, Growable, NodeRange, Pending, plan, priority_value, timestamp
from gangctl.policy.quota_gate import admission_record, admitted_workload, grown_record
from gangctl.plugins.coscheduling import coscheduling_objects
from gangctl.commands.policy_apply import objects_for, policy_text
from gangctl.sim.objects import trainjob

EXAMPLE_TEXT = (Path(__file__).parents[2] / "policies/example-teams.yaml").read_text()
EXAMPLE = QuotaPolicy.model_validate(yaml.safe_load(EXAMPLE_TEXT))
NOW = datetime(2025, 1, 2, 3, 4, 5, tzinfo=timezone.utc)


def policy(*teams: dict, **top) -> QuotaPolicy:
    return QuotaPolicy.model_validate({"priorities": {"low": 1, "high": 10}, "defaultPriority": "low",
                                       "teams": list(teams), **top})


def pending(key: str, gpus: int, created: float, priority: int = 1) -> Pending:
    ns = key.split("/")[0]
    return Pending(key, ns, created, priority, {GPU: Fraction(gpus), "cpu": Fraction(gpus)})


def test_objects_store_the_policy_text_and_reuse_the_priority_classes():
    objs = coscheduling_objects(EXAMPLE, EXAMPLE_TEXT)
    cm = [o for o in objs if o["kind"] == "ConfigMap"]
    assert len(cm) == 1 and cm[0]["metadata"]["name"] == POLICY_CONFIGMAP
    assert cm[0]["metadata"]["namespace"] == POLICY_NAMESPACE and cm[0]["data"] == {POLICY_KEY: EXAMPLE_TEXT}
    kinds = [o["kind"] for o in objs]
    assert kinds.index("Namespace") < kinds.index("ConfigMap")  # gangctl-system first
    assert POLICY_NAMESPACE in {o["metadata"]["name"] for o in objs if o["kind"] == "Namespace"}
    assert {o["metadata"]["name"]: o["value"] for o in objs if o["kind"] == "PriorityClass"} == EXAMPLE.priorities
    # without the file text, the stored YAML is the policy itself (it round-trips)
    text = objects_for(EXAMPLE, "coscheduling")[-1]["data"][POLICY_KEY]
    assert text == policy_text(EXAMPLE)
    assert QuotaPolicy.model_validate(yaml.safe_load(text)) == EXAMPLE


def test_admission_record_round_trips_to_the_workload_it_charged():
    p = policy({"name": "a", "nominal": {"gpu": 8}})
    record = admission_record("a", {GPU: Fraction(4), "memory": Fraction(3 * 2**30), "cpu": Fraction(1, 2)}, 10, NOW)
    assert record == {"team": "a", "admittedAt": "2025-01-02T03:04:05Z", "priority": 10,
                      "requests": {"cpu": "500m", "memory": "3221225472", GPU: "4"}}
    w = admitted_workload(p, "a/j", "a", record)
    assert (w.id, w.team, w.priority, w.created) == ("a/j", "a", 10, NOW.timestamp())
    assert w.requests == {GPU: 4, "memory": 3 * 2**30, "cpu": Fraction(1, 2)}
    # a namespace that left the policy keeps the team it was charged to
    assert admitted_workload(p, "gone/j", "gone", record).team == "a"
    assert timestamp("2025-01-02T03:04:05.250000Z") == NOW.timestamp() + 0.25


def test_priority_from_the_class_else_the_team_default_else_the_policy_default():
    p = policy({"name": "a", "nominal": {"gpu": 8}, "defaultPriority": "high"}, {"name": "b", "nominal": {"gpu": 8}})
    assert priority_value(p, "b", "high") == 10
    assert priority_value(p, "a", None) == 10
    assert priority_value(p, "b", None) == 1
    assert priority_value(p, "b", "system-cluster-critical") == 1   # not a policy class: as if none
    assert priority_value(p, "elsewhere", None) == 1


def test_plan_admits_within_quota_in_fifo_order_and_explains_the_rest():
    p = policy({"name": "a", "nominal": {"gpu": 16}})
    result = plan(p, p.to_quotas(QUANTITY_UNITS),
                  [pending("a/third", 8, 3), pending("a/first", 8, 1), pending("a/second", 8, 2), pending("a/fourth", 1, 4)],
                  [admitted_workload(p, "a/old", "a", admission_record("a", {GPU: 4}, 1, NOW))])
    assert [(d.workload.id, d.verdict) for d in result.decisions] == [("a/first", Verdict.ADMIT)]
    assert result.reasons["a/second"] == "requests 8 GPUs, team a uses 12 of 16 nominal"
    # StrictFIFO: the small job behind the blocked one is not examined
    assert result.reasons["a/third"] == result.reasons["a/fourth"] == "queued behind a/second in team a's StrictFIFO queue"
    assert "a/first" not in result.reasons


def test_plan_keeps_jobs_of_a_namespace_in_no_team_waiting():
    p = policy({"name": "a", "nominal": {"gpu": 16}})
    result = plan(p, p.to_quotas(QUANTITY_UNITS), [pending("stray/j", 1, 1)], [])
    assert result.decisions == []
    assert result.reasons == {"stray/j": "namespace stray is in no team of the quota policy"}


def test_plan_preempts_the_lower_priority_job_of_the_team():
    p = policy({"name": "a", "nominal": {"gpu": 16}, "preemption": {"withinTeam": "LowerPriority"}})
    low = admitted_workload(p, "a/low", "a", admission_record("a", {GPU: 8}, 1, NOW))
    older = admitted_workload(p, "a/older", "a", admission_record("a", {GPU: 8}, 1, NOW.replace(hour=1)))
    result = plan(p, p.to_quotas(QUANTITY_UNITS), [pending("a/urgent", 8, 5, priority=10)], [low, older])
    [d] = result.decisions
    assert d.verdict is Verdict.PREEMPT and d.workload.id == "a/urgent"
    assert [v.id for v in d.victims] == ["a/low"]   # the most recently admitted goes first


def test_plan_with_best_effort_fifo_lets_a_small_job_pass_a_blocked_one():
    p = policy({"name": "a", "nominal": {"gpu": 16}, "queueing": "BestEffortFIFO"})
    result = plan(p, p.to_quotas(QUANTITY_UNITS), [pending("a/big", 32, 1), pending("a/small", 8, 2)], [])
    assert [d.workload.id for d in result.decisions] == ["a/small"]
    assert result.reasons["a/big"].startswith("requests 32 GPUs")


def elastic_pending(key: str, per_node: int, min_nodes: int, max_nodes: int, created: float) -> Pending:
    ns = key.split("/")[0]
    return Pending(key, ns, created, 1, {GPU: Fraction(per_node * min_nodes)},
                   NodeRange(min_nodes, max_nodes, {GPU: Fraction(per_node)}))


def test_an_elastic_job_is_admitted_on_its_floor_with_the_nodes_the_quota_still_has_room_for():
    p = policy({"name": "a", "nominal": {"gpu": 16}})
    used = admitted_workload(p, "a/old", "a", admission_record("a", {GPU: 4}, 1, NOW))
    result = plan(p, p.to_quotas(QUANTITY_UNITS), [elastic_pending("a/el", 4, 1, 4, 1)], [used])
    [d] = result.decisions
    assert result.nodes == {"a/el": 3}, "12 GPUs left: its floor of 1 node plus 2 more, not its max of 4"
    assert d.workload.requests == {GPU: 12}, "it is charged what it may run"
    # a full team: the floor only
    tight = plan(p, p.to_quotas(QUANTITY_UNITS), [elastic_pending("a/el", 4, 1, 4, 1)],
                 [admitted_workload(p, "a/old", "a", admission_record("a", {GPU: 12}, 1, NOW))])
    assert tight.nodes == {"a/el": 1} and tight.decisions[0].workload.requests == {GPU: 4}


def test_elastic_surplus_goes_in_decision_order_after_every_floor_of_the_round_is_charged():
    p = policy({"name": "a", "nominal": {"gpu": 16}, "queueing": "BestEffortFIFO"})
    result = plan(p, p.to_quotas(QUANTITY_UNITS),
                  [elastic_pending("a/first", 4, 1, 4, 1), pending("a/rigid", 8, 2), elastic_pending("a/last", 4, 1, 2, 3)], [])
    assert [d.workload.id for d in result.decisions] == ["a/first", "a/rigid", "a/last"]
    assert result.nodes == {"a/first": 1, "a/last": 1}, "4 + 8 + 4 = 16: no room above any floor"
    roomy = plan(p, p.to_quotas(QUANTITY_UNITS), [elastic_pending("a/first", 4, 1, 4, 1), elastic_pending("a/last", 4, 1, 4, 2)], [])
    assert roomy.nodes == {"a/first": 3, "a/last": 1}, "16 - two floors of 4 = 8: the first job takes 2 more nodes"
    assert sum(d.workload.requests[GPU] for d in roomy.decisions) == 16


def test_admitted_elastic_jobs_grow_into_their_team_room_unless_a_job_of_the_team_waits():
    p = policy({"name": "a", "nominal": {"gpu": 16}}, {"name": "b", "nominal": {"gpu": 8}})
    quotas = p.to_quotas(QUANTITY_UNITS)
    el = admitted_workload(p, "a/el", "a", admission_record("a", {GPU: 8}, 1, NOW, nodes=2))
    rigid = admitted_workload(p, "a/rigid", "a", admission_record("a", {GPU: 4}, 1, NOW))
    g = Growable(el, 2, NodeRange(1, 4, {GPU: Fraction(4)}))
    assert grow(quotas, [el, rigid], [g], set()) == {"a/el": 3}, "16 - 12 = 4 GPUs: one more node of 4"
    assert grow(quotas, [el], [g], set()) == {"a/el": 4}, "never past maxNodes"
    assert grow(quotas, [el, rigid], [g], {"a"}) == {}, "a waiting job of the team comes first"
    assert grow(quotas, [el, rigid], [g], {"b"}) == {"a/el": 3}
    full = admitted_workload(p, "a/full", "a", admission_record("a", {GPU: 8}, 1, NOW))
    assert grow(quotas, [el, full], [g], set()) == {}
    record = grown_record(admission_record("a", {GPU: 8}, 1, NOW, nodes=2), {GPU: Fraction(4)}, 3)
    assert record == {"team": "a", "admittedAt": "2025-01-02T03:04:05Z", "priority": 1, "nodes": 3,
                      "requests": {GPU: "12"}}, "charged for 3 nodes; admission time kept (orders victims)"


def test_an_invalid_policy_holds_the_namespaces_it_still_names():
    from gangctl.policy.quota_gate import held_namespaces, invalid_policy_message

    # each team's namespaces (a string counts as one), else its name; whatever else is wrong
    text = ("teams:\n- {name: a, namespaces: [ns-a1, ns-a2], nominal: {gpu: -1}}\n- {name: b}\n"
            "- {name: c, namespaces: ns-c}\n- 7\n- {namespaces: [3, '']}\n")
    assert held_namespaces(text) == {"ns-a1", "ns-a2", "b", "ns-c"}
    # nothing readable: every namespace (None)
    for text in (None, "teams: [a, b", "teams: 3", "- just a list", "priorities: {x: 1}", "teams: []", ""):
        assert held_namespaces(text) is None, text
    one = invalid_policy_message("p.yaml:3: teams[0].nominal.gpu: bad", frozenset({"ns-a"}))
    assert "namespace ns-a:" in one and "p.yaml:3: teams[0].nominal.gpu: bad" in one
    assert "gangctl policy validate" in one and f"{POLICY_NAMESPACE}/{POLICY_CONFIGMAP}" in one
    assert "namespaces a, b:" in invalid_policy_message("x", frozenset({"b", "a"}))
    assert "any namespace" in invalid_policy_message("x", None)


def test_a_starting_gate_waits_for_every_job_that_may_ask():
    from gangctl.policy.quota_gate import awaiting_start, needs_admission

    tj = partial(trainjob, "x", status={})
    record = {"team": "a"}
    assert needs_admission(tj(), None)
    assert not needs_admission(tj(), record)
    assert not needs_admission(tj(suspend=True), None)
    assert not needs_admission(tj(metadata={"deletionTimestamp": "2025-01-01T00:00:00Z"}), None)
    assert not needs_admission(tj(status={"conditions": [{"type": "Complete", "status": "True"}]}), None)
    cache = {"n/a": tj(), "n/b": tj(), "n/c": tj(status={"admission": record}), "n/d": tj(suspend=True)}

    def admission_of(t):
        return (t.get("status") or {}).get("admission")
    expected = {"n/a", "n/b", "n/c", "n/d", "n/gone"}
    # a and b not heard of; c was admitted since, d suspended, gone deleted: none of those holds it up
    assert awaiting_start(expected, cache, set(), admission_of) == {"n/a", "n/b"}
    assert awaiting_start(expected, cache, {"n/a"}, admission_of) == {"n/b"}
    assert awaiting_start(expected, cache, {"n/a", "n/b"}, admission_of) == set()
    # a job created after the start is not waited for
    assert awaiting_start(expected, {**cache, "n/new": tj()}, {"n/a", "n/b"}, admission_of) == set()
