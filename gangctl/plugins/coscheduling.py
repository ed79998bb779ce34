"""scheduler-plugins Coscheduling: a PodGroup scheduling.x-k8s.io/v1alpha1 and labelled pods.

The scheduler's Permit stage holds pods until minMember of them fit, then binds them together;
PreFilter rejects a gang at once when minResources exceed what the cluster has free.
"""
from __future__ import annotations

from gangctl.api.pytorchjob import SchedulingPolicy
from gangctl.api.quantity import format_quantity
from gangctl.api.resources import POD_GROUPS, Resource
from gangctl.plugins.base import group_object, min_member, scheduling_priority
from gangctl.model.gang import Gang
from gangctl.model.quota import QuotaPolicy
from gangctl.model.resolve import ResolvedJob
from gangctl.plugins.quota_objects import priority_classes, stored_policy, team_namespaces

POD_GROUP_LABEL = "scheduling.x-k8s.io/pod-group"


class Coscheduling:
    name = "coscheduling"
    group_resource: Resource = POD_GROUPS
    watch: Resource = POD_GROUPS
    # No quota system of its own: gangctl's quota gate admits (gangctl.runtime.quota_gate).
    gated_by_gangctl = True
    # Coscheduling re-queues a rejected gang only on Pod add and PodGroup add/update events, not when
    # other pods go away: without a touch it waits for the scheduler's periodic flush (five minutes).
    needs_nudge = True
    allocates_whole = False    # the gate admits on quota alone; the admitted gang then waits for nodes
    requeues_unready = False
    rejects_short_gangs = True   # PreFilter on minResources; Permit holds the pods until minMember fit
    setup_hint = "check the API server"

    def pod_labels(self, job: ResolvedJob) -> dict[str, str]:
        return {POD_GROUP_LABEL: job.gang_name}

    def pod_annotations(self, job: ResolvedJob) -> dict[str, str]:
        return {}

    def scheduler_name(self, job: ResolvedJob, default: str) -> str | None:
        return default

    def group(self, job: ResolvedJob, gang: Gang, owner: dict) -> dict:
        return group_object(POD_GROUPS, job, owner, {
            "minMember": gang.min_member,
            "minResources": {k: format_quantity(v) for k, v in sorted(gang.min_resources.items())},
            "scheduleTimeoutSeconds": gang.schedule_timeout_seconds,
        })

    def gang_floor(self, group: dict | None, job: dict) -> int:
        return min_member(group or {})

    def quota_objects(self, policy: QuotaPolicy, text: str) -> list[dict]:
        return coscheduling_objects(policy, text)

    def pytorchjob_settings(self, scheduling: SchedulingPolicy) -> dict:
        timeout = scheduling.schedule_timeout_seconds
        return {**scheduling_priority(scheduling), **({"scheduleTimeoutSeconds": timeout} if timeout is not None else {})}


def coscheduling_objects(policy: QuotaPolicy, text: str) -> list[dict]:
    """What `policy apply` writes for a backend whose quota is gangctl's own gate: the teams'
    namespaces, a PriorityClass per policy priority (pods may name them), and the policy itself
    where the gate reads it; `text` is the policy YAML to store."""
    return [*team_namespaces(policy), *priority_classes(policy), *stored_policy(text)]
