"""Level-based reconcile of one TrainJob: observed state from the caches in, desired state out.

Never acts on an event itself: a key comes in, everything is read from the informers' caches, the
desired children are built by pure code and applied with server-side apply under one field
manager, and the status is derived from what the children show.
"""
from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Callable

from gangctl.api.resources import JOBS, PODS, SERVICES, TRAINJOBS, Resource
from gangctl.api.trainjob import parse_trainjob
from gangctl.kube.client import ApiError, Kube
from gangctl.kube.events import EventRecorder
from gangctl.kube.informer import Informer
from gangctl.obs.metrics import Metrics
from gangctl.plugins.names import REPLICATED_JOB, RESULT_FINALIZER, SPEC_HASH, TRAINJOB_NAME, child_job_name
from gangctl.plugins import base
from gangctl.plugins.kueue import JOB_UID_LABEL, QUEUE_LABEL
from gangctl.plugins.registry import BACKENDS, backend_for
from gangctl.plugins.workload import headless_service, node_job, owner_reference, with_spec_hash
from gangctl.policy import status as st
from gangctl.plugins.torch import rendezvous_store, store_name
from gangctl.policy import elastic
from gangctl.policy.failure import PodFailure, Restarts, classify, decide, parse_failure_policy
from gangctl.policy.gang import size_gang
from gangctl.policy.quota_coscheduling import NodeRange
from gangctl.policy.resolve import NODE_JOB, ResolveError, resolve

log = logging.getLogger(__name__)

# managedBy values this controller serves: unset, and Kubeflow Trainer's own (gangctl is a drop-in).
RETRY_ANNOTATION = "gangctl.io/retry-requested-at"
ELASTIC_RECHECK_SECONDS = 2.0
SERVED_MANAGERS = {None, "", "trainer.kubeflow.org/trainjob-controller", "gangctl.io/controller"}


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

    def all(self) -> list[Informer]:
        return [self.trainjobs, self.runtimes, self.cluster_runtimes, self.jobs, self.pods,
                self.services, *self.groups.values()]


class Reconciler:
    def __init__(self, kube: Kube, caches: Caches, metrics: Metrics, events: EventRecorder, *,
                 field_manager: str, scheduler_name: str, clock: Callable[[], datetime] | None = None):
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
        self.requeue_after: Callable[[str, float], None] = lambda key, delay: None
        # Waiting gangs whose PodGroup should be touched on their next reconcile (see _nudge).
        self.nudge: set[str] = set()
        # gangctl's own quota admission for coscheduling (gangctl.runtime.quota_gate.QuotaGate).
        self.gate = None
        # Status is the only memory of what was decided (restart counters, the failed attempt already
        # judged): every status write carries the uid and resourceVersion it was decided from, so a
        # decision made on a stale cache fails with 409 and is made again on fresh data, and the
        # written object goes straight into the cache (a write-through, as client-go's mutation
        # cache). Pods seen disrupted before they vanished are only a hint for elastic sizing.
        self._disruptions: dict[str, dict[str, PodFailure]] = {}  # Job uid -> pod name -> disruption

    def forget(self, key: str, trainjob: dict) -> None:
        """A TrainJob is gone: drop what this process kept about it, and its metric series."""
        self.nudge.discard(key)
        meta = trainjob["metadata"]
        try:
            self.metrics.world_size.remove(meta.get("namespace", ""), meta.get("name", ""))
        except KeyError:
            pass  # never elastic

    def forget_job(self, uid: str) -> None:
        """A child Job is gone: its disruption hints go with it."""
        self._disruptions.pop(uid, None)

    async def reconcile(self, key: str) -> None:
        trainjob = self.caches.trainjobs.get(key)
        if trainjob is None or trainjob["metadata"].get("deletionTimestamp"):
            # Owner references let the garbage collector remove the children; nothing is left to
            # record, so their result finalizers go.
            ns, _, name = key.partition("/")
            for child in self.caches.jobs.list(ns, {TRAINJOB_NAME: name}):
                await self._let_go(child)
            return
        if (trainjob.get("spec") or {}).get("managedBy") not in SERVED_MANAGERS:
            return
        previous = trainjob.get("status") or {}
        if st.finished(previous):
            # Final: release the gang, and never recreate children someone deleted (TTL, cleanup).
            await self._release_gang(trainjob)
            for child in self.caches.jobs.list(trainjob["metadata"]["namespace"], {TRAINJOB_NAME: trainjob["metadata"]["name"]}):
                await self._let_go(child)  # the outcome is recorded: the Job may go (TTL, by hand)
            return

        try:
            parse_trainjob(trainjob)
        except ValueError as err:
            await self._fail(trainjob, "InvalidSpec", str(err))
            return
        runtime = self._runtime_for(trainjob)
        if runtime is None:
            ref = trainjob["spec"]["runtimeRef"]
            message = (f"{ref.get('kind', 'ClusterTrainingRuntime')} {ref['name']!r} not found; "
                       "create it or fix spec.runtimeRef")
            conditions = st.set_condition(list(previous.get("conditions") or []), st.CREATED, False,
                                          "RuntimeNotFound", message, self.clock())
            if conditions != previous.get("conditions"):
                await self._write_status(trainjob, {**previous, "conditions": conditions})
            return
        try:
            job = resolve(trainjob, runtime)
            backend = backend_for(job.gang_backend)
            gang = size_gang(job.num_nodes, job.requests, min_nodes=job.min_nodes,
                             schedule_timeout_seconds=job.gang_settings.get("scheduleTimeoutSeconds"))
        except (ResolveError, KeyError, ValueError) as err:
            message = err.args[0] if err.args else str(err)
            await self._fail(trainjob, getattr(err, "reason", "InvalidRuntime"), str(message))
            return
        if backend is not None and backend.name not in self.caches.groups:
            message = (f"the runtime's podGroupPolicy asks for {backend.name}, but this cluster does not serve "
                       f"{backend.watch.plural}.{backend.watch.group}: install {backend.name} (locally: `gangctl "
                       f"cluster up --scheduler {backend.name}`), then restart gangctl")
            conditions = st.set_condition(list(previous.get("conditions") or []), st.CREATED, False,
                                          "BackendNotInstalled", message, self.clock())
            if conditions != previous.get("conditions"):
                await self._write_status(trainjob, {**previous, "conditions": conditions})
            return
        # Kueue admits by flipping the child Job's spec.suspend: gangctl creates that Job once,
        # suspended, and never applies it again; suspending the TrainJob deletes it (and its Workload).
        kueue_owned = base.controls_suspend(backend)
        # Coscheduling has no quota system: with a policy applied, gangctl's gate admits the jobs of
        # the policy's namespaces, and holds each until then like a suspended one (no PodGroup, Job
        # suspended). Other namespaces are not gated (as Kueue leaves jobs without a queue alone).
        # An elastic job admitted by the gate runs at most the nodes it was admitted with; the gate
        # admits more of them when its team's quota has room and no job of the team waits.
        user_suspend = job.suspend
        quota_wait: tuple[str, str] | None = None
        max_nodes = job.num_nodes
        if self.gate is not None and backend is BACKENDS["coscheduling"] and self.gate.governs(job.namespace):
            admission = self.gate.admission(trainjob)
            if job.suspend:
                self.gate.forget(key)
            elif admission is None:
                priority_class = (job.pod_template.get("spec") or {}).get("priorityClassName")
                self.gate.wants(key, trainjob, gang.min_resources, self.gate.priority(job.namespace, priority_class),
                                NodeRange(gang.min_member, gang.size, gang.per_pod) if job.elastic else None)
                quota_wait = self.gate.waiting(key)   # WaitingForQuota, or QuotaPolicyInvalid (fail closed)
                job = dataclasses.replace(job, suspend=True)
            elif job.elastic and admission.get("nodes"):
                max_nodes = max(gang.min_member, min(job.num_nodes, int(admission["nodes"])))
                self.gate.may_grow(key, trainjob, NodeRange(gang.min_member, gang.size, gang.per_pod))

        owner = owner_reference(trainjob)
        ns = job.namespace
        observed_job = self.caches.jobs.get(f"{ns}/{child_job_name(job.name, NODE_JOB)}")
        restarts = Restarts.from_status(previous)
        size: int | None = None
        resize: elastic.Resize | None = None
        lost_gone = 0
        if observed_job is not None:
            child = st.ChildJob.from_job(observed_job, NODE_JOB)
            if child.failure is None and job.elastic:
                child = self._elastic_pod_failure(observed_job, child)
            if child.failure is not None:
                await self._on_failed_job(trainjob, job, observed_job, child, restarts)
                return
            if observed_job["metadata"].get("deletionTimestamp"):
                if child.complete is None:
                    # A restart, a preemption or a person is removing an unfinished attempt (foreground:
                    # its pods go first); nothing to record. Its deletion requeues us.
                    await self._let_go(observed_job)
                    return
                # Finished, and deleted (TTL, by hand) before its outcome was recorded: the result
                # finalizer kept it here to be read. Record it; the next pass lets it go.
                status = st.derive_status(previous, [child], None, job.suspend, self.clock(),
                                          trainjob["metadata"].get("generation"), success_policy=job.success_policy)
                if status != previous:
                    await self._write_status(trainjob, status)
                    self._record_transitions(trainjob, previous, status)
                return
            self._note_disruptions(ns, job.name, observed_job)
            if job.elastic and not job.suspend and not child.complete and not kueue_owned:
                size = min(max_nodes, int((observed_job.get("spec") or {}).get("parallelism") or job.num_nodes))
                workers = self._workers(ns, job.name, observed_job)
                last = (previous.get("elastic") or {}).get("lastShrinkTime")
                counted = int((observed_job.get("status") or {}).get("failed") or 0)
                seen_failed = sum(1 for p in self._pods_of_job(ns, job.name, observed_job["metadata"].get("uid", ""))
                                  if (p.get("status") or {}).get("phase") == "Failed")
                accounted = int((previous.get("elastic") or {}).get("lostAccounted") or 0)
                resize = elastic.plan(size, gang.min_member, max_nodes, workers, self.clock(),
                                      st.parse_time(last) if last else None,
                                      lost_unseen=counted - seen_failed > accounted)
                lost_gone = counted - seen_failed
                if resize is not None:
                    size = resize.size
                    uid = observed_job["metadata"].get("uid", "")
                    for name, seen in list(self._disruptions.get(uid, {}).items()):
                        if seen.index is not None and seen.index >= size:
                            del self._disruptions[uid][name]  # accounted for by this shrink
                if size < max_nodes or any(not w.healthy for w in workers):
                    self.requeue_after(key, ELASTIC_RECHECK_SECONDS)
        elif self._live_pods(ns, job.name):
            return  # an old attempt's pods are still going: never two live pods for one index
        elif job.elastic and max_nodes < job.num_nodes:
            size = max_nodes
        if job.elastic and not job.suspend:
            await self._ensure_store(job, owner, backend)

        try:
            await self._ensure(SERVICES, self.caches.services, headless_service(job, owner))
            if base.wants_group(backend) and not job.suspend:
                await self._ensure(backend.group_resource, self.caches.groups[backend.name],
                                   with_spec_hash(backend.group(job, gang, owner)))
            desired = node_job(job, owner, backend, self.scheduler_name, size, gang)
            if not kueue_owned:
                await self._ensure(JOBS, self.caches.jobs, desired)
            elif observed_job is None and not job.suspend:
                await self._create(JOBS, self.caches.jobs, desired)
        except ApiError as err:
            if observed_job is None and err.status == 422:
                # Valid to the TrainJob API, refused as a child (a request over its limit, an env name
                # the Job API rejects, more nodes than an Indexed Job may have): the same spec will be
                # refused every time, so only this TrainJob fails, with the API's own words.
                await self._fail(trainjob, "JobRejected",
                                 f"the API server refused this TrainJob's child objects: {err.message}; "
                                 "fix the TrainJob or its runtime and create it again")
                return
            raise
        if job.suspend:
            await self._release_gang(trainjob)
            if kueue_owned:
                observed_job = None  # deleted by the release

        jobs = []
        if observed_job is not None:
            jobs.append(st.ChildJob.from_job(observed_job, NODE_JOB))
        gang_obs = st.GangObservation(gang.min_member, self._bound_pods(ns, job.name, observed_job))
        waiting = base.waiting(backend, self._gang_object(backend, ns, job.name, observed_job)) if backend else None
        status = st.derive_status(previous, jobs, gang_obs, user_suspend, self.clock(),
                                  trainjob["metadata"].get("generation"), success_policy=job.success_policy,
                                  waiting=quota_wait or waiting)
        status = st.drop_condition(status, st.SYNCED)  # this pass applied everything: nothing stuck
        if restarts.total or restarts.last_failure:
            status["restarts"] = restarts.to_status()
            status["restartCount"] = restarts.user
        if job.elastic and observed_job is not None:
            status["elastic"] = self._elastic_status(job, previous, observed_job, size, resize, gang.min_member,
                                                   lost_gone)
            if resize is not None:
                self.metrics.resizes.labels(resize.direction, resize.cause).inc()
                await self.events.normal(trainjob, "Resized", resize.message)
        if status != previous:
            await self._write_status(trainjob, status)
            self._record_transitions(trainjob, previous, status)
        if st.finished(status):
            await self._release_gang(trainjob)
        elif key in self.nudge:
            self.nudge.discard(key)
            # Only coscheduling needs the touch: Volcano retries every session, Kueue on quota changes.
            if backend is BACKENDS["coscheduling"] and not job.suspend and st.waiting_for_gang(status):
                await self._nudge(backend.group_resource, job.namespace, job.name)

    async def _on_failed_job(self, trainjob: dict, job, observed_job: dict, child: st.ChildJob,
                             restarts: Restarts) -> None:
        """The child Job failed: classify, then fail the TrainJob or restart (recreate) the Job, once per
        Job: the judgement is written to status (guarded by resourceVersion) before anything else."""
        uid = observed_job["metadata"].get("uid", "")
        if restarts.last_failure.get("jobUID") == uid:  # already judged (by us, or an earlier run)
            if restarts.last_failure.get("action", "Restart") == "Restart":
                await self._delete_job(observed_job)
            return
        reason, message = child.failure  # type: ignore[misc]
        pods = {p.name: p for p in self._disruptions.get(uid, {}).values()}
        for pod in self._pods_of_job(job.namespace, job.name, uid):
            failed = PodFailure.from_pod(pod)
            if failed is not None:
                pods[failed.name] = failed
        failure = classify(reason, message, list(pods.values()))
        policy = parse_failure_policy(job.failure_policy) if job.failure_policy is not None else None
        decision = decide(policy, failure, restarts)
        now = self.clock()
        after = restarts.after(decision, failure, observed_job["metadata"]["name"], uid, st.timestamp(now))
        previous = trainjob.get("status") or {}
        status = {**previous, "restarts": after.to_status(), "restartCount": after.user}
        status["jobsStatus"] = st.derive_status(previous, [child], None, False, now)["jobsStatus"]
        if decision.action == "Fail":
            status = st.failed_status(status, decision.reason, decision.message, now)
            self.metrics.policy_failures.labels(decision.reason).inc()
            await self._write_status(trainjob, status)
            await self.events.warning(trainjob, decision.reason, decision.message)
            await self._release_gang(trainjob)
            return
        conds = st.set_condition(list(status.get("conditions") or []), st.RUNNING, False, "Restarting",
                                 decision.message, now)
        status["conditions"] = conds
        status.pop("gang", None)  # the new attempt's gang is measured from its own creation
        self.metrics.restarts.labels(decision.counter).inc()
        await self._write_status(trainjob, status)
        record = self.events.normal if decision.counter == "infrastructure" else self.events.warning
        await record(trainjob, "Restarting", f"{decision.reason}: {decision.message}")
        await self._delete_job(observed_job)
        self._disruptions.pop(uid, None)

    async def _let_go(self, job: dict) -> None:
        """Remove gangctl's result finalizer from a child Job whose outcome needs no more recording."""
        meta = job["metadata"]
        if RESULT_FINALIZER in (meta.get("finalizers") or []):
            await self.kube.remove_finalizer(JOBS.path(meta["namespace"], meta["name"]), job, RESULT_FINALIZER)

    async def _delete_job(self, job: dict) -> None:
        """Delete a failed attempt (its judgement is in status already), its pods first (foreground),
        and only that attempt (uid precondition)."""
        meta = job["metadata"]
        await self._let_go(job)
        if not meta.get("deletionTimestamp"):
            await self.kube.delete(JOBS.path(meta["namespace"], meta["name"]), "Foreground", uid=meta.get("uid"))

    def _pods_of_job(self, namespace: str, name: str, uid: str) -> list[dict]:
        return [pod for pod in self.caches.pods.list(namespace, {TRAINJOB_NAME: name})
                if any(ref.get("uid") == uid for ref in pod["metadata"].get("ownerReferences") or [])]

    def _note_disruptions(self, namespace: str, name: str, job: dict) -> None:
        """Remember pods of the running attempt that carry DisruptionTarget: they may be gone when it fails."""
        uid = job["metadata"].get("uid", "")
        for pod in self._pods_of_job(namespace, name, uid):
            failed = PodFailure.from_pod(pod)
            if failed is not None and failed.disruption is not None:
                self._disruptions.setdefault(uid, {})[failed.name] = failed

    def _live_pods(self, namespace: str, name: str) -> bool:
        return any((pod.get("status") or {}).get("phase") not in ("Succeeded", "Failed")
                   for pod in self.caches.pods.list(namespace, {TRAINJOB_NAME: name, REPLICATED_JOB: NODE_JOB}))

    # --- elastic ---------------------------------------------------------------------------------
    def _workers(self, namespace: str, name: str, job: dict) -> list[elastic.Worker]:
        uid = job["metadata"].get("uid", "")
        pods = self._pods_of_job(namespace, name, uid)
        present = {p["metadata"]["name"] for p in pods}
        # Pods seen disrupted that are already gone (a lost node's pod is deleted within seconds).
        out = [elastic.Worker(index=seen.index, bound=True, healthy=False, lost=True)
               for seen in self._disruptions.get(uid, {}).values()
               if seen.index is not None and seen.name not in present]
        for pod in pods:
            meta, status = pod["metadata"], pod.get("status") or {}
            index = (meta.get("annotations") or {}).get("batch.kubernetes.io/job-completion-index")
            if index is None or not index.isdigit():
                continue
            conds = {c.get("type"): c for c in status.get("conditions") or []}
            disrupted = (conds.get("DisruptionTarget") or {}).get("status") == "True"
            deleting = bool(meta.get("deletionTimestamp"))
            bound = bool((pod.get("spec") or {}).get("nodeName"))
            phase = status.get("phase")
            sched = conds.get("PodScheduled") or {}
            since = (st.parse_time(sched["lastTransitionTime"])
                     if sched.get("status") == "False" and sched.get("reason") == "Unschedulable"
                     and sched.get("lastTransitionTime") else None)
            out.append(elastic.Worker(
                index=int(index), bound=bound,
                healthy=bound and not deleting and not disrupted and phase in ("Pending", "Running"),
                lost=disrupted or (deleting and bound and phase not in ("Succeeded",)),
                unschedulable_since=since, succeeded=phase == "Succeeded"))
        return out

    def _elastic_pod_failure(self, job: dict, child: st.ChildJob) -> st.ChildJob:
        """An elastic Job never fails on its own (huge backoffLimit): a worker that exited non-zero
        without a disruption is the attempt's failure, judged by the failure policy."""
        meta = job["metadata"]
        size = int((job.get("spec") or {}).get("parallelism") or 0)
        for pod in self._pods_of_job(meta["namespace"], meta["labels"].get(TRAINJOB_NAME, ""), meta.get("uid", "")):
            failed = PodFailure.from_pod(pod)
            if (failed is not None and failed.disruption is None and failed.index is not None
                    and failed.index < size and (pod.get("status") or {}).get("phase") == "Failed"):
                code = f" with exit code {failed.exit_code}" if failed.exit_code is not None else ""
                return st.ChildJob(**{**child.__dict__, "failure": (
                    "PodFailed", f"worker {meta['namespace']}/{failed.name} failed{code}")})
        return child

    def _elastic_status(self, job, previous: dict, observed_job: dict, size: int | None,
                        resize: elastic.Resize | None, min_nodes: int, lost_gone: int) -> dict:
        workers = self._workers(job.namespace, job.name, observed_job)
        healthy = elastic.healthy_count(workers)
        self.metrics.world_size.labels(job.namespace, job.name).set(healthy)
        out = dict(previous.get("elastic") or {})
        out.update({"currentNodes": healthy, "minNodes": min_nodes, "maxNodes": job.num_nodes,
                    "size": size or int((observed_job.get("spec") or {}).get("parallelism") or 0)})
        if resize is not None:
            stamp = st.timestamp(self.clock())
            out["resizes"] = int(out.get("resizes") or 0) + 1
            out["lastResizeReason"] = resize.cause
            out["lastResizeTime"] = stamp
            if resize.direction == "shrink":
                out["lastShrinkTime"] = stamp
            if resize.cause == "NodeLost":
                out["lostAccounted"] = max(int(out.get("lostAccounted") or 0), lost_gone)
        return out

    async def _ensure_store(self, job, owner: dict, backend) -> None:
        """The rendezvous store pod; recreated when it is lost (a new name, since a pod on a lost node
        can stay Terminating until the node comes back)."""
        pods = [p for p in self.caches.pods.list(job.namespace, {TRAINJOB_NAME: job.name})
                if (p["metadata"].get("labels") or {}).get("gangctl.io/role") == "rendezvous-store"]
        live = [p for p in pods if not p["metadata"].get("deletionTimestamp")
                and (p.get("status") or {}).get("phase") not in ("Failed", "Succeeded")]
        if live:
            return
        for p in pods:
            if not p["metadata"].get("deletionTimestamp"):
                await self.kube.delete(PODS.path(job.namespace, p["metadata"]["name"]))
        pod = rendezvous_store(job, owner, {})
        pod["spec"]["schedulerName"] = self.scheduler_name
        if pods:
            pod["metadata"]["name"] = f"{store_name(job.name)}-{len(pods)}"
        try:
            await self.kube.create(PODS.path(job.namespace), pod)
        except ApiError as err:
            if not err.conflict:
                raise

    def _runtime_for(self, trainjob: dict) -> dict | None:
        ref = trainjob["spec"]["runtimeRef"]
        if ref.get("kind", "ClusterTrainingRuntime") == "TrainingRuntime":
            return self.caches.runtimes.get(f"{trainjob['metadata']['namespace']}/{ref['name']}")
        return self.caches.cluster_runtimes.get(ref["name"])

    def _bound_pods(self, namespace: str, name: str, job: dict | None) -> int:
        """Pods of the current Job (by uid) that the scheduler has bound to a node."""
        if job is None:
            return 0
        uid = job["metadata"].get("uid")
        return sum(
            1 for pod in self.caches.pods.list(namespace, {TRAINJOB_NAME: name})
            if (pod.get("spec") or {}).get("nodeName")
            and any(ref.get("uid") == uid for ref in pod["metadata"].get("ownerReferences") or [])
            and (pod.get("status") or {}).get("phase") not in ("Failed",)
        )

    async def _ensure(self, resource: Resource, cache: Informer, obj: dict) -> None:
        meta = obj["metadata"]
        cached = cache.get(f"{meta['namespace']}/{meta['name']}")
        want = meta.get("annotations", {}).get(SPEC_HASH)
        if cached is not None and want and (cached["metadata"].get("annotations") or {}).get(SPEC_HASH) == want:
            return
        cache.write_through(await self.kube.apply(resource.path(meta["namespace"], meta["name"]), obj,
                                                  self.field_manager))

    async def _create(self, resource: Resource, cache: Informer, obj: dict) -> None:
        """Create once (an object another controller takes over after creation); exists already: fine."""
        meta = obj["metadata"]
        try:
            cache.write_through(await self.kube.create(resource.path(meta["namespace"]), obj))
        except ApiError as err:
            if not err.conflict:
                raise

    def _gang_object(self, backend, namespace: str, name: str, job: dict | None) -> dict | None:
        """What the backend says about the gang: its PodGroup, or the Workload Kueue made of the Job."""
        cache = self.caches.groups.get(backend.name) if backend is not None else None
        if cache is None:
            return None
        if base.wants_group(backend):
            return cache.get(f"{namespace}/{name}")
        if job is None:
            return None
        found = cache.list(namespace, {JOB_UID_LABEL: job["metadata"].get("uid", "")})
        return found[0] if found else None

    async def _release_gang(self, trainjob: dict) -> None:
        """Let go of everything that holds capacity or quota: the PodGroup, a Kueue-queued Job that has
        not finished (its Workload holds quota until it does), the rendezvous store."""
        meta = trainjob["metadata"]
        key = f"{meta['namespace']}/{meta['name']}"
        for name, cache in self.caches.groups.items():
            resource = BACKENDS[name].group_resource
            if resource is not None and cache.get(key) is not None:
                await self.kube.delete(resource.path(meta["namespace"], meta["name"]))
                self.on_capacity_freed()
        child = self.caches.jobs.get(f"{meta['namespace']}/{child_job_name(meta['name'], NODE_JOB)}")
        if (child is not None and not child["metadata"].get("deletionTimestamp")
                and not st.ChildJob.from_job(child, NODE_JOB).finished):
            path = JOBS.path(meta["namespace"], child["metadata"]["name"])
            if QUEUE_LABEL in (child["metadata"].get("labels") or {}):
                await self._let_go(child)
                await self.kube.delete(path)  # Kueue owns spec.suspend: only deleting frees its Workload
                self.on_capacity_freed()
            elif not (child.get("spec") or {}).get("suspend"):
                # A Job gangctl ended itself (an elastic Job never fails on its own: huge
                # backoffLimit) would go on recreating workers: suspend it, keeping the failed pods.
                await self.kube.merge_patch(path, {"spec": {"suspend": True}})
        for pod in self.caches.pods.list(meta["namespace"], {TRAINJOB_NAME: meta["name"],
                                                             "gangctl.io/role": "rendezvous-store"}):
            if not pod["metadata"].get("deletionTimestamp"):
                await self.kube.delete(PODS.path(meta["namespace"], pod["metadata"]["name"]))

    async def _nudge(self, resource: Resource, namespace: str, name: str) -> None:
        """Touch a waiting gang's PodGroup so the scheduler tries it again now.

        Coscheduling re-queues a rejected gang only on Pod add and PodGroup add/update events, not
        when other pods go away; without this a gang waits for the scheduler's periodic flush of
        unschedulable pods (five minutes) after capacity appears.
        """
        stamp = st.precise_timestamp(self.clock())
        try:
            await self.kube.merge_patch(resource.path(namespace, name),
                                        {"metadata": {"annotations": {RETRY_ANNOTATION: stamp}}})
        except ApiError as err:
            if not err.not_found:
                raise

    async def _fail(self, trainjob: dict, reason: str, message: str) -> None:
        previous = trainjob.get("status") or {}
        status = st.failed_status(previous, reason, message, self.clock())
        self.metrics.invalid.inc()
        await self._write_status(trainjob, status)
        await self.events.warning(trainjob, reason, message)
        await self._release_gang(trainjob)

    async def _write_status(self, trainjob: dict, status: dict) -> None:
        """Apply `status` as decided from `trainjob`: only onto that incarnation (uid) as it was then
        (resourceVersion). A stale cache or a concurrent writer gets 409 and the key is decided
        again; a TrainJob recreated under the same name never receives its predecessor's status."""
        # status.admission is the quota gate's (its own field manager): never sent back from a
        # possibly stale cache, or this apply would co-own it and could restore a removed admission.
        status = {k: v for k, v in status.items() if k != "admission"}
        meta = trainjob["metadata"]
        body = {"apiVersion": trainjob["apiVersion"], "kind": trainjob["kind"],
                "metadata": {"name": meta["name"], "namespace": meta["namespace"]}, "status": status}
        for field in ("uid", "resourceVersion"):
            if meta.get(field):
                body["metadata"][field] = meta[field]
        try:
            written = await self.kube.apply(TRAINJOBS.path(meta["namespace"], meta["name"], "status"), body,
                                            self.field_manager)
        except ApiError as err:
            if not err.not_found:  # deleted meanwhile: nothing to report on
                raise
            return
        self.caches.trainjobs.write_through(written)

    async def report_stuck(self, key: str, err: Exception) -> None:
        """A key that keeps failing for a reason a retry will not change (the API's 422, 403, 400, or a
        bug of gangctl's on this job's input): say so on the TrainJob, with the API's own message or
        the error, while the retries go on (capped backoff)."""
        trainjob = self.caches.trainjobs.get(key)
        if trainjob is None or trainjob["metadata"].get("deletionTimestamp"):
            return
        previous = trainjob.get("status") or {}
        if st.finished(previous):
            return
        if isinstance(err, ApiError):
            reason = err.reason or str(err.status)
            message = f"the API server refused gangctl's change: {err.message}. {st.stuck_hint(err.reason, err.message)}"
        else:
            reason = "InternalError"
            message = (f"gangctl failed on this TrainJob: {type(err).__name__}: {err}. It keeps retrying; please "
                       "report it with the TrainJob and its runtime")
        conditions = st.set_condition(list(previous.get("conditions") or []), st.SYNCED, False,
                                      reason, message, self.clock())
        if conditions != previous.get("conditions"):
            await self._write_status(trainjob, {**previous, "conditions": conditions})
            await self.events.warning(trainjob, "ReconcileError", message)

    def _record_transitions(self, trainjob: dict, previous: dict, status: dict) -> None:
        before, after = (previous.get("gang") or {}), (status.get("gang") or {})
        if "waitSeconds" in after and after.get("boundAt") != before.get("boundAt"):
            self.metrics.gang_wait.observe(after["waitSeconds"])

