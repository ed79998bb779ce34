"""Quota policy -> Kueue objects / Volcano Queues (pure translators) and `policy validate` errors."""
from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from gangctl.model.quota import QuotaPolicy
from gangctl.policy.quota_check import check_policy
from gangctl.plugins.kueue import kueue_objects, priority_label, UNLIMITED
from gangctl.plugins.quota_objects import quantity
from gangctl.plugins.kai import kai_objects, unexpressed
from gangctl.plugins.volcano import queue_for_namespace, volcano_objects

EXAMPLE_TEXT = (Path(__file__).parents[2] / "policies/example-teams.yaml").read_text()
EXAMPLE = QuotaPolicy.model_validate(yaml.safe_load(EXAMPLE_TEXT))


def by(objs: list[dict], kind: str) -> dict[str, dict]:
    return {(o["metadata"].get("namespace", "") + "/" if o["metadata"].get("namespace") else "") + o["metadata"]["name"]: o
            for o in objs if o["kind"] == kind}


def policy(**team) -> QuotaPolicy:
    return QuotaPolicy.model_validate({"teams": [{"name": "a", "nominal": {"gpu": 8}, **team}]})


def test_kueue_objects_of_the_example_policy():
    objs = kueue_objects(EXAMPLE)
    assert [o["kind"] for o in objs][:6] == ["Namespace"] * 5 + ["ResourceFlavor"]
    assert set(by(objs, "Cohort")) == {"research", "product"}
    assert {n: o["value"] for n, o in by(objs, "WorkloadPriorityClass").items()} == {"low": 10, "normal": 100, "high": 1000}
    assert set(by(objs, "LocalQueue")) == {"ml-a/default", "ml-a-dev/default", "ml-b/default", "prod/default", "eval/default"}
    assert by(objs, "LocalQueue")["ml-a-dev/default"]["spec"] == {"clusterQueue": "ml-a"}

    cqs = by(objs, "ClusterQueue")
    ml_a, ml_b = cqs["ml-a"]["spec"], cqs["ml-b"]["spec"]
    assert ml_a["cohortName"] == "research" and ml_a["queueingStrategy"] == "StrictFIFO"
    assert ml_a["namespaceSelector"]["matchExpressions"][0]["values"] == ["ml-a", "ml-a-dev"]
    assert ml_a["preemption"] == {"withinClusterQueue": "LowerPriority", "reclaimWithinCohort": "Any"}
    group = ml_a["resourceGroups"][0]
    assert group["coveredResources"] == ["nvidia.com/gpu", "cpu", "memory"]
    assert group["flavors"][0]["name"] == "default-flavor"
    assert group["flavors"][0]["resources"] == [
        {"name": "nvidia.com/gpu", "nominalQuota": "64", "borrowingLimit": "32"},
        {"name": "cpu", "nominalQuota": "512"},
        {"name": "memory", "nominalQuota": "4Ti"}]
    assert ml_b["queueingStrategy"] == "BestEffortFIFO"
    assert ml_b["resourceGroups"][0]["flavors"][0]["resources"][0] == {
        "name": "nvidia.com/gpu", "nominalQuota": "64", "lendingLimit": "32"}
    assert ml_b["preemption"] == {"withinClusterQueue": "Never", "reclaimWithinCohort": "LowerPriority"}


def test_a_resource_a_team_leaves_out_is_covered_unlimited_and_never_lent():
    pol = QuotaPolicy.model_validate({"teams": [
        {"name": "a", "cohort": "c", "nominal": {"gpu": 8, "cpu": 10}},
        {"name": "b", "cohort": "c", "nominal": {"gpu": 8}}]})
    res = by(kueue_objects(pol), "ClusterQueue")["b"]["spec"]["resourceGroups"][0]["flavors"][0]["resources"]
    assert res[1] == {"name": "cpu", "nominalQuota": UNLIMITED["cpu"], "lendingLimit": "0"}
    solo = by(kueue_objects(policy()), "ClusterQueue")["a"]["spec"]
    # A policy of GPUs alone: Kueue admits nothing that asks for an uncovered resource, so CPU and
    # memory are covered too, unlimited.
    assert solo["resourceGroups"][0]["coveredResources"] == ["nvidia.com/gpu", "cpu", "memory"]
    assert [r["nominalQuota"] for r in solo["resourceGroups"][0]["flavors"][0]["resources"][1:]] == \
        [UNLIMITED["cpu"], UNLIMITED["memory"]] and "cohortName" not in solo


def test_quantities_are_canonical():
    assert [quantity("memory", 4096), quantity("memory", 96), quantity("memory", 0.5)] == ["4Ti", "96Gi", "512Mi"]
    assert [quantity("cpu", 0.5), quantity("cpu", 12), quantity("gpu", 8)] == ["500m", "12", "8"]


def test_priority_label_uses_the_team_default():
    assert priority_label(EXAMPLE, "prod") == "high"
    assert priority_label(EXAMPLE, "ml-a-dev") == "normal"
    assert priority_label(EXAMPLE, "prod", "low") == "low"
    assert priority_label(EXAMPLE, "elsewhere") is None


def test_volcano_queues_of_the_example_policy():
    objs = volcano_objects(EXAMPLE)
    queues = {n: o["spec"] for n, o in by(objs, "Queue").items()}
    assert set(queues) == {"ml-a", "ml-b", "prod", "eval"}
    assert {n: o["value"] for n, o in by(objs, "PriorityClass").items()} == {"low": 10, "normal": 100, "high": 1000}
    # ml-a: nominal 64, borrows at most 32 (ml-b lends up to 32, so 96 either way); lends all: no guarantee.
    assert queues["ml-a"]["deserved"] == {"nvidia.com/gpu": "64", "cpu": "512", "memory": "4Ti"}
    assert queues["ml-a"]["capability"]["nvidia.com/gpu"] == "96"
    assert "guarantee" not in queues["ml-a"]
    # ml-b: keeps 32 of 64 (lendingLimit 32), may borrow all of ml-a's 64.
    assert queues["ml-b"]["guarantee"] == {"resource": {"nvidia.com/gpu": "32"}}
    assert queues["ml-b"]["capability"]["nvidia.com/gpu"] == "128"
    # reclaimable: a cohort member may take back what this queue borrowed.
    assert queues["ml-a"]["reclaimable"] and queues["ml-b"]["reclaimable"]
    assert queues["eval"]["reclaimable"] and not queues["prod"]["reclaimable"], "eval never reclaims from prod"
    assert queue_for_namespace(EXAMPLE, "ml-a-dev") == "ml-a" and queue_for_namespace(EXAMPLE, "x") is None


def test_volcano_queue_outside_a_cohort_is_capped_and_guaranteed_at_nominal():
    spec = by(volcano_objects(policy()), "Queue")["a"]["spec"]
    assert spec["capability"] == spec["deserved"] == spec["guarantee"]["resource"] == {"nvidia.com/gpu": "8"}
    assert spec["reclaimable"] is False


def test_volcano_capability_counts_what_members_lend_and_the_borrowing_limit():
    pol = QuotaPolicy.model_validate({"teams": [
        {"name": "a", "cohort": "c", "nominal": {"gpu": 8, "cpu": 4}},
        {"name": "b", "cohort": "c", "nominal": {"gpu": 8}, "borrowingLimit": {"gpu": 2}}]})
    queues = {n: o["spec"] for n, o in by(volcano_objects(pol), "Queue").items()}
    assert queues["b"]["capability"] == {"nvidia.com/gpu": "10"}
    assert queues["a"]["capability"] == {"nvidia.com/gpu": "16", "cpu": "4"}, "b limits no cpu, so lends none"


def test_kai_queues_of_the_example_policy():
    objs = kai_objects(EXAMPLE)
    queues = {n: o["spec"] for n, o in by(objs, "Queue").items()}
    assert set(queues) == {"cohort-research", "cohort-product", "ml-a", "ml-b", "prod", "eval"}
    assert {n: o["value"] for n, o in by(objs, "PriorityClass").items()} == {"low": 10, "normal": 100, "high": 1000}
    # A cohort is the parent of its teams: its quota and its limit are the sum of their nominal quotas.
    assert queues["cohort-research"]["resources"]["gpu"] == {"quota": 128, "limit": 128, "overQuotaWeight": 1}
    assert queues["cohort-research"]["resources"]["cpu"]["quota"] == 1024_000, "millicores"
    assert queues["cohort-research"]["resources"]["memory"]["quota"] == 8796093, "8 TiB in megabytes, rounded down"
    assert "parentQueue" not in queues["cohort-research"]
    # ml-a: 64 guaranteed, borrows at most 32; ml-b has no borrowing limit: the cohort caps it.
    assert queues["ml-a"]["parentQueue"] == "cohort-research"
    assert queues["ml-a"]["resources"]["gpu"] == {"quota": 64, "limit": 96, "overQuotaWeight": 1}
    assert queues["ml-b"]["resources"]["gpu"] == {"quota": 64, "limit": -1, "overQuotaWeight": 1}
    assert queues["prod"]["parentQueue"] == queues["eval"]["parentQueue"] == "cohort-product"
    assert by(objs, "Queue")["ml-a"]["metadata"]["labels"]["gangctl.io/quota-team"] == "ml-a"


def test_kai_queue_outside_a_cohort_has_its_own_parent_and_unlimited_resources_it_leaves_out():
    queues = {n: o["spec"] for n, o in by(kai_objects(policy()), "Queue").items()}
    assert queues["a"]["parentQueue"] == "team-a"
    assert queues["a"]["resources"]["gpu"] == queues["team-a"]["resources"]["gpu"] == \
        {"quota": 8, "limit": 8, "overQuotaWeight": 1}
    assert queues["a"]["resources"]["cpu"] == {"quota": -1, "limit": -1, "overQuotaWeight": 1}


def test_kai_names_what_its_queues_cannot_enforce():
    notes = unexpressed(EXAMPLE)
    assert any(n.startswith("team ml-b: lendingLimit") for n in notes)
    assert not any("team prod" in n for n in notes), "prod sets nothing KAI lacks"
    assert any(n.startswith("team eval: reclaimWithinCohort Never") for n in notes)
    assert any(n.startswith("team a: withinTeam Never") for n in unexpressed(policy())), "the default"
    assert unexpressed(policy(preemption={"withinTeam": "LowerPriority"})) == []


def test_the_example_policy_is_valid():
    pol, problems = check_policy(EXAMPLE_TEXT)
    assert problems == [] and pol == EXAMPLE


@pytest.mark.parametrize("text, expected", [
    ("teams:\n  - name: a\n    nominal: {gpu: -1}\n", ["x.yaml:3: teams[0].nominal.gpu: Input should be greater than or equal to 0"]),
    ("teams:\n  - name: a\n    nominal: {gpu: 1}\n    borrowingLimit: {gpu: 1}\n",
     ["x.yaml:2: teams[0]: team a: borrowingLimit/lendingLimit need a cohort"]),
    ("teams:\n  - name: a\n    nominal: {gpu: 1}\n    queueing: Fifo\n",
     ["x.yaml:4: teams[0].queueing: Input should be 'StrictFIFO' or 'BestEffortFIFO'"]),
    ("teams:\n  - name: a\n    nominal: {gpu: 1}\n  - name: b\n    namespaces: [a]\n    nominal: {}\n",
     ["x.yaml:1: namespace a belongs to both a and b"]),
    ("defaultPriority: top\nteams:\n  - name: a\n    nominal: {}\n", ["x.yaml:1: defaultPriority: unknown priority class 'top'"]),
    ("teams: [\n", None),
    ("- 1\n", ["x.yaml:1: expected a mapping with `teams` (and optionally `priorities`, `defaultPriority`)"]),
])
def test_validate_names_the_field_and_line(text, expected):
    pol, problems = check_policy(text)
    assert pol is None
    lines = [p.format("x.yaml") for p in problems]
    if expected is None:
        assert len(lines) == 1 and "not valid YAML" in lines[0]
    else:
        assert lines == expected
