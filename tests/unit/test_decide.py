"""`decide(snapshot) -> plan` on hand-built snapshots: every path of a reconcile pass, no cluster.

Each test builds what the caches would hold and asserts what a user would then see: the TrainJob's
conditions, which objects exist or go, and in which order the writes happen where the order is
what makes a crash between two writes safe.
"""
from __future__ import annotations

import copy
from datetime import datetime, timedelta, timezone

from gangctl.api.resources import JOBS, POD_GROUPS, PODS, SERVICES
from gangctl.plugins.kueue import QUEUE_LABEL
from gangctl.model.names import REPLICATED_JOB, RESULT_FINALIZER, TRAINJOB_NAME
from gangctl.policy import status as st
from gangctl.policy.failure import PodFailure
from gangctl.policy.decide import (Apply, CapacityFreed, Create, Delete, Event, GateView, GateWants, LetGo, Patch,
                                   Snapshot, WriteStatus, decide, rejected)
from gangctl.sim import objects
from gangctl.sim.objects import runtime

NOW = datetime(2026, 11, 23, 12, 0, tzinfo=timezone.utc)
RUNTIME = runtime()
ALL_BACKENDS = {"coscheduling": None, "volcano": None, "kueue": None}
OWNER = {"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob", "name": "llm", "uid": "tj-1",
         "controller": True, "blockOwnerDeletion": True}


def trainjob(nodes: int = 2, *, status: dict | None = None, suspend: bool = False, elastic: dict | None = None,
             **spec) -> dict:
    """The TrainJob these tests decide about: `nodes` nodes of 8 GPUs (elastic between `elastic`'s bounds)."""
    trainer: dict = {"numNodes": nodes, "resourcesPerNode": {"limits": {"nvidia.com/gpu": "8"}}}
    if elastic:
        trainer["elasticPolicy"] = elastic
    return objects.trainjob(uid="tj-1", metadata={"resourceVersion": "7", "generation": 1}, status=status or {},
                            **{"trainer": trainer, "suspend": suspend, **spec})


def child(uid: str = "job-1", *, conditions: list[dict] | None = None, parallelism: int = 2, failed: int = 0,
          labels: dict | None = None, suspend: bool = False, deleting: bool = False) -> dict:
    meta = {"name": "llm-node-0", "namespace": "team-a", "uid": uid, "finalizers": [RESULT_FINALIZER],
            "labels": {TRAINJOB_NAME: "llm", **(labels or {})}, "ownerReferences": [OWNER]}
    if deleting:
        meta["deletionTimestamp"] = st.timestamp(NOW)
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": meta,
            "spec": {"parallelism": parallelism, "suspend": suspend},
            "status": {"conditions": conditions or [], "failed": failed}}


def pod(index: int, job_uid: str = "job-1", *, node: str | None = "n1", disrupted: bool = False, **fields) -> dict:
    """Pod `index` of the TrainJob's node Job (uid `job_uid`), on `node`."""
    job = {"metadata": {"name": "llm-node-0", "namespace": "team-a", "uid": job_uid}}
    return objects.job_pod(job, index, labels={TRAINJOB_NAME: "llm", REPLICATED_JOB: "node"}, node=node,
                           disrupted="DeletionByPodGC" if disrupted else None, **fields)


def snap(tj: dict, *, rt: dict | None = None, groups: dict | None = None, **kw) -> Snapshot:
    return Snapshot("team-a/llm", NOW, tj, runtime=RUNTIME if rt is None else rt,
                    groups=ALL_BACKENDS if groups is None else groups, **kw)


def condition(status: dict | None, ctype: str) -> dict:
    return next((c for c in (status or {}).get("conditions") or [] if c["type"] == ctype), {})


def kinds(plan) -> list[str]:
    return [type(s).__name__ for s in plan.steps]


FAILED = [{"type": "Failed", "status": "True", "reason": "BackoffLimitExceeded", "message": "a pod failed"}]
COMPLETE = [{"type": "Complete", "status": "True", "reason": "Completed", "message": "done"}]


def test_invalid_spec_fails_the_trainjob_with_the_reason():
    tj = trainjob()
    tj["spec"]["trainer"]["numNodes"] = -3
    plan = decide(snap(tj))
    assert condition(plan.status, "Failed") == {**condition(plan.status, "Failed"), "status": "True",
                                                "reason": "InvalidSpec"}
    assert [e.reason for e in plan.of(Event)] == ["InvalidSpec"]
    assert not plan.of(Apply) and not plan.of(Create), "an invalid job gets no children"


def test_missing_runtime_is_reported_and_nothing_is_created():
    plan = decide(Snapshot("team-a/llm", NOW, trainjob(), runtime=None, groups=ALL_BACKENDS))
    created = plan.status["gang"]
    assert (created["state"], created["reason"]) == ("Pending", "RuntimeNotFound")
    assert "conditions" not in plan.status, "Trainer has no condition for it either"
    assert "torch-distributed" in created["message"]
    assert kinds(plan) == ["WriteStatus"]
    again = decide(Snapshot("team-a/llm", NOW, trainjob(status=plan.status), runtime=None, groups=ALL_BACKENDS))
    assert again.steps == (), "the same condition is not written twice"


def test_backend_the_cluster_does_not_serve_is_reported():
    plan = decide(snap(trainjob(), rt=runtime(gang={"volcano": {}}), groups={"coscheduling": None}))
    created = plan.status["gang"]
    assert (created["state"], created["reason"]) == ("Pending", "BackendNotInstalled")
    assert "volcano" in created["message"] and not plan.of(Apply)


def test_steady_state_creates_service_podgroup_and_job_then_reports_them():
    plan = decide(snap(trainjob(nodes=3)))
    applied = [(a.resource, a.obj["metadata"]["name"]) for a in plan.of(Apply)]
    assert applied == [(SERVICES, "llm"), (POD_GROUPS, "llm"), (JOBS, "llm-node-0")]
    group = plan.of(Apply)[1].obj
    assert group["spec"]["minMember"] == 3
    assert plan.of(Apply)[2].obj["spec"]["parallelism"] == 3
    assert kinds(plan)[-1] == "WriteStatus", "children first, then the status that reports them"
    # The next pass sees them in the caches with the same spec hash: nothing is applied again.
    service, group, job = (a.obj for a in plan.of(Apply))
    job = {**job, "metadata": {**job["metadata"], "uid": "job-1"}, "status": {}}
    again = decide(snap(trainjob(nodes=3, status=plan.status), node_job=job, service=service,
                        groups={**ALL_BACKENDS, "coscheduling": group}))
    assert not again.of(Apply)
    # The pass that makes the Job reports it made (Waiting); the next pass, seeing the Job as made
    # and no pod bound, has nothing new to write (issue 12: one status write less per job).
    assert (plan.status["gang"]["state"], plan.status["gang"]["reason"]) == ("Waiting", "WaitingForGang")
    assert plan.status["jobsStatus"][0]["name"] == "node"
    assert not again.of(WriteStatus)


def test_gang_bound_reports_running():
    job = child()
    plan = decide(snap(trainjob(), node_job=job, pods=(pod(0), pod(1))))
    running = plan.status["gang"]
    assert (running["state"], running["reason"]) == ("Running", "GangScheduled")
    assert "conditions" not in plan.status, "a running job has no condition, as under Trainer"


def test_failed_attempt_within_budget_records_the_restart_before_deleting():
    rt = runtime(failure_policy={"maxRestarts": 2})
    plan = decide(snap(trainjob(), rt=rt, node_job=child(conditions=FAILED), pods=(pod(0, phase="Failed", exit_code=1),)))
    order = kinds(plan)
    assert order.index("WriteStatus") < order.index("Delete"), "the judgement is durable before the attempt goes"
    deleted = plan.of(Delete)[0]
    assert (deleted.resource, deleted.uid, deleted.propagation) == (JOBS, "job-1", "Foreground")
    assert plan.status["restartCount"] == 1
    assert plan.status["restarts"]["lastFailure"]["jobUID"] == "job-1"
    assert (plan.status["gang"]["state"], plan.status["gang"]["reason"]) == ("Restarting", "Restarting")
    assert not condition(plan.status, "Failed"), "the TrainJob goes on"
    # After a crash between the two writes, the next pass only deletes: the restart is not counted twice.
    again = decide(snap(trainjob(status=plan.status), rt=rt, node_job=child(conditions=FAILED)))
    assert again.status is None and [type(s) for s in again.steps] == [LetGo, Delete]


def test_budget_exhausted_fails_the_trainjob_and_releases_the_gang():
    rt = runtime(failure_policy={"maxRestarts": 1})
    used = {"restarts": {"user": 1, "infrastructure": 0, "ignored": 0}, "restartCount": 1}
    group = {"metadata": {"name": "llm", "namespace": "team-a", "uid": "pg-1", "ownerReferences": [OWNER]}}
    plan = decide(snap(trainjob(status=used), rt=rt, node_job=child("job-2", conditions=FAILED),
                       groups={**ALL_BACKENDS, "coscheduling": group}))
    failed = condition(plan.status, "Failed")
    assert (failed["status"], failed["reason"]) == ("True", "MaxRestartsExceeded")
    order = kinds(plan)
    assert order[0] == "WriteStatus" and (POD_GROUPS, "llm") in [(d.resource, d.name) for d in plan.of(Delete)]
    assert order.index("WriteStatus") < order.index("Delete"), "the failure is recorded before the gang goes"
    assert plan.of(CapacityFreed), "waiting gangs are told the nodes are free"


def test_finished_trainjob_lets_its_jobs_go_and_recreates_nothing():
    done = st.derive_status({}, [st.ChildJob.from_job(child(conditions=COMPLETE), "node")], None, False, NOW)
    job = child(conditions=COMPLETE)
    plan = decide(snap(trainjob(status=done), node_job=job, jobs=(job,)))
    assert [s.job["metadata"]["name"] for s in plan.of(LetGo)] == ["llm-node-0"]
    assert not plan.of(Apply) and not plan.of(Create) and plan.status is None
    gone = decide(snap(trainjob(status=done)))
    assert gone.steps == (), "a finished TrainJob's deleted Job is not recreated"


def test_suspended_trainjob_releases_its_gang():
    group = {"metadata": {"name": "llm", "namespace": "team-a", "uid": "pg-1", "ownerReferences": [OWNER]}}
    plan = decide(snap(trainjob(suspend=True), node_job=child(suspend=True),
                       groups={**ALL_BACKENDS, "coscheduling": group}))
    assert (POD_GROUPS, "llm") in [(d.resource, d.name) for d in plan.of(Delete)]
    assert all(a.resource != POD_GROUPS for a in plan.of(Apply)), "no PodGroup for a suspended job"
    job = next(a.obj for a in plan.of(Apply) if a.resource == JOBS)
    assert job["spec"]["suspend"] is True
    assert condition(plan.status, "Suspended")["status"] == "True"


def test_kueue_owned_job_is_created_once_suspended_and_never_applied():
    rt = runtime(gang={"kueue": {"queueName": "team-a"}})
    plan = decide(snap(trainjob(), rt=rt))
    created = plan.of(Create)
    assert [c.resource for c in created] == [JOBS]
    job = created[0].obj
    assert job["metadata"]["labels"][QUEUE_LABEL] == "team-a" and job["spec"]["suspend"] is True
    assert all(a.resource != JOBS for a in plan.of(Apply))
    observed = {**job, "metadata": {**job["metadata"], "uid": "job-1"}, "spec": {**job["spec"], "suspend": False}}
    again = decide(snap(trainjob(status=plan.status), rt=rt, node_job=observed))
    assert not again.of(Create) and all(a.resource != JOBS for a in again.of(Apply)), \
        "Kueue owns spec.suspend once the Job exists"
    assert (again.status["gang"]["state"], again.status["gang"]["reason"]) == ("Waiting", "WaitingForQuota")


def unplaced(index: int) -> dict:
    """A pod of the node Job that has found no node for a minute (a lost worker's replacement)."""
    waiting = pod(index, node=None, phase="Pending")
    waiting["status"]["conditions"] = [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                                        "lastTransitionTime": "2026-11-23T11:59:00Z"}]
    return waiting


def test_elastic_shrinks_when_a_lost_workers_replacement_finds_no_node_and_looks_again_soon():
    tj = trainjob(nodes=4, elastic={"minNodes": 2, "maxNodes": 4})
    job = child(parallelism=4)
    job["spec"]["backoffLimitPerIndex"] = 0   # made with the pool of indexes
    lost = (pod(0), pod(1), pod(2), pod(3, disrupted=True))
    waits = decide(snap(tj, node_job=job, pods=lost))
    assert not [a for a in waits.of(Apply) if a.resource == JOBS and a.obj["spec"]["parallelism"] != 4], \
        "the Job controller replaces it at once (a fresh index): no shrink before the replacement is refused"
    plan = decide(snap(tj, node_job=job, pods=(*lost, unplaced(4))))
    applied = next(a.obj for a in plan.of(Apply) if a.resource == JOBS)
    assert applied["spec"]["parallelism"] == 3 and applied["spec"]["completions"] == 1_000
    assert plan.status["elastic"]["lastResizeReason"] == "NodeLost"
    assert plan.status["elastic"]["size"] == 3 and plan.status["elastic"]["currentNodes"] == 3
    assert [e.reason for e in plan.of(Event)] == ["Resized"]
    assert plan.requeue_after is not None
    assert any(a.resource == PODS for a in plan.of(Create)), "an elastic job gets its rendezvous store"


def test_a_native_elastic_gang_keeps_its_jobs_size_and_its_replacement_waits_for_a_node():
    """Kubernetes refuses to change the parallelism of a Job whose pods name a gang PodGroup: under
    native gangs the refused replacement waits, and the Job is never resized (the patch would be
    refused at every pass)."""
    tj = trainjob(nodes=4, elastic={"minNodes": 2, "maxNodes": 4})
    rt = runtime(gang={"native": {}})
    job = child(parallelism=4)
    job["spec"]["backoffLimitPerIndex"] = 0
    plan = decide(snap(tj, rt=rt, node_job=job, pods=(pod(0), pod(1), pod(2), pod(3, disrupted=True), unplaced(4)),
                       groups={**ALL_BACKENDS, "native": None}))
    assert [a.obj["spec"]["parallelism"] for a in plan.of(Apply) if a.resource == JOBS] in ([], [4])
    assert not plan.of(Event) and plan.status["elastic"]["size"] == 4
    assert plan.status["elastic"]["currentNodes"] == 3


def test_elastic_lost_worker_gone_from_the_cache_still_names_the_cause_from_the_hint():
    """A lost node's pod is deleted within seconds: the disruption seen on an earlier pass is the
    only trace, and it enters decide through the snapshot; the shrink accounts for it."""
    tj = trainjob(nodes=4, elastic={"minNodes": 2, "maxNodes": 4})
    survivors = (pod(0), pod(1), pod(2), unplaced(4))
    without = decide(snap(tj, node_job=child(parallelism=4), pods=survivors))
    hint = {"llm-node-0-3": PodFailure.from_pod(pod(3, disrupted=True))}
    gone = decide(snap(tj, node_job=child(parallelism=4), pods=survivors, disruptions=hint))
    assert without.status["elastic"]["size"] == gone.status["elastic"]["size"] == 3
    assert gone.status["elastic"]["lastResizeReason"] == "NodeLost"
    assert without.status["elastic"]["lastResizeReason"] == "Unschedulable", "no hint: only the refused pod is seen"
    assert gone.hints is not None and "llm-node-0-3" not in gone.hints[1], "the shrink accounts for the lost pod"


def test_quota_held_job_is_suspended_and_waits_for_quota():
    gate = GateView(admission=None, hold=("WaitingForQuota", "gangctl quota admission: waiting for quota admission"))
    plan = decide(snap(trainjob(), gate=gate))
    assert [type(i) for i in plan.gate] == [GateWants]
    job = next(a.obj for a in plan.of(Apply) if a.resource == JOBS)
    assert job["spec"]["suspend"] is True, "held like a suspended job"
    assert all(a.resource != POD_GROUPS for a in plan.of(Apply)), "no PodGroup while held"
    assert not condition(plan.status, "Suspended"), "the user did not suspend it"
    admitted = decide(snap(trainjob(), gate=GateView({"nodes": 2}, ("", ""))))
    assert not admitted.gate and any(a.resource == POD_GROUPS for a in admitted.of(Apply))


def test_quota_gate_does_not_govern_a_backend_with_its_own_quota():
    gate = GateView(admission=None, hold=("WaitingForQuota", "held"))
    plan = decide(snap(trainjob(), rt=runtime(gang={"volcano": {}}), gate=gate))
    assert not plan.gate
    job = next(a.obj for a in plan.of(Apply) if a.resource == JOBS)
    assert job["spec"]["suspend"] is False


def unschedulable(p: dict) -> dict:
    p["status"]["phase"] = "Pending"
    p["status"]["conditions"] = [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable"}]
    return p


def test_nudge_touches_only_a_waiting_coscheduling_gang_the_scheduler_refused():
    job = child()
    group = {"metadata": {"name": "llm", "namespace": "team-a", "uid": "pg-1", "ownerReferences": [OWNER]}}
    refused = (unschedulable(pod(0, node=None)), unschedulable(pod(1, node=None)))
    plan = decide(snap(trainjob(), node_job=job, pods=refused, nudge=True, groups={**ALL_BACKENDS, "coscheduling": group}))
    assert plan.clear_nudge and [(p.resource, p.missing_ok) for p in plan.of(Patch)] == [(POD_GROUPS, True)]
    volcano = decide(snap(trainjob(), rt=runtime(gang={"volcano": {}}), node_job=job, pods=refused, nudge=True))
    assert volcano.clear_nudge and not volcano.of(Patch), "Volcano retries on its own"


def test_no_nudge_while_the_gang_is_still_being_made_or_placed():
    """Each new pod makes the scheduler try the gang again, and a gang it is placing was not refused:
    patching its PodGroup then is a write for nothing (issue 12: the writes of a 1,024-pod gang)."""
    job = child()
    group = {"metadata": {"name": "llm", "namespace": "team-a", "uid": "pg-1", "ownerReferences": [OWNER]}}
    for pods in ((unschedulable(pod(0, node=None)),),          # one of two pods made so far
                 (pod(0, node=None, phase="Pending"), pod(1, node=None, phase="Pending")),  # not tried yet
                 (pod(0), unschedulable(pod(1, node=None)))):  # one bound: the gang passed, being bound
        plan = decide(snap(trainjob(), node_job=job, pods=pods, nudge=True,
                           groups={**ALL_BACKENDS, "coscheduling": group}))
        assert plan.clear_nudge and not plan.of(Patch), pods


def test_rejected_children_fail_the_trainjob_with_the_api_message():
    plan = rejected(snap(trainjob()), "spec.template: Invalid value")
    failed = condition(plan.status, "Failed")
    assert failed["reason"] == "JobRejected" and "Invalid value" in failed["message"]
    steady = decide(snap(trainjob()))
    assert all(a.rejectable for a in steady.of(Apply)), "a first create is refused for good only then"


def test_a_priority_class_that_does_not_exist_fails_the_trainjob_before_its_job_is_made():
    overrides = [{"targetJobs": [{"name": "node"}], "spec": {"priorityClassName": "nope"}}]
    tj = trainjob(podTemplateOverrides=overrides)
    plan = decide(snap(tj, priority_classes=frozenset({"high", "system-cluster-critical"})))
    failed = condition(plan.status, "Failed")
    assert failed["reason"] == "JobRejected" and "'nope'" in failed["message"] and "kubectl get priorityclasses" in failed["message"]
    assert not plan.of(Apply) and not plan.of(Create)
    assert decide(snap(tj, priority_classes=frozenset({"nope"}))).of(Apply), "it exists: the job is made"
    assert decide(snap(tj)).of(Apply), "not known (no cache): not checked"
    running = decide(snap(tj, node_job=child(), jobs=(child(),), priority_classes=frozenset()))
    assert not condition(running.status, "Failed"), "a running job is never failed for a class deleted since"
    # A job 2 s old waits for the cache (the class may have been created just before it)
    young = copy.deepcopy(tj)
    young["metadata"]["creationTimestamp"] = st.timestamp(NOW - timedelta(seconds=2))
    plan = decide(snap(young, priority_classes=frozenset()))
    assert not condition(plan.status, "Failed") and plan.status["gang"]["reason"] == "PriorityClassNotFound"
    assert plan.requeue_after == 8 and not plan.of(Apply)


def test_deleted_trainjob_releases_result_finalizers():
    job = child(conditions=COMPLETE)
    plan = decide(Snapshot("team-a/llm", NOW, None, jobs=(job,)))
    assert [type(s) for s in plan.steps] == [LetGo]


def test_kueue_job_of_a_failed_trainjob_is_deleted_to_free_its_workload():
    queued = child(labels={QUEUE_LABEL: "team-a"})
    tj = trainjob()
    tj["spec"]["trainer"]["numNodes"] = 0
    plan = decide(snap(tj, node_job=queued))
    deleted = [(d.resource, d.name) for d in plan.of(Delete)]
    assert condition(plan.status, "Failed")["status"] == "True"
    assert (JOBS, "llm-node-0") in deleted and plan.of(CapacityFreed)
    assert kinds(plan).index("WriteStatus") < kinds(plan).index("Delete")


def test_a_pass_is_a_function_of_its_snapshot():
    s = snap(trainjob(nodes=3), node_job=child(parallelism=3), pods=(pod(0), pod(1)))
    assert decide(s) == decide(s)
    assert isinstance(decide(s).steps[0], (Apply, WriteStatus, Create))


# --- spec.activeDeadlineSeconds ----------------------------------------------------------------------
def _deadline_job(seconds: int, created_ago: float, *, status: dict | None = None, suspend: bool = False) -> dict:
    tj = trainjob(status=status, suspend=suspend, activeDeadlineSeconds=seconds)
    tj["metadata"]["creationTimestamp"] = st.timestamp(NOW - timedelta(seconds=created_ago))
    return tj


def test_past_its_deadline_a_trainjob_fails_deadline_exceeded_and_lets_its_gang_go():
    group = {"metadata": {"name": "llm", "namespace": "team-a", "uid": "pg-1", "ownerReferences": [OWNER]}}
    plan = decide(snap(_deadline_job(600, 601), groups={**ALL_BACKENDS, "coscheduling": group},
                       node_job=child()))
    failed = condition(plan.status, "Failed")
    assert (failed.get("status"), failed.get("reason")) == ("True", "DeadlineExceeded")
    assert "activeDeadlineSeconds (600s)" in failed["message"]
    deletes = [(d.resource, d.name) for d in plan.of(Delete)]
    assert (POD_GROUPS, "llm") in deletes
    # its pods stop (that Job only: its uid is the patch's precondition)
    assert [p.patch for p in plan.of(Patch)] == [{"spec": {"suspend": True}, "metadata": {"uid": "job-1"}}]
    steps = list(plan.steps)
    assert steps.index(plan.of(WriteStatus)[0]) < steps.index(plan.of(Delete)[0])  # failure recorded first


def test_before_its_deadline_it_runs_and_comes_back_when_the_deadline_passes():
    plan = decide(snap(_deadline_job(600, 100)))
    assert not condition(plan.status, "Failed")
    assert plan.of(Apply) and plan.requeue_after is not None and abs(plan.requeue_after - 500) < 1


def test_the_clock_stops_while_suspended_and_restarts_on_resume():
    assert decide(snap(_deadline_job(600, 10_000, suspend=True))).requeue_after is None
    resumed = {"conditions": [{"type": "Suspended", "status": "False", "reason": "Resumed", "message": "",
                               "lastTransitionTime": st.timestamp(NOW - timedelta(seconds=60))}]}
    plan = decide(snap(_deadline_job(600, 10_000, status=resumed)))
    assert not condition(plan.status, "Failed") and abs(plan.requeue_after - 540) < 1, "as Trainer wrote it"
    assert "conditions" not in plan.status and plan.status["gang"]["resumedAt"] == resumed["conditions"][0][
        "lastTransitionTime"], "gangctl drops Suspended=False and keeps its time"
    plan = decide(snap(_deadline_job(600, 10_000, status=plan.status)))
    assert not condition(plan.status, "Failed") and abs(plan.requeue_after - 540) < 1, "as gangctl keeps it"


def test_a_trainjob_managed_by_kubeflow_trainer_is_left_to_trainer():
    assert decide(snap(trainjob(managedBy="trainer.kubeflow.org/trainjob-controller"))).steps == ()
    assert decide(snap(trainjob(managedBy="gangctl.io/controller"))).of(Apply)
    assert decide(snap(trainjob())).of(Apply)


# --- initializers: the runtime's other replicated jobs run before the trainer -----------------------
def with_initializers() -> dict:
    """The runtime with Trainer's two initializer jobs: model after dataset, the trainer after both."""
    rt = copy.deepcopy(RUNTIME)
    jobs = rt["spec"]["template"]["spec"]["replicatedJobs"]

    def step(name: str, depends: list[str]) -> dict:
        out = {"name": name, "replicas": 1,
               "template": {"metadata": {"labels": {"trainer.kubeflow.org/trainjob-ancestor-step": name}},
                            "spec": {"template": {"spec": {"restartPolicy": "Never", "containers": [
                                {"name": name, "image": "initializer:v1",
                                 "volumeMounts": [{"name": "initializer", "mountPath": "/workspace"}]}]}}}}}
        if depends:
            out["dependsOn"] = [{"name": d, "status": "Complete"} for d in depends]
        return out
    jobs[0]["dependsOn"] = [{"name": "dataset-initializer", "status": "Complete"},
                            {"name": "model-initializer", "status": "Complete"}]
    rt["spec"]["template"]["spec"]["replicatedJobs"] = [step("dataset-initializer", []),
                                                        step("model-initializer", ["dataset-initializer"]), *jobs]
    return rt


def step_child(name: str, conditions: list[dict] | None = None) -> dict:
    return {"apiVersion": "batch/v1", "kind": "Job",
            "metadata": {"name": f"llm-{name}-0", "namespace": "team-a", "uid": f"{name}-uid",
                         "finalizers": [RESULT_FINALIZER], "labels": {TRAINJOB_NAME: "llm"},
                         "ownerReferences": [OWNER]},
            "spec": {"parallelism": 1}, "status": {"conditions": conditions or []}}


def test_initializers_run_in_order_before_the_trainer():
    rt = with_initializers()
    tj = trainjob(initializer={"dataset": {"storageUri": "hf://tatsu-lab/alpaca"}})
    first = decide(snap(tj, rt=rt))
    created = [c.obj for c in first.of(Create)]
    assert [o["metadata"]["name"] for o in created] == ["llm-dataset-initializer-0"], "model waits for dataset"
    dataset = created[0]
    container = dataset["spec"]["template"]["spec"]["containers"][0]
    assert {"name": "STORAGE_URI", "value": "hf://tatsu-lab/alpaca"} in container["env"]
    assert dataset["spec"]["template"]["metadata"]["labels"]["trainer.kubeflow.org/trainjob-ancestor-step"] == \
        "dataset-initializer", "the SDK finds the step's pods by this label"
    assert dataset["metadata"]["ownerReferences"][0]["uid"] == "tj-1"
    assert "schedulerName" not in dataset["spec"]["template"]["spec"], "an initializer is not part of the gang"
    assert not first.of(Apply), "no gang and no trainer Job before the initializers are done"
    gang = first.status["gang"]
    assert (gang["state"], gang["reason"]) == ("Pending", "Initializing")
    assert "dataset-initializer, model-initializer" in gang["message"]

    done = [step_child("dataset-initializer", COMPLETE)]
    second = decide(snap(trainjob(status=first.status, **tj["spec"]), rt=rt, jobs=tuple(done)))
    assert [c.obj["metadata"]["name"] for c in second.of(Create)] == ["llm-model-initializer-0"]
    assert not second.of(Apply)

    done.append(step_child("model-initializer", COMPLETE))
    third = decide(snap(trainjob(status=second.status, **tj["spec"]), rt=rt, jobs=tuple(done)))
    assert not third.of(Create), "a finished step is never run again"
    assert [a.obj["kind"] for a in third.of(Apply)] == ["Service", "PodGroup", "Job"], "now the gang and the trainer"


def test_a_failed_initializer_fails_the_trainjob_with_its_reason_and_the_trainer_never_starts():
    rt = with_initializers()
    failed = step_child("dataset-initializer", [{"type": "Failed", "status": "True", "reason": "BackoffLimitExceeded",
                                                 "message": "Job has reached the specified backoff limit"}])
    plan = decide(snap(trainjob(), rt=rt, jobs=(failed,)))
    cond = condition(plan.status, "Failed")
    assert cond["status"] == "True" and cond["reason"] == "BackoffLimitExceeded"
    assert "llm-dataset-initializer-0 (dataset-initializer) failed" in cond["message"]
    assert not plan.of(Apply) and not plan.of(Create)


def test_a_second_attempt_failing_soon_after_it_started_waits_before_the_gang_is_made_again():
    rt = runtime(failure_policy={"maxRestarts": 5})
    once = {"restarts": {"user": 1, "infrastructure": 0, "ignored": 0,
                         "lastFailure": {"kind": "user", "reason": "BackoffLimitExceeded", "jobUID": "job-1",
                                         "action": "Restart", "streak": 1}}, "restartCount": 1}
    quick = child("job-2", conditions=FAILED)
    quick["metadata"]["creationTimestamp"] = st.timestamp(NOW - timedelta(seconds=30))
    plan = decide(snap(trainjob(status=once), rt=rt, node_job=quick, pods=(pod(0, "job-2", phase="Failed", exit_code=1),)))
    last = plan.status["restarts"]["lastFailure"]
    assert (last["streak"], last["backoffSeconds"]) == (2, 10)
    assert plan.status["gang"]["message"].endswith("next attempt in 10s (2 attempts in a row failed within 10 min of starting)")
    assert "next attempt in 10s" in plan.of(Event)[0].message
    # The attempt is gone: no new Job until the pace allows, and the pass comes back when it does.
    later = NOW + timedelta(seconds=4)
    waiting = decide(Snapshot("team-a/llm", later, trainjob(status=plan.status), runtime=rt, groups=ALL_BACKENDS))
    assert not [a for a in waiting.of(Apply) if a.resource == JOBS] and waiting.requeue_after == 6
    made = decide(Snapshot("team-a/llm", NOW + timedelta(seconds=10), trainjob(status=plan.status), runtime=rt,
                           groups=ALL_BACKENDS))
    assert [a.obj["metadata"]["name"] for a in made.of(Apply) if a.resource == JOBS] == ["llm-node-0"]
