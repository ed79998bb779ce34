"""Level-based reconcile of one job of any kind (gangctl.runtime.kinds): observe -> decide -> apply.

Never acts on an event itself: a key (kind, namespace, name) comes in, the kind's `observe` reads
everything one pass needs from the informers' caches (and the quota gate's answer, and this process's
hints) into a Snapshot, the kind's pure `decide` returns the Plan, and `apply` carries it out:
server-side apply under one field manager, in the plan's order, which is safe to stop between any
two writes.
"""
from __future__ import annotations

import asyncio
import dataclasses
import logging
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Awaitable, Callable, Mapping

from gangctl.api.resources import JOBS, SERVICES, Resource
from gangctl.kube.client import ApiError, Kube
from gangctl.kube.events import EventRecorder
from gangctl.kube.informer import Informer
from gangctl.obs.metrics import Metrics
from gangctl.model.names import RESULT_FINALIZER
from gangctl.model.topology import Topology
from gangctl.plugins.registry import BACKENDS
from gangctl.policy import decide as d
from gangctl.policy import ownership, placement
from gangctl.policy.failure import PodFailure
from gangctl.runtime.kinds import JobKey, JobKind

log = logging.getLogger(__name__)


async def _no_cluster() -> d.ClusterView:
    raise RuntimeError("no cluster lister wired: gangctl's own topology placement cannot list the nodes")

@dataclass
class Caches:
    trainjobs: Informer
    runtimes: Informer
    cluster_runtimes: Informer
    jobs: Informer
    pods: Informer
    services: Informer
    # Backend name -> what its gangs are watched through (PodGroups; Kueue's Workloads). Only the
    # backends this cluster serves are present.
    groups: dict[str, Informer]
    pytorchjobs: Informer | None = None   # kubeflow.org/v1, when the cluster serves its CRD
    priority_classes: Informer | None = None  # names a pod template may give (None: not checked)
    claims: Informer | None = None   # PVCs labelled with a TrainJob's name (its volumeClaimPolicies)
    nodes: Informer | None = None    # Nodes, as `cached.node_view` keeps them (restart mode, lost pods)

    def all(self) -> list[Informer]:
        return [self.trainjobs, self.runtimes, self.cluster_runtimes, self.jobs, self.pods,
                self.services, *self.groups.values(),
                *[i for i in (self.pytorchjobs, self.priority_classes, self.claims, self.nodes) if i is not None]]

    def node_list(self) -> tuple[dict, ...] | None:
        return tuple(self.nodes.cache.values()) if self.nodes is not None else None

    def priority_class_names(self) -> frozenset[str] | None:
        return frozenset(self.priority_classes.cache) if self.priority_classes is not None else None


class Reconciler:
    """`kinds`: the job kinds served, by API kind (gangctl.runtime.kinds)."""

    def __init__(self, kube: Kube, caches: Caches, metrics: Metrics, events: EventRecorder, *,
                 kinds: Mapping[str, JobKind], field_manager: str, scheduler_name: str,
                 clock: Callable[[], datetime] | None = None):
        self.kinds = dict(kinds)
        self.kube = kube
        self.caches = caches
        self.metrics = metrics
        self.events = events
        self.field_manager = field_manager
        self.scheduler_name = scheduler_name
        self.clock = clock or (lambda: datetime.now(timezone.utc))
        # Called when a gang lets go of its nodes, so waiting gangs are retried at once.
        self.on_capacity_freed: Callable[[], None] = lambda: None
        # Reconcile a key again after a delay (the controller wires its work queue's add_after):
        # elastic sizing decides on time (how long a pod waited for a node, probe backoff).
        self.requeue_after: Callable[[JobKey, float], None] = lambda key, delay: None
        # Waiting gangs whose group object should be touched on their next reconcile (see decide's nudge).
        self.nudge: set[JobKey] = set()
        # gangctl's own quota admission for coscheduling (gangctl.runtime.quota_gate.QuotaGate).
        self.gate = None
        # Where trainer pods report status.trainerStatus (the controller sets it when it serves it).
        self.progress = None
        # The cluster's topology, and the nodes and pods gangctl's own placement weighs (the
        # controller wires gangctl.runtime.cluster_view's sources).
        self.topology: Callable[[], Topology | None] = lambda: None
        self.list_cluster: Callable[[], Awaitable[d.ClusterView]] = _no_cluster
        self._placing = asyncio.Lock()
        # Status is the only memory of what was decided (restart counters, the failed attempt already
        # judged): every status write carries the uid and resourceVersion it was decided from, so a
        # decision made on a stale cache fails with 409 and is made again on fresh data, and the
        # written object goes straight into the cache (a write-through, as client-go's mutation
        # cache). Pods seen disrupted before they vanished are only a hint for elastic sizing.
        self._disruptions: dict[str, dict[str, PodFailure]] = {}  # Job uid -> pod name -> disruption

    async def cluster_view(self) -> d.ClusterView:
        """The listed nodes and bound pods, and the gangs this controller pinned (from its Job cache)
        that have fewer pods bound in that listing than they ask for."""
        view = await self.list_cluster()
        # Bound as of the listing (not the newer pod cache): a pod bound since is reserved, not lost.
        reserved = placement.pinned_gangs(self.caches.jobs.cache.values(), view.pods)
        return dataclasses.replace(view, reserved=tuple(reserved))

    def forget(self, key: JobKey) -> None:
        """A job is gone: drop what this process kept about it, and its metric series."""
        self.nudge.discard(key)
        for series in (self.metrics.world_size, self.metrics.last_progress, self.metrics.pytorchjob_last_progress):
            try:
                series.remove(key.namespace, key.name)
            except KeyError:
                pass  # never elastic, or never watched for stalls

    def forget_job(self, uid: str) -> None:
        """A child Job is gone: its disruption hints go with it."""
        self._disruptions.pop(uid, None)

    def hints(self, uid: str) -> dict[str, PodFailure]:
        """The disruption hints of a child Job (by uid): pods seen disrupted on earlier passes."""
        return dict(self._disruptions.get(uid, {}))

    async def reconcile(self, key: JobKey) -> None:
        kind = self.kinds[key.kind]
        plan = kind.decide(kind.observe(self, key))
        log.debug("pass of %s: %d writes, requeue after %s, places itself %s", key, len(plan.steps),
                  plan.requeue_after, plan.wants_nodes)
        if not plan.wants_nodes:
            await self._carry_out(kind, key, plan)
            return
        # gangctl places this gang itself: one placement at a time, each decided with the nodes listed
        # and every gang placed before it (its Job written through to the cache before the next one).
        async with self._placing:
            plan = kind.decide(dataclasses.replace(kind.observe(self, key), cluster=await self.cluster_view()))
            await self._carry_out(kind, key, plan)

    async def _carry_out(self, kind: JobKind, key: JobKey, plan: d.Plan) -> None:
        try:
            await self.apply(key, plan)
        except _Rejected as err:
            # The decisions that depend on a write's outcome: the API refused the first create of
            # the children (422), or a create found an object of that name that the job does not
            # own (not in the caches: not labelled as gangctl's). Decided again, as a follow-up, on
            # what the caches hold now.
            follow_up = kind.rejected(kind.observe(self, key), err.message)
            if follow_up is None:
                raise
            await self.apply(key, follow_up)
        except NotOwned as err:
            await self.apply(key, kind.not_owned(kind.observe(self, key), err.obj))

    async def apply(self, key: JobKey, plan: d.Plan) -> None:
        """Carry out a plan: in-memory intents first (the gate, requeues, hints), then the writes in
        the plan's order, then what only holds once they all succeeded (metrics, dropped hints)."""
        for intent in plan.gate:
            self._tell_gate(str(key), plan, intent)
        if plan.requeue_after is not None:
            self.requeue_after(key, plan.requeue_after)
        if plan.hints is not None:
            uid, hints = plan.hints
            if hints:
                self._disruptions[uid] = dict(hints)
            else:
                self._disruptions.pop(uid, None)
        if plan.clear_nudge:
            self.nudge.discard(key)
        for step in plan.steps:
            await self._step(self.kinds[key.kind], plan, step)
        for metric in plan.metrics:
            series = getattr(self.metrics, metric.name)
            series = series.labels(*metric.labels) if metric.labels else series
            getattr(series, metric.op)(*([metric.value] if metric.op != "inc" else []))
        if plan.drop_hints is not None:
            self._disruptions.pop(plan.drop_hints, None)

    def _tell_gate(self, key: str, plan: d.Plan, intent: d.GateIntent) -> None:
        if isinstance(intent, d.GateForget):
            self.gate.forget(key)
        elif isinstance(intent, d.GateWants):
            ns = plan.job["metadata"]["namespace"]
            self.gate.wants(key, plan.job, intent.min_resources,
                            self.gate.priority(ns, intent.priority_class), intent.nodes)
        elif isinstance(intent, d.GateMayGrow):
            self.gate.may_grow(key, plan.job, intent.nodes)

    async def _step(self, kind: JobKind, plan: d.Plan, step: d.Step) -> None:
        if isinstance(step, d.WriteStatus):
            log.debug("status of %s: gang %s", plan.key, (step.status or {}).get("gang"))
            await self.write_status(kind, plan.job, step.status)
        elif isinstance(step, d.Event):
            record = self.events.normal if step.type == "Normal" else self.events.warning
            await record(plan.job, step.reason, step.message)
        elif isinstance(step, d.CapacityFreed):
            self.on_capacity_freed()
        elif isinstance(step, d.LetGo):
            meta = step.job["metadata"]
            await self.kube.remove_finalizer(JOBS.path(meta["namespace"], meta["name"]), step.job, RESULT_FINALIZER)
        elif isinstance(step, d.Delete):
            await self._delete(step)
        elif isinstance(step, d.Patch):
            await self._patch(step)
        elif isinstance(step, d.Apply):
            await self._apply_object(plan, step)
        elif isinstance(step, d.Create):
            await self._create_object(plan, step)
        else:  # pragma: no cover - a Step kind without a writer is a bug
            raise TypeError(f"no writer for {step!r}")

    # One writer per Step kind, each typed: tests/unit/test_deploy.py derives the RBAC the controller
    # needs from the resources decide puts in each kind of step.
    async def _delete(self, step: d.Delete) -> None:
        log.debug("%s", step)
        await self.kube.delete(step.resource.path(step.namespace, step.name), step.propagation, uid=step.uid)

    async def _patch(self, step: d.Patch) -> None:
        log.debug("%s", step)
        try:
            await self.kube.merge_patch(step.resource.path(step.namespace, step.name), step.patch)
        except ApiError as err:
            if not (step.missing_ok and err.not_found):
                raise

    async def _apply_object(self, plan: d.Plan, step: d.Apply) -> None:
        """Server-side apply (forced: the fields are gangctl's) onto the incarnation the plan names by
        its uid; without one, the object is created, never applied: see _create_object."""
        meta = step.obj["metadata"]
        if not meta.get("uid"):
            await self._create_object(plan, step)
            return
        try:
            written = await self.kube.apply(step.resource.path(meta["namespace"], meta["name"]), step.obj,
                                            self.field_manager)
        except ApiError as err:
            if step.rejectable and err.status == 422:
                raise _Rejected(err.message) from err
            raise
        self._write_through(step.resource, written)

    async def _create_object(self, plan: d.Plan, step: d.Apply | d.Create) -> None:
        """Create once (a POST: an existing object is never changed). An object of that name that the
        job owns is fine (made by an earlier pass); one it does not own is someone else's: used as it
        is when `exists_ok` (a PVC), else the pass stops with NotOwned."""
        meta = step.obj["metadata"]
        path = step.resource.path(meta["namespace"])
        try:
            written = await self.kube.request("POST", path, body=step.obj, params={"fieldManager": self.field_manager})
        except ApiError as err:
            if step.rejectable and err.status == 422:
                raise _Rejected(err.message) from err
            if not err.conflict:
                raise
            if getattr(step, "exists_ok", False):
                return
            written = await self.kube.get(step.resource.path(meta["namespace"], meta["name"]))
            if not ownership.owned(written, (plan.job or {}).get("metadata", {}).get("uid")):
                raise NotOwned(written) from err
        if getattr(step, "cached", True):
            self._write_through(step.resource, written)

    def _write_through(self, resource: Resource, written: dict) -> None:
        cache = self._cache_for(resource)
        if cache is not None:
            cache.write_through(written)

    def _cache_for(self, resource: Resource) -> Informer | None:
        if resource == JOBS:
            return self.caches.jobs
        if resource == SERVICES:
            return self.caches.services
        for kind in self.kinds.values():
            if kind.resource == resource:
                return kind.cache(self.caches)
        for name, cache in self.caches.groups.items():
            if BACKENDS[name].group_resource == resource:
                return cache
        return None

    async def write_status(self, kind: JobKind, obj: dict, status: dict) -> None:
        """Apply `status` as decided from `obj`: only onto that incarnation (uid) as it was then
        (resourceVersion). A stale cache or a concurrent writer gets 409 and the key is decided
        again; a job recreated under the same name never receives its predecessor's status. The
        fields other writers own (`kind.other_writers`) are never sent back."""
        status = {k: v for k, v in status.items() if k not in kind.other_writers}
        meta = obj["metadata"]
        body = {"apiVersion": obj["apiVersion"], "kind": obj["kind"],
                "metadata": {"name": meta["name"], "namespace": meta["namespace"]}, "status": status}
        for field in ("uid", "resourceVersion"):
            if meta.get(field):
                body["metadata"][field] = meta[field]
        try:
            written = await self.kube.apply(kind.resource.path(meta["namespace"], meta["name"], "status"), body,
                                            self.field_manager)
        except ApiError as err:
            if not err.not_found:  # deleted meanwhile: nothing to report on
                raise
            return
        self._write_through(kind.resource, written)

    async def report_stuck(self, key: JobKey, err: Exception) -> None:
        """A key that keeps failing for a reason a retry will not change (the API's 422, 403, 400, or a
        bug of gangctl's on this job's input): say so on the job, in its kind's way, while the
        retries go on (capped backoff)."""
        kind = self.kinds[key.kind]
        cache = kind.cache(self.caches)
        obj = cache.get(key.object_key) if cache is not None else None
        if obj is None or obj["metadata"].get("deletionTimestamp"):
            return
        await kind.report_stuck(self, obj, err)


class NotOwned(Exception):
    """A create found an object of that name that the job does not own (see `ownership`)."""

    def __init__(self, obj: dict):
        super().__init__(ownership.message(obj, "job"))
        self.obj = obj


class _Rejected(Exception):
    """A first create of the children refused with 422 (see `gangctl.policy.decide.rejected`)."""

    def __init__(self, message: str):
        super().__init__(message)
        self.message = message
