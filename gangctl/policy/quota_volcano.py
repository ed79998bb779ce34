"""A quota policy (`policies/*.yaml`) as Volcano Queues: pure, policy in, Kubernetes objects out.

One team = one `scheduling.volcano.sh/v1beta1` Queue named after the team. Volcano has no cohorts
(every queue may use what the others leave idle, up to its capability), so the cohort semantics are
folded into each queue's numbers, for the resources the team limits:

| Queue field | from the policy |
|---|---|
| `deserved` | `nominal` (the capacity plugin's share; over it a queue's jobs may be reclaimed) |
| `guarantee.resource` | the part of `nominal` never lent: `nominal - lendingLimit` in a cohort, all of `nominal` outside one |
| `capability` | the most the team may use: `nominal` outside a cohort; in one, `nominal` plus what the other members lend, capped by `nominal + borrowingLimit` |
| `reclaimable` | true when a cohort member may reclaim (`reclaimWithinCohort` is not Never) |

Jobs reach a queue through their PodGroup's `spec.queue`; Volcano does not tie queues to
namespaces, so the backend builder names the team's queue (`queue_for_namespace`).
Priorities become `scheduling.k8s.io/v1` PriorityClasses (Volcano reads the pods' and PodGroup's
priorityClassName).
"""
from __future__ import annotations

from gangctl.model.quota import QuotaPolicy, Team
from gangctl.policy.quota_kueue import MANAGED, RESOURCES, TEAM_LABEL, quantity, team_namespaces

API_VERSION = "scheduling.volcano.sh/v1beta1"


def _amounts(team: Team, field_values: dict[str, float | None]) -> dict[str, str]:
    return {name: quantity(field, v) for field, name in RESOURCES
            if (v := field_values.get(field)) is not None}


def _lendable(team: Team, field: str) -> float:
    """What a cohort member lends of a resource. One that does not limit the resource lends none of
    it (as in the Kueue translation, where it is covered with lendingLimit 0)."""
    nominal = getattr(team.nominal, field)
    if nominal is None:
        return 0
    lend = getattr(team.lending_limit, field) if team.lending_limit else None
    return nominal if lend is None else lend


def queue(policy: QuotaPolicy, team: Team) -> dict:
    members = [t for t in policy.teams if team.cohort and t.cohort == team.cohort and t.name != team.name]
    deserved: dict[str, float | None] = {}
    guarantee: dict[str, float | None] = {}
    capability: dict[str, float | None] = {}
    for field, _ in RESOURCES:
        nominal = getattr(team.nominal, field)
        if nominal is None:
            continue
        deserved[field] = nominal
        if team.cohort is None:
            guarantee[field] = capability[field] = nominal
            continue
        lend = getattr(team.lending_limit, field) if team.lending_limit else None
        if lend is not None and nominal - lend > 0:
            guarantee[field] = nominal - lend
        cap = nominal + sum(_lendable(m, field) for m in members)
        borrow = getattr(team.borrowing_limit, field) if team.borrowing_limit else None
        capability[field] = cap if borrow is None else min(cap, nominal + borrow)
    spec: dict = {"weight": 1, "reclaimable": any(m.preemption.reclaim_within_cohort.value != "Never" for m in members)}
    if capability:
        spec["capability"] = _amounts(team, capability)
    if deserved:
        spec["deserved"] = _amounts(team, deserved)
    if guarantee:
        spec["guarantee"] = {"resource": _amounts(team, guarantee)}
    return {"apiVersion": API_VERSION, "kind": "Queue",
            "metadata": {"name": team.name, "labels": {**MANAGED, TEAM_LABEL: team.name}}, "spec": spec}


def priority_classes(policy: QuotaPolicy) -> list[dict]:
    return [{"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass",
             "metadata": {"name": name, "labels": dict(MANAGED)}, "value": value,
             "preemptionPolicy": "PreemptLowerPriority", "description": f"gangctl quota policy priority {name!r}"}
            for name, value in sorted(policy.priorities.items(), key=lambda kv: (-kv[1], kv[0]))]


def volcano_objects(policy: QuotaPolicy) -> list[dict]:
    return [*team_namespaces(policy), *priority_classes(policy), *(queue(policy, t) for t in policy.teams)]


def queue_for_namespace(policy: QuotaPolicy, namespace: str) -> str | None:
    """The Volcano Queue of the team owning `namespace` (None: not under the policy)."""
    return policy.team_of_namespace(namespace)
