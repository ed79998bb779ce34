"""deploy/'s API Priority and Fairness objects: the leader election Lease's requests, and only they,
get gangctl's own priority level, in every variant and in the Helm chart (which renders the same
objects: tests/unit/test_deploy.py)."""
from __future__ import annotations

from tests.unit.test_deploy import SYSTEM_NS, base, one, variants  # noqa: F401 - fixtures

NAME = "gangctl-leader-election"


def lease_namespace(dep: dict) -> str:
    args = dep["spec"]["template"]["spec"]["containers"][0]["args"]
    return args[args.index("--leader-elect-namespace") + 1]


def test_the_lease_has_a_priority_level_of_its_own(variants):  # noqa: F811
    for variant, docs in variants.items():
        dep = one(docs, "Deployment", "gangctl-controller")
        level = one(docs, "PriorityLevelConfiguration", NAME)["spec"]
        assert level["type"] == "Limited" and level["limited"]["lendablePercent"] == 0, variant
        assert level["limited"]["limitResponse"]["type"] == "Queue", "a renewal waits its turn, never a 429"
        flow = one(docs, "FlowSchema", NAME)["spec"]
        assert flow["priorityLevelConfiguration"]["name"] == NAME
        # before the built-in `service-accounts` FlowSchema (9000), which would take a ServiceAccount's requests
        assert flow["matchingPrecedence"] < 9000
        [rule] = flow["rules"]
        assert rule["subjects"] == [{"kind": "ServiceAccount", "serviceAccount": {
            "name": dep["spec"]["template"]["spec"]["serviceAccountName"], "namespace": SYSTEM_NS}}], variant
        [resources] = rule["resourceRules"]
        assert resources["apiGroups"] == ["coordination.k8s.io"] and resources["resources"] == ["leases"]
        assert resources["namespaces"] == [lease_namespace(dep)], "only the Lease's namespace, not its other traffic"
        assert set(resources["verbs"]) == {"get", "watch", "create", "update"}, "what the elector calls"
        assert not rule.get("nonResourceRules")
