"""NVIDIA KAI Scheduler: a PodGroup scheduling.run.ai/v2alpha2, pods with schedulerName kai-scheduler.

Pods join the group by the annotation `pod-group-name` (KAI's podgrouper is not run: it would regroup
gangctl's pods by their owner). KAI's scheduler allocates a PodGroup only when `minMember` of its pods
fit at once and its queue's quota, limit and fair share allow it, and preempts (within a queue, by
priority) or reclaims (between queues, back to their quota) to make room; its binder binds the pods.

The queue is the runtime's `podGroupPolicy.kai.queue`; else, under a quota policy, the team's leaf
queue (see gangctl.policy.quota_kai.queue_for_namespace: the controller names it through the
gang settings); else `default-queue`. The priority class is `podGroupPolicy.kai.priorityClassName`,
else the pod template's `priorityClassName`. `preemptibility` defaults to preemptible: KAI would
otherwise infer it from the priority value (below 100 preemptible), and a non-preemptible gang may
never run on another queue's idle quota.
"""
from __future__ import annotations

from gangctl.api.resources import Resource
from gangctl.plugins.base import group_object, group_priority_class
from gangctl.model.gang import Gang
from gangctl.model.resolve import ResolvedJob

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
    gated_by_gangctl = False   # its queues enforce quota (gangctl.policy.quota_kai writes them)
    needs_nudge = False        # the scheduler looks at every pending PodGroup each cycle

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
