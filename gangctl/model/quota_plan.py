"""One round of quota admission over the policy: pure, pending and admitted jobs in, decisions out.

`plan` runs `admission.decide` (the code the simulator runs) over the jobs that ask to be admitted
and the ones admitted, with a reason for every job that waits. An elastic gang is decided on its
floor; once admitted it also gets the nodes up to its maximum that the quota still has room for
(`grow` gives admitted gangs the room freed later), and never runs more than it was admitted with.

Both gangctl's own quota gate (gangctl.policy.quota_gate, for backends without a quota system) and
Volcano's priority preemption (gangctl.plugins.volcano) decide with it, so it sits below both.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from datetime import datetime
from typing import Iterable, Mapping

from gangctl.model.admission import Amount, Decision, Quotas, Verdict, Workload, decide, headroom, queue_key, usage_of
from gangctl.model.quota import QuotaPolicy


def no_team_reason(namespace: str) -> str:
    return f"namespace {namespace} is in no team of the quota policy"


def priority_value(policy: QuotaPolicy, namespace: str, priority_class: str | None) -> int:
    """A job's priority: its pods' priorityClassName if the policy names that class, else its team's
    default priority, else the policy's default (a class the policy does not know counts as none)."""
    if priority_class and priority_class in policy.priorities:
        return policy.priorities[priority_class]
    team = policy.team_of_namespace(namespace)
    return policy.priority_of(team) if team else policy.priorities[policy.default_priority]


def timestamp(value: str) -> float:
    """An RFC 3339 time (metadata.creationTimestamp, admittedAt) as epoch seconds."""
    return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()


@dataclass(frozen=True, slots=True)
class NodeRange:
    """An elastic gang's range: admitted with its floor, plus as many nodes up to `max_nodes` as the
    quota has room for then (Kueue's partial admission, the other way round)."""

    min_nodes: int
    max_nodes: int
    per_node: Mapping[str, Amount]


@dataclass(frozen=True, slots=True)
class Pending:
    """A TrainJob that asks to be admitted: `requests` is its gang floor in QUANTITY_UNITS."""

    key: str
    namespace: str
    created: float
    priority: int
    requests: Mapping[str, Amount]
    elastic: NodeRange | None = None


@dataclass(frozen=True, slots=True)
class Plan:
    decisions: list[Decision]   # ADMIT and PREEMPT, in the order to carry them out; an elastic
                                # gang's workload carries what it is admitted with (floor + surplus)
    reasons: dict[str, str]     # key -> why it waits (every pending job that is not admitted)
    nodes: dict[str, int] = field(default_factory=dict)   # key -> nodes admitted (elastic gangs)


def plan(policy: QuotaPolicy, quotas: Quotas, pending: Iterable[Pending], admitted: Iterable[Workload]) -> Plan:
    """One admission round. `quotas` is `policy.to_quotas(QUANTITY_UNITS)`."""
    admitted = list(admitted)
    queues: dict[str, list[Workload]] = {}
    reasons: dict[str, str] = {}
    for p in pending:
        team = policy.team_of_namespace(p.namespace)
        if team is None:
            reasons[p.key] = no_team_reason(p.namespace)
            continue
        queues.setdefault(team, []).append(Workload(p.key, team, p.priority, p.created, p.requests))
    for queue in queues.values():
        queue.sort(key=queue_key)
    by_team: dict[str, list[Workload]] = {}
    for w in admitted:
        by_team.setdefault(w.team, []).append(w)
    decisions = decide(quotas, usage_of(admitted), queues, by_team if quotas.preemption_enabled else None)
    heads: dict[str, str] = {}
    out: list[Decision] = []
    for d in decisions:
        if d.verdict is Verdict.WAIT:
            reasons[d.workload.id] = d.reason
            heads.setdefault(d.workload.team, d.workload.id)
        else:
            out.append(d)
    decided = {d.workload.id for d in decisions}
    for team, queue in queues.items():
        for w in queue:
            if w.id not in decided:  # StrictFIFO: behind its team's first blocked job, not examined
                reasons[w.id] = f"queued behind {heads.get(team, 'an earlier job')} in team {team}'s StrictFIFO queue"
    out, nodes = _grow_elastic(quotas, out, admitted, {p.key: p.elastic for p in pending if p.elastic})
    return Plan(out, reasons, nodes)


def _grow_elastic(quotas: Quotas, decisions: list[Decision], admitted: list[Workload],
                  elastic: Mapping[str, NodeRange]) -> tuple[list[Decision], dict[str, int]]:
    """Give each admitted elastic gang, in decision order, the nodes above its floor that the quota
    still has room for once every decision of the round is charged. What it is admitted with is
    what it may run: the controller never grows it past that (no quota is taken unseen)."""
    if not elastic:
        return decisions, {}
    evicted = {v.id for d in decisions for v in d.victims}
    usage = usage_of([*(w for w in admitted if w.id not in evicted), *(d.workload for d in decisions)])
    out: list[Decision] = []
    nodes: dict[str, int] = {}
    for d in decisions:
        e = elastic.get(d.workload.id)
        if e is None:
            out.append(d)
            continue
        n = nodes[d.workload.id] = _take_room(quotas, usage, d.workload.team, e, e.min_nodes)
        requests = {r: amount * n for r, amount in e.per_node.items()}
        out.append(dataclasses.replace(d, workload=dataclasses.replace(d.workload, requests=requests)))
    return out, nodes


@dataclass(frozen=True, slots=True)
class Growable:
    """An admitted elastic gang below its maximum: `workload` as charged now, `nodes` admitted."""

    workload: Workload
    nodes: int
    range: NodeRange


def grow(quotas: Quotas, admitted: Iterable[Workload], growable: Iterable[Growable],
         waiting_teams: set[str]) -> dict[str, int]:
    """Admitted elastic gangs take the room their team's quota has now (as the simulator's elastic
    jobs do), highest priority then earliest admitted first, only in teams where no job waits for
    admission (a waiting job comes first). key -> the nodes it is admitted with from now on."""
    usage = usage_of(admitted)
    out: dict[str, int] = {}
    for g in sorted(growable, key=lambda g: queue_key(g.workload)):
        if g.workload.team in waiting_teams:
            continue
        n = _take_room(quotas, usage, g.workload.team, g.range, g.nodes)
        if n > g.nodes:
            out[g.workload.id] = n
    return out


def _take_room(quotas: Quotas, usage: dict[str, dict[str, Amount]], team: str, e: NodeRange, nodes: int) -> int:
    """The most nodes (from `nodes` up to `e.max_nodes`) the team's room allows; charges the extra."""
    room = headroom(quotas, usage, team)
    extra = e.max_nodes - nodes
    for r, amount in e.per_node.items():
        if amount and r in room:
            extra = min(extra, int(room[r] // amount))
    extra = max(0, extra)
    team_usage = usage.setdefault(team, {})
    for r, amount in e.per_node.items():
        team_usage[r] = team_usage.get(r, 0) + amount * extra
    return nodes + extra
