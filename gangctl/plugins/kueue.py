"""Kueue: the child Job carries `kueue.x-k8s.io/queue-name` and is created suspended; no PodGroup.

Kueue's batch/job integration makes a Workload of the Job (one pod set, `parallelism` pods, the pod
template's requests), admits it against the LocalQueue's ClusterQueue and unsuspends the Job. With
`waitForPodsReady` enabled (gangctl's local cluster does) a Job whose pods do not all become ready
in time is suspended again and requeued: all-or-nothing at pod level. An elastic gang sets
`kueue.x-k8s.io/job-min-parallelism` so Kueue may admit it partially, down to `minNodes`.

Because Kueue flips `spec.suspend`, gangctl sets it only when it creates the Job
(`controls_suspend`); after that the field is Kueue's. A PyTorchJob is Kueue's own kind: its
`kubeflow.org/pytorchjob` integration makes the Workload of the PyTorchJob (a pod set per replica
type) and flips its `runPolicy.suspend`, so gangctl's Jobs for it carry no Kueue label
(`gangctl.policy.decide_pytorchjob`). The LocalQueue is the runtime's
`podGroupPolicy.kueue.queueName`, else `default` (the LocalQueue `gangctl policy apply` creates in
each team namespace). Priority: the `kueue.x-k8s.io/priority-class` label, from
`podGroupPolicy.kueue.priorityClassName` when set.

Quota (`gangctl policy apply --backend kueue`, `kueue_objects`): a quota policy (`policies/*.yaml`)
as Kueue objects, all kueue.x-k8s.io/v1beta2 (Kueue >= v0.15; v1beta1 is deprecated there). One team =
one ClusterQueue with one resource group over one ResourceFlavor, a LocalQueue named `default` in each
of the team's namespaces, one Cohort per cohort name, one WorkloadPriorityClass per priority. Names are
the policy's own.

How the policy's fields map:

| policy | Kueue |
|---|---|
| `nominal.{gpu,cpu,memory}` | `resourceGroups[0].flavors[0].resources[].nominalQuota` |
| `borrowingLimit` / `lendingLimit` | `borrowingLimit` / `lendingLimit` of the same resource |
| `cohort` | `spec.cohortName` (v1beta1's `spec.cohort`; and a `Cohort` object) |
| `queueing` | `spec.queueingStrategy` |
| `preemption.withinTeam` / `reclaimWithinCohort` | `spec.preemption.withinClusterQueue` / `reclaimWithinCohort` |
| `namespaces` | `spec.namespaceSelector` on `kubernetes.io/metadata.name`, and the LocalQueues |
| `priorities` | `WorkloadPriorityClass` objects |

A resource a team leaves out is "not limited" in the policy, but Kueue refuses a workload that
requests a resource its ClusterQueue does not cover. Such a resource is covered with
`UNLIMITED` nominal quota and `lendingLimit: 0`, so the team is not limited and lends no phantom
capacity to its cohort.

Team `defaultPriority` has no Kueue field (Kueue takes the priority from the job's
`kueue.x-k8s.io/priority-class` label): the backend builder sets that label, from `priority_label`.
"""
from __future__ import annotations

from gangctl.api.pytorchjob import SchedulingPolicy
from gangctl.api.resources import Resource
from gangctl.model.gang import Gang
from gangctl.model.resolve import ResolvedJob
from gangctl.plugins.base import scheduling_priority
from gangctl.model.quota import QuotaPolicy, Resources, Team
from gangctl.model.topology import (KUEUE_PREFERRED, KUEUE_REQUIRED, KUEUE_SLICE_REQUIRED, KUEUE_SLICE_SIZE,
                                    PlacementIntent, Topology)
from gangctl.plugins.quota_objects import MANAGED, RESOURCES, TEAM_LABEL, quantity, team_namespaces

GROUP = "kueue.x-k8s.io"
QUEUE_LABEL = f"{GROUP}/queue-name"
PRIORITY_LABEL = f"{GROUP}/priority-class"
MIN_PARALLELISM_ANNOTATION = f"{GROUP}/job-min-parallelism"
JOB_UID_LABEL = f"{GROUP}/job-uid"  # on the Workload Kueue makes for a Job: that Job's uid
DEFAULT_LOCAL_QUEUE = "default"
WORKLOADS = Resource(GROUP, "v1beta2", "workloads", "Workload")
# Workload conditions, in the order a Workload goes through them.
QUOTA_RESERVED, ADMITTED, PODS_READY, EVICTED, FINISHED = "QuotaReserved", "Admitted", "PodsReady", "Evicted", "Finished"


class Kueue:
    name = "kueue"
    group_resource: Resource | None = None  # the Workload is Kueue's, made from the Job
    watch: Resource = WORKLOADS
    controls_suspend = True
    gated_by_gangctl = False   # Kueue admits against its ClusterQueues
    needs_nudge = False        # Kueue retries on quota changes; no group object to touch
    allocates_whole = False    # admits on quota alone; the admitted Job holds it while its pods wait for nodes
    requeues_unready = True    # waitForPodsReady: a Job whose pods are not all ready in time is suspended, requeued
    admits_one_until_ready = True  # waitForPodsReady.blockAdmission (gangctl's configuration): one at a time
    allocates_whole_with_topology = True  # TAS: a flavor with a topology admits only what its nodes hold now
    rejects_short_gangs = False  # the admitted Job's pods go to kube-scheduler one by one
    setup_hint = "start the cluster with `gangctl cluster up --scheduler kueue`"

    def queue_name(self, job: ResolvedJob) -> str:
        return str(job.gang_settings.get("queueName") or DEFAULT_LOCAL_QUEUE)

    def pod_labels(self, job: ResolvedJob) -> dict[str, str]:
        return {}

    def pod_annotations(self, job: ResolvedJob) -> dict[str, str]:
        return {}

    def scheduler_name(self, job: ResolvedJob, default: str) -> str | None:
        # Kueue admits; any scheduler binds. The default one places the admitted pods.
        return None

    def group(self, job: ResolvedJob, gang: Gang, owner: dict) -> None:
        return None

    def waiting(self, observed: dict | None) -> tuple[str, str] | None:
        return why_waiting(observed)  # observed: the gang's Workload

    def watched_selector(self, job_uid: str) -> dict[str, str]:
        return {JOB_UID_LABEL: job_uid}  # the Workload Kueue made of the Job (or of the PyTorchJob)

    def job_labels(self, job: ResolvedJob, gang: Gang) -> dict[str, str]:
        labels = {QUEUE_LABEL: self.queue_name(job)}
        if (pc := job.gang_settings.get("priorityClassName")):
            labels[PRIORITY_LABEL] = str(pc)
        return labels

    def job_annotations(self, job: ResolvedJob, gang: Gang) -> dict[str, str]:
        if gang.min_member < gang.size:
            return {MIN_PARALLELISM_ANNOTATION: str(gang.min_member)}
        return {}

    def gang_floor(self, group: dict | None, job: dict) -> int:
        # Kueue's Workload of the Job: parallelism pods, or down to job-min-parallelism (partial admission)
        meta_annotations = job["metadata"].get("annotations") or {}
        return int(meta_annotations.get(MIN_PARALLELISM_ANNOTATION) or job["spec"]["parallelism"])

    def quota_objects(self, policy: QuotaPolicy, text: str) -> list[dict]:
        return kueue_objects(policy)

    def unexpressed(self, policy: QuotaPolicy) -> list[str]:
        if policy.topology is not None and not policy.topology.node_labels:
            return [f"topology {policy.topology.name}: Kueue ties a ResourceFlavor to a Topology only with "
                    f"nodeLabels; add topology.nodeLabels (a label every node of the topology carries) so the "
                    f"flavor gets topologyName {policy.topology.name}"]
        return []

    def placement_annotations(self, intent: PlacementIntent) -> dict[str, str]:
        return topology_annotations(intent)

    def topology_objects(self, topology: Topology, nodes: list[dict]) -> list[dict]:
        return [topology_object(topology)]

    def pytorchjob_settings(self, scheduling: SchedulingPolicy) -> dict:
        return scheduling_priority(scheduling)   # the LocalQueue is the job's queue-name label


def workload_state(workload: dict | None) -> str:
    """One word for a Workload: Pending, QuotaReserved, Admitted, Running (PodsReady), Evicted, Finished."""
    if not workload:
        return "Pending"
    conds = {c["type"]: c.get("status") == "True" for c in (workload.get("status") or {}).get("conditions") or []}
    for name, word in ((FINISHED, "Finished"), (EVICTED, "Evicted"), (PODS_READY, "Running"),
                       (ADMITTED, "Admitted"), (QUOTA_RESERVED, "QuotaReserved")):
        if conds.get(name):
            return word
    return "Pending"


def _condition(workload: dict, ctype: str) -> dict:
    return next((c for c in (workload.get("status") or {}).get("conditions") or [] if c.get("type") == ctype), {})


def why_waiting(workload: dict | None) -> tuple[str, str] | None:
    """Why a gang under Kueue waits, from its Workload (None: nothing beyond "not all pods bound")."""
    state = workload_state(workload)
    if workload is None:
        return "WaitingForQuota", "Kueue has not made a Workload for the Job yet"
    queue = (workload.get("spec") or {}).get("queueName") or DEFAULT_LOCAL_QUEUE
    if state == "Evicted":
        c = _condition(workload, EVICTED)
        return ("Evicted", f"Kueue evicted the workload ({c.get('reason', 'Evicted')}: {c.get('message', '')}); "
                           f"it is requeued in LocalQueue {queue} and starts again when admitted")
    if state == "Pending":
        c = _condition(workload, QUOTA_RESERVED)
        said = c.get("message") or "not evaluated yet"
        return "WaitingForQuota", f"Kueue has not admitted it in LocalQueue {queue}: {said}"
    return None


V1BETA2 = f"{GROUP}/v1beta2"   # every Kueue object gangctl writes (the storage version since v0.15)
FLAVOR = "default-flavor"
UNLIMITED = {"gpu": "1M", "cpu": "1M", "memory": "1Ei"}


def covered_resources(policy: QuotaPolicy) -> list[tuple[str, str]]:
    """Every resource a policy can name (GPUs, CPU, memory, in that order): each ClusterQueue covers
    all of them, the ones a team leaves out unlimited. Kueue admits no workload that requests a
    resource its ClusterQueue does not cover, so a policy of GPUs alone would otherwise turn away
    every pod that asks for CPU or memory, where the policy means them unlimited."""
    return list(RESOURCES)


def _limit(limits: Resources | None, field: str) -> float | None:
    return getattr(limits, field) if limits is not None else None


def _resource_quota(team: Team, field: str, name: str) -> dict:
    nominal = getattr(team.nominal, field)
    if nominal is None:
        return {"name": name, "nominalQuota": UNLIMITED[field],
                **({"lendingLimit": "0"} if team.cohort else {})}
    out: dict = {"name": name, "nominalQuota": quantity(field, nominal)}
    borrow, lend = _limit(team.borrowing_limit, field), _limit(team.lending_limit, field)
    if borrow is not None:
        out["borrowingLimit"] = quantity(field, borrow)
    if lend is not None:
        out["lendingLimit"] = quantity(field, lend)
    return out


def _meta(name: str, namespace: str | None = None, team: str | None = None) -> dict:
    labels = dict(MANAGED)
    if team:
        labels[TEAM_LABEL] = team
    meta: dict = {"name": name, "labels": labels}
    if namespace:
        meta["namespace"] = namespace
    return meta


def resource_flavor(topology: Topology | None = None) -> dict:
    """The one flavor; with a topology that names its nodes' labels, a Topology Aware Scheduling
    flavor (Kueue requires nodeLabels beside topologyName)."""
    spec: dict = {}
    if topology is not None and topology.node_labels:
        spec = {"nodeLabels": dict(topology.node_labels), "topologyName": topology.name}
    return {"apiVersion": V1BETA2, "kind": "ResourceFlavor", "metadata": _meta(FLAVOR), "spec": spec}


def topology_object(topology: Topology) -> dict:
    """Kueue's Topology: the levels' node labels, widest first (what ResourceFlavor.topologyName names)."""
    return {"apiVersion": V1BETA2, "kind": "Topology", "metadata": _meta(topology.name),
            "spec": {"levels": [{"nodeLabel": level.node_label} for level in topology.levels]}}


def topology_annotations(intent: PlacementIntent) -> dict[str, str]:
    """Kueue's pod set annotations for `intent` (levels as node labels). Kueue takes one of required
    and preferred: required wins, since Kueue already packs a required pod set as narrowly as it can."""
    out: dict[str, str] = {}
    if intent.required is not None:
        out[KUEUE_REQUIRED] = str(intent.required)
    elif intent.preferred is not None:
        out[KUEUE_PREFERRED] = str(intent.preferred)
    if intent.slice_level is not None and intent.slice_size is not None:
        out[KUEUE_SLICE_REQUIRED] = intent.slice_level
        out[KUEUE_SLICE_SIZE] = str(intent.slice_size)
    return out


def cluster_queue(policy: QuotaPolicy, team: Team) -> dict:
    covered = covered_resources(policy)
    spec: dict = {
        "namespaceSelector": {"matchExpressions": [
            {"key": "kubernetes.io/metadata.name", "operator": "In", "values": list(team.namespaces or [team.name])}]},
        "queueingStrategy": team.queueing,
        "resourceGroups": [{
            "coveredResources": [r for _, r in covered],
            "flavors": [{"name": FLAVOR, "resources": [_resource_quota(team, f, r) for f, r in covered]}],
        }],
        "preemption": {
            "withinClusterQueue": team.preemption.within_team,
            "reclaimWithinCohort": team.preemption.reclaim_within_cohort.value,
        },
    }
    if team.cohort:
        spec["cohortName"] = team.cohort
    return {"apiVersion": V1BETA2, "kind": "ClusterQueue", "metadata": _meta(team.name, team=team.name), "spec": spec}


def local_queues(team: Team) -> list[dict]:
    return [{"apiVersion": V1BETA2, "kind": "LocalQueue", "metadata": _meta(DEFAULT_LOCAL_QUEUE, ns, team.name),
             "spec": {"clusterQueue": team.name}} for ns in team.namespaces or [team.name]]


def cohorts(policy: QuotaPolicy) -> list[dict]:
    names = sorted({t.cohort for t in policy.teams if t.cohort})
    return [{"apiVersion": V1BETA2, "kind": "Cohort", "metadata": _meta(n), "spec": {}} for n in names]


def workload_priority_classes(policy: QuotaPolicy) -> list[dict]:
    return [{"apiVersion": V1BETA2, "kind": "WorkloadPriorityClass", "metadata": _meta(name),
             "value": value, "description": f"gangctl quota policy priority {name!r}"}
            for name, value in sorted(policy.priorities.items(), key=lambda kv: (-kv[1], kv[0]))]


def kueue_objects(policy: QuotaPolicy) -> list[dict]:
    """Everything the policy needs in Kueue, in an order that applies cleanly (referenced first)."""
    return [*team_namespaces(policy), resource_flavor(policy.topology), *workload_priority_classes(policy), *cohorts(policy),
            *(cluster_queue(policy, t) for t in policy.teams),
            *(q for t in policy.teams for q in local_queues(t))]


def priority_label(policy: QuotaPolicy, namespace: str, priority_class: str | None = None) -> str | None:
    """The WorkloadPriorityClass a job in `namespace` gets: its own class, else its team's default."""
    if priority_class:
        return priority_class
    team = next((t for t in policy.teams if namespace in (t.namespaces or [t.name])), None)
    if team is None:
        return None
    return team.default_priority or policy.default_priority
