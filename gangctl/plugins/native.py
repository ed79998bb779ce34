"""Kubernetes' own gang scheduling: a PodGroup scheduling.k8s.io/v1alpha2 and pods that name it.

KEP-4671 (Workload-aware scheduling), as Kubernetes 1.36 serves it behind the GenericWorkload and
GangScheduling feature gates: a standalone PodGroup with `schedulingPolicy.gang.minCount`, and each
pod joins it by `spec.schedulingGroup.podGroupName` (immutable; the group may be created after the
pod). kube-scheduler's GangScheduling plugin keeps a group's pods out of the queue until minCount of
them exist (PreEnqueue) and binds them together or not at all (Permit, waiting up to five minutes),
and sets the PodGroup's `PodGroupScheduled` condition.

The PodGroup spec is immutable, so the group is created once per TrainJob (an elastic job's floor is
its minCount: the members above it are scheduled one by one as they fit), and its Job keeps its size.
The alpha has no quota and no gang timeout of its own: gangctl's quota gate admits native gangs in the namespaces a policy
names (as for coscheduling), and reports a gang that cannot be placed with the scheduler's words.
"""
from __future__ import annotations

from gangctl.api.pytorchjob import SchedulingPolicy
from gangctl.api.resources import NATIVE_POD_GROUPS, Resource
from gangctl.plugins.base import group_object, scheduling_priority
from gangctl.plugins.coscheduling import coscheduling_objects
from gangctl.model.gang import Gang
from gangctl.model.quota import QuotaPolicy
from gangctl.model.resolve import ResolvedJob
from gangctl.model.topology import PlacementIntent, Topology

SCHEDULED = "PodGroupScheduled"


class Native:
    name = "native"
    group_resource: Resource = NATIVE_POD_GROUPS
    watch: Resource = NATIVE_POD_GROUPS
    gated_by_gangctl = True   # no quota system of its own: gangctl's quota gate admits
    needs_nudge = False       # the scheduler retries on pod and node events; a PodGroup cannot be touched
    allocates_whole = False   # the gate admits on quota alone; the admitted gang then waits for nodes
    requeues_unready = False
    rejects_short_gangs = False  # no PreFilter on the gang's sum: tried again as pods leave a node
    setup_hint = "check the API server"
    # Kubernetes 1.36 admission refuses a change of parallelism of a Job whose pods name a gang PodGroup
    # (kubernetes/kubernetes#140112): an elastic gang keeps its Job's size; above the floor (minCount)
    # its pods are scheduled as they fit, and a lost member's replacement waits until one fits.
    resizes_jobs = False

    def pod_labels(self, job: ResolvedJob) -> dict[str, str]:
        return {}

    def pod_annotations(self, job: ResolvedJob) -> dict[str, str]:
        return {}

    def pod_spec(self, job: ResolvedJob) -> dict:
        return {"schedulingGroup": {"podGroupName": job.gang_name}}

    def scheduler_name(self, job: ResolvedJob, default: str) -> str | None:
        return str(job.gang_settings.get("schedulerName") or default)

    def waiting(self, observed: dict | None) -> tuple[str, str] | None:
        return why_waiting(observed)

    def group(self, job: ResolvedJob, gang: Gang, owner: dict) -> dict:
        return group_object(NATIVE_POD_GROUPS, job, owner, {"schedulingPolicy": {"gang": {"minCount": gang.min_member}}})

    def gang_floor(self, group: dict | None, job: dict) -> int:
        return int((group or {})["spec"]["schedulingPolicy"]["gang"]["minCount"])

    def quota_objects(self, policy: QuotaPolicy, text: str) -> list[dict]:
        return coscheduling_objects(policy, text)   # gangctl's gate admits, as for coscheduling

    def pytorchjob_settings(self, scheduling: SchedulingPolicy) -> dict:
        return scheduling_priority(scheduling)

    def placement_spec(self, intent: PlacementIntent, topology: Topology) -> dict:
        return scheduling_constraints(intent)


def scheduling_constraints(intent: PlacementIntent) -> dict:
    """The PodGroup's `schedulingConstraints.topology` for `intent` (levels as node labels): the
    alpha takes one required key and has no preferred mode, so a preferred level is gangctl's own
    placement to make (not here: {})."""
    if intent.required is None:
        return {}
    return {"schedulingConstraints": {"topology": [{"key": str(intent.required)}]}}


def why_waiting(podgroup: dict | None) -> tuple[str, str] | None:
    """Why the gang waits, from its PodGroup's PodGroupScheduled condition (None: nothing said)."""
    for cond in ((podgroup or {}).get("status") or {}).get("conditions") or []:
        if cond.get("type") == SCHEDULED and cond.get("status") == "False":
            return ("WaitingForGang", f"kube-scheduler cannot place the gang of PodGroup "
                                      f"{podgroup['metadata']['name']} ({cond.get('reason') or 'Unschedulable'})"  # type: ignore[index]
                                      + (f": {cond['message']}" if cond.get("message") else ""))
    return None
