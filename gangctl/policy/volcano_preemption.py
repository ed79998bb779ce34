"""Priority preemption for Volcano queues, decided by the quota policy: pure, PodGroups in, victims out.

Volcano v1.10 cannot do what a policy's `preemption` asks on its own: the capacity plugin keeps a
higher-priority PodGroup Pending while its queue's capability is used up, and Volcano's preempt
action only considers PodGroups that are already Inqueue, so the urgent job waits behind the batch
job it was meant to displace. gangctl fills the gap with the code its coscheduling admission and
the simulator run (`quota_coscheduling.plan`, i.e. `admission.decide`):

- a PodGroup Inqueue, Running or Unknown holds its `minResources` of its team's quota (admitted);
- a PodGroup Pending, or not yet seen by Volcano, waits in its team's queue;
- only the PREEMPT decisions are returned: admitting is Volcano's work (its queues carry the same
  limits, see `quota_volcano`), evicting for priority is gangctl's. The caller evicts the victims'
  gangs and lets them queue again; Volcano's enqueue then orders the queue by priority.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Mapping

from gangctl.api.quantity import parse_quantity
from gangctl.model.admission import Amount, Decision, Quotas, Verdict, Workload
from gangctl.model.quota import QuotaPolicy
from gangctl.policy.quota_coscheduling import Pending, plan, priority_value, timestamp

ADMITTED_PHASES = frozenset({"Inqueue", "Running", "Unknown"})
WAITING_PHASES = frozenset({None, "", "Pending"})


@dataclass(frozen=True, slots=True)
class Group:
    """A gang's Volcano PodGroup as preemption sees it (`requests`: its minResources)."""

    key: str            # namespace/name, the TrainJob's key
    namespace: str
    phase: str | None
    priority_class: str | None
    created: float
    requests: Mapping[str, Amount]

    @classmethod
    def from_podgroup(cls, podgroup: Mapping) -> "Group":
        meta, spec = podgroup["metadata"], podgroup.get("spec") or {}
        return cls(f"{meta['namespace']}/{meta['name']}", meta["namespace"],
                   (podgroup.get("status") or {}).get("phase"), spec.get("priorityClassName"),
                   timestamp(meta["creationTimestamp"]) if meta.get("creationTimestamp") else 0.0,
                   {r: parse_quantity(str(q)) for r, q in (spec.get("minResources") or {}).items()})


def preemptions(policy: QuotaPolicy, quotas: Quotas, groups: Iterable[Group]) -> list[Decision]:
    """The evictions the policy asks for now: PREEMPT decisions, each with its victims' keys as ids.
    `quotas` is `policy.to_quotas(QUANTITY_UNITS)`. Gangs outside the policy's namespaces are ignored."""
    if not quotas.preemption_enabled:
        return []
    pending: list[Pending] = []
    admitted: list[Workload] = []
    for g in groups:
        team = policy.team_of_namespace(g.namespace)
        if team is None:
            continue
        priority = priority_value(policy, g.namespace, g.priority_class)
        if g.phase in ADMITTED_PHASES:
            admitted.append(Workload(g.key, team, priority, g.created, g.requests))
        elif g.phase in WAITING_PHASES:
            pending.append(Pending(g.key, g.namespace, g.created, priority, g.requests))
    return [d for d in plan(policy, quotas, pending, admitted).decisions if d.verdict is Verdict.PREEMPT]
