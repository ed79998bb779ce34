"""A quota policy (`policies/*.yaml`) as KAI Scheduler Queues: pure, policy in, Kubernetes objects out.

KAI schedules only into leaf queues that have a parent, so a policy becomes a two-level tree of
`scheduling.run.ai/v2` Queues:

| policy | KAI |
|---|---|
| a team | a leaf Queue named after the team (what its PodGroups name in `spec.queue`) |
| a cohort | the parent Queue `cohort-<cohort>` of its teams, its quota and limit the sum of their `nominal` |
| a team outside a cohort | its own parent Queue `team-<team>`, quota and limit its `nominal` |
| `nominal` | the leaf's `quota` (guaranteed; what reclaim gives back to it) |
| `borrowingLimit` | the leaf's `limit` = `nominal + borrowingLimit`; without one, the cohort's total caps it |
| a resource the team leaves out | `quota` and `limit` -1 (unlimited) |
| `priorities` | `scheduling.k8s.io/v1` PriorityClasses (KAI orders and preempts by the PodGroup's) |

KAI's units: GPUs, CPU in millicores, memory in megabytes (10^6 bytes; a policy's GiB are converted
and rounded down). Every queue has `overQuotaWeight` 1, so teams share idle quota evenly.

What KAI cannot say: `lendingLimit` (it lends all of a queue's idle quota and reclaims it when the
owner needs it back) and `reclaimWithinCohort` other than Any (a queue below its quota reclaims
from preemptible jobs of any priority above theirs); `queueing` (KAI orders a queue's jobs by priority, then age) and
`preemption.withinTeam: Never` have no per-queue switch either. `gangctl policy apply --backend kai`
says so for each team that sets them.
"""
from __future__ import annotations

from gangctl.model.quota import QuotaPolicy, Team
from gangctl.policy.quota_kueue import MANAGED, TEAM_LABEL, team_namespaces
from gangctl.policy.quota_volcano import priority_classes

API_VERSION = "scheduling.run.ai/v2"
UNLIMITED = -1
# Policy field -> (KAI's resource key, KAI units per policy unit).
UNITS = {"gpu": ("gpu", 1), "cpu": ("cpu", 1000), "memory": ("memory", 2**30 / 10**6)}


def parent_name(team: Team) -> str:
    return f"cohort-{team.cohort}" if team.cohort else f"team-{team.name}"


def _amount(field: str, value: float) -> float | int:
    scaled = value * UNITS[field][1]
    return int(scaled) if field == "memory" or float(scaled).is_integer() else scaled


def _resources(quota: dict[str, float | None], limit: dict[str, float | None]) -> dict:
    out = {}
    for field, (key, _) in UNITS.items():
        q, cap = quota.get(field), limit.get(field)
        out[key] = {"quota": UNLIMITED if q is None else _amount(field, q),
                    "limit": UNLIMITED if cap is None else _amount(field, cap),
                    "overQuotaWeight": 1}
    return out


def _queue(name: str, parent: str | None, resources: dict, labels: dict[str, str]) -> dict:
    spec: dict = {"displayName": name, "resources": resources}
    if parent:
        spec["parentQueue"] = parent
    return {"apiVersion": API_VERSION, "kind": "Queue",
            "metadata": {"name": name, "labels": {**MANAGED, **labels}}, "spec": spec}


def leaf_queue(policy: QuotaPolicy, team: Team) -> dict:
    quota: dict[str, float | None] = {}
    limit: dict[str, float | None] = {}
    for field in UNITS:
        nominal = getattr(team.nominal, field)
        quota[field] = nominal
        borrow = getattr(team.borrowing_limit, field) if team.borrowing_limit else None
        if nominal is None:
            limit[field] = None
        elif team.cohort is None:
            limit[field] = nominal
        else:
            limit[field] = None if borrow is None else nominal + borrow
    return _queue(team.name, parent_name(team), _resources(quota, limit), {TEAM_LABEL: team.name})


def parent_queues(policy: QuotaPolicy) -> list[dict]:
    groups: dict[str, list[Team]] = {}
    for team in policy.teams:
        groups.setdefault(parent_name(team), []).append(team)
    out = []
    for name, members in groups.items():
        total: dict[str, float | None] = {}
        for field in UNITS:
            values = [getattr(t.nominal, field) for t in members]
            total[field] = None if any(v is None for v in values) else sum(v for v in values if v is not None)
        out.append(_queue(name, None, _resources(total, total), {}))
    return out


def kai_objects(policy: QuotaPolicy) -> list[dict]:
    return [*team_namespaces(policy), *priority_classes(policy), *parent_queues(policy),
            *(leaf_queue(policy, t) for t in policy.teams)]


def queue_for_namespace(policy: QuotaPolicy, namespace: str) -> str | None:
    """The KAI leaf Queue of the team owning `namespace` (None: not under the policy)."""
    return policy.team_of_namespace(namespace)


def unexpressed(policy: QuotaPolicy) -> list[str]:
    """What the policy says that KAI's Queues cannot, one line per team and field."""
    notes = []
    for t in policy.teams:
        if t.lending_limit is not None:
            notes.append(f"team {t.name}: lendingLimit is not enforced by KAI (it lends all idle quota and "
                         "reclaims it when the team needs it back)")
        reclaim = t.preemption.reclaim_within_cohort.value
        if t.cohort and reclaim != "Any":
            notes.append(f"team {t.name}: reclaimWithinCohort {reclaim} is not enforced by KAI (a queue below its "
                         "quota reclaims from preemptible jobs of any priority above theirs)")
        if t.preemption.within_team == "Never":
            notes.append(f"team {t.name}: withinTeam Never is not enforced by KAI (it preempts lower-priority "
                         "preemptible gangs in a queue; run them non-preemptible to protect them)")
    return notes
