"""One reconcile pass as a pure function: `decide(Snapshot) -> Plan`.

The reconciler observes (reads the informers' caches, the quota gate's answer, its own hints)
into a `Snapshot`, calls `decide`, and applies the `Plan` it gets back. Every decision a pass makes
lives here, so it can be read top to bottom, unit-tested on hand-built snapshots, and run by the
simulator on the same code as the cluster.

A plan's `steps` are ordered, and the order is part of the decision: each step must leave the
cluster in a state the next pass can finish from if the process dies right after it. The rules:
the judgement of a failed attempt goes to status (guarded by uid + resourceVersion) before the
attempt is deleted; a failure is written before the gang is released; the children are applied
before the status that reports them.

Backends take part only through the plugin hooks (gangctl.plugins.base): who owns the child Job's
`spec.suspend`, whether gangctl's quota gate governs the backend, whether a waiting gang needs a
nudge, why a gang waits.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Iterable, Mapping, Union

from gangctl.api.resources import CONFIGMAPS, JOBS, PERSISTENT_VOLUME_CLAIMS, PODS, SERVICES, Resource
from gangctl.api.trainjob import parse_trainjob
from gangctl.plugins import base
from gangctl.plugins.kueue import QUEUE_LABEL
from gangctl.model.names import REPLICATED_JOB, RESULT_FINALIZER, SPEC_HASH, child_job_name
from gangctl.plugins.registry import BACKENDS, backend_for
from gangctl.plugins.torch import STORE_ROLE as TORCH_STORE_ROLE
from gangctl.plugins.torch import rendezvous_store
from gangctl.plugins.workload import (RESTART_ATTEMPT_ANNOTATION, claims, headless_service, node_job, owner_reference,
                                      pooled, step_job, watches_restart_attempt, with_spec_hash)
from gangctl.policy import elastic, ownership, restart_mode
from gangctl.model import jobset, progress
from gangctl.policy import status as st
from gangctl.policy.failure import (RESTART_IN_PLACE, PodFailure, Restarts, charge_in_place, classify, most_restarted,
                                    paced, parse_failure_policy, recreate_wait)
from gangctl.policy.failure import decide as judge
from gangctl.model.gang import Gang, size_gang
from gangctl.model.quota_plan import NodeRange
from gangctl.model.resolve import NODE_CONTAINER, NODE_JOB, ResolveError, ResolvedJob, resolve
from gangctl.model.topology import PlacementIntent, Topology, TopologyError
from gangctl.policy import placement
from gangctl.policy.explain import node_rooms

# managedBy values this controller serves: unset, and gangctl's own. A TrainJob naming Kubeflow
# Trainer's controller (trainer.kubeflow.org/trainjob-controller, what Trainer's CRD defaults) is
# Trainer's: with both installed, each job has exactly one controller.
MANAGER_NAME = "gangctl.io/controller"
SERVED_MANAGERS = {None, "", MANAGER_NAME}
RETRY_ANNOTATION = "gangctl.io/retry-requested-at"
ELASTIC_RECHECK_SECONDS = 2.0
# How long a name a job refers to may be missing from a cache before the job fails for it: an object
# created just before the job can reach its watch a little after the job's.
CACHE_GRACE_SECONDS = 10.0
STORE_ROLE = "rendezvous-store"


# --- what one pass reads ------------------------------------------------------------------------
@dataclass(frozen=True)
class ClusterView:
    nodes: tuple[dict, ...]
    pods: tuple[dict, ...]                   # bound and unfinished
    reserved: tuple[placement.Reserved, ...] = ()   # gangs gangctl pinned that are not all bound yet


@dataclass(frozen=True)
class GateView:
    """The quota gate's answer for a TrainJob of a namespace it governs."""

    admission: dict | None          # status.admission as the gate knows it (None: not admitted)
    hold: tuple[str, str]           # the Running=False (reason, message) for a job the gate holds


@dataclass(frozen=True)
class Snapshot:
    """What one pass of a job of either kind reads. The fields marked (TrainJob) or (PyTorchJob) are
    read for that kind only."""

    key: str
    now: datetime
    job: dict | None                       # the TrainJob or PyTorchJob (None: gone)
    scheduler_name: str = "default-scheduler"
    runtime: dict | None = None            # (TrainJob) its ClusterTrainingRuntime or TrainingRuntime
    jobs: tuple[dict, ...] = ()            # every child Job labelled with the job's name
    node_job: dict | None = None           # (TrainJob) the node Job, by its name
    service: dict | None = None            # (TrainJob) the headless Service, by its name
    services: tuple[dict, ...] = ()        # (PyTorchJob) Services labelled with the job's name
    gang_scheduler: str | None = None      # (PyTorchJob) v1's --gang-scheduler-name: the backend for every job
    gang_scheduler_name: str | None = None  # (PyTorchJob) its pods' schedulerName on native (None: scheduler_name)
    pods: tuple[dict, ...] = ()            # every pod labelled with the job's name
    # Backend name -> the object its gang is watched through (PodGroup; Kueue's Workload of the node
    # Job), None when absent. Its keys are the backends this cluster serves.
    groups: Mapping[str, dict | None] = field(default_factory=dict)
    gate: GateView | None = None           # None: no quota gate governs this namespace
    # (TrainJob) Pods of the node Job seen disrupted on earlier passes (a hint: they may be gone by now).
    disruptions: Mapping[str, PodFailure] = field(default_factory=dict)
    nudge: bool = False                    # capacity was freed since this gang last tried
    priority_classes: frozenset[str] | None = None  # the PriorityClasses that exist (None: not checked)
    progress: progress.Endpoint | None = None   # where trainer pods report progress (status.trainerStatus)
    claims: tuple[dict, ...] = ()          # (TrainJob) PVCs labelled with its name (volumeClaimPolicies)
    topology: Topology | None = None       # the cluster's topology (policy apply's ConfigMap; None: none)
    # Every Node and every pod bound to one, listed only when a plan asked (`wants_nodes`):
    # gangctl's own topology placement weighs what is free where.
    cluster: ClusterView | None = None
    # (TrainJob) the cached Nodes (`cached.node_view`), given while it has no node Job: where the
    # restart mode its runtime leaves to gangctl is chosen (`restart_mode`). None: not known.
    nodes: tuple[dict, ...] | None = None

    @property
    def obj(self) -> dict:
        """The job, for the decisions made only once it exists."""
        if self.job is None:
            raise ValueError(f"{self.key}: no job to decide on")
        return self.job

    @property
    def uid(self) -> str:
        """The job's uid ("" when it is gone): what its children's controller reference names."""
        return ((self.job or {}).get("metadata") or {}).get("uid", "")

    @property
    def namespace_name(self) -> tuple[str, str]:
        meta = self.obj["metadata"]
        return meta["namespace"], meta["name"]


# --- what one pass does -------------------------------------------------------------------------
@dataclass(frozen=True)
class _Write:
    """An object to write. `rejectable`: a 422 on it means the API refuses this TrainJob's children
    for good (see `rejected`)."""

    resource: Resource
    obj: dict
    rejectable: bool = False


@dataclass(frozen=True)
class Apply(_Write):
    """Make the object be `obj` (decide already skipped it when the cached object has the same spec
    hash). With `metadata.uid` (an object the job owns, as cached): server-side applied onto that
    incarnation only. Without (none cached): created, never taken over: an object of that name the
    job does not own stops the pass, as with `Create`."""


@dataclass(frozen=True)
class Create(_Write):
    """Create once (a POST: an object of that name is never taken over). An existing object the job
    owns is fine; one it does not own stops the pass (the job waits: `not_owned`), unless
    `exists_ok` (a PVC made before the job is used as it is). `cached`: write the answer through."""

    cached: bool = True
    exists_ok: bool = False


@dataclass(frozen=True)
class _At:
    """A write to one named object (not built by gangctl: no body to send)."""

    resource: Resource
    namespace: str
    name: str

    def __str__(self) -> str:
        return f"{type(self).__name__.lower()} {self.resource.plural} {self.namespace}/{self.name}"


@dataclass(frozen=True)
class Delete(_At):
    """`uid`: only that incarnation (a new object of the same name is left alone)."""

    uid: str | None = None           # only this incarnation
    propagation: str = "Background"


@dataclass(frozen=True)
class Patch(_At):
    """A merge patch; `missing_ok`: a 404 is fine (a nudge on a PodGroup deleted meanwhile)."""

    patch: dict = field(default_factory=dict)
    missing_ok: bool = False


@dataclass(frozen=True)
class LetGo:
    """Remove gangctl's result finalizer from a child Job whose outcome needs no more recording."""

    job: dict


@dataclass(frozen=True)
class WriteStatus:
    status: dict


@dataclass(frozen=True)
class Event:
    type: str       # Normal, Warning
    reason: str
    message: str


@dataclass(frozen=True)
class CapacityFreed:
    """The gang let go of nodes or quota: waiting gangs should try again now."""


Step = Union[Apply, Create, Delete, LetGo, Patch, WriteStatus, Event, CapacityFreed]


@dataclass(frozen=True)
class Metric:
    name: str                       # an attribute of gangctl.obs.metrics.Metrics
    op: str                         # inc, observe, set
    labels: tuple[str, ...] = ()
    value: float = 1


@dataclass(frozen=True)
class GateWants:
    min_resources: Mapping
    priority_class: str | None
    nodes: NodeRange | None


@dataclass(frozen=True)
class GateMayGrow:
    nodes: NodeRange


@dataclass(frozen=True)
class GateForget:
    pass


GateIntent = Union[GateWants, GateMayGrow, GateForget]


@dataclass(frozen=True)
class Plan:
    key: str = ""                           # namespace/name of the job (set by `decide`)
    job: dict | None = None                 # as observed: status writes are guarded by its uid + resourceVersion
    steps: tuple[Step, ...] = ()
    # Recorded only after every step succeeded (a pass that fails with 409 is decided again).
    metrics: tuple[Metric, ...] = ()
    gate: tuple[GateIntent, ...] = ()       # told to the quota gate before any write
    requeue_after: float | None = None
    clear_nudge: bool = False
    # Disruption hints: the node Job's hints after this pass, set before the steps (`hints`), or
    # dropped after them (`drop_hints`: the attempt was judged and deleted).
    hints: tuple[str, Mapping[str, PodFailure]] | None = None
    drop_hints: str | None = None
    # Decide again with the snapshot's `cluster` listed (gangctl's own topology placement); no step runs.
    wants_nodes: bool = False

    @property
    def status(self) -> dict | None:
        return next((s.status for s in self.steps if isinstance(s, WriteStatus)), None)

    def of(self, kind: type) -> list:
        return [s for s in self.steps if isinstance(s, kind)]


# --- the decision -------------------------------------------------------------------------------
def decide(s: Snapshot) -> Plan:
    """Everything one reconcile pass does, from what it observed."""
    return dataclasses.replace(_decide(s), key=s.key, job=s.job)


def _decide(s: Snapshot) -> Plan:
    trainjob = s.job
    if trainjob is None or trainjob["metadata"].get("deletionTimestamp"):
        # Owner references let the garbage collector remove the children; nothing is left to
        # record, so their result finalizers go.
        return Plan(steps=tuple(_let_go(*s.jobs)))
    if (trainjob.get("spec") or {}).get("managedBy") not in SERVED_MANAGERS:
        return Plan()
    if st.finished(_previous(s)):
        return _finished(s)
    try:
        parse_trainjob(trainjob)
    except ValueError as err:
        return _fail(s, "InvalidSpec", str(err))
    if s.runtime is None:
        return _runtime_missing(s)
    try:
        job = resolve(trainjob, s.runtime)
        backend = backend_for(job.gang_backend)
        gang = size_gang(job.num_nodes, job.requests, min_nodes=job.min_nodes,
                         schedule_timeout_seconds=job.gang_settings.get("scheduleTimeoutSeconds"))
    except (ResolveError, KeyError, ValueError) as err:
        message = err.args[0] if err.args else str(err)
        return _fail(s, getattr(err, "reason", "InvalidRuntime"), str(message))
    if backend is not None and backend.name not in s.groups:
        return _backend_missing(s, backend)
    if job.restart_mode is None:
        job = dataclasses.replace(job, restart_in_place=restart_mode.in_place(job, s.node_job, s.nodes))
    left = _deadline_left(s, job)
    if left is not None and left <= 0:
        return _deadline_exceeded(s, job)
    group = s.groups.get(backend.name) if base.wants_group(backend) else None
    if (other := ownership.foreign(s.uid, (s.service, group, s.node_job, *s.jobs))) is not None:
        return not_owned(s, other)
    if s.node_job is None and (missing := missing_priority_class(job.pod_template, s.priority_classes)):
        wait = cache_grace_left(s.job, s.now)
        if wait > 0:   # a PriorityClass created just before the job may not be in the cache yet
            return dataclasses.replace(_not_created(s, "PriorityClassNotFound", missing), requeue_after=wait)
        return _fail(s, "JobRejected", missing)
    first: list[Step] = []
    if s.node_job is None and job.steps and not job.suspend:
        first, waiting = _steps(s, job)
        if waiting is not None:
            return waiting
    plan = _run(s, job, backend, gang)
    if first:
        plan = dataclasses.replace(plan, steps=(*first, *plan.steps))
    if left is not None:  # come back when the deadline passes, if nothing else brings us back first
        plan = dataclasses.replace(plan, requeue_after=min(plan.requeue_after or left, left))
    return plan


def _steps(s: Snapshot, job: ResolvedJob) -> tuple[list[Step], Plan | None]:
    """The runtime's other replicated jobs (dataset-initializer, model-initializer), run as JobSet runs
    them: each when the jobs it dependsOn are Complete (Ready: created), the trainer when its own
    dependsOn are. Returns the steps' Jobs to create now, and the plan of a pass that must not start
    the trainer yet (waiting, or a step failed: the TrainJob fails with that Job's reason)."""
    by_name = {j["metadata"]["name"]: j for j in s.jobs}
    owner = owner_reference(s.job)
    complete: set[str] = set()
    created: set[str] = set()
    creates: list[Step] = []
    for step in job.steps:
        names = [child_job_name(job.name, step.name, i) for i in range(max(1, step.replicas))]
        seen = [st.ChildJob.from_job(by_name[n], step.name) for n in names if n in by_name]
        failed = next(((c.name, c.failure) for c in seen if c.failure), None)
        if failed is not None:
            name, (reason, message) = failed
            return [], _fail(s, reason, f"Job {name} ({step.name}) failed: {message or reason}; the trainer "
                                        "did not start", metric=Metric("policy_failures", "inc", (reason,)))
        if len(seen) == len(names):
            created.add(step.name)
            if all(c.complete for c in seen):
                complete.add(step.name)
        elif _met(step.depends_on, complete, created):
            creates += [Create(JOBS, step_job(job, step, i, owner), rejectable=True)
                        for i, n in enumerate(names) if n not in by_name]
    if creates and not s.jobs:  # the runtime's shared volumes exist before the first pod that mounts them
        creates = [*_claims(job, owner), *creates]
    if _met(job.depends_on, complete, created):
        return creates, None
    pending = [d.get("name", "") for d in job.depends_on if d.get("name") not in complete]
    plan = _not_created(s, "Initializing", f"waiting for {', '.join(pending)} to complete before the trainer starts")
    return creates, dataclasses.replace(plan, steps=(*creates, *plan.steps))


def _met(depends_on: Iterable[dict], complete: set[str], created: set[str]) -> bool:
    return all(d.get("name") in (created if d.get("status") == "Ready" else complete) for d in depends_on)


def _deadline_left(s: Snapshot, job: ResolvedJob) -> float | None:
    """Seconds left of spec.activeDeadlineSeconds, counted as Trainer does: from the TrainJob's start,
    and again from its last resume; None without a deadline or while suspended (the clock stops)."""
    created = s.obj["metadata"].get("creationTimestamp")
    if job.active_deadline_seconds is None or job.suspend or not created:
        return None
    start = st.parse_time(created)
    previous = _previous(s)
    # gangctl keeps the resume time in status.gang; Trainer (and an older gangctl) in Suspended=False.
    resumed = [st.gang_state(previous).get("resumedAt")] + [
        c.get("lastTransitionTime") for c in previous.get("conditions") or []
        if c.get("type") == st.SUSPENDED and c.get("status") == "False"]
    for when in filter(None, resumed):
        start = max(start, st.parse_time(when))
    return job.active_deadline_seconds - (s.now - start).total_seconds()


def _deadline_exceeded(s: Snapshot, job: ResolvedJob) -> Plan:
    message = (f"the TrainJob was active longer than spec.activeDeadlineSeconds ({job.active_deadline_seconds}s); "
               "its pods were stopped and its gang released")
    return _fail(s, "DeadlineExceeded", message, metric=Metric("policy_failures", "inc", ("DeadlineExceeded",)))


def missing_priority_class(pod_template: dict, known: frozenset[str] | None) -> str | None:
    """The Job API accepts a template naming a PriorityClass that does not exist, and then every pod
    create is refused by admission (only the Job's FailedCreate events say so): say it before."""
    name = (pod_template.get("spec") or {}).get("priorityClassName")
    if not name or known is None or name in known:
        return None
    return (f"priorityClassName: no PriorityClass {name!r} exists (kubectl get priorityclasses), so none of the "
            "pods could be created; create it, or fix the runtime or the TrainJob's overrides, and create the job again")


def cache_grace_left(obj: dict, now: datetime) -> float:
    """Seconds until a job is CACHE_GRACE_SECONDS old (0 when it is, or its age is unknown)."""
    created = obj["metadata"].get("creationTimestamp")
    if not created:
        return 0.0
    return max(0.0, CACHE_GRACE_SECONDS - (now - st.parse_time(created)).total_seconds())


def rejected(s: Snapshot, message: str) -> Plan:
    """The follow-up decision when the API refused a first create of the children with 422: valid to
    the TrainJob API, refused as a child (a request over its limit, an env name the Job API rejects,
    more nodes than an Indexed Job may have). The same spec is refused every time, so only this
    TrainJob fails, with the API's own words."""
    plan = _fail(s, "JobRejected", f"the API server refused this TrainJob's child objects: {message}; "
                                   "fix the TrainJob or its runtime and create it again")
    return dataclasses.replace(plan, key=s.key, job=s.job)


def not_owned(s: Snapshot, obj: dict) -> Plan:
    """An object of a child's name exists and this TrainJob does not own it (seen in a cache, or by a
    create that found it): nothing of it is touched; the TrainJob waits, naming it, and looks again."""
    if s.job is None:
        return Plan(key=s.key)
    message = ownership.message(obj, "TrainJob")
    plan = _not_created(s, ownership.REASON, message)
    if plan.steps:
        plan = dataclasses.replace(plan, steps=(*plan.steps, Event("Warning", ownership.REASON, message)))
    return dataclasses.replace(plan, key=s.key, job=s.job, requeue_after=ownership.RECHECK_SECONDS)


def _previous(s: Snapshot) -> dict:
    return (s.job or {}).get("status") or {}


def _let_go(*jobs: dict) -> list[Step]:
    return [LetGo(j) for j in jobs if RESULT_FINALIZER in (j["metadata"].get("finalizers") or [])]


def store_pods(pods: Iterable[dict]) -> list[dict]:
    """The rendezvous store pods among a job's pods (every incarnation: see ensure_store)."""
    return [p for p in pods if (p["metadata"].get("labels") or {}).get(TORCH_STORE_ROLE) == STORE_ROLE]


def _release(s: Snapshot, child: dict | None, applied_group: str | None = None) -> list[Step]:
    """Let go of everything that holds capacity or quota: the PodGroup, a Kueue-queued Job that has
    not finished (its Workload holds quota until it does), the rendezvous store. `child`: the node
    Job as the earlier steps of this pass leave it; `applied_group`: a backend whose group this
    pass applied."""
    ns, name = s.namespace_name
    uid = s.uid
    out: list[Step] = []
    for backend_name, obj in s.groups.items():
        resource = BACKENDS[backend_name].group_resource
        if resource is not None and obj is not None and ownership.owned(obj, uid):
            out += [delete_child(resource, obj), CapacityFreed()]
        elif resource is not None and obj is None and backend_name == applied_group:
            out += [Delete(resource, ns, name), CapacityFreed()]  # created by this very pass: it is ours
    if (child is not None and ownership.owned(child, uid) and not child["metadata"].get("deletionTimestamp")
            and not st.ChildJob.from_job(child, NODE_JOB).finished):
        if QUEUE_LABEL in (child["metadata"].get("labels") or {}):
            # Kueue owns spec.suspend: only deleting the Job frees its Workload.
            out += [*_let_go(child), delete_child(JOBS, child), CapacityFreed()]
        elif not (child.get("spec") or {}).get("suspend"):
            # A Job gangctl ended itself (an elastic Job never fails on its own: huge backoffLimit)
            # would go on recreating workers: suspend it, keeping the failed pods.
            out.append(patch_child(JOBS, child, {"spec": {"suspend": True}}))
    return out + let_go_of_store(uid, s.pods)


def let_go_of_store(uid: str, pods: Iterable[dict]) -> list[Step]:
    """Delete the job's rendezvous store pods (every incarnation still alive)."""
    return [delete_child(PODS, p) for p in ownership.mine(uid, store_pods(pods)) if not p["metadata"].get("deletionTimestamp")]


def delete_child(resource: Resource, obj: dict, propagation: str = "Background") -> Delete:
    """Delete a child the job owns (observed, or made by this pass: no uid yet), only that incarnation."""
    meta = obj["metadata"]
    return Delete(resource, meta["namespace"], meta["name"], uid=meta.get("uid"), propagation=propagation)


def patch_child(resource: Resource, obj: dict, patch: dict) -> Patch:
    """A merge patch onto that incarnation of a child the job owns: its uid in the patch is a
    precondition (a recreated object of the name refuses it)."""
    meta = obj["metadata"]
    if meta.get("uid"):
        patch = {**patch, "metadata": {**(patch.get("metadata") or {}), "uid": meta["uid"]}}
    return Patch(resource, meta["namespace"], meta["name"], patch)


def _finished(s: Snapshot) -> Plan:
    """Final: release the gang, and never recreate children someone deleted (TTL, cleanup); the
    outcome is recorded, so the Jobs may go (TTL, by hand). The runtime's ttlSecondsAfterFinished
    deletes them, as JobSet deletes itself: see _expired."""
    steps = _release(s, s.node_job)
    released = {step.job["metadata"]["name"] for step in steps if isinstance(step, LetGo)}
    plan = Plan(steps=(*steps, *_let_go(*(j for j in s.jobs if j["metadata"]["name"] not in released))))
    ttl = jobset.ttl_after_finished(s.runtime)
    if ttl is None:
        return plan
    left = ttl - (s.now - _finished_at(_previous(s))).total_seconds()
    if left > 0:
        return dataclasses.replace(plan, requeue_after=left)
    return dataclasses.replace(plan, steps=(*plan.steps, *_expired(s)))


def _finished_at(status: dict) -> datetime:
    when = [c.get("lastTransitionTime") for c in status.get("conditions") or []
            if c.get("type") in (st.COMPLETE, st.FAILED) and c.get("status") == "True" and c.get("lastTransitionTime")]
    return st.parse_time(when[0]) if when else datetime.min.replace(tzinfo=timezone.utc)


def _expired(s: Snapshot) -> list[Step]:
    """ttlSecondsAfterFinished has passed: the child Jobs (their pods with them), the headless Service
    and the PVCs owned by the TrainJob go, each by its uid; the TrainJob and its status stay. Once
    nothing is left, nothing more is sent."""
    def live(objects: Iterable[dict | None]) -> list[dict]:
        # Only what the TrainJob owns: a claim made before it (used as it was) or kept (Retain) has no
        # ownerReference of it, and stays.
        return ownership.mine(s.uid, (o for o in objects if o is not None and not o["metadata"].get("deletionTimestamp")))
    return [*(delete_child(JOBS, j) for j in live(s.jobs)), *(delete_child(SERVICES, v) for v in live([s.service])),
            *(delete_child(PERSISTENT_VOLUME_CLAIMS, c) for c in live(s.claims))]


def _fail(s: Snapshot, reason: str, message: str, *, status: dict | None = None,
          metric: Metric = Metric("invalid", "inc")) -> Plan:
    """Fail the TrainJob (onto `status`, by default what it shows now): the failure is written first,
    then the gang is released."""
    status = st.failed_status(_previous(s) if status is None else status, reason, message, s.now)
    return Plan(steps=(WriteStatus(status), Event("Warning", reason, message), *_release(s, s.node_job)),
                metrics=(metric,))


def _not_created(s: Snapshot, reason: str, message: str) -> Plan:
    previous = _previous(s)
    status = st.set_state(previous, st.PENDING, reason, message, s.now)
    if status == previous:
        return Plan()
    return Plan(steps=(WriteStatus(status),))


def _runtime_missing(s: Snapshot) -> Plan:
    ref = s.obj["spec"]["runtimeRef"]
    return _not_created(s, "RuntimeNotFound", f"{ref.get('kind', 'ClusterTrainingRuntime')} {ref['name']!r} not "
                                              "found; create it or fix spec.runtimeRef")


def _backend_missing(s: Snapshot, backend) -> Plan:
    return _not_created(s, "BackendNotInstalled", (
        f"the runtime's podGroupPolicy asks for {backend.name}, but this cluster does not serve "
        f"{backend.watch.plural}.{backend.watch.group}: install {backend.name} (locally: `gangctl "
        f"cluster up --scheduler {backend.name}`), then restart gangctl"))


# --- the steady state ---------------------------------------------------------------------------
@dataclass(frozen=True)
class _Quota:
    """What the quota gate's answer means for this pass."""

    job: ResolvedJob                    # with suspend=True while the gate holds it
    wait: tuple[str, str] | None        # the hold's Running=False reason
    max_nodes: int                      # an elastic job runs at most the nodes it was admitted with
    intents: tuple[GateIntent, ...]
    user_suspend: bool                  # the TrainJob's own spec.suspend


def _quota(s: Snapshot, job: ResolvedJob, backend, gang: Gang) -> _Quota:
    """A backend without a quota system of its own (coscheduling) is gated by gangctl's quota gate
    in the namespaces a policy names: each job is held like a suspended one (no PodGroup, Job
    suspended) until admitted. An admitted elastic job runs at most the nodes it was admitted with;
    the gate admits more when its team's quota has room and no job of the team waits."""
    nodes = NodeRange(gang.min_member, gang.size, gang.per_pod) if job.elastic else None
    answer = ask_gate(s.gate, backend, job.suspend, gang.min_resources,
                      (job.pod_template.get("spec") or {}).get("priorityClassName"), nodes)
    if answer.held is not None:
        return _Quota(dataclasses.replace(job, suspend=True), answer.held, job.num_nodes, answer.intents, False)
    granted = answer.granted if answer.granted is not None else job.num_nodes
    return _Quota(job, None, granted, answer.intents, job.suspend)


@dataclass(frozen=True)
class GateAnswer:
    """What the quota gate's answer means for a job of any kind."""

    held: tuple[str, str] | None = None   # not admitted: the gate holds the job, with this reason
    granted: int | None = None            # an admitted elastic job may run this many nodes (None: not told)
    intents: tuple[GateIntent, ...] = ()
    admitted: bool = False                # the gate governs the job and admitted it


def ask_gate(gate: GateView | None, backend, suspend: bool, requests: Mapping, priority_class: str | None,
             nodes: NodeRange | None) -> GateAnswer:
    """What to tell the gate and what it answered, for a job asking for `requests` (its floor) and,
    when elastic, for more nodes in `nodes`. A backend with a quota system of its own is not gated."""
    if gate is None or not base.gated_by_gangctl(backend):
        return GateAnswer()
    if suspend:
        return GateAnswer(intents=(GateForget(),))
    if gate.admission is None:
        return GateAnswer(held=gate.hold, intents=(GateWants(requests, priority_class, nodes),))
    if nodes is not None and gate.admission.get("nodes"):
        granted = max(nodes.min_nodes, min(nodes.max_nodes, int(gate.admission["nodes"])))
        return GateAnswer(granted=granted, intents=(GateMayGrow(nodes),), admitted=True)
    return GateAnswer(admitted=True)


def _run(s: Snapshot, job: ResolvedJob, backend, gang: Gang) -> Plan:
    quota = _quota(s, job, backend, gang)
    placed = _place(s, quota.job, backend, gang)
    if isinstance(placed, Plan):
        return dataclasses.replace(placed, gate=quota.intents)
    job, observed = placed, s.node_job
    plan = Plan(gate=quota.intents)
    resize: elastic.Resize | None = None
    size: int | None = None
    lost_gone = 0
    stall: tuple[str, str] | float | None = None
    if observed is not None:
        child = st.ChildJob.from_job(observed, NODE_JOB)
        if child.failure is None and job.elastic:
            pods = ownership.children_of([observed["metadata"].get("uid", "")], s.pods)
            child = dataclasses.replace(child, failure=elastic.failed_worker(observed, pods, "node"))
        stall = _stall(s, job, observed, child)
        if isinstance(stall, tuple):
            if (restarted := _stalled_in_place(s, job, observed, stall)) is not None:
                return dataclasses.replace(restarted, gate=quota.intents)
            child = dataclasses.replace(child, failure=stall)
        if child.failure is None and job.restart_in_place and (in_place := _restarted_in_place(s, job, observed)):
            return dataclasses.replace(in_place, gate=quota.intents)
        if child.failure is not None:
            return dataclasses.replace(_failed_attempt(s, job, observed, child, child.failure), gate=quota.intents)
        if observed["metadata"].get("deletionTimestamp"):
            return dataclasses.replace(_deleting_attempt(s, job, observed, child), gate=quota.intents)
        hints = _noted(s, observed)
        if job.elastic and not job.suspend and not child.complete and base.resizes_jobs(backend):
            size, resize, lost_gone, hints, recheck = _elastic_size(s, job, gang, quota.max_nodes, observed, hints)
            plan = dataclasses.replace(plan, requeue_after=ELASTIC_RECHECK_SECONDS if recheck else None)
        plan = dataclasses.replace(plan, hints=(observed["metadata"].get("uid", ""), hints))
    elif any((p.get("status") or {}).get("phase") not in ("Succeeded", "Failed")
             for p in s.pods if (p["metadata"].get("labels") or {}).get(REPLICATED_JOB) == NODE_JOB):
        return plan  # an old attempt's pods are still going: never two live pods for one index
    elif (wait := recreate_wait(Restarts.from_status(_previous(s)).last_failure, s.now)) > 0:
        return dataclasses.replace(plan, requeue_after=wait)   # a gang failing soon after it starts: paced
    elif job.elastic and quota.max_nodes < job.num_nodes:
        size = quota.max_nodes
    plan = _converge(s, plan, job, backend, gang, quota, size, resize, lost_gone)
    if observed is not None and (raise_attempt := _restart_attempt_patches(s, observed)):
        plan = dataclasses.replace(plan, steps=(*plan.steps, *raise_attempt))
    if observed is not None and isinstance(stall, float):   # come back when the stall timeout would pass
        reported = st.parse_time(_previous(s)["trainerStatus"]["lastUpdatedTime"]).timestamp()
        plan = dataclasses.replace(plan, requeue_after=min(plan.requeue_after or stall, stall), metrics=(
            *plan.metrics, Metric("last_progress", "set", (job.namespace, job.name), reported)))
    return plan


def _restarted_in_place(s: Snapshot, job: ResolvedJob, observed: dict) -> Plan | None:
    """A runtime that restarts in place: the episodes its pods went through and are not charged yet,
    charged (status first, then an Event); past the budget, the job fails (`failure.charge_in_place`)."""
    uid = observed["metadata"].get("uid", "")
    seen = most_restarted(ownership.children_of([uid], s.pods), NODE_CONTAINER)
    if seen is None:
        return None
    previous = _previous(s)
    policy = parse_failure_policy(job.failure_policy) if job.failure_policy is not None else None
    charged = charge_in_place(policy, Restarts.from_status(previous), observed["metadata"]["name"], uid, seen,
                              st.timestamp(s.now))
    if charged is None:
        return None
    decision, after = charged
    status = {**previous, "restarts": after.to_status(), "restartCount": after.user}
    if decision.action == "Fail":
        return _fail(s, decision.reason, decision.message, status=status,
                     metric=Metric("policy_failures", "inc", (decision.reason,)))
    return Plan(steps=(WriteStatus(status), Event("Warning", decision.reason, decision.message)),
                metrics=(Metric("restarts", "inc", ("user",), after.user - Restarts.from_status(previous).user),))


def _in_place_restart(s: Snapshot, observed: dict) -> dict:
    """lastFailure when it records an in-place restart of this attempt (else {})."""
    last = Restarts.from_status(_previous(s)).last_failure
    return last if (last.get("jobUID") == observed["metadata"].get("uid") and last.get("action") == RESTART_IN_PLACE) else {}


def _stalled_in_place(s: Snapshot, job: ResolvedJob, observed: dict, stall: tuple[str, str]) -> Plan | None:
    """A stalled attempt whose trainers watch the restart attempt (`workload.watches_restart_attempt`)
    and whose every pod runs: restarted in place while the stall budget allows. The judgement goes to
    status first: the stall counted (infrastructure), and lastFailure recording the restart attempt the
    pods are raised to and the restart count it brings (`attemptRestarts`, so the restarts it causes
    are not charged again as the user's); then the pods are raised (`_restart_attempt_patches`, which
    every later pass repeats until they show it). None: recreate or fail as for any failed attempt."""
    uid = observed["metadata"].get("uid", "")
    if not (job.restart_in_place and not job.elastic and watches_restart_attempt(observed)):
        return None
    pods = [p for p in ownership.children_of([uid], s.pods) if (p.get("status") or {}).get("phase") == "Running"
            and (p.get("spec") or {}).get("nodeName") and not p["metadata"].get("deletionTimestamp")]
    if len(pods) < int((observed.get("spec") or {}).get("parallelism") or 0):
        return None   # a rank is missing: the gang is made anew
    if (charged := _restarted_in_place(s, job, observed)) is not None:
        return charged   # a user's in-place restart not charged yet goes first (the stall's would absorb it)
    previous = _previous(s)
    restarts = Restarts.from_status(previous)
    policy = parse_failure_policy(job.failure_policy) if job.failure_policy is not None else None
    failure = classify(*stall, [])
    decision = judge(policy, failure, restarts)
    if decision.action != "Restart":
        return None
    at = st.timestamp(s.now)
    after = restarts.after(decision, failure, observed["metadata"]["name"], uid, at)
    seen = most_restarted(pods, NODE_CONTAINER)
    last = {**after.last_failure, "action": RESTART_IN_PLACE, "restartAttempt": after.stalled,
            "attemptRestarts": (seen.restarts if seen else 0) + 1}
    after = dataclasses.replace(after, last_failure=last)
    status = {**previous, "restarts": after.to_status(), "restartCount": after.user}
    message = f"{decision.message}; restarting in place (same pods, same nodes)"
    return Plan(steps=(WriteStatus(status), Event("Normal", "Restarting", f"{decision.reason}: {message}"),
                       *_raise_attempt(pods, str(after.stalled))),
                metrics=(Metric("restarts", "inc", (decision.counter,)),))


def _raise_attempt(pods: Iterable[dict], attempt: str) -> list[Step]:
    """Merge patches of the pods' restart attempt, each on that pod only (its uid in the patch)."""
    return [Patch(PODS, p["metadata"]["namespace"], p["metadata"]["name"], {"metadata": {
        "uid": p["metadata"]["uid"], "annotations": {RESTART_ATTEMPT_ANNOTATION: attempt}}}, missing_ok=True)
        for p in pods if ((p["metadata"].get("annotations") or {}).get(RESTART_ATTEMPT_ANNOTATION) != attempt)]


def _restart_attempt_patches(s: Snapshot, observed: dict) -> list[Step]:
    """The attempt's pods that existed at its last in-place stall restart and do not show its restart
    attempt yet (a pass that wrote status and stopped before them, or a stale pod cache), raised."""
    last = _in_place_restart(s, observed)
    if "restartAttempt" not in last:
        return []
    when = st.parse_time(last["time"])
    pods = [p for p in ownership.children_of([observed["metadata"].get("uid", "")], s.pods)
            if not p["metadata"].get("deletionTimestamp") and p["metadata"].get("creationTimestamp")
            and st.parse_time(p["metadata"]["creationTimestamp"]) < when]
    return _raise_attempt(pods, str(last["restartAttempt"]))


def _stall(s: Snapshot, job: ResolvedJob, observed: dict, child: st.ChildJob) -> tuple[str, str] | float | None:
    """A running attempt whose progress reports stopped for longer than the runtime's stall timeout:
    its failure (reason Stalled); else the seconds until it would be stalled, if nothing is reported
    meanwhile (None: the runtime sets no timeout, the job is not running or never reported)."""
    timeout = job.stall_timeout_seconds
    status = _previous(s)
    if timeout is None or child.failure is not None or child.complete or job.suspend or (
            st.gang_state(status).get("state") != st.RUNNING):
        return None
    created = observed["metadata"].get("creationTimestamp")
    bound = (status.get("gang") or {}).get("boundAt")
    restarted = _in_place_restart(s, observed).get("time")   # the gang restarted in place: a new start
    times = [t for t in (created, bound, restarted) if t]
    started = max(st.parse_time(t) for t in times) if times else s.now
    silent = progress.silent_for(status.get("trainerStatus"), started, s.now)
    if silent is None:
        return None
    if silent <= timeout:
        return max(1.0, timeout - silent + 1.0)
    return progress.STALLED, (f"no progress report for {silent:.0f}s (stall timeout {timeout}s, "
                              f"{progress.STALL_TIMEOUT_ANNOTATION} of the runtime)")


PLACEMENT_RECHECK_SECONDS = 5.0   # a gang waiting for a domain with room looks again this often


@dataclass(frozen=True)
class Placing:
    """What the topology means for a job's pod template, for either job kind (`place`)."""
    template: dict                        # with the backend's annotations and gangctl's pin, if any
    intent: PlacementIntent | None = None  # on the cluster's topology (levels as node labels)
    problem: str = ""                      # the intent names no level of the topology (the job fails)
    # gangctl's own placement could not pin the template: the nodes must be listed first, no domain
    # has room now (the job waits), or none ever will (the job fails).
    blocked: placement.NeedNodes | placement.Waiting | placement.Unsatisfiable | None = None


def place(s: Snapshot, intent: PlacementIntent | None, template: dict, observed: dict | None, backend,
          floor: placement.Floor, held: bool) -> Placing:
    """The pod `template` of a job asking for `intent`, whose Job carrying it is `observed` (None: not
    made yet): pinned where gangctl placed the observed Job (`placement.kept`), else with the backend's
    own annotations for it (Kueue) or, where the backend cannot place it and the job is not `held`,
    pinned by gangctl (`placement.pin`). Before its Job is made, a required level that no domain could
    ever hold blocks it as `Unsatisfiable` on every backend (the nodes are listed for that check)."""
    if (pin := placement.kept(template, ((observed or {}).get("spec") or {}).get("template"))) is not None:
        return Placing(pin)   # placed by gangctl when the Job was made: it stays there
    if s.topology is None:
        return Placing(template)
    if intent is None:
        return _packed(s, template, observed, backend, floor, held)
    try:
        intent = intent.on(s.topology)
    except TopologyError as err:
        return Placing(template, problem=str(err))
    template = with_annotations(template, base.placement_annotations(backend, intent))
    nodes = None if s.cluster is None else node_rooms(s.cluster.nodes, s.cluster.pods, template.get("spec"))
    if observed is None and intent.required is not None:   # whoever places it: never waits forever
        if nodes is None:
            return Placing(template, intent, blocked=placement.NeedNodes())
        if (never := placement.never_fits(nodes, s.topology, intent, floor)) is not None:
            return Placing(template, intent, blocked=never)
    if held or placement.places_itself(backend, intent, s.topology) or (observed is not None
                                                                         and not _may_pin(observed)):
        return Placing(template, intent)
    rooms = None if nodes is None or s.cluster is None else placement.reserve(nodes, list(s.cluster.reserved))
    chosen = placement.pin(template, intent, s.topology, floor, rooms)
    if isinstance(chosen, dict):
        return Placing(chosen, intent)
    return Placing(template, intent, blocked=chosen)


def _packed(s: Snapshot, template: dict, observed: dict | None, backend, floor: placement.Floor,
            held: bool) -> Placing:
    """A gang that asks for no level, on a cluster with a topology, whose scheduler would scatter it
    (coscheduling, native): pinned by preferred node affinity where `placement.packing` puts it, the
    narrowest domain that holds its floor now, as Kueue's TAS places a pod set without a topology
    request. Gangs that ask nothing then leave whole racks to the gangs that ask for one. Never a
    reason to wait: when no domain holds it now it goes unpinned, as without a topology."""
    intent = placement.packing(s.topology)
    if held or placement.places_itself(backend, intent, s.topology) or (observed is not None
                                                                         and not _may_pin(observed)):
        return Placing(template)
    if s.cluster is None:
        return Placing(template, blocked=placement.NeedNodes())
    nodes = node_rooms(s.cluster.nodes, s.cluster.pods, template.get("spec"))
    chosen = placement.pin(template, intent, s.topology, floor, placement.reserve(nodes, list(s.cluster.reserved)))
    placed = isinstance(chosen, dict) and placement.mark_of(chosen) != placement.ANYWHERE
    return Placing(chosen if placed else template)


def with_annotations(template: dict, annotations: Mapping[str, str]) -> dict:
    if not annotations:
        return template
    meta = template.get("metadata") or {}
    return {**template, "metadata": {**meta, "annotations": {**(meta.get("annotations") or {}), **annotations}}}


def _place(s: Snapshot, job: ResolvedJob, backend, gang: Gang) -> ResolvedJob | Plan:
    """The TrainJob's node job placed (`place`), or the plan of a job that cannot start so."""
    if (again := _place_again(s, gang)) is not None and not job.suspend:
        return again
    placing = place(s, job.placement, job.pod_template, s.node_job, backend,
                    placement.Floor(gang.min_member, gang.per_pod), job.suspend)
    if placing.problem:
        return _fail(s, "InvalidPlacement", placing.problem)
    if isinstance(placing.blocked, placement.NeedNodes):
        return Plan(wants_nodes=True)
    if isinstance(placing.blocked, placement.Unsatisfiable):
        return _fail(s, placing.blocked.reason, placing.blocked.message)
    if isinstance(placing.blocked, placement.Waiting):
        return dataclasses.replace(_not_created(s, placing.blocked.reason, placing.blocked.message),
                                   requeue_after=PLACEMENT_RECHECK_SECONDS)
    return dataclasses.replace(job, placement=placing.intent, pod_template=placing.template)


def _place_again(s: Snapshot, gang: Gang) -> Plan | None:
    """A gang pinned to a domain that its scheduler still refuses after the gang's schedule timeout
    (counted from its Job's `status.startTime`, which the Job controller sets when the Job runs and
    resets on every resume: a Job held suspended is not being scheduled): its Job goes (not charged:
    no pod ran) and the next pass chooses again, once its pods are gone, weighing the nodes as they
    are then."""
    node_job = s.node_job
    mark = placement.mark_of(((node_job or {}).get("spec") or {}).get("template"))
    if node_job is None or mark in (None, placement.ANYWHERE) or node_job["metadata"].get("deletionTimestamp"):
        return None
    started = (node_job.get("status") or {}).get("startTime")
    if not started or (node_job.get("spec") or {}).get("suspend"):
        return None
    waited = (s.now - st.parse_time(started)).total_seconds()
    if waited < gang.schedule_timeout_seconds or not _refused(s, node_job, gang):
        return None
    message = (f"the gang was refused in {mark} for {waited:.0f}s (schedule timeout "
               f"{gang.schedule_timeout_seconds}s); placing it again")
    return Plan(steps=(delete_child(JOBS, node_job, "Foreground"), Event("Normal", "PlacingAgain", message)),
                requeue_after=PLACEMENT_RECHECK_SECONDS)


def _may_pin(node_job: dict) -> bool:
    """Whether an unpinned node Job may still get gangctl's placement: a Job whose pods never started
    (suspended, no startTime) may have its node affinity changed."""
    return bool((node_job.get("spec") or {}).get("suspend")) and not (node_job.get("status") or {}).get("startTime")


def _converge(s: Snapshot, plan: Plan, job: ResolvedJob, backend, gang: Gang, quota: _Quota, size: int | None,
              resize: elastic.Resize | None, lost_gone: int) -> Plan:
    """Apply the children, release what a suspended job holds, report, and release what a finished
    one holds; nudge a waiting gang when capacity was freed."""
    observed, owner = s.node_job, owner_reference(s.job)
    kueue_owned = base.controls_suspend(backend)
    steps: list[Step] = []
    if job.elastic and not job.suspend:
        steps += ensure_store(store_pods(s.pods), rendezvous_store(job, owner, {}), s.scheduler_name)
    first = observed is None
    steps += ensure(SERVICES, s.service, headless_service(job, owner), first)
    if first and not s.jobs:  # made with the TrainJob's first child (an initializer's, when it has some)
        steps += _claims(job, owner)
    applied_group, gang_after = None, s.groups.get(backend.name) if backend is not None else None
    if base.wants_group(backend) and not job.suspend:
        group = with_spec_hash(with_placement(backend.group(job, gang, owner), backend, job, s.topology))
        steps += ensure(backend.group_resource, gang_after, group, first)
        applied_group, gang_after = backend.name, gang_after or group
    progress_url = _progress_url(s, job)
    if first and progress_url and s.progress is not None:
        steps.append(Create(CONFIGMAPS, progress.config_map(job.namespace, job.name, s.progress.ca_pem, owner),
                            cached=False))
    desired = node_job(job, owner, backend, s.scheduler_name, size, gang, progress_url, pooled(observed))
    after = observed
    if not kueue_owned:
        steps += ensure(JOBS, observed, desired, first)
        after = desired if observed is None else {**observed, "spec": {**(observed.get("spec") or {}),
                                                                       "suspend": desired["spec"].get("suspend")}}
    elif observed is None and not job.suspend:
        steps.append(Create(JOBS, desired, rejectable=True))
    if job.suspend:
        steps += _release(s, after, applied_group)
        if kueue_owned:
            observed = None  # deleted by the release
    if backend is not None and not base.wants_group(backend) and observed is None:
        gang_after = None  # a Workload is found by its Job's uid: no Job, no Workload
    hints = plan.hints[1] if plan.hints else {}
    # A Job this pass creates is reported as made (its writes come before the status write): the
    # status says Waiting now instead of Creating, then Waiting one pass later (one write less).
    made = after if observed is None and not job.elastic else None
    status, metrics = _steady_status(s, job, backend, gang, quota, observed, gang_after, hints, size, resize,
                                     lost_gone, made=made)
    previous = _previous(s)
    if resize is not None:
        steps.append(Event("Normal", "Resized", resize.message))
    if status != previous:
        steps.append(WriteStatus(status))
        metrics += _transitions(previous, status)
    if st.finished(status):
        steps += _release(s, after, applied_group)
    elif s.nudge:
        plan = dataclasses.replace(plan, clear_nudge=True)
        if (base.needs_nudge(backend) and not job.suspend and st.waiting_for_gang(status)
                and _refused(s, observed, gang)):
            steps.append(nudge(backend.group_resource, job.namespace, job.name, s.now))
    return dataclasses.replace(plan, steps=tuple(steps), metrics=tuple(metrics))


def with_placement(group: dict, backend, job: ResolvedJob, topology: Topology | None) -> dict:
    """The gang's group object asking its scheduler for the job's placement (`_place` put the intent
    on the topology), where the backend has a field for it."""
    if topology is None or job.placement is None:
        return group
    return {**group, "spec": {**(group.get("spec") or {}), **base.placement_spec(backend, job.placement, topology)}}


def nudge(resource: Resource, namespace: str, name: str, now: datetime) -> Patch:
    """Hand a waiting gang back to its scheduler (capacity was freed): a touch of its group object."""
    return Patch(resource, namespace, name, {"metadata": {"annotations": {RETRY_ANNOTATION: st.precise_timestamp(now)}}},
                 missing_ok=True)


def _progress_url(s: Snapshot, job: ResolvedJob) -> str | None:
    """A new node Job's pods get this controller's status endpoint; an existing Job keeps what its pods
    were given (its template is immutable), whether progress reporting was on then or is now."""
    if s.node_job is not None:
        url = progress.injected_url(s.node_job)
        return progress.base_of(url, job.namespace, job.name) if url else None
    return s.progress.base_url if s.progress is not None else None


def _claims(job: ResolvedJob, owner: dict) -> list[Step]:
    """Create the runtime's volumeClaimPolicies PVCs (once: an existing claim, the TrainJob's or made
    before it, is used as it is)."""
    return [Create(PERSISTENT_VOLUME_CLAIMS, claim, rejectable=True, cached=False, exists_ok=True)
            for claim in claims(job, owner)]


def ensure(resource: Resource, cached: dict | None, obj: dict, rejectable: bool = False) -> list[Step]:
    """A child the job owns (the caller checked `cached` with `ownership.foreign`) as `obj`: created
    when none is cached, else applied onto that incarnation (its uid) unless it carries the same spec
    hash (nothing to change)."""
    want = obj["metadata"].get("annotations", {}).get(SPEC_HASH)
    if cached is None:
        return [Apply(resource, obj, rejectable)]
    if want and (cached["metadata"].get("annotations") or {}).get(SPEC_HASH) == want:
        return []
    if cached["metadata"].get("uid"):
        obj = {**obj, "metadata": {**obj["metadata"], "uid": cached["metadata"]["uid"]}}
    return [Apply(resource, obj, rejectable)]


def ensure_store(pods: list[dict], pod: dict, scheduler_name: str) -> list[Step]:
    """The rendezvous store `pod` when none of `pods` (the store pods observed; only those of `pod`'s
    owner count) is alive; recreated when it is lost, under a new name (`<name>-<n>`), since a pod on
    a lost node can stay Terminating until the node comes back."""
    pods = ownership.mine(pod["metadata"]["ownerReferences"][0]["uid"], pods)
    if any(not p["metadata"].get("deletionTimestamp") and (p.get("status") or {}).get("phase")
           not in ("Failed", "Succeeded") for p in pods):
        return []
    ns = pod["metadata"]["namespace"]
    steps: list[Step] = [delete_child(PODS, p) for p in pods if not p["metadata"].get("deletionTimestamp")]
    pod["spec"]["schedulerName"] = scheduler_name
    taken, n, base_name = {p["metadata"]["name"] for p in pods}, len(pods), pod["metadata"]["name"]
    while pods and f"{base_name}-{n}" in taken:
        n += 1
    if pods:
        pod["metadata"]["name"] = f"{base_name}-{n}"
    return [*steps, Create(PODS, pod, cached=False)]


def _steady_status(s: Snapshot, job: ResolvedJob, backend, gang: Gang, quota: _Quota, observed: dict | None,
                   gang_object: dict | None, hints: Mapping[str, PodFailure], size: int | None,
                   resize: elastic.Resize | None, lost_gone: int, made: dict | None = None) -> tuple[dict, list[Metric]]:
    """The status this pass reports. `gang_object`: what the backend watches, as this pass leaves it;
    `made`: the node Job this pass creates (no Job observed yet)."""
    previous = _previous(s)
    reported = observed if observed is not None else made
    jobs = [st.ChildJob.from_job(reported, NODE_JOB)] if reported is not None else []
    gang_obs = st.GangObservation(gang.min_member, _bound_pods(s, observed))
    waiting = base.waiting(backend, gang_object) if backend else None
    # The user's spec.suspend: the quota gate's hold is reported as waiting, not as Suspended.
    status = st.derive_status(previous, jobs, gang_obs, quota.user_suspend, s.now,
                              s.job["metadata"].get("generation"), success_policy=job.success_policy,
                              waiting=quota.wait or waiting)
    restarts = Restarts.from_status(previous)
    if restarts.total or restarts.last_failure:
        status["restarts"] = restarts.to_status()
        status["restartCount"] = restarts.user
    metrics: list[Metric] = []
    if job.elastic and observed is not None:
        status["elastic"], healthy = _elastic_status(s, job, observed, hints, size, resize, gang.min_member,
                                                     lost_gone)
        metrics.append(Metric("world_size", "set", (job.namespace, job.name), healthy))
        if resize is not None:
            metrics.append(Metric("resizes", "inc", (resize.direction, resize.cause)))
    return status, metrics


def _refused(s: Snapshot, job: dict | None, gang: Gang) -> bool:
    """The scheduler gave up on the gang for now: all its pods exist, none is bound, and one is marked
    unschedulable. Only then is it worth handing back (a patch of its PodGroup). While the Job
    controller still creates its pods, each new pod makes the scheduler try the gang again anyway; once
    one pod is bound, the gang has passed the scheduler's gang check and the rest are being bound."""
    pods = ownership.children_of([job["metadata"].get("uid")], s.pods) if job is not None else []
    live = [p for p in pods if (p.get("status") or {}).get("phase") not in ("Failed", "Succeeded")
            and not p["metadata"].get("deletionTimestamp")]
    if len(live) < gang.min_member or any((p.get("spec") or {}).get("nodeName") for p in live):
        return False
    return any(c.get("type") == "PodScheduled" and c.get("status") == "False"
               for p in live for c in (p.get("status") or {}).get("conditions") or [])


def _bound_pods(s: Snapshot, job: dict | None) -> int:
    """Pods of the current Job (by uid) that the scheduler has bound to a node."""
    if job is None:
        return 0
    return sum(1 for p in ownership.children_of([job["metadata"].get("uid")], s.pods)
               if (p.get("spec") or {}).get("nodeName") and (p.get("status") or {}).get("phase") != "Failed")


def _transitions(previous: dict, status: dict) -> list[Metric]:
    before, after = (previous.get("gang") or {}), (status.get("gang") or {})
    if "waitSeconds" in after and after.get("boundAt") != before.get("boundAt"):
        return [Metric("gang_wait", "observe", (), after["waitSeconds"])]
    return []


def _deleting_attempt(s: Snapshot, job: ResolvedJob, observed: dict, child: st.ChildJob) -> Plan:
    """The node Job is being deleted. Unfinished: a restart, a preemption or a person removes it
    (foreground: its pods go first); nothing to record, its deletion requeues us. Finished and
    deleted (TTL, by hand) before its outcome was recorded: the result finalizer kept it here to be
    read. Record it; the next pass lets it go."""
    if child.complete is None:
        return Plan(steps=tuple(_let_go(observed)))
    previous = _previous(s)
    status = st.derive_status(previous, [child], None, job.suspend, s.now,
                              s.job["metadata"].get("generation"), success_policy=job.success_policy)
    if status == previous:
        return Plan()
    return Plan(steps=(WriteStatus(status),), metrics=tuple(_transitions(previous, status)))


# --- failed attempts ----------------------------------------------------------------------------
def _failed_attempt(s: Snapshot, job: ResolvedJob, observed: dict, child: st.ChildJob,
                    failure: tuple[str, str]) -> Plan:
    """The child Job failed: classify, then fail the TrainJob or restart (recreate) the Job, once per
    Job: the judgement is written to status (guarded by resourceVersion) before anything else."""
    previous = _previous(s)
    restarts = Restarts.from_status(previous)
    uid = observed["metadata"].get("uid", "")
    if restarts.last_failure.get("jobUID") == uid and restarts.last_failure.get("action") != RESTART_IN_PLACE:
        # already judged (by us, or an earlier run); an in-place restart of it is no judgement of its failure
        if restarts.last_failure.get("action", "Restart") == "Restart":
            return Plan(steps=tuple(_delete_attempt(observed)))
        return Plan()
    reason, message = failure
    pods = {p.name: p for p in s.disruptions.values()}
    for pod in ownership.children_of([uid], s.pods):
        failed = PodFailure.from_pod(pod)
        if failed is not None:
            pods[failed.name] = failed
    failure = classify(reason, message, list(pods.values()))
    policy = parse_failure_policy(job.failure_policy) if job.failure_policy is not None else None
    decision = judge(policy, failure, restarts)
    after = restarts.after(decision, failure, observed["metadata"]["name"], uid, st.timestamp(s.now), ran_seconds(s, observed))
    decision = paced(decision, after)
    status = {**previous, "restarts": after.to_status(), "restartCount": after.user}
    status["jobsStatus"] = st.derive_status(previous, [child], None, False, s.now)["jobsStatus"]
    if decision.action == "Fail":  # observed is s.node_job: _fail releases it
        return _fail(s, decision.reason, decision.message, status=status,
                     metric=Metric("policy_failures", "inc", (decision.reason,)))
    status = st.set_state(status, st.RESTARTING, "Restarting", decision.message, s.now)
    for key in st.GANG_TIMING:
        status["gang"].pop(key, None)  # the new attempt's gang is measured from its own creation
    kind = "Normal" if decision.counter == "infrastructure" else "Warning"
    return Plan(steps=(WriteStatus(status), Event(kind, "Restarting", f"{decision.reason}: {decision.message}"),
                       *_delete_attempt(observed)),
                metrics=(Metric("restarts", "inc", (decision.counter,)),), drop_hints=uid)


def ran_seconds(s: Snapshot, child: dict) -> float:
    """How long a child Job of the attempt has existed (how soon after it started the attempt failed)."""
    created = child["metadata"].get("creationTimestamp")
    return (s.now - st.parse_time(created)).total_seconds() if created else float("inf")


def _delete_attempt(job: dict) -> list[Step]:
    """Delete a failed attempt (its judgement is in status already), its pods first (foreground),
    and only that attempt (uid precondition)."""
    meta = job["metadata"]
    steps = _let_go(job)
    if not meta.get("deletionTimestamp"):
        steps.append(Delete(JOBS, meta["namespace"], meta["name"], uid=meta.get("uid"), propagation="Foreground"))
    return steps


# --- elastic ------------------------------------------------------------------------------------
def _noted(s: Snapshot, job: dict) -> dict[str, PodFailure]:
    """The hints plus pods of the running attempt that carry DisruptionTarget now: they may be gone
    when it fails, or when it is sized."""
    hints = dict(s.disruptions)
    for pod in ownership.children_of([job["metadata"].get("uid", "")], s.pods):
        failed = PodFailure.from_pod(pod)
        if failed is not None and failed.disruption is not None:
            hints[failed.name] = failed
    return hints


def _elastic_size(s: Snapshot, job: ResolvedJob, gang: Gang, max_nodes: int, observed: dict,
                  hints: dict[str, PodFailure]):
    """(size, resize, lost_gone, hints, recheck): the Job's next size and whether to look again soon."""
    size = min(max_nodes, int((observed.get("spec") or {}).get("parallelism") or job.num_nodes))
    pods = ownership.children_of([observed["metadata"].get("uid", "")], s.pods)
    resize, workers, gone = elastic.size_step(size, gang.min_member, max_nodes, observed, pods,
                                              _previous(s).get("elastic") or {}, s.now, hints)
    if resize is not None:
        size = resize.size
        # Hints of lost pods already gone are accounted for by this resize.
        present = {p["metadata"]["name"] for p in pods}
        hints = {n: h for n, h in hints.items() if n in present}
    recheck = size < max_nodes or any(not w.healthy for w in workers)
    return size, resize, gone, hints, recheck


def _workers(s: Snapshot, job: dict, hints: Mapping[str, PodFailure]) -> list[elastic.Worker]:
    return elastic.workers_of(ownership.children_of([job["metadata"].get("uid", "")], s.pods), hints)


def _elastic_status(s: Snapshot, job: ResolvedJob, observed: dict, hints: Mapping[str, PodFailure],
                    size: int | None, resize: elastic.Resize | None, min_nodes: int,
                    lost_gone: int) -> tuple[dict, int]:
    healthy = elastic.healthy_count(_workers(s, observed, hints))
    out = dict(_previous(s).get("elastic") or {})
    out.update({"currentNodes": healthy, "minNodes": min_nodes, "maxNodes": job.num_nodes,
                "size": size or int((observed.get("spec") or {}).get("parallelism") or 0)})
    if resize is not None:
        out = elastic.noted(out, resize, st.timestamp(s.now), lost_gone)
    return out, healthy
