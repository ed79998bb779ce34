"""The interface every scheduler backend implements.

A backend is pure and owns everything about itself: from the resolved job and its gang it says how
pods join the gang and which objects (a PodGroup, …) must exist; why a gang waits, in its scheduler's
words; what `gangctl policy apply` writes for a quota policy (`quota_objects`); how a PyTorchJob's
v1 scheduling policy becomes its gang settings (`pytorchjob_settings`); and what it can do, as
declared capabilities the controller and the simulator ask instead of comparing backends by name.
Adding a backend is one module, its name in gangctl.api.runtime.GANG_BACKENDS and one registry line.

The four methods of `GangBackend` are what every backend has. Backends answer the optional hooks below
where they differ from the defaults: Kueue (admission works on the child Job itself) for the Job's
labels, suspend ownership and its Workload; coscheduling (no quota system, no retry on capacity
freed) for the quota gate and the nudge. The functions here read them with their defaults, so no
caller ever compares backends by name.
"""
from __future__ import annotations

from typing import Protocol

from gangctl.api.pytorchjob import SchedulingPolicy
from gangctl.api.resources import Resource
from gangctl.model.names import MANAGED_BY, MANAGER, TRAINJOB_NAME
from gangctl.model.gang import Gang
from gangctl.model.quota import QuotaPolicy
from gangctl.model.resolve import ResolvedJob
from gangctl.model.topology import PlacementIntent, Topology


class GangBackend(Protocol):
    name: str
    group_resource: Resource | None  # the kind of object gangctl creates for the gang (None: no object)
    watch: Resource                  # what gangctl watches to see the gang's state (its group, Kueue's Workload)
    setup_hint: str                  # what to do when the API server does not serve its quota objects
    # Declared capabilities:
    gated_by_gangctl: bool   # no quota system of its own: gangctl's quota gate admits its jobs, and
                             # counts a job's quota until it sees the job reported finished
    allocates_whole: bool    # takes a gang only when its queue's quota and free nodes both hold it, in
                             # one decision: a waiting gang holds no quota (otherwise an admitted gang
                             # holds its quota while it waits for nodes)
    requeues_unready: bool   # suspends and requeues a gang whose pods are not all ready in time
    rejects_short_gangs: bool  # its scheduler sees the gang whole before placing a pod: it turns a gang
                               # away at once when the free capacity falls short of it in sum (tried
                               # again only on an event of the gang: its group touched, a pod added),
                               # and holds the pods that fit at Permit until the gang is turned away
    # Optional (default True): resizes_jobs, the API server lets gangctl change the parallelism of a
    # Job whose pods belong to the gang (an elastic gang is sized by it).
    # Optional (default False): allocates_whole_with_topology, on a cluster with a topology it
    # allocates whole as above (Kueue's Topology-Aware Scheduling admits a workload on a flavor with a
    # topology only where its pods fit on the nodes now); admits_one_until_ready, it admits no gang
    # while an admitted one's pods are not all ready (Kueue's waitForPodsReady.blockAdmission, as
    # gangctl's Kueue configuration sets it); consolidates, it evicts running preemptible gangs to
    # make room for a pending one when all can be placed at once (KAI's consolidation action).

    def pod_labels(self, job: ResolvedJob) -> dict[str, str]: ...

    def pod_annotations(self, job: ResolvedJob) -> dict[str, str]: ...

    def scheduler_name(self, job: ResolvedJob, default: str) -> str | None: ...

    def group(self, job: ResolvedJob, gang: Gang, owner: dict) -> dict | None: ...

    def gang_floor(self, group: dict | None, job: dict) -> int:
        """How many pods the gang needs at once, as its scheduler reads it: from `group` (what
        `group` made; None for a backend without one) or the child Job `job` it gates."""
        ...

    def quota_objects(self, policy: QuotaPolicy, text: str) -> list[dict]:
        """Everything `gangctl policy apply` writes for `policy` (`text`: the policy file as written),
        in an order that applies cleanly."""
        ...

    def pytorchjob_settings(self, scheduling: SchedulingPolicy) -> dict:
        """A PyTorchJob's `runPolicy.schedulingPolicy` as this backend's gang settings (the keys a
        runtime's `podGroupPolicy.<backend>` would set)."""
        ...

    # Optional hooks (see the module docstring):
    #   job_labels(job, gang) -> dict[str, str]        labels on the child Job (Kueue's queue-name)
    #   job_annotations(job, gang) -> dict[str, str]   annotations on the child Job
    #   controls_suspend: bool                         the backend, not gangctl, owns spec.suspend
    #   waiting(observed) -> (reason, message) | None   why the gang waits, from its watched object
    #   needs_nudge: bool                              a waiting gang is retried only when its group is touched
    #   watched_selector(job_uid) -> dict[str, str]    labels of the watched object made from the child Job
    #   unexpressed(policy) -> list[str]               what of a quota policy it cannot express (KAI)
    #   pod_spec(job) -> dict                          fields set on every pod's spec (native: schedulingGroup)
    #   placement_spec(intent, topology) -> dict        fields of the gang's group spec for a placement intent
    #   placement_annotations(intent) -> dict[str, str] pod template annotations for it (Kueue)
    #   topology_objects(topology, nodes) -> list[dict] what `policy apply` writes for the policy's topology
    #   topology_from_nodes: bool                      those objects name the cluster's nodes (Volcano's HyperNodes)


def group_object(resource: Resource, job: ResolvedJob, owner: dict, spec: dict) -> dict:
    """A gang object gangctl creates: named after the job's gang, in its namespace, labelled as
    gangctl's and owned by the TrainJob (the garbage collector removes it with the job)."""
    return {"apiVersion": resource.api_version, "kind": resource.kind,
            "metadata": {"name": job.gang_name, "namespace": job.namespace,
                         "labels": {MANAGED_BY: MANAGER, TRAINJOB_NAME: job.name}, "ownerReferences": [owner]},
            "spec": spec}


def min_member(group: dict) -> int:
    """The floor of a PodGroup that says it as `spec.minMember` (coscheduling, Volcano, KAI)."""
    return int(group["spec"]["minMember"])


def group_priority_class(job: ResolvedJob) -> str | None:
    """The PriorityClass a queue-based backend's group carries (Volcano, KAI): the runtime's
    `podGroupPolicy.<backend>.priorityClassName`, else the pod template's."""
    return (job.gang_settings.get("priorityClassName")
            or (job.pod_template.get("spec") or {}).get("priorityClassName"))


def scheduling_priority(scheduling: SchedulingPolicy) -> dict:
    """The gang setting every backend takes from a PyTorchJob's scheduling policy: its priority class."""
    return {"priorityClassName": scheduling.priority_class} if scheduling.priority_class else {}


def queued_settings(scheduling: SchedulingPolicy) -> dict:
    """A queue-based backend's settings (Volcano, KAI): v1's queue names the gang's queue."""
    return {**({"queue": scheduling.queue} if scheduling.queue else {}), **scheduling_priority(scheduling)}


def job_labels(backend: GangBackend | None, job: ResolvedJob, gang: Gang) -> dict[str, str]:
    hook = getattr(backend, "job_labels", None)
    return dict(hook(job, gang)) if hook else {}


def job_annotations(backend: GangBackend | None, job: ResolvedJob, gang: Gang) -> dict[str, str]:
    hook = getattr(backend, "job_annotations", None)
    return dict(hook(job, gang)) if hook else {}


def pod_spec(backend: GangBackend | None, job: ResolvedJob) -> dict:
    hook = getattr(backend, "pod_spec", None)
    return dict(hook(job)) if hook else {}


def controls_suspend(backend: GangBackend | None) -> bool:
    """True when the backend's admission flips the child Job's spec.suspend (gangctl must not apply it
    after creating the Job suspended, or server-side apply would take admission back)."""
    return bool(getattr(backend, "controls_suspend", False))


def resizes_jobs(backend: GangBackend | None) -> bool:
    """Whether gangctl sizes an elastic gang's Job (its parallelism). Not when the backend's admission
    owns the Job (Kueue sets the size it admits), nor when the API server refuses the change (native
    gangs): the Job then keeps its size, and its members above the floor are scheduled as they fit."""
    return not controls_suspend(backend) and bool(getattr(backend, "resizes_jobs", True))


def allocates_whole(backend: GangBackend, topology: bool) -> bool:
    """Whether the backend takes a gang only when its quota and free nodes both hold it, in one
    decision, on a cluster with (`topology`) or without a topology."""
    return backend.allocates_whole or (topology and bool(getattr(backend, "allocates_whole_with_topology", False)))


def admits_one_until_ready(backend: GangBackend) -> bool:
    """Whether the backend admits no gang while an admitted one's pods are not all ready."""
    return bool(getattr(backend, "admits_one_until_ready", False))


def wants_group(backend: GangBackend | None) -> bool:
    """True when the backend represents the gang by an object gangctl must create (a PodGroup)."""
    return backend is not None and getattr(backend, "group_resource", None) is not None


def waiting(backend: GangBackend | None, observed: dict | None) -> tuple[str, str] | None:
    """Why the gang waits, in the backend's words (None: only that its pods are not all bound yet)."""
    hook = getattr(backend, "waiting", None)
    return hook(observed) if hook else None


def gated_by_gangctl(backend: GangBackend | None) -> bool:
    """True when the backend has no quota system of its own, so gangctl's quota gate admits its jobs
    in the namespaces a quota policy names (Volcano and Kueue enforce quota themselves)."""
    return bool(getattr(backend, "gated_by_gangctl", False))


def consolidates(backend: GangBackend | None) -> bool:
    """True when the scheduler evicts running preemptible gangs that can all be placed again at once,
    to make room for a pending one that fits the free GPUs in sum but no nodes (KAI's consolidation)."""
    return bool(getattr(backend, "consolidates", False))


def needs_nudge(backend: GangBackend | None) -> bool:
    """True when a waiting gang is retried by the scheduler only when its group object changes, so
    gangctl touches it after capacity is freed (Volcano retries every session, Kueue on quota changes)."""
    return bool(getattr(backend, "needs_nudge", False)) and wants_group(backend)


def unexpressed(backend: GangBackend, policy: QuotaPolicy) -> list[str]:
    """Notes on what of `policy` the backend's quota objects cannot say (`policy apply` prints them)."""
    hook = getattr(backend, "unexpressed", None)
    return list(hook(policy)) if hook else []


def watched_selector(backend: GangBackend | None, job_uid: str) -> dict[str, str] | None:
    """Labels that find the watched object the backend made from a job (Kueue's Workload, made from a
    TrainJob's child Job or from a PyTorchJob itself) by that job's uid; None for a backend whose
    watched object is gangctl's own group, found by the job's name."""
    hook = getattr(backend, "watched_selector", None)
    return hook(job_uid) if hook else None


def placement_spec(backend: GangBackend | None, intent: PlacementIntent | None, topology: Topology) -> dict:
    """The fields of the gang's group spec that ask the backend's scheduler for `intent` (its levels
    already the topology's node labels: `intent.on(topology)`); {} when the backend has no such
    field (coscheduling: gangctl places the gang itself) or the job asks for nothing."""
    hook = getattr(backend, "placement_spec", None)
    return dict(hook(intent, topology)) if hook and intent is not None else {}


def placement_annotations(backend: GangBackend | None, intent: PlacementIntent | None) -> dict[str, str]:
    """The pod template annotations that ask the backend's scheduler for `intent` (Kueue's)."""
    hook = getattr(backend, "placement_annotations", None)
    return dict(hook(intent)) if hook and intent is not None else {}


def topology_objects(backend: GangBackend, topology: Topology | None, nodes: list[dict]) -> list[dict]:
    """What `gangctl policy apply` writes for the policy's topology (`nodes`: the cluster's Node
    objects, for a backend that lists them by name); [] without a topology or for a backend whose
    scheduler reads the node labels directly (native) or has no topology (coscheduling)."""
    hook = getattr(backend, "topology_objects", None)
    return list(hook(topology, nodes)) if hook and topology is not None else []
