"""One reconcile pass of a PyTorchJob (kubeflow.org/v1) as a pure function: `decide(Snapshot) -> Plan`.

The TrainJob's `gangctl.policy.decide` has the Plan and its step types; this module decides with the
same steps, the same gang backends (`gangctl.plugins`), the same failure judgement
(`gangctl.policy.failure`), and the PyTorchJob mapping of `gangctl.policy.pytorchjob` (children,
env, labels, gang floor, v1 status). The reconciler's writers carry the plan out unchanged.

What one pass does, in order (docs/pytorchjob.md):

- **Finished** (Succeeded/Failed): release the gang (the PodGroup), apply `cleanPodPolicy` to the
  pods, and delete the PyTorchJob when `ttlSecondsAfterFinished` has passed (else requeue).
- **Pods** are gangctl's own, as v1 made them: `<job>-<type>-<i>`, owned by the PyTorchJob
  (`replica_pod`, `gangctl.policy.replica_pods`). Jobs an older gangctl made for it (one Indexed Job per
  replica type) are deleted first, uncharged, and the pods made once they are gone.
- **A failed pod** is judged once: the judgement goes to the annotation `gangctl.io/restarts` (v1's
  status schema prunes unknown fields) with the pod's uid, guarded by the PyTorchJob's
  resourceVersion, and nothing else is written in that pass. The next pass reads the judgement back:
  Restart deletes every pod of the attempt (by uid, the judged one last) and reports Restarting, and
  the pods are made again, under the same names, once the judged one is gone; Fail reports Failed and
  releases. The counters only grow, so a controller restart never resets the budget.
- **An elastic Worker group** is sized by `gangctl.policy.elastic.plan` between
  `elasticPolicy.minReplicas` and the Worker replicas (clamped to maxReplicas), as a TrainJob's:
  trailing workers with no node (lost, or unschedulable for a few seconds) are cut, and one is added
  back at a time while all are healthy. A resize is written alone to the annotation
  `gangctl.io/elastic` (guarded by resourceVersion); the next pass makes or deletes pods to that size.
- **Quota** (namespaces a quota policy names, backends gangctl gates: coscheduling, native): the
  job asks the quota gate (`gangctl.runtime.quota_gate`, shared with TrainJobs) for what it will
  run (every replica; an elastic job its floor) and is held like a suspended one (no pods, no
  PodGroup, `Suspended=True` with the gate's reason) until admitted. An admitted elastic Worker-only
  job runs at most the workers it was admitted with and may be granted more; one with a Master runs
  at its floor.
- **Stalls** (gangctl's extension, as for TrainJobs): with the annotation `gangctl.io/stall-timeout`
  on the PyTorchJob, a running job whose progress reports (`gangctl.model.progress`: its pods get the
  endpoint's variables, the report is kept in the annotation `gangctl.io/trainer-status`) stop for
  longer is judged as a failure with reason Stalled on its first pod: charged as infrastructure, at
  most `runPolicy.backoffLimit` times, then Failed. A job that never reported is never stalled.
- **Otherwise**: apply the per-pod Services and the backend's group (PodGroup minMember = the
  PyTorchJob's gang floor), create the missing pods, and report v1's status.
"""
from __future__ import annotations

import copy
import dataclasses
import json
from dataclasses import dataclass

from gangctl.api.pytorchjob import DEFAULT_CONTAINER, PyTorchJob, PyTorchJobError, parse
from gangctl.api.quantity import format_quantity
from gangctl.api.resources import CONFIGMAPS, JOBS, PODS, PYTORCHJOBS, SERVICES
from gangctl.plugins import base
from gangctl.model.names import MANAGED_BY, MANAGER
from gangctl.plugins.kueue import PRIORITY_LABEL as KUEUE_PRIORITY_LABEL
from gangctl.plugins.registry import BACKENDS, backend_for
from gangctl.plugins.workload import gang_pod, owner_reference, with_spec_hash
from gangctl.policy import elastic, ownership, placement, replica_pods
from gangctl.policy import pytorchjob as pj
from gangctl.policy import status as st
from gangctl.plugins.torch import rendezvous_store
from gangctl.policy.decide import (Create, Delete, Event, GateIntent, Metric, Patch, Plan, Snapshot, Step, WriteStatus,
                                   ask_gate, cache_grace_left, delete_child, ensure, ensure_store, let_go_of_store,
                                   missing_priority_class, nudge, place, PLACEMENT_RECHECK_SECONDS, ran_seconds, store_pods, with_annotations,
                                   with_placement)
from gangctl.policy.failure import (RESTART_IN_PLACE, Decision, PodFailure, Restarts, charge_in_place, classify,
                                    most_restarted, paced, recreate_wait)
from gangctl.policy.failure import decide as judge
from gangctl.model import progress
from gangctl.model.topology import Topology
from gangctl.model.quota_plan import NodeRange

# runPolicy.managedBy values gangctl serves: unset, and Training Operator's own name (what v1 manifests
# and the v1 SDK write). Any other manager's jobs are left alone.
SERVED_MANAGERS = {None, "", "kubeflow.org/training-operator"}
# The sticky restart counters (gangctl.policy.failure.Restarts), as JSON: v1's status schema has no
# field for them and prunes unknown ones.
RESTARTS_ANNOTATION = "gangctl.io/restarts"
# The elastic Worker group's size and when it last shrank, as JSON (same reason): {"size", "resizes",
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
    pods = _replica_pods(s)
    services = {svc["metadata"]["name"]: svc for svc in s.services}
    gang_object = s.groups.get(backend.name) if base.wants_group(backend) else None
    if (other := ownership.foreign(s.uid, (*(services.get(svc["metadata"]["name"]) for svc in gang.services),
                                             gang_object))) is not None:
        return not_owned(s, other)
    if (old := ownership.mine(s.uid, s.jobs)):
        return _replace_old_jobs(old)
    if (in_place := _restarted_in_place(s, gang, pods, restarts)) is not None:
        return in_place
    last = restarts.last_failure
    judged = last.get("jobUID") if last.get("action") != RESTART_IN_PLACE else None
    if judged and (pod := next((p for p in pods if p["metadata"].get("uid") == judged), None)) is not None:
        if pod["metadata"].get("deletionTimestamp"):
            return Plan()   # the judged attempt is going: its pod's deletion requeues us
        return _carry_out(s, job, restarts, pods, pod)
    for group in gang.groups:
        found = _failure(s, job, group, _of_group(pods, group))
        if found is not None:
            return _judge(s, gang, group, *found, restarts)
    try:
        stall = _stall(s, gang, pods, restarts)
    except ValueError as err:   # the stall timeout annotation is not a duration
        return _fail(s, job, str(err))
    if isinstance(stall, Plan):
        return stall
    attempt = [p for p in pods if not p["metadata"].get("deletionTimestamp")]
    if not attempt and (wait := recreate_wait(last, s.now)) > 0:
        return Plan(requeue_after=wait)   # a gang failing soon after it starts: paced
    if not attempt and (missing := _missing_priority_class(s, job, gang, backend)):
        if (wait := cache_grace_left(s.obj, s.now)) > 0:
            return Plan(requeue_after=wait)   # the PriorityClass may be newer than the cache
        return _fail(s, job, missing)
    quota = _quota(s, job, gang, backend)
    plan = _run(s, job, gang, backend, pods, quota)
    if stall is not None:   # come back when the stall timeout would pass
        wait, reported = stall
        plan = dataclasses.replace(plan, requeue_after=min(plan.requeue_after or wait, wait), metrics=(
            *plan.metrics, Metric("pytorchjob_last_progress", "set", (job.namespace, job.name), reported)))
    return dataclasses.replace(plan, gate=quota.intents)


def _stall(s: Snapshot, gang: pj.PyTorchGang, pods: list[dict], restarts: Restarts) -> Plan | tuple[float, float] | None:
    """A running PyTorchJob whose progress reports stopped for longer than its stall timeout: the stall
    judged on the attempt's first live pod (`_judge`; the next pass carries it out: every pod deleted and
    made again, or Failed past the budget). Else, while it reports, the seconds until it would be
    stalled and when it last reported; None: no timeout, not running, or it never reported.
    ValueError naming the annotation when the timeout is not a duration."""
    timeout = progress.stall_timeout(s.obj["metadata"].get("annotations"))
    live = [p for p in pods if not p["metadata"].get("deletionTimestamp")]
    # judged on the lowest index live (an elastic group's worker 0 may be gone with its node)
    first = min(_of_group(live, gang.groups[0]), key=replica_pods.index_of, default=None)
    if (timeout is None or first is None or not _running(s.obj.get("status") or {})
            or any((p.get("status") or {}).get("phase") != "Running" for p in live)):
        return None   # v1's Running counts pods not yet scheduled: a stall is judged once every pod runs
    report = progress.reported(s.obj)
    # the attempt starts when its last pod started or its last in-place restart was charged: a
    # restarted attempt gets the whole timeout, however long its pods waited for their nodes
    times = [s.obj["metadata"].get("creationTimestamp"), restarts.last_failure.get("time"), *map(_started, live)]
    started = max(st.parse_time(t) for t in times if t)
    silent = progress.silent_for(report, started, s.now)
    if silent is None:
        return None
    if silent <= timeout:
        return max(1.0, timeout - silent + 1.0), st.parse_time(report["lastUpdatedTime"]).timestamp()
    return _judge(s, gang, gang.groups[0], first, (progress.STALLED, (
        f"no progress report for {silent:.0f}s (stall timeout {timeout}s, {progress.STALL_TIMEOUT_ANNOTATION} "
        "of the PyTorchJob)")), restarts)


def _started(pod: dict) -> str | None:
    """When a running pod's containers started (the latest), else when it was made."""
    started = [c["state"]["running"].get("startedAt") for c in (pod.get("status") or {}).get("containerStatuses") or []
               if (c.get("state") or {}).get("running")]
    return max((t for t in started if t), default=None) or pod["metadata"].get("creationTimestamp")


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
    status = pj.next_status(previous, job, pj.count_pods(job, _replica_pods(s)), s.now,
                            held=(ownership.REASON, message))
    steps: tuple[Step, ...] = (WriteStatus(status), Event("Warning", ownership.REASON, message)) \
        if status != previous else ()
    return Plan(key=s.key, job=s.job, steps=steps, requeue_after=ownership.RECHECK_SECONDS)


def _replica_pods(s: Snapshot) -> list[dict]:
    """The job's replica pods (made by it: its uid; not the rendezvous store)."""
    return [p for p in ownership.mine(s.uid, s.pods) if (p["metadata"].get("labels") or {}).get(pj.REPLICA_TYPE)]


def _of_group(pods: list[dict], group: pj.ReplicaGroup) -> list[dict]:
    rtype = group.replica_type.lower()
    return [p for p in pods if p["metadata"]["labels"].get(pj.REPLICA_TYPE) == rtype]


def _replace_old_jobs(jobs: list[dict]) -> Plan:
    """Jobs an older gangctl made for the job (one Indexed Job per replica type, pods named by the Job
    controller): deleted with their pods (foreground, by uid), uncharged; the pods are made, under v1's
    names, once they are gone (their deletion requeues the job)."""
    return Plan(steps=tuple(delete_child(JOBS, j, "Foreground") for j in jobs
                            if not j["metadata"].get("deletionTimestamp")))


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


def _fail(s: Snapshot, job: PyTorchJob, message: str) -> Plan:
    """Failed (written first), then the gang is released and cleanPodPolicy applied."""
    status = pj.next_status(s.obj.get("status"), job, pj.count_pods(job, _replica_pods(s)), s.now,
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
    """Let go of the gang and apply cleanPodPolicy to the pods: All deletes them, Running those not
    finished. A failed job's pods that restart in place are deleted whatever the policy: the kubelet
    would restart them forever."""
    steps = _let_go_of_gang(s)
    cleanup = pj.cleanup(job)
    restarting = {t.lower() for t, spec in job.replica_specs.items() if failed and pj.restarts_in_place(spec)}
    for pod in _replica_pods(s):
        if pod["metadata"].get("deletionTimestamp"):
            continue
        again = pod["metadata"]["labels"].get(pj.REPLICA_TYPE) in restarting
        if cleanup == "delete" or ((cleanup == "running" or again) and not replica_pods.finished(pod)):
            steps.append(delete_child(PODS, pod))
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


def _failure(s: Snapshot, job: PyTorchJob, group: pj.ReplicaGroup, pods: list[dict]) -> tuple[dict, tuple[str, str]] | None:
    """The group's failed pod (not one being deleted: gangctl's own deletions end in Failed too) and
    the failure as the judgement reads it: with restartPolicy ExitCode an exit code of 1-127 is reason
    PodFailurePolicy (the failure policy's FailJobSet rule for it), anything else PodFailed.
    An elastic group's failure is a worker that failed without a disruption (`elastic.failed_worker`);
    a lost worker is the sizing's."""
    if group.job.elastic:
        found = elastic.failed_worker_pod(pods, DEFAULT_CONTAINER)
        return None if found is None else (found[0], elastic.worker_failure(job.namespace, found[1]))
    failed = [(f, p) for p in pods if (p.get("status") or {}).get("phase") == "Failed"
              and not p["metadata"].get("deletionTimestamp")
              and (f := PodFailure.from_pod(p, DEFAULT_CONTAINER)) is not None]
    if not failed:
        return None
    seen, pod = min(failed, key=lambda fp: fp[0].at or "9999")
    if (job.replica_specs[group.replica_type].restart_policy == "ExitCode"
            and seen.exit_code in pj.PERMANENT_EXIT_CODES):
        return pod, ("PodFailurePolicy", f"Container {DEFAULT_CONTAINER} for pod {job.namespace}/{seen.name} failed "
                                         f"with exit code {seen.exit_code} matching FailJob rule")
    # no message: one quoting the pod (`ns/name`) names the culprit as a PodFailurePolicy's does, and a
    # disruption of that pod would then be judged as the user's failure (`failure.classify`)
    return pod, ("PodFailed", "")


def _judge(s: Snapshot, gang: pj.PyTorchGang, group: pj.ReplicaGroup, pod: dict, failure: tuple[str, str],
           restarts: Restarts) -> Plan:
    """Judge a failed pod and record the judgement, with the pod's uid, and nothing else, on the
    PyTorchJob."""
    pods = [f for p in _of_group(_replica_pods(s), group)
            if (f := PodFailure.from_pod(p, container=DEFAULT_CONTAINER)) is not None]
    found = classify(failure[0], failure[1], pods)
    decision = judge(gang.failure_policy, found, restarts, group.replica_type.lower())
    after = restarts.after(decision, found, pod["metadata"]["name"], pod["metadata"].get("uid", ""),
                           st.timestamp(s.now), ran_seconds(s, pod))
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


def _restarted_in_place(s: Snapshot, gang: pj.PyTorchGang, pods: list[dict], restarts: Restarts) -> Plan | None:
    """OnFailure replicas restart in place (`pj.restarts_in_place`): the episodes their pods went through
    and are not charged yet, charged (the annotation first, then an Event). The attempt is named by
    its first pod (the Master's, when there is one). Past the budget the record says Fail, and
    the next pass carries it out as any judged failure (`_carry_out`)."""
    live = [p for p in pods if not p["metadata"].get("deletionTimestamp")]
    first = next((p for p in _of_group(live, gang.groups[0]) if replica_pods.index_of(p) == 0), None)
    restarting = [p for g in gang.groups if g.job.restart_in_place for p in _of_group(live, g)]
    if first is None or not restarting or (seen := most_restarted(restarting, DEFAULT_CONTAINER)) is None:
        return None
    charged = charge_in_place(gang.failure_policy, restarts, first["metadata"]["name"], first["metadata"].get("uid", ""),
                              seen, st.timestamp(s.now))
    if charged is None:
        return None
    decision, after = charged
    metrics = (Metric("restarts", "inc", ("user",), after.user - restarts.user),) if after.user > restarts.user else ()
    return Plan(steps=(_record(s, decision, after), Event("Warning", decision.reason, decision.message)),
                metrics=metrics)


def _carry_out(s: Snapshot, job: PyTorchJob, restarts: Restarts, pods: list[dict], judged: dict) -> Plan:
    """The judged attempt: fail the job, or report Restarting and delete every pod of it, the judged
    one last (while it is there, the restart is not done: a pass cut short finds it again)."""
    last = restarts.last_failure
    message = f"{last.get('decision', '')}: {last.get('decisionMessage', '')}"
    if last.get("action") == "Fail":
        return _fail(s, job, message)
    status = pj.next_status(s.obj.get("status"), job, pj.count_pods(job, pods), s.now, restarting=message)
    steps: list[Step] = []
    if status != s.obj.get("status"):
        steps += [WriteStatus(status), Event("Warning", pj.reason("Restarting"), message)]
    steps += [delete_child(PODS, p) for p in pods if p is not judged and not p["metadata"].get("deletionTimestamp")]
    steps.append(delete_child(PODS, judged))
    return Plan(steps=tuple(steps))


# --- the running job ----------------------------------------------------------------------------
def replica_pod(group: pj.ReplicaGroup, index: int, owner: dict, backend, scheduler_name: str,
                progress_url: str | None = None) -> dict:
    """Pod `index` of a replica type as v1 made it: named (and so its hostname) `<job>-<type>-<index>`,
    owned by the PyTorchJob, with v1's labels and its RANK; the backend's labels, annotations and
    scheduler as on every gang pod; where the controller serves progress reports (`progress_url`, its
    base URL), the variables to report with."""
    job = group.job
    template = copy.deepcopy(job.pod_template)
    meta = template.setdefault("metadata", {})
    labels = {**(meta.get("labels") or {}), MANAGED_BY: MANAGER,
              **pj.pod_labels(job.name, group.replica_type, index, group.ranked)}
    annotations = dict(meta.get("annotations") or {})
    spec = template["spec"]
    gang_pod(meta, spec, labels, annotations, job, backend, scheduler_name)
    if group.ranked:
        for container in spec.get("containers") or []:
            pj.with_env(container, pj.rank_env(index + group.rank_offset))
    if progress_url:
        progress.inject(spec, progress_url, job.namespace, job.name, kind="PyTorchJob")
    meta.update(name=pj.replica_name(job.name, group.replica_type, index), namespace=job.namespace,
                ownerReferences=[owner])
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec}


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


def _hold_and_place(s: Snapshot, job: PyTorchJob, gang: pj.PyTorchGang, backend, pods: list[dict],
                    quota: _Quota) -> tuple[pj.PyTorchGang, _Quota, bool, placement.Waiting | None] | Plan:
    """The gang as this pass applies it: held (no pods) while its user, the quota gate or Kueue holds
    it, or while no topology domain has room for it; else placed (`_place`)."""
    if job.run_policy.suspend and quota.held is None:
        quota = dataclasses.replace(quota, held=_admission_wait(s, backend))
    held = job.run_policy.suspend or quota.held is not None
    placed = _place(s, job, gang, backend, pods, held)
    if isinstance(placed, Plan):
        return placed
    gang, waits = placed
    if waits is not None:   # no domain has room now: held like a suspended job until one has
        quota, held = dataclasses.replace(quota, held=(waits.reason, waits.message)), True
    return gang, quota, held, waits


def _as_made(pods: list[dict]) -> dict | None:
    """The Workers' pod template as their live pods were made (None: none is), in the shape
    `gangctl.policy.decide.place` reads a node Job: a gang placed when its pods were made stays there."""
    pod = next((p for p in pods if replica_pods.live(p)), None)
    if pod is None:
        return None
    return {"spec": {"template": {"metadata": pod["metadata"], "spec": pod.get("spec") or {}}},
            "status": {"startTime": pod["metadata"].get("creationTimestamp") or "made"}}


def _place(s: Snapshot, job: PyTorchJob, gang: pj.PyTorchGang, backend, pods: list[dict],
           held: bool) -> tuple[pj.PyTorchGang, placement.Waiting | None] | Plan:
    """The gang with every replica type's template placed as one (`gangctl.policy.decide.place`, on
    the Workers' template; the Master gets the same domain), and the wait when no domain has room now;
    or the plan of a job that cannot start so."""
    workers = gang.groups[-1]
    placing = place(s, workers.job.placement, workers.job.pod_template, _as_made(_of_group(pods, workers)), backend,
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


def _pods_to(s: Snapshot, gang: pj.PyTorchGang, backend, pods: list[dict], workers_size: int | None) -> list[Step]:
    """Create each group's missing pods; an elastic Worker group's live pods brought to its size
    (`workers_size`; None: its replicas, where the backend owns the size)."""
    owner = owner_reference(s.obj)
    url = s.progress.base_url if s.progress is not None else None
    steps: list[Step] = []
    for group in gang.groups:
        mine = _of_group(pods, group)
        if group.job.elastic:
            create, delete = replica_pods.elastic_changes(workers_size or group.job.num_nodes, mine)
        else:
            create, delete = replica_pods.missing(group.job.num_nodes, mine), []
        steps += [Create(PODS, replica_pod(group, i, owner, backend, s.scheduler_name, url)) for i in create]
        steps += [delete_child(PODS, p) for p in delete]
    if s.progress is not None and any(isinstance(step, Create) for step in steps):
        # the CA the pods verify the endpoint with, before them (a second Create of it is fine: it is ours)
        ca = progress.config_map(s.obj["metadata"]["namespace"], gang.name, s.progress.ca_pem, owner,
                                 {pj.JOB_NAME: gang.name}, kind="PyTorchJob")
        steps.insert(0, Create(CONFIGMAPS, ca, cached=False))
    return steps


def _run(s: Snapshot, job: PyTorchJob, gang: pj.PyTorchGang, backend, pods: list[dict], quota: _Quota) -> Plan:
    owner = owner_reference(s.obj)
    prepared = _hold_and_place(s, job, gang, backend, pods, quota)
    if isinstance(prepared, Plan):
        return prepared
    gang, quota, held, waits = prepared
    workers = gang.groups[-1]
    size, recheck = None, False
    if workers.job.elastic and not held and base.resizes_jobs(backend):   # Kueue admitted the replicas
        sized = _elastic_size(s, workers, _of_group(pods, workers), quota.max_workers)
        if isinstance(sized, Plan):
            return sized
        size, recheck = sized
    services = {svc["metadata"]["name"]: svc for svc in s.services}
    steps: list[Step] = []
    for svc in gang.services:
        steps += ensure(SERVICES, services.get(svc["metadata"]["name"]), _service(svc, owner))
    if held:   # no pods and no gang while held
        steps += _let_go_of_gang(s)
        steps += [delete_child(PODS, p) for p in pods if not p["metadata"].get("deletionTimestamp")]
    else:
        if base.wants_group(backend):
            steps += ensure(backend.group_resource, s.groups.get(backend.name),
                            gang_group(gang, backend, owner, s.topology))
        if gang.rdzv_store:
            steps += ensure_store(store_pods(s.pods), store_pod(gang, owner), s.scheduler_name)
    previous = s.obj.get("status") or {}
    status = pj.next_status(previous, job, pj.count_pods(job, pods), s.now, held=quota.held)
    if not held and not _finished(status):
        steps += _pods_to(s, gang, backend, pods, size)
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


def _elastic_size(s: Snapshot, workers: pj.ReplicaGroup, pods: list[dict],
                  admitted: int | None) -> tuple[int, bool] | Plan:
    """(size, look again soon) for the elastic Worker group, or the Plan that records a resize alone.
    `admitted`: the most workers the quota gate admitted it with (None: no gate)."""
    top = workers.job.num_nodes                              # the Worker replicas, within [min, max]
    if admitted is not None:
        top = min(top, admitted)
    floor = workers.job.min_nodes or top
    memo = elastic_of(s.obj)
    size = max(floor, min(top, int(memo.get("size") or top)))
    if not any(not p["metadata"].get("deletionTimestamp") for p in pods):
        return size, False
    resize, found, gone = elastic.size_step(size, floor, top, {}, pods, memo, s.now)
    if resize is None:
        return size, size < top or any(not w.healthy for w in found)
    after = {**elastic.noted(memo, resize, st.timestamp(s.now), gone), "size": resize.size}
    ns, name = s.namespace_name
    meta = s.obj["metadata"]
    patch = {"metadata": {"resourceVersion": meta.get("resourceVersion"), "annotations": {
        ELASTIC_ANNOTATION: json.dumps(after, sort_keys=True, separators=(",", ":"))}}}
    return Plan(steps=(Patch(PYTORCHJOBS, ns, name, patch), Event("Normal", "Resized", resize.message)),
                metrics=(Metric("resizes", "inc", (resize.direction, resize.cause)),))
