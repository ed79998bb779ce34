"""NVIDIA KAI Scheduler: a PodGroup scheduling.run.ai/v2alpha2, pods with schedulerName kai-scheduler.

Pods join the group by the annotation `pod-group-name` (KAI's podgrouper is not run: it would regroup
gangctl's pods by their owner). KAI's scheduler allocates a PodGroup only when `minMember` of its pods
fit at once and its queue's quota, limit and fair share allow it, and preempts (within a queue, by
priority) or reclaims (between queues, back to their quota) to make room; its binder binds the pods.

The queue is the runtime's `podGroupPolicy.kai.queue`; else, under a quota policy, the team's leaf
queue (see `queue_for_namespace`: the controller names it through the gang settings); else `default-queue`. The priority class is `podGroupPolicy.kai.priorityClassName`,
else the pod template's `priorityClassName`. `preemptibility` defaults to preemptible: KAI would
otherwise infer it from the priority value (below 100 preemptible), and a non-preemptible gang may
never run on another queue's idle quota.

Quota (`gangctl policy apply --backend kai`, `kai_objects`): a quota policy (`policies/*.yaml`) as
KAI Scheduler Queues. KAI schedules only into leaf queues that have a parent, so a policy becomes a two-level tree of
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

from gangctl.api.pytorchjob import SchedulingPolicy
from gangctl.api.resources import Resource
from gangctl.plugins.base import group_object, group_priority_class, min_member, queued_settings
from gangctl.model.gang import Gang
from gangctl.model.resolve import ResolvedJob
from gangctl.model.quota import QuotaPolicy, Team
from gangctl.model.topology import PlacementIntent, Topology
from gangctl.plugins.quota_objects import MANAGED, TEAM_LABEL, priority_classes, team_namespaces

KAI_POD_GROUPS = Resource("scheduling.run.ai", "v2alpha2", "podgroups", "PodGroup")
KAI_QUEUES = Resource("scheduling.run.ai", "v2", "queues", "Queue", namespaced=False)
GROUP_NAME_ANNOTATION = "pod-group-name"
SCHEDULER_NAME = "kai-scheduler"
DEFAULT_QUEUE = "default-queue"
PREEMPTIBLE = "preemptible"

# KAI's PodGroup condition types (status.schedulingConditions[].type).
UNSCHEDULABLE_ON_NODE_POOL = "UnschedulableOnNodePool"
# Its reasons that name the queue (scheduling.run.ai/v2alpha2 UnschedulableReason).
QUOTA_REASONS = ("OverLimit", "NonPreemptibleOverQuota")


class Kai:
    name = "kai"
    group_resource: Resource = KAI_POD_GROUPS
    watch: Resource = KAI_POD_GROUPS
    gated_by_gangctl = False   # its queues enforce quota (`kai_objects` writes them)
    needs_nudge = False        # the scheduler looks at every pending PodGroup each cycle
    allocates_whole = True     # allocates a PodGroup only when its queue and the nodes both hold it
    requeues_unready = False
    rejects_short_gangs = False  # allocates a gang only with room on the nodes: it never waits for them
    consolidates = True        # its consolidation action moves running preemptible gangs to make room
    setup_hint = "start the cluster with `gangctl cluster up --scheduler kai`"

    def pod_labels(self, job: ResolvedJob) -> dict[str, str]:
        return {}

    def pod_annotations(self, job: ResolvedJob) -> dict[str, str]:
        return {GROUP_NAME_ANNOTATION: job.gang_name}

    def scheduler_name(self, job: ResolvedJob, default: str) -> str | None:
        return SCHEDULER_NAME

    def queue(self, job: ResolvedJob) -> str:
        return str(job.gang_settings.get("queue") or DEFAULT_QUEUE)

    def waiting(self, observed: dict | None) -> tuple[str, str] | None:
        return why_waiting(observed)

    def group(self, job: ResolvedJob, gang: Gang, owner: dict) -> dict:
        spec: dict = {"minMember": gang.min_member, "queue": self.queue(job),
                      "preemptibility": str(job.gang_settings.get("preemptibility") or PREEMPTIBLE)}
        if (pc := group_priority_class(job)):
            spec["priorityClassName"] = pc
        return group_object(KAI_POD_GROUPS, job, owner, spec)

    def gang_floor(self, group: dict | None, job: dict) -> int:
        return min_member(group or {})

    def quota_objects(self, policy: QuotaPolicy, text: str) -> list[dict]:
        return kai_objects(policy)

    def pytorchjob_settings(self, scheduling: SchedulingPolicy) -> dict:
        return queued_settings(scheduling)

    def unexpressed(self, policy: QuotaPolicy) -> list[str]:
        return unexpressed(policy)

    def placement_spec(self, intent: PlacementIntent, topology: Topology) -> dict:
        return topology_constraint(intent, topology)

    def topology_objects(self, topology: Topology, nodes: list[dict]) -> list[dict]:
        return [topology_object(topology)]


def why_waiting(podgroup: dict | None) -> tuple[str, str] | None:
    """Why a gang under KAI waits, from its PodGroup's latest scheduling condition (None: nothing said).

    KAI writes one condition per node pool with `reasons` (OverLimit, NonPreemptibleOverQuota: the
    queue; anything else: no room on the nodes, or the queue's fair share) and a message."""
    conds = ((podgroup or {}).get("status") or {}).get("schedulingConditions") or []
    if not conds:
        return None
    last = max(conds, key=lambda c: str(c.get("lastTransitionTime") or ""))
    reasons = [r.get("reason") for r in last.get("reasons") or [] if r.get("reason")]
    queue = ((podgroup or {}).get("spec") or {}).get("queue") or DEFAULT_QUEUE
    message = " ".join(str(last.get("message") or "").split()) or ", ".join(reasons) or "unschedulable"
    name = podgroup["metadata"]["name"]  # type: ignore[index]
    if any(r in QUOTA_REASONS for r in reasons):
        return "WaitingForQuota", f"KAI queue {queue} has no room for PodGroup {name}: {message}"
    return "WaitingForGang", f"KAI cannot place the gang of PodGroup {name} (queue {queue}): {message}"


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
    return {"apiVersion": KAI_QUEUES.api_version, "kind": "Queue",
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


KAI_TOPOLOGY_API = "kai.scheduler/v1alpha1"


def topology_object(topology: Topology) -> dict:
    """KAI's Topology: the levels' node labels, widest first (what a PodGroup's constraint names)."""
    return {"apiVersion": KAI_TOPOLOGY_API, "kind": "Topology",
            "metadata": {"name": topology.name, "labels": dict(MANAGED)},
            "spec": {"levels": [{"nodeLabel": level.node_label} for level in topology.levels]}}


def topology_constraint(intent: PlacementIntent, topology: Topology) -> dict:
    """The PodGroup's `topologyConstraint` for `intent` (levels as node labels): KAI takes both a
    required level (the widest domain allowed) and a preferred, narrower one."""
    constraint = {"topology": topology.name}
    if intent.required is not None:
        constraint["requiredTopologyLevel"] = str(intent.required)
    if intent.preferred is not None:
        constraint["preferredTopologyLevel"] = str(intent.preferred)
    return {"topologyConstraint": constraint} if len(constraint) > 1 else {}
