"""What every backend's quota translation shares (`gangctl policy apply`): pure, policy in, objects out.

The teams' namespaces labelled with their team, the `scheduling.k8s.io/v1` PriorityClasses of the
policy's priorities (pods name them; Volcano, KAI and gangctl's own gate order by them), how a policy
amount is written as a Kubernetes quantity, and the policy stored verbatim in the ConfigMap
`gangctl-system/gangctl-quota-policy` (key `policy.yaml`), where gangctl's controller reads it: to
admit jobs itself under a backend without a quota system, and to preempt for priority under Volcano.
Each backend module says which of these it applies (its `quota_objects`).
"""
from __future__ import annotations

import yaml
from pydantic import ValidationError

from gangctl.model.quota import QuotaPolicy
from gangctl.model.topology import Topology


MANAGED = {"gangctl.io/managed-by": "gangctl-policy"}
TEAM_LABEL = "gangctl.io/quota-team"

# Policy field -> Kubernetes resource name, and how a policy amount is written as a quantity.
RESOURCES = (("gpu", "nvidia.com/gpu"), ("cpu", "cpu"), ("memory", "memory"))
_BINARY = (("Ei", 2**60), ("Pi", 2**50), ("Ti", 2**40), ("Gi", 2**30), ("Mi", 2**20), ("Ki", 2**10))


def quantity(field: str, amount: float) -> str:
    """A policy amount (GPUs, cores, GiB) as a Kubernetes quantity in the API server's canonical form
    (4096 GiB is "4Ti"), so what is applied reads back unchanged and diffs show only real changes."""
    if field == "memory":
        n = int(round(amount * 2**30))
        if n == 0:
            return "0"
        return next((f"{n // size}{suffix}" for suffix, size in _BINARY if n % size == 0), str(n))
    if float(amount).is_integer():
        return str(int(amount))
    return f"{int(round(amount * 1000))}m"


def team_namespaces(policy: QuotaPolicy) -> list[dict]:
    """The teams' namespaces (a LocalQueue needs its namespace), labelled with their team."""
    return [{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns, "labels": {TEAM_LABEL: t.name}}}
            for t in policy.teams for ns in t.namespaces or [t.name]]


def priority_classes(policy: QuotaPolicy) -> list[dict]:
    return [{"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass",
             "metadata": {"name": name, "labels": dict(MANAGED)}, "value": value,
             "preemptionPolicy": "PreemptLowerPriority", "description": f"gangctl quota policy priority {name!r}"}
            for name, value in sorted(policy.priorities.items(), key=lambda kv: (-kv[1], kv[0]))]


POLICY_NAMESPACE = "gangctl-system"
POLICY_CONFIGMAP = "gangctl-quota-policy"
POLICY_KEY = "policy.yaml"
# The cluster's topology, where the controller reads it (gangctl.runtime.cluster_view): written by
# `gangctl policy apply` for every backend when the policy has a topology section.
TOPOLOGY_CONFIGMAP = "gangctl-topology"
TOPOLOGY_KEY = "topology.yaml"


def policy_configmap(text: str) -> dict:
    return {"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": POLICY_CONFIGMAP, "namespace": POLICY_NAMESPACE, "labels": dict(MANAGED)},
            "data": {POLICY_KEY: text}}


def stored_topology(topology: Topology) -> list[dict]:
    """The policy's topology where the controller reads it."""
    system = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": POLICY_NAMESPACE}}
    text = yaml.safe_dump(topology.model_dump(mode="json", by_alias=True, exclude_none=True), sort_keys=False)
    return [system, {"apiVersion": "v1", "kind": "ConfigMap",
                     "metadata": {"name": TOPOLOGY_CONFIGMAP, "namespace": POLICY_NAMESPACE, "labels": dict(MANAGED)},
                     "data": {TOPOLOGY_KEY: text}}]


def topology_of(configmap: dict) -> Topology:
    """The topology a stored ConfigMap holds (ValueError naming the ConfigMap when it holds none that is valid)."""
    try:
        return Topology.model_validate(yaml.safe_load((configmap.get("data") or {}).get(TOPOLOGY_KEY) or ""))
    except (yaml.YAMLError, ValidationError) as err:
        raise ValueError(f"ConfigMap {POLICY_NAMESPACE}/{TOPOLOGY_CONFIGMAP} is not a valid topology: {err}") from None


def stored_policy(text: str) -> list[dict]:
    """The policy YAML `text` where the controller reads it: gangctl-system, then the ConfigMap."""
    system = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": POLICY_NAMESPACE}}
    return [system, policy_configmap(text)]
