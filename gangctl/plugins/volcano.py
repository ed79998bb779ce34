"""Volcano: a PodGroup scheduling.volcano.sh/v1beta1, pods with schedulerName volcano.

Pods join the group by the annotation `scheduling.k8s.io/group-name`. Volcano's enqueue action moves
the PodGroup Pending -> Inqueue when its queue has room for `minResources`; the gang plugin then
binds `minMember` pods together or none. `minTaskMember` counts pods per task, and Volcano reads a
pod's task from the annotation `volcano.sh/task-spec`, so the trainer's pods carry `node`.

The queue is the runtime's `podGroupPolicy.volcano.queue`, else `default` (the queue Volcano
creates); with a quota policy applied, each team has a Queue named after it (see
`queue_for_namespace`). The priority class is
`podGroupPolicy.volcano.priorityClassName`, else the pod template's `priorityClassName`.

Quota (`gangctl policy apply --backend volcano`, `volcano_objects`): a quota policy
(`policies/*.yaml`) as Volcano Queues. One team = one `scheduling.volcano.sh/v1beta1` Queue named after the team. Volcano has no cohorts
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

Priority preemption (`preemptions`), which gangctl must do for Volcano: decided by the quota
policy, PodGroups in, victims out. Volcano v1.10 cannot do what a policy's `preemption` asks on its own: the capacity plugin keeps a
higher-priority PodGroup Pending while its queue's capability is used up, and Volcano's preempt
action only considers PodGroups that are already Inqueue, so the urgent job waits behind the batch
job it was meant to displace. gangctl fills the gap with the code its coscheduling admission and
the simulator run (`gangctl.model.quota_plan.plan`, i.e. `admission.decide`):

- a PodGroup Inqueue, Running or Unknown holds its `minResources` of its team's quota (admitted);
- a PodGroup Pending, or not yet seen by Volcano, waits in its team's queue;
- only the PREEMPT decisions are returned: admitting is Volcano's work (its queues carry the same
  limits, see `volcano_objects`), evicting for priority is gangctl's. The caller evicts the victims'
  gangs and lets them queue again; Volcano's enqueue then orders the queue by priority.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Iterable, Mapping

from gangctl.api.pytorchjob import SchedulingPolicy
from gangctl.api.quantity import format_quantity, parse_quantity
from gangctl.api.resources import Resource
from gangctl.model.admission import Amount, Decision, Quotas, Verdict, Workload
from gangctl.model.gang import Gang
from gangctl.model.quota import QuotaPolicy, Team
from gangctl.model.quota_plan import Pending, plan, priority_value, timestamp
from gangctl.model.resolve import ResolvedJob
from gangctl.model.topology import PlacementIntent, Topology
from gangctl.plugins.base import group_object, group_priority_class, min_member, queued_settings
from gangctl.plugins.quota_objects import (MANAGED, RESOURCES, TEAM_LABEL, priority_classes, quantity, stored_policy,
                                           team_namespaces)

VOLCANO_POD_GROUPS = Resource("scheduling.volcano.sh", "v1beta1", "podgroups", "PodGroup")
VOLCANO_QUEUES = Resource("scheduling.volcano.sh", "v1beta1", "queues", "Queue", namespaced=False)
GROUP_NAME_ANNOTATION = "scheduling.k8s.io/group-name"
TASK_SPEC_ANNOTATION = "volcano.sh/task-spec"
SCHEDULER_NAME = "volcano"
DEFAULT_QUEUE = "default"
TASK = "node"  # the trainer's replicated job: the only task of the gang

# PodGroup phases (status.phase); Inqueue means admitted by the queue, pods may now be bound.
PENDING, INQUEUE, RUNNING = "Pending", "Inqueue", "Running"


class Volcano:
    name = "volcano"
    group_resource: Resource = VOLCANO_POD_GROUPS
    watch: Resource = VOLCANO_POD_GROUPS
    gated_by_gangctl = False   # its queues enforce quota (`volcano_objects` writes them)
    needs_nudge = False        # the scheduler retries every pending PodGroup each session
    allocates_whole = True     # enqueue admits a PodGroup only when its queue has room: a waiting gang holds no quota
    requeues_unready = False
    rejects_short_gangs = False  # enqueue takes a gang only with room on the nodes: it never waits for them
    topology_from_nodes = True   # its HyperNodes name the nodes: `policy apply` lists them for a topology
    setup_hint = "start the cluster with `gangctl cluster up --scheduler volcano`"

    def pod_labels(self, job: ResolvedJob) -> dict[str, str]:
        return {}

    def pod_annotations(self, job: ResolvedJob) -> dict[str, str]:
        return {GROUP_NAME_ANNOTATION: job.gang_name, TASK_SPEC_ANNOTATION: TASK}

    def scheduler_name(self, job: ResolvedJob, default: str) -> str | None:
        return SCHEDULER_NAME

    def queue(self, job: ResolvedJob) -> str:
        return str(job.gang_settings.get("queue") or DEFAULT_QUEUE)

    def waiting(self, observed: dict | None) -> tuple[str, str] | None:
        return why_waiting(observed)  # observed: the gang's PodGroup

    def group(self, job: ResolvedJob, gang: Gang, owner: dict) -> dict:
        spec: dict = {
            "minMember": gang.min_member,
            "minTaskMember": {TASK: gang.min_member},
            "minResources": {k: format_quantity(v) for k, v in sorted(gang.min_resources.items())},
            "queue": self.queue(job),
        }
        if (pc := group_priority_class(job)):
            spec["priorityClassName"] = pc
        if job.gang_settings.get("networkTopology"):
            # As Trainer: Volcano v1.11+ places the gang within the tiers it allows. (The local
            # cluster's Volcano v1.10 has no such field; its API server drops it.)
            spec["networkTopology"] = dict(job.gang_settings["networkTopology"])
        return group_object(VOLCANO_POD_GROUPS, job, owner, spec)

    def gang_floor(self, group: dict | None, job: dict) -> int:
        return min_member(group or {})

    def quota_objects(self, policy: QuotaPolicy, text: str) -> list[dict]:
        # The policy is stored too: gangctl preempts for priority by it (`preemptions`).
        return [*volcano_objects(policy), *stored_policy(text)]

    def pytorchjob_settings(self, scheduling: SchedulingPolicy) -> dict:
        return queued_settings(scheduling)

    def placement_spec(self, intent: PlacementIntent, topology: Topology) -> dict:
        return network_topology(intent, topology)

    def topology_objects(self, topology: Topology, nodes: list[dict]) -> list[dict]:
        return hypernodes(topology, nodes)


def podgroup_phase(podgroup: dict | None) -> str | None:
    """The observed phase of a Volcano PodGroup (None: not created or not yet seen by Volcano)."""
    return ((podgroup or {}).get("status") or {}).get("phase")


def why_waiting(podgroup: dict | None) -> tuple[str, str] | None:
    """Why a gang under Volcano waits, from its PodGroup (None: nothing beyond "not all pods bound")."""
    if not podgroup:
        return None
    phase = podgroup_phase(podgroup)
    conds = [c for c in (podgroup.get("status") or {}).get("conditions") or []
             if c.get("type") == "Unschedulable" and c.get("status") == "True"]
    said = f": {conds[-1].get('message')}" if conds and conds[-1].get("message") else ""
    queue = (podgroup.get("spec") or {}).get("queue") or DEFAULT_QUEUE
    if phase in (None, PENDING):
        need = ", ".join(f"{v} {k}" for k, v in sorted(((podgroup.get("spec") or {}).get("minResources") or {}).items()))
        return ("WaitingForQuota",
                f"Volcano queue {queue} has not admitted PodGroup {podgroup['metadata']['name']} (phase "
                f"{phase or 'not yet seen'}): the queue's capability or deserved share has no room for its "
                f"minResources ({need or 'none'}){said}")
    if phase == INQUEUE and said:
        return "WaitingForGang", f"admitted by Volcano queue {queue}; the gang is not placed yet{said}"
    return None


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


def team_queue(policy: QuotaPolicy, team: Team) -> dict:
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
    return {"apiVersion": VOLCANO_QUEUES.api_version, "kind": "Queue",
            "metadata": {"name": team.name, "labels": {**MANAGED, TEAM_LABEL: team.name}}, "spec": spec}


def volcano_objects(policy: QuotaPolicy) -> list[dict]:
    return [*team_namespaces(policy), *priority_classes(policy), *(team_queue(policy, t) for t in policy.teams)]


def queue_for_namespace(policy: QuotaPolicy, namespace: str) -> str | None:
    """The Volcano Queue of the team owning `namespace` (None: not under the policy)."""
    return policy.team_of_namespace(namespace)


ADMITTED_PHASES = frozenset({INQUEUE, RUNNING, "Unknown"})
WAITING_PHASES = frozenset({None, "", PENDING})


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


HYPERNODE_API = "topology.volcano.sh/v1alpha1"


def network_topology(intent: PlacementIntent, topology: Topology) -> dict:
    """The PodGroup's `networkTopology` for `intent` (levels as node labels): hard up to the required
    level's tier; soft (Volcano keeps the gang as low in the tiers as it can) for a preferred level.
    A level Volcano has no tier for (the host level) is required as tier 1, the narrowest it has."""
    if intent.required is not None:
        level = topology.level(str(intent.required))
        tier = topology.tier_of(level) if level is not None else None
        return {"networkTopology": {"mode": "hard", "highestTierAllowed": tier or 1}}
    if intent.preferred is not None:
        return {"networkTopology": {"mode": "soft"}}
    return {}


def _hypernode_name(topology: Topology, level: str, domain: str) -> str:
    raw = f"{topology.name}-{level}-{domain}".lower()
    return re.sub(r"[^a-z0-9.-]+", "-", raw).strip("-.")[:253]


def hypernodes(topology: Topology, nodes: list[dict]) -> list[dict]:
    """Volcano's HyperNodes for the topology: one per domain of each level above the hosts, tier 1 the
    narrowest; a tier-1 HyperNode lists its nodes by name, a higher one its HyperNodes. Nodes without
    the labels are left out (`gangctl policy validate --nodes` names them). Children come first."""
    tiered = topology.tiered
    members: dict[tuple[int, str], set[tuple[str, str]]] = {}
    for node in nodes:
        labels = (node.get("metadata") or {}).get("labels") or {}
        if any(lv.node_label not in labels for lv in tiered):
            continue
        child = ("Node", node["metadata"]["name"])
        for i in range(len(tiered) - 1, -1, -1):
            level = tiered[i]
            members.setdefault((i, labels[level.node_label]), set()).add(child)
            child = ("HyperNode", _hypernode_name(topology, level.name, labels[level.node_label]))
    out = []
    for (i, domain), children in sorted(members.items(), key=lambda kv: (-kv[0][0], kv[0][1])):
        level = tiered[i]
        out.append({"apiVersion": HYPERNODE_API, "kind": "HyperNode",
                    "metadata": {"name": _hypernode_name(topology, level.name, domain), "labels": dict(MANAGED)},
                    "spec": {"tier": topology.tier_of(level), "members": [
                        {"type": kind, "selector": {"exactMatch": {"name": name}}} for kind, name in sorted(children)]}})
    return out
