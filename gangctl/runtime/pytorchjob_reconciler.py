"""Level-based reconcile of one PyTorchJob (kubeflow.org/v1): observe -> decide -> apply.

The same writers as the TrainJob reconciler (one per step kind, server-side apply under one field
manager, status guarded by uid + resourceVersion); what differs is what a pass observes, the pure
decision (`gangctl.policy.decide_pytorchjob`), and where the status goes.
"""
from __future__ import annotations

from gangctl.api.resources import PYTORCHJOBS, Resource
from gangctl.kube.client import ApiError
from gangctl.kube.informer import Informer
from gangctl.plugins import base
from gangctl.plugins.registry import BACKENDS
from gangctl.policy import decide_pytorchjob as dp
from gangctl.policy.decide import GateView
from gangctl.policy.pytorchjob import JOB_NAME, group_name
from gangctl.runtime.reconciler import NotOwned, Reconciler, stuck_words

# PyTorchJob keys share the work queue (and the quota gate) with TrainJob keys under this prefix.
KEY_PREFIX = "pytorchjob:"


class PyTorchJobReconciler(Reconciler):
    """`caches.pytorchjobs` must be set. `gang_scheduler`: the backend every PyTorchJob's gang goes
    through when the cluster serves it (v1's --gang-scheduler-name)."""

    gang_scheduler: str | None = "coscheduling"

    async def reconcile(self, key: str) -> None:
        try:
            await self.apply(dp.decide(self.observe(key)))
        except NotOwned as err:  # see Reconciler.reconcile
            await self.apply(dp.not_owned(self.observe(key), err.obj))

    def observe(self, key: str) -> dp.Snapshot:  # type: ignore[override]
        obj = self.caches.pytorchjobs.get(key)
        ns, _, name = key.partition("/")
        if obj is None:
            return dp.Snapshot(key, self.clock(), None)
        selector = {JOB_NAME: name}
        jobs = tuple(self.caches.jobs.list(ns, selector))
        groups: dict[str, dict | None] = {}
        for backend_name, cache in self.caches.groups.items():
            # A backend's object made from a child Job (Kueue's Workload) is found by that Job's uid
            # (a Kueue-queued PyTorchJob has one Job, its Workers); gangctl's own group by its name.
            made_from = [sel for j in jobs if (sel := base.watched_selector(BACKENDS[backend_name],
                                                                            j["metadata"].get("uid", "")))]
            if base.watched_selector(BACKENDS[backend_name], "") is not None:
                found = [w for sel in made_from for w in cache.list(ns, sel)]
            else:
                found = [g for g in cache.list(ns, selector) if g["metadata"]["name"] == group_name(name)]
            groups[backend_name] = found[0] if found else None
        gate = None
        if self.gate is not None and self.gate.governs(ns):
            gate = GateView(self.gate.admission(obj), self.gate.hold_reason(KEY_PREFIX + key))
        return dp.Snapshot(
            key, self.clock(), obj, scheduler_name=self.scheduler_name, gang_scheduler=self.gang_scheduler,
            jobs=jobs, pods=tuple(self.caches.pods.list(ns, selector)),
            services=tuple(self.caches.services.list(ns, selector)), groups=groups,
            priority_classes=self.caches.priority_class_names(), gate=gate, nudge=key in self.nudge)

    async def report_stuck(self, key: str, err: Exception) -> None:
        """v1's status has no condition for it (its conditions are the job's lifecycle): a Warning event
        on the PyTorchJob, seen in `kubectl describe pytorchjob` and `kubectl get events`."""
        obj = self.caches.pytorchjobs.get(key)
        if obj is None or obj["metadata"].get("deletionTimestamp"):
            return
        _, message = stuck_words("PyTorchJob", err)
        await self.events.warning(obj, "ReconcileError", message)

    def _cache_for(self, resource: Resource) -> Informer | None:
        if resource == PYTORCHJOBS:
            return self.caches.pytorchjobs
        return super()._cache_for(resource)

    async def _write_status(self, pytorchjob: dict, status: dict) -> None:
        """Apply `status` onto the incarnation (uid) and version (resourceVersion) it was decided from."""
        meta = pytorchjob["metadata"]
        body = {"apiVersion": pytorchjob["apiVersion"], "kind": pytorchjob["kind"],
                "metadata": {"name": meta["name"], "namespace": meta["namespace"]}, "status": status}
        for field in ("uid", "resourceVersion"):
            if meta.get(field):
                body["metadata"][field] = meta[field]
        try:
            written = await self.kube.apply(PYTORCHJOBS.path(meta["namespace"], meta["name"], "status"), body,
                                            self.field_manager)
        except ApiError as err:
            if not err.not_found:
                raise
            return
        self.caches.pytorchjobs.write_through(written)
