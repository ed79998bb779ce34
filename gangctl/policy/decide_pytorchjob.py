"""One reconcile pass of a PyTorchJob (kubeflow.org/v1) as a pure function: `decide(Snapshot) -> Plan`.

The TrainJob's `gangctl.policy.decide` has the Plan and its step types; this module decides with the
same steps, the same gang backends (`gangctl.plugins`), the same failure judgement
(`gangctl.policy.failure`), and the PyTorchJob mapping of `gangctl.policy.pytorchjob` (children,
env, labels, gang floor, v1 status). The reconciler's writers carry the plan out unchanged.

What one pass does, in order (docs/pytorchjob.md):

- **Finished** (Succeeded/Failed): release the gang (the PodGroup), apply `cleanPodPolicy` to the
  child Jobs, and delete the PyTorchJob when `ttlSecondsAfterFinished` has passed (else requeue).
- **A failed child Job** is judged once: the judgement goes to the annotation `gangctl.io/restarts`
  (v1's status schema prunes unknown fields), guarded by the PyTorchJob's resourceVersion, and
  nothing else is written in that pass. The next pass reads the judgement back: Restart deletes
  every child Job of the attempt (foreground, by uid) and reports Restarting; Fail reports Failed
  and releases. The counters only grow, so a controller restart never resets the budget.
- **An elastic Worker Job** is sized by `gangctl.policy.elastic.plan` between
  `elasticPolicy.minReplicas` and the Worker replicas (clamped to maxReplicas), as a TrainJob's:
  trailing workers with no node (lost, or unschedulable for a few seconds) are cut, and one is added
  back at a time while all are healthy. A resize is written alone to the annotation
  `gangctl.io/elastic` (guarded by resourceVersion); the next pass applies the Job at that size.
- **Quota** (namespaces a quota policy names, backends gangctl gates: coscheduling, native): the
  job asks the quota gate (`gangctl.runtime.quota_gate`, shared with TrainJobs) for what it will
  run (every replica; an elastic job its floor) and is held like a suspended one (child Jobs
  suspended, no PodGroup, `Suspended=True` with the gate's reason) until admitted. An admitted
  elastic Worker-only job runs at most the workers it was admitted with and may be granted more;
  one with a Master runs at its floor.
- **Otherwise**: apply the per-pod Services, the backend's group (PodGroup minMember = the
  PyTorchJob's gang floor), one Indexed Job per replica type, stamp each pod's RANK and
  replica-index labels (lifting the RANK scheduling gate), and report v1's status.
"""
from __future__ import annotations

import copy
import dataclasses
import json
from dataclasses import dataclass
from typing import Mapping

from gangctl.api.pytorchjob import DEFAULT_CONTAINER, PyTorchJob, PyTorchJobError, parse
from gangctl.api.quantity import format_quantity
from gangctl.api.resources import JOBS, PODS, PYTORCHJOBS, SERVICES
from gangctl.plugins import base
from gangctl.model.names import MANAGED_BY, MANAGER
from gangctl.plugins.kueue import PRIORITY_LABEL as KUEUE_PRIORITY_LABEL
from gangctl.plugins.registry import BACKENDS, backend_for
from gangctl.plugins.workload import (gang_pod, indexed_spec, pooled,
                                      owner_reference, with_spec_hash)
from gangctl.policy import elastic, ownership, placement
from gangctl.policy import pytorchjob as pj
from gangctl.policy import status as st
from gangctl.plugins.torch import rendezvous_store
from gangctl.policy.decide import (Delete, Event, GateIntent, Metric, Patch, Plan, Snapshot, Step, WriteStatus,
                                   ask_gate, cache_grace_left, delete_child, ensure, ensure_store, let_go_of_store,
                                   missing_priority_class, nudge, patch_child, place, PLACEMENT_RECHECK_SECONDS, ran_seconds, store_pods, with_annotations,
                                   with_placement)
from gangctl.policy.failure import (RESTART_IN_PLACE, Decision, PodFailure, Restarts, charge_in_place, classify,
                                    most_restarted, paced, recreate_wait)
from gangctl.policy.failure import decide as judge
from gangctl.model.topology import Topology
from gangctl.model.quota_plan import NodeRange

# runPolicy.managedBy values gangctl serves: unset, and Training Operator's own name (what v1 manifests
# and the v1 SDK write). Any other manager's jobs are left alone.
SERVED_MANAGERS = {None, "", "kubeflow.org/training-operator"}
# The sticky restart counters (gangctl.policy.failure.Restarts), as JSON: v1's status schema has no
# field for them and prunes unknown ones.
RESTARTS_ANNOTATION = "gangctl.io/restarts"
# The elastic Worker Job's size and when it last shrank, as JSON (same reason): {"size", "resizes",
# "lastResizeReason", "lastResizeTime", "lastShrinkTime", "lostAccounted"}.
ELASTIC_ANNOTATION = "gangctl.io/elastic"
ELASTIC_RECHECK_SECONDS = 2.0   # an elastic job short of its replicas is looked at again this often


def decide(s: Snapshot) -> Plan:
    return dataclasses.replace(_decide(s), key=s.key, job=s.job)


def _decide(s: Snapshot) -> Plan:
    obj = s.job
    if obj is None or obj["metadata"].get("deletionTimestamp"):
        return Plan()  # owner references let the garbage collector remove the children
    if ((obj.get("spec") or {}).get("runPolicy") or {}).get("managedBy") not in SERVED_MANAGERS:
        return Plan()
    try:
        job = parse(obj)
    except PyTorchJobError as err:
        return _invalid(s, str(err))
    previous = obj.get("status") or {}
    if _finished(previous):
        return _done(s, job)
    backend_name = s.gang_scheduler if s.gang_scheduler in s.groups else None
    try:
        gang = pj.to_gang(job, default_backend=backend_name, scheduler_name=s.gang_scheduler_name)
        backend = backend_for(gang.gang_backend)
    except (pj.PyTorchJobMappingError, KeyError) as err:
        return _fail(s, job, str(err.args[0] if err.args else err))
    if backend is not None and backend.name not in s.groups:
        return _fail(s, job, f"metadata.labels: the gang backend {backend.name!r} is not served by this cluster")
    restarts = restarts_of(obj)
    current = _children(s, gang)
    services = {svc["metadata"]["name"]: svc for svc in s.services}
    gang_object = s.groups.get(backend.name) if base.wants_group(backend) else None
    if (other := ownership.foreign(s.uid, (*(services.get(svc["metadata"]["name"]) for svc in gang.services),
                                             gang_object, *current.values()))) is not None:
        return not_owned(s, other)
    if (in_place := _restarted_in_place(s, gang, current, restarts)) is not None:
        return in_place
    last = restarts.last_failure
    judged = last.get("jobUID") if last.get("action") != RESTART_IN_PLACE else None
    for group in gang.groups:
        child = current[group.child_name]
        if child is None or child["metadata"].get("deletionTimestamp"):
            continue
        if child["metadata"].get("uid") == judged:
            return _carry_out(s, job, gang, restarts, current)
        failure = st.ChildJob.from_job(child, group.replica_type.lower()).failure
        if failure is None and group.job.elastic:
            failure = elastic.failed_worker(child, ownership.children_of([child["metadata"].get("uid")], s.pods),
                                                  DEFAULT_CONTAINER)
        if failure is not None:
            return _judge(s, gang, group, child, failure, restarts)
    if any(c is not None and c["metadata"].get("deletionTimestamp") for c in current.values()):
        return Plan()  # a restart is under way: the deletion of the old attempt requeues us
    if all(c is None for c in current.values()) and (wait := recreate_wait(last, s.now)) > 0:
        return Plan(requeue_after=wait)   # a gang failing soon after it starts: paced
    if all(c is None for c in current.values()) and (missing := _missing_priority_class(s, job, gang, backend)):
        if (wait := cache_grace_left(s.obj, s.now)) > 0:
            return Plan(requeue_after=wait)   # the PriorityClass may be newer than the cache
        return _fail(s, job, missing)
    quota = _quota(s, job, gang, backend)
    return dataclasses.replace(_run(s, job, gang, backend, current, quota), gate=quota.intents)


def _missing_priority_class(s: Snapshot, job: PyTorchJob, gang: pj.PyTorchGang, backend) -> str | None:
    """The field naming a PriorityClass that does not exist, with what to do. A replica template's
    stops every pod create; under Kueue so does `schedulingPolicy.priorityClass` of a job without
    Kueue's priority-class label: Kueue takes the Workload's priority from that PriorityClass and
    makes no Workload while it is missing, so the job would wait for ever."""
    for group in gang.groups:
        if (missing := missing_priority_class(group.job.pod_template, s.priority_classes)):
            return f"spec.pytorchReplicaSpecs.{group.replica_type}.template.spec.{missing}"
    named = job.run_policy.scheduling.priority_class if job.run_policy.scheduling is not None else ""
    if (named and base.controls_suspend(backend) and KUEUE_PRIORITY_LABEL not in job.labels
            and s.priority_classes is not None and named not in s.priority_classes):
        return (f"spec.runPolicy.schedulingPolicy.priorityClass: no PriorityClass {named!r} exists, and Kueue takes "
                f"the job's priority from it, so it would never be admitted; create the PriorityClass, or name a "
                f"WorkloadPriorityClass with the label {KUEUE_PRIORITY_LABEL} (kubectl get workloadpriorityclasses), "
                "and create the job again")
    return None


# --- quota --------------------------------------------------------------------------------------
@dataclass(frozen=True)
class _Quota:
    """What the quota gate's answer means for this pass."""

    held: tuple[str, str] | None = None   # the gate holds the job: the Suspended (reason, message)
    max_workers: int | None = None        # an admitted elastic job runs at most this many workers
    intents: tuple[GateIntent, ...] = ()


def charge(gang: pj.PyTorchGang) -> tuple[dict, NodeRange | None]:
    """What the job asks the gate for: every replica it runs (an elastic Worker Job at its floor),
    and, for a Worker-only elastic job, the range the gate may grant more workers in."""
    total: dict = {}
    for group in gang.groups:
        count = group.job.min_nodes if group.job.elastic else group.job.num_nodes
        for name, qty in group.job.requests.items():
            total[name] = total.get(name, 0) + qty * count
    workers = gang.groups[-1].job
    if workers.elastic and len(gang.groups) == 1:
        return total, NodeRange(workers.min_nodes, workers.num_nodes, dict(workers.requests))
    return total, None


def _quota(s: Snapshot, job: PyTorchJob, gang: pj.PyTorchGang, backend) -> _Quota:
    """As a TrainJob's (`gangctl.policy.decide.ask_gate`), asking for every replica it runs."""
    requests, nodes = charge(gang)
    workers = gang.groups[-1].job
    priority_class = ((workers.pod_template.get("spec") or {}).get("priorityClassName")
                      or gang.gang_settings.get("priorityClassName"))
    answer = ask_gate(s.gate, backend, job.run_policy.suspend, requests, priority_class, nodes)
    if answer.admitted and workers.elastic and answer.granted is None:
        return _Quota(max_workers=workers.min_nodes, intents=answer.intents)   # admitted at its floor
    return _Quota(held=answer.held, max_workers=answer.granted, intents=answer.intents)


# --- reading ------------------------------------------------------------------------------------
def restarts_of(obj: dict) -> Restarts:
    text = ((obj.get("metadata") or {}).get("annotations") or {}).get(RESTARTS_ANNOTATION)
    try:
        return Restarts.from_status({"restarts": json.loads(text)}) if text else Restarts()
    except (ValueError, TypeError, AttributeError):
        return Restarts()


def elastic_of(obj: dict) -> dict:
    text = ((obj.get("metadata") or {}).get("annotations") or {}).get(ELASTIC_ANNOTATION)
    try:
        memo = json.loads(text) if text else {}
    except ValueError:
        return {}
    return memo if isinstance(memo, dict) else {}


def _finished(status: dict) -> bool:
    return any(c.get("type") in (pj.SUCCEEDED, pj.FAILED) and c.get("status") == "True"
               for c in status.get("conditions") or [])


def not_owned(s: Snapshot, obj: dict) -> Plan:
    """An object of a child's name exists and this PyTorchJob does not own it: nothing of it is
    touched; the job waits (Suspended, as a job the quota gate holds, with the reason naming it) and
    looks again."""
    if s.job is None:
        return Plan(key=s.key)
    message = ownership.message(obj, "PyTorchJob")
    previous = s.obj.get("status") or {}
    job = parse(s.obj)
    current = {j["metadata"]["name"]: j for j in ownership.mine(s.uid, s.jobs)}
    status = pj.next_status(previous, job, _counts(s, job, current), s.now, held=(ownership.REASON, message))
    steps: tuple[Step, ...] = (WriteStatus(status), Event("Warning", ownership.REASON, message)) \
        if status != previous else ()
    return Plan(key=s.key, job=s.job, steps=steps, requeue_after=ownership.RECHECK_SECONDS)


def _children(s: Snapshot, gang: pj.PyTorchGang) -> dict[str, dict | None]:
    by_name = {j["metadata"]["name"]: j for j in s.jobs}
    return {g.child_name: by_name.get(g.child_name) for g in gang.groups}


def _attempt_pods(s: Snapshot, current: Mapping[str, dict | None]) -> list[dict]:
    """Pods of the current child Jobs (by the owner's uid)."""
    return ownership.children_of((c["metadata"].get("uid") for c in current.values() if c is not None), s.pods)


def _counts(s: Snapshot, job: PyTorchJob, current: Mapping[str, dict | None]) -> dict[str, pj.ReplicaCounts]:
    return pj.count_pods(job, _attempt_pods(s, current))


# --- outcomes -----------------------------------------------------------------------------------
def _invalid(s: Snapshot, message: str) -> Plan:
    """The CRD's validation refuses what parse refuses; an object stored before it was installed gets
    v1's Failed condition with the field named."""
    previous = (s.job or {}).get("status") or {}
    if _finished(previous):
        return Plan()
    at = st.timestamp(s.now)
    cond = {"type": pj.FAILED, "status": "True", "reason": pj.reason("Failed"), "message": message,
            "lastUpdateTime": at, "lastTransitionTime": at}
    status = {**previous, "conditions": [*(previous.get("conditions") or []), cond], "completionTime": at}
    return Plan(steps=(WriteStatus(status), Event("Warning", "InvalidSpec", message)))


def _fail(s: Snapshot, job: PyTorchJob, message: str, current: Mapping[str, dict | None] | None = None) -> Plan:
    """Failed (written first), then the gang is released and cleanPodPolicy applied."""
    current = current or {}
    status = pj.next_status(s.obj.get("status"), job, _counts(s, job, current), s.now,
                            failed=message)
    return Plan(steps=(WriteStatus(status), Event("Warning", pj.reason("Failed"), message),
                       *_release(s, job, failed=True)))


def _let_go_of_gang(s: Snapshot) -> list[Step]:
    """Delete the gang's group and the rendezvous store pod: a finished or suspended job holds neither."""
    uid = s.uid
    steps: list[Step] = []
    for backend_name, group in s.groups.items():
        resource = BACKENDS[backend_name].group_resource
        if (resource is not None and group is not None and ownership.owned(group, uid)
                and not group["metadata"].get("deletionTimestamp")):
            steps.append(delete_child(resource, group))
    return steps + let_go_of_store(uid, s.pods)


def _release(s: Snapshot, job: PyTorchJob, failed: bool) -> list[Step]:
    """Let go of the gang and apply cleanPodPolicy to the child Jobs. A failed job's Jobs whose pods
    restart in place are suspended whatever the policy: the kubelet would restart them forever."""
    steps = _let_go_of_gang(s)
    cleanup = pj.cleanup(job)
    for child in ownership.mine(s.uid, s.jobs):
        meta = child["metadata"]
        if meta.get("deletionTimestamp"):
            continue
        spec = child.get("spec") or {}
        restarting = failed and ((spec.get("template") or {}).get("spec") or {}).get("restartPolicy") == "OnFailure"
        if cleanup == "delete":
            steps.append(delete_child(JOBS, child))
        elif (cleanup == "suspend" or restarting) and not spec.get("suspend") \
                and not st.ChildJob.from_job(child, "").finished:
            steps.append(patch_child(JOBS, child, {"spec": {"suspend": True}}))
    return steps


def _done(s: Snapshot, job: PyTorchJob) -> Plan:
    """Finished: release what is left, and delete the PyTorchJob once its TTL has passed."""
    steps = _release(s, job, failed=st.is_true(s.obj.get("status"), pj.FAILED))
    left = pj.ttl_remaining(job, s.obj.get("status"), s.now)
    if left is not None and left <= 0:
        ns, name = s.namespace_name
        steps.append(Delete(PYTORCHJOBS, ns, name, uid=s.obj["metadata"].get("uid")))
        left = None
    return Plan(steps=tuple(steps), requeue_after=left)


def _judge(s: Snapshot, gang: pj.PyTorchGang, group: pj.ReplicaGroup, child: dict, failure: tuple[str, str],
           restarts: Restarts) -> Plan:
    """Judge a failed child Job and record the judgement, and nothing else, on the PyTorchJob."""
    uid = child["metadata"].get("uid", "")
    pods = [f for p in ownership.children_of([uid], s.pods)
            if (f := PodFailure.from_pod(p, container=DEFAULT_CONTAINER)) is not None]
    found = classify(failure[0], failure[1], pods)
    decision = judge(gang.failure_policy, found, restarts, group.replica_type.lower())
    after = restarts.after(decision, found, child["metadata"]["name"], uid, st.timestamp(s.now), ran_seconds(s, child))
    decision = paced(decision, after)
    metrics = (Metric("restarts", "inc", (decision.counter,)),) if decision.action == "Restart" else ()
    return Plan(steps=(_record(s, decision, after),), metrics=metrics)


def _record(s: Snapshot, decision: Decision, after: Restarts) -> Patch:
    """The judgement on the PyTorchJob's restarts annotation (written before it is carried out; the
    resourceVersion makes a second controller's stale judgement fail instead of counting twice)."""
    after = dataclasses.replace(after, last_failure={**after.last_failure, "decision": decision.reason,
                                                     "decisionMessage": decision.message})
    ns, name = s.namespace_name
    annotation = json.dumps(after.to_status(), sort_keys=True, separators=(",", ":"))
    return Patch(PYTORCHJOBS, ns, name, {"metadata": {"resourceVersion": s.obj["metadata"].get("resourceVersion"),
                                                      "annotations": {RESTARTS_ANNOTATION: annotation}}})


def _restarted_in_place(s: Snapshot, gang: pj.PyTorchGang, current: Mapping[str, dict | None],
                        restarts: Restarts) -> Plan | None:
    """OnFailure replicas restart in place (`pj.restarts_in_place`): the episodes their pods went through
    and are not charged yet, charged (the annotation first, then an Event). The attempt is named by
    its first child Job (the Master's, when there is one). Past the budget the record says Fail, and
    the next pass carries it out as any judged failure (`_carry_out`)."""
    first = current[gang.groups[0].child_name]
    uids = [c["metadata"].get("uid") for g in gang.groups if g.job.restart_in_place
            and (c := current[g.child_name]) is not None]
    if first is None or not uids or (seen := most_restarted(ownership.children_of(uids, s.pods),
                                                            DEFAULT_CONTAINER)) is None:
        return None
    charged = charge_in_place(gang.failure_policy, restarts, first["metadata"]["name"], first["metadata"].get("uid", ""),
                              seen, st.timestamp(s.now))
    if charged is None:
        return None
    decision, after = charged
    metrics = (Metric("restarts", "inc", ("user",), after.user - restarts.user),) if after.user > restarts.user else ()
    return Plan(steps=(_record(s, decision, after), Event("Warning", decision.reason, decision.message)),
                metrics=metrics)


def _carry_out(s: Snapshot, job: PyTorchJob, gang: pj.PyTorchGang, restarts: Restarts,
               current: Mapping[str, dict | None]) -> Plan:
    """The judged attempt: fail the job, or report Restarting and delete every child Job of it."""
    last = restarts.last_failure
    message = f"{last.get('decision', '')}: {last.get('decisionMessage', '')}"
    if last.get("action") == "Fail":
        return _fail(s, job, message, current)
    status = pj.next_status(s.obj.get("status"), job, _counts(s, job, current), s.now,
                            restarting=message)
    steps: list[Step] = []
    if status != s.obj.get("status"):
        steps += [WriteStatus(status), Event("Warning", pj.reason("Restarting"), message)]
    for child in ownership.mine(s.uid, (c for c in current.values() if c is not None)):
        if not child["metadata"].get("deletionTimestamp"):
            steps.append(delete_child(JOBS, child, "Foreground"))
    return Plan(steps=tuple(steps))


# --- the running job ----------------------------------------------------------------------------
def child_job(group: pj.ReplicaGroup, owner: dict, backend, scheduler_name: str, size: int | None = None,
              observed: dict | None = None) -> dict:
    """The Indexed Job of one replica type: pod i's hostname is `<job>-<type>-<i>`, as v1's pod name.
    `size`: an elastic Worker Job's current size (its parallelism; its completions are a pool of indexes);
    `observed`: the Job as it is (one made before the pool of indexes keeps its shape). It carries no
    label of a backend's: what a backend admits is the PyTorchJob (Kueue) or its gang object."""
    job = group.job
    size = job.num_nodes if size is None else size
    template = copy.deepcopy(job.pod_template)
    meta = template.setdefault("metadata", {})
    labels = {**(meta.get("labels") or {}), MANAGED_BY: MANAGER}
    annotations = dict(meta.get("annotations") or {})
    spec = template["spec"]
    gang_pod(meta, spec, labels, annotations, job, backend, scheduler_name)
    job_spec = indexed_spec(job, size, pooled(observed))
    child_labels = {MANAGED_BY: MANAGER, pj.JOB_NAME: job.name, pj.REPLICA_TYPE: group.replica_type.lower()}
    metadata: dict = {"name": group.child_name, "namespace": job.namespace, "labels": child_labels,
                      "ownerReferences": [owner]}
    return with_spec_hash({
        "apiVersion": "batch/v1", "kind": "Job",
        "metadata": metadata,
        "spec": {**job_spec, "suspend": job.suspend, "template": template},
    })


def store_pod(gang: pj.PyTorchGang, owner: dict) -> dict:
    """gangctl's rendezvous store (`gangctl.plugins.torch`), kept off the Workers' nodes."""
    workers = gang.groups[-1]
    return rendezvous_store(workers.job, owner, {}, name=pj.store_name(gang.name),
                            job_labels=pj.store_labels(gang.name),
                            workers={pj.JOB_NAME: gang.name, pj.REPLICA_TYPE: workers.replica_type.lower()},
                            container=DEFAULT_CONTAINER)


def _service(svc: dict, owner: dict) -> dict:
    out = copy.deepcopy(svc)
    out["metadata"]["labels"] = {**out["metadata"]["labels"], MANAGED_BY: MANAGER}
    out["metadata"]["ownerReferences"] = [owner]
    return with_spec_hash(out)


def gang_group(gang: pj.PyTorchGang, backend, owner: dict, topology: Topology | None = None) -> dict:
    """The backend's group for the whole job (both replica types): minMember is the gang floor, and
    minResources what the floor holds (Master and Workers may differ in size); it asks the backend's
    scheduler for the job's placement where the backend has a field for it."""
    group = with_placement(backend.group(gang.groups[-1].job, gang.gang(), owner), backend, gang.groups[-1].job,
                           topology)
    if "minResources" in (group.get("spec") or {}):
        group["spec"]["minResources"] = {k: format_quantity(v) for k, v in sorted(gang.min_resources.items())}
    group["metadata"]["labels"] = {MANAGED_BY: MANAGER, pj.JOB_NAME: gang.name}  # not a TrainJob's
    return with_spec_hash(group)


def _hold_and_place(s: Snapshot, job: PyTorchJob, gang: pj.PyTorchGang, backend, current: Mapping[str, dict | None],
                    quota: _Quota) -> tuple[pj.PyTorchGang, _Quota, bool, placement.Waiting | None] | Plan:
    """The gang as this pass applies it: held (its Jobs suspended) while its user, the quota gate or
    Kueue holds it, or while no topology domain has room for it; else placed (`_place`)."""
    if job.run_policy.suspend and quota.held is None:
        quota = dataclasses.replace(quota, held=_admission_wait(s, backend))
    held = job.run_policy.suspend or quota.held is not None
    if quota.held is not None:   # held like a suspended job: its child Jobs are applied suspended
        gang = _suspended(gang)
    placed = _place(s, job, gang, backend, current, held)
    if isinstance(placed, Plan):
        return placed
    gang, waits = placed
    if waits is not None:   # no domain has room now: held like a suspended job until one has
        quota, held, gang = dataclasses.replace(quota, held=(waits.reason, waits.message)), True, _suspended(gang)
    return gang, quota, held, waits


def _suspended(gang: pj.PyTorchGang) -> pj.PyTorchGang:
    return dataclasses.replace(gang, groups=tuple(
        dataclasses.replace(g, job=dataclasses.replace(g.job, suspend=True)) for g in gang.groups))


def _place(s: Snapshot, job: PyTorchJob, gang: pj.PyTorchGang, backend, current: Mapping[str, dict | None],
           held: bool) -> tuple[pj.PyTorchGang, placement.Waiting | None] | Plan:
    """The gang with every replica type's template placed as one (`gangctl.policy.decide.place`, on
    the Workers' Job; the Master gets the same domain), and the wait when no domain has room now; or
    the plan of a job that cannot start so."""
    workers = gang.groups[-1]
    placing = place(s, workers.job.placement, workers.job.pod_template, current[workers.child_name], backend,
                    placement.Floor(gang.min_member, workers.job.requests), held)
    if placing.problem:
        return _fail(s, job, f"spec.pytorchReplicaSpecs: {placing.problem}")
    if isinstance(placing.blocked, placement.NeedNodes):
        return Plan(wants_nodes=True)
    if isinstance(placing.blocked, placement.Unsatisfiable):
        return _fail(s, job, f"{placing.blocked.reason}: {placing.blocked.message}")
    waits = placing.blocked if isinstance(placing.blocked, placement.Waiting) else None
    if placing.template is workers.job.pod_template:
        return gang, waits   # no pin and no annotation: the templates stay as they are
    asked = base.placement_annotations(backend, placing.intent) if placing.intent is not None else {}

    def placed(group: pj.ReplicaGroup) -> pj.ReplicaGroup:
        template = placing.template
        if group is not workers:   # the same domain as the Workers', pinned the same way
            template = with_annotations(group.job.pod_template, asked)
            template = placement.kept(template, placing.template) or template
        return dataclasses.replace(group, job=dataclasses.replace(group.job, placement=placing.intent,
                                                                  pod_template=template))
    return dataclasses.replace(gang, groups=tuple(placed(g) for g in gang.groups)), waits


def _run(s: Snapshot, job: PyTorchJob, gang: pj.PyTorchGang, backend, current: Mapping[str, dict | None],
         quota: _Quota) -> Plan:
    owner = owner_reference(s.obj)
    prepared = _hold_and_place(s, job, gang, backend, current, quota)
    if isinstance(prepared, Plan):
        return prepared
    gang, quota, held, waits = prepared
    workers = gang.groups[-1]
    size, recheck = None, False
    if workers.job.elastic and not held and base.resizes_jobs(backend):   # Kueue admitted the replicas
        sized = _elastic_size(s, workers, current[workers.child_name], quota.max_workers)
        if isinstance(sized, Plan):
            return sized
        size, recheck = sized
    services = {svc["metadata"]["name"]: svc for svc in s.services}
    steps: list[Step] = []
    for svc in gang.services:
        steps += ensure(SERVICES, services.get(svc["metadata"]["name"]), _service(svc, owner))
    if held:   # the Jobs below are applied suspended: their pods go, and so does the gang
        steps += _let_go_of_gang(s)
    else:
        if base.wants_group(backend):
            steps += ensure(backend.group_resource, s.groups.get(backend.name),
                            gang_group(gang, backend, owner, s.topology))
        if gang.rdzv_store:
            steps += ensure_store(store_pods(s.pods), store_pod(gang, owner), s.scheduler_name)
    for group in gang.groups:
        steps += ensure(JOBS, current[group.child_name],
                         child_job(group, owner, backend, s.scheduler_name, size if group is workers else None,
                                   current[group.child_name]))
    for pod in _attempt_pods(s, current):
        stamp = pj.pod_stamp(job, pod)
        if stamp is not None and not pod["metadata"].get("deletionTimestamp"):
            steps.append(Patch(PODS, job.namespace, pod["metadata"]["name"], stamp, missing_ok=True))
    previous = s.obj.get("status") or {}
    status = pj.next_status(previous, job, _counts(s, job, current), s.now, held=quota.held)
    if status != previous:
        steps.append(WriteStatus(status))
        if _finished(status):
            kind = next(c for c in status["conditions"] if c["status"] == "True" and c["type"] in (pj.SUCCEEDED, pj.FAILED))
            steps.append(Event("Normal" if kind["type"] == pj.SUCCEEDED else "Warning", kind["reason"], kind["message"]))
            steps += _release(s, job, failed=kind["type"] == pj.FAILED)
    nudged = False
    if s.nudge:   # capacity was freed: a gang still waiting for it is handed back to its scheduler
        nudged = True
        if base.needs_nudge(backend) and not held and not _finished(status) and not _running(status):
            steps.append(nudge(backend.group_resource, job.namespace, pj.group_name(job.name), s.now))
    requeue = ELASTIC_RECHECK_SECONDS if recheck and not _finished(status) else None
    if waits is not None:   # a domain may have room by then (capacity freed also nudges us sooner)
        requeue = PLACEMENT_RECHECK_SECONDS
    limit, start = job.run_policy.active_deadline_seconds, status.get("startTime")
    if limit is not None and start is not None and not _finished(status):
        left = max(0.0, limit - (s.now - st.parse_time(start)).total_seconds())
        requeue = left if requeue is None else min(requeue, left)
    return Plan(steps=tuple(steps), requeue_after=requeue, clear_nudge=nudged)


def _running(status: dict) -> bool:
    return any(c.get("type") == pj.RUNNING and c.get("status") == "True" for c in status.get("conditions") or [])


def waiting_for_gang(obj: dict) -> bool:
    """Whether a PyTorchJob's gang may be waiting for capacity: not finished, not suspended (by its
    user or gangctl's quota gate) and not running."""
    status = obj.get("status") or {}
    return not (_finished(status) or _running(status) or any(
        c.get("type") == pj.SUSPENDED and c.get("status") == "True" for c in status.get("conditions") or []))


def _admission_wait(s: Snapshot, backend) -> tuple[str, str] | None:
    """A suspended PyTorchJob under a backend that admits by unsuspending it (Kueue, whose
    `kubeflow.org/pytorchjob` integration suspends a queued job when it is made and lets it run once
    admitted): why it waits, in the backend's words. None: suspended by its user."""
    if not base.controls_suspend(backend):
        return None
    return base.waiting(backend, s.groups.get(backend.name)) or (
        "WaitingForQuota", f"waiting for {backend.name} to admit the job")


def _elastic_size(s: Snapshot, workers: pj.ReplicaGroup, observed: dict | None,
                  admitted: int | None) -> tuple[int, bool] | Plan:
    """(size, look again soon) for the elastic Worker Job, or the Plan that records a resize alone.
    `admitted`: the most workers the quota gate admitted it with (None: no gate)."""
    top = workers.job.num_nodes                              # the Worker replicas, within [min, max]
    if admitted is not None:
        top = min(top, admitted)
    floor = workers.job.min_nodes or top
    memo = elastic_of(s.obj)
    size = max(floor, min(top, int(memo.get("size") or top)))
    if observed is None or st.ChildJob.from_job(observed, "").finished:
        return size, False
    pods = ownership.children_of([observed["metadata"].get("uid")], s.pods)
    resize, found, gone = elastic.size_step(size, floor, top, observed, pods, memo, s.now)
    if resize is None:
        return size, size < top or any(not w.healthy for w in found)
    after = {**elastic.noted(memo, resize, st.timestamp(s.now), gone), "size": resize.size}
    ns, name = s.namespace_name
    meta = s.obj["metadata"]
    patch = {"metadata": {"resourceVersion": meta.get("resourceVersion"), "annotations": {
        ELASTIC_ANNOTATION: json.dumps(after, sort_keys=True, separators=(",", ":"))}}}
    return Plan(steps=(Patch(PYTORCHJOBS, ns, name, patch), Event("Normal", "Resized", resize.message)),
                metrics=(Metric("resizes", "inc", (resize.direction, resize.cause)),))

