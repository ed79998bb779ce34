"""Volcano: a PodGroup scheduling.volcano.sh/v1beta1, pods with schedulerName volcano.

Pods join the group by the annotation `scheduling.k8s.io/group-name`. Volcano's enqueue action moves
the PodGroup Pending -> Inqueue when its queue has room for `minResources`; the gang plugin then
binds `minMember` pods together or none. `minTaskMember` counts pods per task, and Volcano reads a
pod's task from the annotation `volcano.sh/task-spec`, so the trainer's pods carry `node`.

The queue is the runtime's `podGroupPolicy.volcano.queue`, else `default` (the queue Volcano
creates); with a quota policy applied, each team has a Queue named after it (see
gangctl.policy.quota_volcano.queue_for_namespace). The priority class is
`podGroupPolicy.volcano.priorityClassName`, else the pod template's `priorityClassName`.
"""
from __future__ import annotations

from gangctl.api.quantity import format_quantity
from gangctl.api.resources import Resource
from gangctl.plugins.base import group_object, group_priority_class
from gangctl.model.gang import Gang
from gangctl.model.resolve import ResolvedJob

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
    gated_by_gangctl = False   # its queues enforce quota (gangctl.policy.quota_volcano writes them)
    needs_nudge = False        # the scheduler retries every pending PodGroup each session

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
