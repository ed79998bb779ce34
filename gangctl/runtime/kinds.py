"""The job kinds the reconciler serves, each behind one small interface (as Kueue's GenericJob).

One reconciler, one work queue and one quota gate serve every kind; what differs between a TrainJob
(trainer.kubeflow.org/v1alpha1) and a PyTorchJob (kubeflow.org/v1) is said here, once per kind: how
a pass observes it (`observe`), its pure decision (`decide`, and the follow-ups for a child it does
not own or the API refused), which cache holds it, which label names it on its children, which
status fields are its own, whether its gang may be waiting, and how it is told that it is stuck.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, Any, NamedTuple

from gangctl.api.resources import PYTORCHJOBS, TRAINJOBS, Resource
from gangctl.kube.client import ApiError
from gangctl.kube.informer import Informer
from gangctl.plugins import base
from gangctl.model.names import JOBSET_NAME, TRAINJOB_NAME, child_job_name
from gangctl.plugins.registry import BACKENDS
from gangctl.policy import decide as d
from gangctl.policy import decide_pytorchjob as dp
from gangctl.policy import status as st
from gangctl.policy.pytorchjob import JOB_NAME as PYTORCHJOB_NAME
from gangctl.policy.pytorchjob import group_name
from gangctl.model.resolve import NODE_JOB

if TYPE_CHECKING:
    from gangctl.runtime.reconciler import Caches, Reconciler

# How the quota gate's ids (and so its messages: "queued behind ...") name a job of each kind: a
# TrainJob as namespace/name, other kinds with their kind in front.
_ID_PREFIX = {TRAINJOBS.kind: "", PYTORCHJOBS.kind: "pytorchjob:"}


class JobKey(NamedTuple):
    """The work queue's key of one job: its kind, namespace and name."""

    kind: str
    namespace: str
    name: str

    @classmethod
    def of(cls, obj: dict) -> JobKey:
        meta = obj["metadata"]
        return cls(obj.get("kind") or TRAINJOBS.kind, meta.get("namespace", ""), meta["name"])

    @property
    def object_key(self) -> str:
        """namespace/name: the key of the job in its informer's cache."""
        return f"{self.namespace}/{self.name}"

    def __str__(self) -> str:
        return self.id_prefix(self.kind) + self.object_key

    @staticmethod
    def id_prefix(kind: str) -> str:
        """What a job's id starts with: nothing for a TrainJob, its kind for others."""
        return _ID_PREFIX.get(kind, f"{kind.lower()}:")

    @classmethod
    def parse(cls, text: str) -> JobKey:
        """The key `str(key)` was made from."""
        kind = next((k for k, p in _ID_PREFIX.items() if p and text.startswith(p)), TRAINJOBS.kind)
        ns, _, name = text[len(cls.id_prefix(kind)):].partition("/")
        return cls(kind, ns, name)


class JobKind(ABC):
    """What the reconciler needs to know of one job kind."""

    resource: Resource       # the kind's API resource (its status subresource is written)
    name_label: str          # the label that names the job on its children (Jobs, pods, Services, groups)
    other_writers: tuple[str, ...] = ()   # status fields other field managers own: never sent back

    @abstractmethod
    def cache(self, caches: Caches) -> Informer | None:
        """The informer of this kind's objects (None: the cluster does not serve the kind)."""

    @abstractmethod
    def observe(self, rec: Reconciler, key: JobKey) -> Any:
        """The snapshot one pass decides on, read from the caches, the gate and this process's hints."""

    @abstractmethod
    def decide(self, snapshot: Any) -> d.Plan: ...

    @abstractmethod
    def not_owned(self, snapshot: Any, obj: dict) -> d.Plan:
        """The follow-up when a create found an object of a child's name that the job does not own."""

    def rejected(self, snapshot: Any, message: str) -> d.Plan | None:
        """The follow-up when the API refused a first create of the children (None: retried as an error)."""
        return None

    @abstractmethod
    def waiting_for_gang(self, obj: dict) -> bool:
        """Whether the job's gang may be waiting for capacity (a nudge is worth it)."""

    @abstractmethod
    async def report_stuck(self, rec: Reconciler, obj: dict, err: Exception) -> None:
        """Say on the job that its passes keep failing for a reason a retry will not change."""


def _gate_view(rec: Reconciler, key: JobKey, obj: dict) -> d.GateView | None:
    if rec.gate is None or not rec.gate.governs(key.namespace):
        return None
    return d.GateView(rec.gate.admission(obj), rec.gate.hold_reason(str(key)))


class TrainJobKind(JobKind):
    resource = TRAINJOBS
    name_label = TRAINJOB_NAME
    # status.admission is the quota gate's and status.trainerStatus the progress endpoint's (each its
    # own field manager): never sent back from a possibly stale cache, or a status apply would co-own
    # them and could restore a removed admission or an older progress report.
    other_writers = ("admission", "trainerStatus")

    def cache(self, caches: Caches) -> Informer | None:
        return caches.trainjobs

    def observe(self, rec: Reconciler, key: JobKey) -> d.Snapshot:
        ns, name = key.namespace, key.name
        caches = rec.caches
        trainjob = caches.trainjobs.get(key.object_key)
        jobs = tuple(caches.jobs.list(ns, {TRAINJOB_NAME: name}))
        if trainjob is None:
            return d.Snapshot(key.object_key, rec.clock(), None, jobs=jobs)
        node_job = caches.jobs.get(f"{ns}/{child_job_name(name, NODE_JOB)}")
        uid = node_job["metadata"].get("uid", "") if node_job is not None else ""
        groups: dict[str, dict | None] = {}
        for backend_name, cache in caches.groups.items():
            selector = base.watched_selector(BACKENDS[backend_name], uid)
            if selector is None:
                groups[backend_name] = cache.get(key.object_key)
            else:
                found = cache.list(ns, selector) if node_job is not None else []
                groups[backend_name] = found[0] if found else None
        return d.Snapshot(
            key.object_key, rec.clock(), trainjob, scheduler_name=rec.scheduler_name,
            runtime=_runtime_for(caches, trainjob), jobs=jobs, node_job=node_job,
            service=caches.services.get(key.object_key),  # the headless Service has the TrainJob's name
            pods=tuple(caches.pods.list(ns, {TRAINJOB_NAME: name})), groups=groups, gate=_gate_view(rec, key, trainjob),
            disruptions=rec.hints(uid), nudge=key in rec.nudge, priority_classes=caches.priority_class_names(),
            progress=rec.progress, topology=rec.topology(), nodes=caches.node_list() if node_job is None else None,
            claims=tuple(caches.claims.list(ns, {JOBSET_NAME: name})) if caches.claims is not None else ())

    def decide(self, snapshot: d.Snapshot) -> d.Plan:
        return d.decide(snapshot)

    def not_owned(self, snapshot: d.Snapshot, obj: dict) -> d.Plan:
        return d.not_owned(snapshot, obj)

    def rejected(self, snapshot: d.Snapshot, message: str) -> d.Plan | None:
        return d.rejected(snapshot, message)

    def waiting_for_gang(self, obj: dict) -> bool:
        return st.waiting_for_gang(obj.get("status"))

    async def report_stuck(self, rec: Reconciler, obj: dict, err: Exception) -> None:
        """The state stays; its reason and message say what is stuck until a pass applies everything."""
        previous = obj.get("status") or {}
        if st.finished(previous):
            return
        reason, message = stuck_words("TrainJob", err)
        status = st.set_state(previous, st.gang_state(previous).get("state") or st.PENDING, reason, message,
                              rec.clock())
        if status != previous:
            await rec.write_status(self, obj, status)
            await rec.events.warning(obj, "ReconcileError", message)


def _runtime_for(caches: Caches, trainjob: dict) -> dict | None:
    ref = (trainjob.get("spec") or {}).get("runtimeRef") or {}
    if not ref.get("name"):
        return None  # an invalid spec: decide says so
    if ref.get("kind", "ClusterTrainingRuntime") == "TrainingRuntime":
        return caches.runtimes.get(f"{trainjob['metadata']['namespace']}/{ref['name']}")
    return caches.cluster_runtimes.get(ref["name"])


class PyTorchJobKind(JobKind):
    """`gang_scheduler`: the backend every PyTorchJob's gang goes through when the cluster serves it
    (v1's --gang-scheduler-name); `scheduler_name`: its pods' schedulerName where the backend lets the
    cluster name its scheduler (native)."""

    resource = PYTORCHJOBS
    name_label = PYTORCHJOB_NAME

    def __init__(self, gang_scheduler: str | None = "coscheduling", scheduler_name: str | None = None):
        self.gang_scheduler = gang_scheduler
        self.scheduler_name = scheduler_name

    def cache(self, caches: Caches) -> Informer | None:
        return caches.pytorchjobs

    def observe(self, rec: Reconciler, key: JobKey) -> d.Snapshot:
        ns, name = key.namespace, key.name
        caches = rec.caches
        obj = caches.pytorchjobs.get(key.object_key) if caches.pytorchjobs is not None else None
        if obj is None:
            return d.Snapshot(key.object_key, rec.clock(), None)
        selector = {PYTORCHJOB_NAME: name}
        jobs = tuple(caches.jobs.list(ns, selector))
        groups: dict[str, dict | None] = {}
        for backend_name, cache in caches.groups.items():
            # A backend's object made from the job (Kueue's Workload of the PyTorchJob, which its
            # kubeflow.org/pytorchjob integration admits) is found by the job's uid; gangctl's own group
            # by its name.
            backend = BACKENDS[backend_name]
            if (sel := base.watched_selector(backend, obj["metadata"].get("uid", ""))) is not None:
                found = cache.list(ns, sel)
            else:
                found = [g for g in cache.list(ns, selector) if g["metadata"]["name"] == group_name(name)]
            groups[backend_name] = found[0] if found else None
        return d.Snapshot(
            key.object_key, rec.clock(), obj, scheduler_name=rec.scheduler_name, gang_scheduler=self.gang_scheduler,
            gang_scheduler_name=self.scheduler_name, jobs=jobs, pods=tuple(caches.pods.list(ns, selector)),
            services=tuple(caches.services.list(ns, selector)),
            groups=groups, priority_classes=caches.priority_class_names(), gate=_gate_view(rec, key, obj),
            nudge=key in rec.nudge, topology=rec.topology(), progress=rec.progress)

    def decide(self, snapshot: d.Snapshot) -> d.Plan:
        return dp.decide(snapshot)

    def not_owned(self, snapshot: d.Snapshot, obj: dict) -> d.Plan:
        return dp.not_owned(snapshot, obj)

    def waiting_for_gang(self, obj: dict) -> bool:
        return dp.waiting_for_gang(obj)

    async def report_stuck(self, rec: Reconciler, obj: dict, err: Exception) -> None:
        """v1's status has no condition for it (its conditions are the job's lifecycle): a Warning event
        on the PyTorchJob, seen in `kubectl describe pytorchjob` and `kubectl get events`."""
        _, message = stuck_words("PyTorchJob", err)
        await rec.events.warning(obj, "ReconcileError", message)


def stuck_words(kind: str, err: Exception) -> tuple[str, str]:
    if isinstance(err, ApiError):
        return st.stuck(kind, err.reason or str(err.status), err.message, str(err))
    return st.stuck(kind, None, None, f"{type(err).__name__}: {err}")
