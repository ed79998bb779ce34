"""decide for a PyTorchJob on hand-built snapshots: what one pass writes, and in which order."""
from __future__ import annotations

import copy
import dataclasses
import json
from datetime import datetime, timedelta, timezone

from gangctl.api.resources import JOBS, NATIVE_POD_GROUPS, PODS, POD_GROUPS, PYTORCHJOBS, SERVICES
from gangctl.policy import decide_pytorchjob as dp
from gangctl.policy import pytorchjob as pj
from gangctl.policy.decide import (Apply, Create, Delete, Event, GateForget, GateMayGrow, GateView, GateWants, Patch,
                                   Snapshot, WriteStatus)
from gangctl.sim import objects

NOW = datetime(2026, 11, 23, 12, 0, 0, tzinfo=timezone.utc)
OWNER = {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "name": "ddp", "uid": "pj-1", "controller": True}


def pytorchjob(name: str = "ddp", workers: int = 3, restart: str = "OnFailure", **spec) -> dict:
    """The job these tests decide about: a Master and `workers` Workers, each restarting `restart`."""
    def replica(replicas: int) -> dict:
        return objects.replica(replicas, image="x", command=["python", "train.py"], requests={"cpu": "1"},
                               restartPolicy=restart)
    return objects.pytorchjob(name, uid="pj-1", metadata={"resourceVersion": "7"},
                              replicas={"Master": replica(1), "Worker": replica(workers)}, **spec)


def snap(obj: dict | None, **kw) -> dp.Snapshot:
    kw.setdefault("groups", {"coscheduling": None})
    return Snapshot("team-a/ddp", NOW, obj, scheduler_name="sched", gang_scheduler="coscheduling", **kw)


def child(name: str, uid: str, failed: tuple[str, str] | None = None, complete: bool = False) -> dict:
    conds = []
    if failed:
        conds.append({"type": "Failed", "status": "True", "reason": failed[0], "message": failed[1]})
    if complete:
        conds.append({"type": "Complete", "status": "True"})
    return {"kind": "Job", "metadata": {"name": name, "namespace": "team-a", "uid": uid,
                                        "labels": {pj.JOB_NAME: "ddp"}, "ownerReferences": [OWNER]},
            "spec": {"parallelism": 1}, "status": {"conditions": conds}}


def pod(name: str, owner_uid: str, rtype: str, index: int, phase: str = "Running", gated: bool = False,
        exit_code: int | None = None) -> dict:
    """Pod `name`, replica `index` of type `rtype`, made by the Job with uid `owner_uid`."""
    return objects.pod(
        name, namespace="team-a", labels={pj.JOB_NAME: "ddp", pj.REPLICA_TYPE: rtype, pj.COMPLETION_INDEX: str(index)},
        index=index, owners=[{"kind": "Job", "uid": owner_uid, "name": f"ddp-{rtype}"}],
        gates=[pj.RANK_GATE] if gated else (), phase=phase,
        container_statuses=None if exit_code is None else [
            objects.terminated(exit_code, container="pytorch", reason="Error", at="2026-11-23T11:59:00Z")])


def test_first_pass_applies_services_podgroup_and_one_job_per_replica_type():
    plan = dp.decide(snap(pytorchjob()))
    applies = plan.of(Apply)
    assert [(a.resource, a.obj["metadata"]["name"]) for a in applies] == [
        (SERVICES, "ddp-master-0"), (SERVICES, "ddp-worker-0"), (SERVICES, "ddp-worker-1"), (SERVICES, "ddp-worker-2"),
        (POD_GROUPS, "ddp-pytorch"), (JOBS, "ddp-master"), (JOBS, "ddp-worker")]
    group = applies[4].obj
    assert group["spec"]["minMember"] == 4
    assert group["spec"]["minResources"] == {"cpu": "4"}
    worker = applies[6].obj
    assert worker["spec"]["completionMode"] == "Indexed" and worker["spec"]["completions"] == 3
    template = worker["spec"]["template"]
    assert template["spec"]["schedulerName"] == "sched"
    assert template["metadata"]["labels"]["scheduling.x-k8s.io/pod-group"] == "ddp-pytorch"
    assert template["spec"]["schedulingGates"] == [{"name": pj.RANK_GATE}]
    env = {e["name"]: e for e in template["spec"]["containers"][0]["env"]}
    assert env["MASTER_ADDR"]["value"] == "ddp-master-0" and env["WORLD_SIZE"]["value"] == "4"
    assert all(a.obj["metadata"]["ownerReferences"][0]["kind"] == "PyTorchJob" for a in applies)
    status = plan.status
    assert [c["type"] for c in status["conditions"]] == ["Created"]
    assert status["conditions"][0]["reason"] == "PyTorchJobCreated"


def test_native_gangs_pods_name_the_gang_scheduler_profile():
    """On the native backend the pods go to the kube-scheduler profile with GangScheduling, which the
    controller is told (GANGCTL_PYTORCHJOB_SCHEDULER_NAME), not to Coscheduling's profile."""
    base = Snapshot("team-a/ddp", NOW, pytorchjob(), scheduler_name="sched", gang_scheduler="native",
                    groups={"native": None})
    for snapshot, expected in ((base, "sched"), (dataclasses.replace(base, gang_scheduler_name="gangs"), "gangs")):
        applies = dp.decide(snapshot).of(Apply)
        assert {a.obj["spec"]["template"]["spec"]["schedulerName"] for a in applies if a.resource == JOBS} == {expected}
        assert [a.obj["metadata"]["name"] for a in applies if a.resource == NATIVE_POD_GROUPS] == ["ddp-pytorch"]


def test_elastic_floor_is_min_replicas():
    obj = pytorchjob(workers=4, elasticPolicy={"minReplicas": 2, "maxReplicas": 4, "rdzvHost": "etcd", "rdzvPort": 2379})
    group = next(a.obj for a in dp.decide(snap(obj)).of(Apply) if a.resource == POD_GROUPS)
    assert group["spec"]["minMember"] == 3   # Master + minReplicas workers, not every replica (v1 #1571)


def test_no_gang_when_the_backend_is_not_served():
    plan = dp.decide(snap(pytorchjob(), groups={}))
    assert POD_GROUPS not in {a.resource for a in plan.of(Apply)}
    assert "schedulerName" not in next(a.obj for a in plan.of(Apply) if a.resource == JOBS)["spec"]["template"]["spec"]


def test_other_managers_are_left_alone():
    assert dp.decide(snap(pytorchjob(runPolicy={"managedBy": "kueue.x-k8s.io/multikueue"}))).steps == ()
    assert dp.decide(snap(pytorchjob(runPolicy={"managedBy": "kubeflow.org/training-operator"}))).steps


def test_gated_worker_pods_get_rank_and_labels_in_one_patch():
    obj = pytorchjob()
    plan = dp.decide(snap(obj, jobs=(child("ddp-master", "m1"), child("ddp-worker", "w1")),
                          pods=(pod("ddp-worker-1-abc", "w1", "worker", 1, phase="Pending", gated=True),)))
    patch = next(p for p in plan.of(Patch) if p.resource == PODS)
    assert patch.name == "ddp-worker-1-abc"
    assert patch.patch["metadata"]["annotations"] == {pj.RANK_ANNOTATION: "2"}
    assert patch.patch["spec"] == {"schedulingGates": []}


def test_master_success_succeeds_the_job_and_releases_the_gang():
    obj = pytorchjob()
    obj["status"] = {"conditions": [{"type": "Created", "status": "True", "reason": "PyTorchJobCreated",
                                     "lastTransitionTime": "2026-11-23T11:00:00Z"}],
                     "startTime": "2026-11-23T11:00:00Z"}
    plan = dp.decide(snap(obj, jobs=(child("ddp-master", "m1", complete=True), child("ddp-worker", "w1")),
                          pods=(pod("ddp-master-0-a", "m1", "master", 0, phase="Succeeded"),),
                          groups={"coscheduling": {"metadata": {"name": "ddp-pytorch", "namespace": "team-a", "uid": "pg-1", "ownerReferences": [OWNER]}}}))
    status = plan.status
    assert {c["type"]: c["status"] for c in status["conditions"]}["Succeeded"] == "True"
    assert status["replicaStatuses"]["Master"]["succeeded"] == 1
    steps = list(plan.steps)
    write = steps.index(next(s for s in steps if isinstance(s, WriteStatus)))
    release = steps.index(next(s for s in steps if isinstance(s, Delete) and s.resource == POD_GROUPS
                               and s.name == "ddp-pytorch"))
    assert write < release


def test_a_failed_attempt_is_judged_into_the_annotation_alone():
    obj = pytorchjob(runPolicy={"backoffLimit": 2})
    plan = dp.decide(snap(obj, jobs=(child("ddp-master", "m1"),
                                     child("ddp-worker", "w1", failed=("BackoffLimitExceeded", "Job has reached the specified backoff limit"))),
                          pods=(pod("ddp-worker-0-a", "w1", "worker", 0, phase="Failed", exit_code=3),)))
    assert len(plan.steps) == 1
    step = plan.steps[0]
    assert isinstance(step, Patch) and step.resource == PYTORCHJOBS
    assert step.patch["metadata"]["resourceVersion"] == "7"   # judged once: a stale cache gets 409
    counters = json.loads(step.patch["metadata"]["annotations"][dp.RESTARTS_ANNOTATION])
    assert counters["user"] == 1 and counters["lastFailure"]["jobUID"] == "w1"
    assert counters["lastFailure"]["action"] == "Restart"


def judged(obj: dict, action: str, uid: str = "w1", user: int = 1) -> dict:
    obj = copy.deepcopy(obj)
    obj["metadata"]["annotations"] = {dp.RESTARTS_ANNOTATION: json.dumps({
        "user": user, "infrastructure": 0, "ignored": 0,
        "lastFailure": {"jobUID": uid, "action": action, "decision": "UserFailure", "decisionMessage": "restart 1/2"}})}
    return obj


def test_a_judged_restart_reports_restarting_and_deletes_the_whole_attempt():
    obj = judged(pytorchjob(runPolicy={"backoffLimit": 2}), "Restart")
    plan = dp.decide(snap(obj, jobs=(child("ddp-master", "m1"), child("ddp-worker", "w1", failed=("BackoffLimitExceeded", "")))))
    assert {c["type"]: c["reason"] for c in plan.status["conditions"]}["Restarting"] == "PyTorchJobRestarting"
    deletes = plan.of(Delete)
    assert {(d.name, d.uid, d.propagation) for d in deletes} == {("ddp-master", "m1", "Foreground"),
                                                                ("ddp-worker", "w1", "Foreground")}


def test_the_restart_budget_survives_in_the_annotation():
    obj = judged(pytorchjob(runPolicy={"backoffLimit": 1}), "Restart", uid="old", user=1)
    plan = dp.decide(snap(obj, jobs=(child("ddp-master", "m2"), child("ddp-worker", "w2", failed=("BackoffLimitExceeded", "")))))
    counters = json.loads(plan.steps[0].patch["metadata"]["annotations"][dp.RESTARTS_ANNOTATION])
    assert counters["lastFailure"]["action"] == "Fail" and counters["user"] == 1
    assert "budget" in counters["lastFailure"]["decisionMessage"]


def test_a_judged_failure_fails_with_v1_reason_then_releases():
    obj = judged(pytorchjob(runPolicy={"backoffLimit": 1}), "Fail", uid="w2")
    plan = dp.decide(snap(obj, jobs=(child("ddp-master", "m2"), child("ddp-worker", "w2", failed=("BackoffLimitExceeded", ""))),
                          groups={"coscheduling": {"metadata": {"name": "ddp-pytorch", "namespace": "team-a", "uid": "pg-1", "ownerReferences": [OWNER]}}}))
    failed = next(c for c in plan.status["conditions"] if c["type"] == "Failed")
    assert failed["reason"] == "PyTorchJobFailed" and failed["status"] == "True"
    assert isinstance(plan.steps[0], WriteStatus) and isinstance(plan.steps[1], Event)
    assert any(isinstance(s, Delete) and s.resource == POD_GROUPS for s in plan.steps[2:])


def test_never_fails_at_once():
    obj = pytorchjob(restart="Never", runPolicy={"backoffLimit": 5})
    plan = dp.decide(snap(obj, jobs=(child("ddp-master", "m1"), child("ddp-worker", "w1", failed=("BackoffLimitExceeded", "")))))
    counters = json.loads(plan.steps[0].patch["metadata"]["annotations"][dp.RESTARTS_ANNOTATION])
    assert counters["lastFailure"]["action"] == "Fail" and counters["user"] == 0


def test_finished_job_is_deleted_after_its_ttl_and_cleaned_per_policy():
    obj = pytorchjob(runPolicy={"ttlSecondsAfterFinished": 60, "cleanPodPolicy": "All"})
    done = (NOW - timedelta(seconds=30)).strftime("%Y-%m-%dT%H:%M:%SZ")
    obj["status"] = {"conditions": [{"type": "Succeeded", "status": "True"}], "completionTime": done}
    plan = dp.decide(snap(obj, jobs=(child("ddp-master", "m1", complete=True),)))
    assert [(d.resource, d.name) for d in plan.of(Delete)] == [(JOBS, "ddp-master")]
    assert plan.requeue_after == 30
    later = dp.decide(Snapshot("team-a/ddp", NOW + timedelta(seconds=31), obj))
    assert [(d.resource, d.name, d.uid) for d in later.of(Delete)] == [(PYTORCHJOBS, "ddp", "pj-1")]


def test_a_deleted_pytorchjob_needs_nothing():
    assert dp.decide(snap(None)).steps == ()


# --- gangctl's rendezvous store (elastic c10d without rdzvHost) -----------------------------------
ELASTIC = {"minReplicas": 2, "maxReplicas": 3, "rdzvBackend": "c10d"}


def store(name: str, phase: str = "Running", deleting: bool = False) -> dict:
    meta = {"name": name, "namespace": "team-a", "uid": f"{name}-uid", "labels": pj.store_labels("ddp"),
            "ownerReferences": [OWNER]}
    if deleting:
        meta["deletionTimestamp"] = "2026-11-23T11:00:00Z"
    return {"metadata": meta, "status": {"phase": phase}}


def test_elastic_c10d_without_rdzv_host_gets_the_store_pod_and_its_service():
    plan = dp.decide(snap(pytorchjob(elasticPolicy=ELASTIC)))
    [create] = plan.of(Create)
    pod_ = create.obj
    assert pod_["metadata"]["name"] == "ddp-rdzv-pt" and pod_["metadata"]["labels"][pj.JOB_NAME] == "ddp"
    assert "trainer.kubeflow.org/trainjob-name" not in pod_["metadata"]["labels"]  # not a TrainJob's store
    assert pod_["spec"]["schedulerName"] == "sched"
    term = pod_["spec"]["affinity"]["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"][0]
    assert term["podAffinityTerm"]["labelSelector"]["matchLabels"] == {pj.JOB_NAME: "ddp", pj.REPLICA_TYPE: "worker"}
    svc = next(a.obj for a in plan.of(Apply) if a.obj["metadata"]["name"] == "ddp-rdzv-pt")
    assert svc["spec"]["selector"] == pj.store_labels("ddp") and svc["spec"]["ports"][0]["port"] == 29400
    env = {e["name"]: e.get("value") for e in next(a.obj for a in plan.of(Apply) if a.obj["metadata"]["name"] ==
                                                   "ddp-worker")["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["PET_RDZV_ENDPOINT"] == "ddp-rdzv-pt:29400"


def test_no_store_with_rdzv_host_or_while_suspended():
    assert not dp.decide(snap(pytorchjob(elasticPolicy={**ELASTIC, "rdzvHost": "etcd", "rdzvPort": 2379}))).of(Create)
    assert not dp.decide(snap(pytorchjob(elasticPolicy=ELASTIC, runPolicy={"suspend": True}))).of(Create)


def test_suspending_lets_go_of_the_gang_and_suspends_the_jobs():
    obj = pytorchjob(elasticPolicy=ELASTIC, runPolicy={"suspend": True})
    group = {"metadata": {"name": "ddp-pytorch", "namespace": "team-a", "uid": "pg-1", "ownerReferences": [OWNER]}}
    plan = dp.decide(snap(obj, groups={"coscheduling": group}, pods=(store("ddp-rdzv-pt"),)))
    assert sorted((d.resource.plural, d.name) for d in plan.of(Delete)) == [("podgroups", "ddp-pytorch"),
                                                                          ("pods", "ddp-rdzv-pt")]
    jobs = [a.obj for a in plan.of(Apply) if a.resource == JOBS]
    assert sorted(j["metadata"]["name"] for j in jobs) == ["ddp-master", "ddp-worker"]
    assert all(j["spec"]["suspend"] for j in jobs)
    assert not plan.of(Create)
    resumed = pytorchjob(elasticPolicy=ELASTIC)
    plan = dp.decide(snap(resumed))
    assert [c.obj["metadata"]["name"] for c in plan.of(Create)] == ["ddp-rdzv-pt"]
    assert any(a.resource == POD_GROUPS for a in plan.of(Apply)) and not plan.of(Delete)


def test_a_live_store_is_kept_and_a_lost_one_replaced_under_a_new_name():
    obj = pytorchjob(elasticPolicy=ELASTIC)
    assert not dp.decide(snap(obj, pods=(store("ddp-rdzv-pt"),))).of(Create)
    plan = dp.decide(snap(obj, pods=(store("ddp-rdzv-pt", phase="Failed"), store("ddp-rdzv-pt-1", deleting=True))))
    assert [c.obj["metadata"]["name"] for c in plan.of(Create)] == ["ddp-rdzv-pt-2"]
    assert [(d.resource, d.name) for d in plan.of(Delete)] == [(PODS, "ddp-rdzv-pt")]


def test_finishing_deletes_the_store():
    obj = pytorchjob(elasticPolicy=ELASTIC)
    obj["status"] = {"conditions": [{"type": "Succeeded", "status": "True"}]}
    plan = dp.decide(snap(obj, pods=(store("ddp-rdzv-pt"),)))
    assert (PODS, "ddp-rdzv-pt") in [(d.resource, d.name) for d in plan.of(Delete)]


def test_a_trainjob_of_the_same_name_keeps_its_own_gang_and_store():
    """TrainJob children keep their names (`<job>` PodGroup, `<job>-rdzv` store); a PyTorchJob's differ
    and carry no TrainJob label, so neither reconciler observes the other's."""
    plan = dp.decide(snap(pytorchjob(elasticPolicy=ELASTIC)))
    names = {a.obj["metadata"]["name"] for a in plan.of(Apply)} | {c.obj["metadata"]["name"] for c in plan.of(Create)}
    assert not names & {"ddp", "ddp-rdzv", "ddp-node"}
    group = next(a.obj for a in plan.of(Apply) if a.resource == POD_GROUPS)
    assert group["metadata"]["labels"] == {"gangctl.io/managed-by": "gangctl", pj.JOB_NAME: "ddp"}
    for obj in [*(a.obj for a in plan.of(Apply)), *(c.obj for c in plan.of(Create))]:
        assert "trainer.kubeflow.org/trainjob-name" not in (obj["metadata"].get("labels") or {}), obj["metadata"]


# --- elastic sizing of the Worker Job --------------------------------------------------------------
WORKERS_4 = {"minReplicas": 2, "maxReplicas": 4, "rdzvHost": "etcd", "rdzvPort": 2379}


def worker_job(size: int, uid: str = "w1", failed: int = 0) -> dict:
    j = child("ddp-worker", uid)
    j["spec"] = {"parallelism": size, "completions": 1_000, "backoffLimitPerIndex": 0}   # the pool of indexes
    j["status"]["failed"] = failed
    return j


def worker(index: int, uid: str = "w1", *, node: str | None = "n", phase: str = "Running",
           unschedulable_for: float | None = None, disrupted: bool = False) -> dict:
    p = pod(f"ddp-worker-{index}-x", uid, "worker", index, phase=phase)
    p["spec"]["nodeName"] = node
    conds = []
    if unschedulable_for is not None:
        at = (NOW - timedelta(seconds=unschedulable_for)).strftime("%Y-%m-%dT%H:%M:%SZ")
        conds.append({"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "lastTransitionTime": at})
    if disrupted:
        conds.append({"type": "DisruptionTarget", "status": "True", "reason": "DeletionByTaintManager"})
    p["status"]["conditions"] = conds
    return p


def elastic_job(memo: dict | None = None) -> dict:
    obj = pytorchjob(workers=4, elasticPolicy=WORKERS_4)
    if memo is not None:
        obj["metadata"]["annotations"] = {dp.ELASTIC_ANNOTATION: json.dumps(memo)}
    return obj


def resizes(plan) -> list[dict]:
    """The elastic memos the plan records on the PyTorchJob."""
    return [json.loads(p.patch["metadata"]["annotations"][dp.ELASTIC_ANNOTATION]) for p in plan.of(Patch)
            if p.resource == PYTORCHJOBS]


def worker_apply(plan) -> dict:
    return next(a.obj for a in plan.of(Apply) if a.resource == JOBS and a.obj["metadata"]["name"] == "ddp-worker")


def test_a_worker_whose_replacement_finds_no_node_is_cut_and_recorded_alone():
    running = [worker(i) for i in range(3)]
    waiting = worker(3, node=None, phase="Pending", unschedulable_for=10)
    plan = dp.decide(snap(elastic_job(), jobs=(child("ddp-master", "m1"), worker_job(4)), pods=(*running, waiting)))
    [patch] = plan.of(Patch)
    assert patch.resource == PYTORCHJOBS and patch.patch["metadata"]["resourceVersion"] == "7"
    [memo] = resizes(plan)
    assert memo["size"] == 3 and memo["lastResizeReason"] == "Unschedulable" and memo["lastShrinkTime"]
    assert not plan.of(Apply) and not plan.of(WriteStatus), "the resize is recorded alone"
    assert [e.reason for e in plan.of(Event)] == ["Resized"]
    # the next pass applies the Worker Job at the recorded size
    after = dp.decide(snap(elastic_job(memo), jobs=(child("ddp-master", "m1"), worker_job(4)), pods=(*running, waiting)))
    spec = worker_apply(after)["spec"]
    assert (spec["parallelism"], spec["completions"], spec["backoffLimitPerIndex"]) == (3, 1_000, 0)
    assert after.requeue_after == dp.ELASTIC_RECHECK_SECONDS, "short of its replicas: it looks again soon"


def test_a_lost_worker_is_cut_when_its_replacement_finds_no_node_never_below_min_replicas():
    lost = worker(3, disrupted=True)
    healthy = [worker(i) for i in range(3)]
    plan = dp.decide(snap(elastic_job(), jobs=(worker_job(4),), pods=(*healthy, lost)))
    assert not resizes(plan), "the Job controller replaces it at once, with a fresh index"
    refused = worker(4, node=None, phase="Pending", unschedulable_for=10)
    plan = dp.decide(snap(elastic_job(), jobs=(worker_job(4),), pods=(*healthy, lost, refused)))
    [memo] = resizes(plan)
    assert memo["size"] == 3 and memo["lastResizeReason"] == "NodeLost"
    # at the floor: two workers left, the rest lost, nothing more is cut
    memo2 = {"size": 2, "lastShrinkTime": NOW.strftime("%Y-%m-%dT%H:%M:%SZ")}
    plan = dp.decide(snap(elastic_job(memo2), jobs=(worker_job(2),), pods=(
        worker(0), worker(1, disrupted=True), worker(5, node=None, phase="Pending", unschedulable_for=10))))
    assert not resizes(plan) and worker_apply(plan)["spec"]["parallelism"] == 2


def test_all_healthy_below_the_replicas_grows_by_one_after_the_backoff():
    shrunk = (NOW - timedelta(seconds=60)).strftime("%Y-%m-%dT%H:%M:%SZ")
    plan = dp.decide(snap(elastic_job({"size": 3, "lastShrinkTime": shrunk}), jobs=(worker_job(3),),
                          pods=tuple(worker(i) for i in range(3))))
    [memo] = resizes(plan)
    assert memo["size"] == 4 and memo["lastResizeReason"] == "CapacityProbe" and memo["resizes"] == 1
    recent = (NOW - timedelta(seconds=5)).strftime("%Y-%m-%dT%H:%M:%SZ")
    plan = dp.decide(snap(elastic_job({"size": 3, "lastShrinkTime": recent}), jobs=(worker_job(3),),
                          pods=tuple(worker(i) for i in range(3))))
    assert not resizes(plan), "no probe within the backoff after a shrink"
    assert plan.requeue_after == dp.ELASTIC_RECHECK_SECONDS


def test_a_full_elastic_job_is_left_alone_and_a_new_one_starts_at_its_replicas():
    plan = dp.decide(snap(elastic_job(), jobs=(worker_job(4),), pods=tuple(worker(i) for i in range(4))))
    assert not resizes(plan) and plan.requeue_after is None
    first = dp.decide(snap(elastic_job()))
    assert worker_apply(first)["spec"]["parallelism"] == 4
    # a memo bigger than the replicas (scaled down since) is clamped to them
    job = elastic_job({"size": 4})
    job["spec"]["pytorchReplicaSpecs"]["Worker"]["replicas"] = 3
    assert worker_apply(dp.decide(snap(job)))["spec"]["parallelism"] == 3


def test_an_elastic_worker_that_exits_non_zero_is_judged_against_the_budget():
    failed = worker(1, phase="Failed")
    failed["status"]["containerStatuses"] = [{"name": "pytorch", "state": {"terminated": {
        "exitCode": 3, "reason": "Error", "finishedAt": "2026-11-23T11:59:00Z"}}}]
    obj = elastic_job()
    obj["spec"]["runPolicy"] = {"backoffLimit": 2}
    plan = dp.decide(snap(obj, jobs=(worker_job(4, failed=1),), pods=(worker(0), failed, worker(2), worker(3))))
    [patch] = [p for p in plan.of(Patch) if p.resource == PYTORCHJOBS]
    restarts = json.loads(patch.patch["metadata"]["annotations"][dp.RESTARTS_ANNOTATION])
    assert restarts["lastFailure"]["action"] == "Restart" and "exit code 3" in restarts["lastFailure"]["message"]
    # a Worker evicted from a lost node is the sizing's business, not a failure
    evicted = worker(1, phase="Failed", disrupted=True)
    plan = dp.decide(snap(elastic_job(), jobs=(worker_job(4, failed=1),), pods=(worker(0), evicted, worker(2), worker(3))))
    assert not [p for p in plan.of(Patch) if p.resource == PYTORCHJOBS and dp.RESTARTS_ANNOTATION in
                p.patch["metadata"]["annotations"]]


def test_a_priority_class_that_does_not_exist_fails_the_pytorchjob_naming_the_replica():
    obj = pytorchjob()
    obj["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]["priorityClassName"] = "nope"
    plan = dp.decide(snap(obj, priority_classes=frozenset({"high"})))
    failed = next(c for c in plan.status["conditions"] if c["type"] == "Failed")
    assert failed["reason"] == "PyTorchJobFailed"
    assert "spec.pytorchReplicaSpecs.Worker.template.spec.priorityClassName" in failed["message"] and "'nope'" in failed["message"]
    assert not [a for a in plan.of(Apply) if a.resource == JOBS]
    assert [a for a in dp.decide(snap(obj, priority_classes=frozenset({"nope"}))).of(Apply) if a.resource == JOBS]


def test_under_kueue_a_scheduling_priority_class_that_does_not_exist_fails_unless_kueues_label_names_one():
    """Kueue takes a queued PyTorchJob's priority from schedulingPolicy.priorityClass (a PriorityClass)
    unless its priority-class label names a WorkloadPriorityClass; a missing one means no Workload."""
    obj = pytorchjob(runPolicy={"suspend": True, "schedulingPolicy": {"priorityClass": "batch"}})
    obj["metadata"]["labels"] = {"kueue.x-k8s.io/queue-name": "default"}
    plan = dp.decide(snap(obj, groups={"kueue": None}, priority_classes=frozenset({"high"})))
    failed = next(c for c in plan.status["conditions"] if c["type"] == "Failed")
    assert failed["message"].startswith("spec.runPolicy.schedulingPolicy.priorityClass: no PriorityClass 'batch'")
    assert "kueue.x-k8s.io/priority-class" in failed["message"]
    obj["metadata"]["labels"]["kueue.x-k8s.io/priority-class"] = "batch"
    plan = dp.decide(snap(obj, groups={"kueue": None}, priority_classes=frozenset({"high"})))
    assert not [c for c in plan.status["conditions"] if c["type"] == "Failed"]
    coscheduled = pytorchjob(runPolicy={"schedulingPolicy": {"priorityClass": "batch"}})
    assert not [c for c in dp.decide(snap(coscheduled, priority_classes=frozenset({"high"}))).status["conditions"]
                if c["type"] == "Failed"], "only Kueue makes nothing of a missing one"


# --- quota: the gate shared with TrainJobs --------------------------------------------------------
HOLD = ("WaitingForQuota", "gangctl quota admission: team a has 0 of 8 GPUs free")


def admitted(**extra) -> GateView:
    return GateView({"team": "a", "admittedAt": "2026-11-23T11:00:00Z", "priority": 1,
                     "requests": {"cpu": "4"}, **extra}, HOLD)


def test_a_job_the_gate_has_not_admitted_asks_for_every_replica_and_waits_suspended():
    plan = dp.decide(snap(pytorchjob(), gate=GateView(None, HOLD)))
    [wants] = plan.gate
    assert isinstance(wants, GateWants) and wants.min_resources == {"cpu": 4} and wants.nodes is None
    jobs = [a.obj for a in plan.of(Apply) if a.resource == JOBS]
    assert len(jobs) == 2 and all(j["spec"]["suspend"] for j in jobs)
    assert POD_GROUPS not in {a.resource for a in plan.of(Apply)}, "no gang holds nodes while it waits"
    suspended = next(c for c in plan.status["conditions"] if c["type"] == "Suspended")
    assert (suspended["status"], suspended["reason"], suspended["message"]) == ("True", *HOLD)
    assert "startTime" not in plan.status


def test_an_admitted_job_runs_and_reports_resumed():
    held = dp.decide(snap(pytorchjob(), gate=GateView(None, HOLD)))
    obj = {**pytorchjob(), "status": held.status}
    plan = dp.decide(snap(obj, gate=admitted()))
    assert plan.gate == ()
    assert any(a.resource == POD_GROUPS for a in plan.of(Apply))
    assert not any(a.obj["spec"]["suspend"] for a in plan.of(Apply) if a.resource == JOBS)
    suspended = next(c for c in plan.status["conditions"] if c["type"] == "Suspended")
    assert (suspended["status"], suspended["reason"]) == ("False", "PyTorchJobResumed")


def test_the_users_suspend_forgets_the_request_and_a_priority_class_is_passed_on():
    assert dp.decide(snap(pytorchjob(runPolicy={"suspend": True}), gate=GateView(None, HOLD))).gate == (GateForget(),)
    obj = pytorchjob(runPolicy={"schedulingPolicy": {"priorityClass": "high"}})
    [wants] = dp.decide(snap(obj, gate=GateView(None, HOLD), priority_classes=frozenset({"high"}))).gate
    assert wants.priority_class == "high"


def test_an_elastic_worker_only_job_runs_the_workers_it_was_admitted_with_and_may_grow():
    obj = pytorchjob(workers=4, elasticPolicy=WORKERS_4)
    del obj["spec"]["pytorchReplicaSpecs"]["Master"]
    [wants] = dp.decide(snap(obj, gate=GateView(None, HOLD))).gate
    assert wants.min_resources == {"cpu": 2} and (wants.nodes.min_nodes, wants.nodes.max_nodes) == (2, 4)
    plan = dp.decide(snap(obj, gate=admitted(nodes=3)))
    spec = worker_apply(plan)["spec"]
    assert (spec["parallelism"], spec["completions"]) == (3, 1_000)
    assert [type(i) for i in plan.gate] == [GateMayGrow]


def test_an_elastic_job_with_a_master_is_charged_and_run_at_its_floor():
    obj = pytorchjob(workers=4, elasticPolicy=WORKERS_4)
    [wants] = dp.decide(snap(obj, gate=GateView(None, HOLD))).gate
    assert wants.min_resources == {"cpu": 3} and wants.nodes is None   # Master + 2 workers
    spec = worker_apply(dp.decide(snap(obj, gate=admitted())))["spec"]
    assert spec["parallelism"] == 2


def test_the_gate_reads_a_pytorchjobs_admission_and_lifecycle():
    from gangctl.policy.quota_gate import ADMISSION_ANNOTATION, job_finished, needs_admission, recorded_admission, user_suspended
    obj = pytorchjob()
    assert recorded_admission(obj) is None and needs_admission(obj, None)
    record = {"team": "a", "admittedAt": "2026-11-23T11:00:00Z"}
    obj["metadata"]["annotations"] = {ADMISSION_ANNOTATION: json.dumps(record)}
    assert recorded_admission(obj) == record
    obj["metadata"]["annotations"] = {ADMISSION_ANNOTATION: "{not json"}
    assert recorded_admission(obj) is None, "a hand-edited annotation is no admission"
    assert user_suspended(pytorchjob(runPolicy={"suspend": True})) and not user_suspended(pytorchjob())
    done = {**pytorchjob(), "status": {"conditions": [{"type": "Succeeded", "status": "True"}]}}
    assert job_finished(done) and not needs_admission(done, None)
    # a TrainJob's record stays in its status, its suspend in spec.suspend
    tj = {"kind": "TrainJob", "spec": {"suspend": True}, "status": {"admission": record}}
    assert recorded_admission(tj) == record and user_suspended(tj)


def test_under_kueue_the_pytorchjob_is_admitted_whole_and_waits_in_kueues_words():
    """Kueue's kubeflow.org/pytorchjob integration suspends a queued PyTorchJob when it is made and
    lets it run once admitted: until then the Master and Worker Jobs are suspended and carry no
    Kueue label (Kueue would make a Workload of each), and the reason is the Workload's."""
    obj = pytorchjob(workers=2, runPolicy={"suspend": True})
    obj["metadata"]["labels"] = {"kueue.x-k8s.io/queue-name": "team-a"}
    plan = dp.decide(snap(obj, groups={"kueue": None}))
    jobs = [a.obj for a in plan.of(Apply) if a.resource == JOBS]
    assert [j["metadata"]["name"] for j in jobs] == ["ddp-master", "ddp-worker"]
    assert all(j["spec"]["suspend"] and not any(k.startswith("kueue.x-k8s.io/") for k in j["metadata"]["labels"])
               for j in jobs), [j["metadata"] for j in jobs]
    held = next(c for c in plan.status["conditions"] if c["type"] == "Suspended")
    assert (held["status"], held["reason"]) == ("True", "WaitingForQuota") and "Workload" in held["message"]
    workload = {"metadata": {"name": "wl"}, "spec": {"queueName": "team-a"}, "status": {"conditions": [
        {"type": "QuotaReserved", "status": "False", "message": "couldn't assign flavors: insufficient quota"}]}}
    plan = dp.decide(snap({**obj, "status": plan.status}, groups={"kueue": workload}))
    held = next(c for c in plan.status["conditions"] if c["type"] == "Suspended")
    assert "insufficient quota" in held["message"]
    admitted = {**obj, "spec": {**obj["spec"], "runPolicy": {"suspend": False}}, "status": plan.status}
    plan = dp.decide(snap(admitted, groups={"kueue": workload}))
    assert next(c for c in plan.status["conditions"] if c["type"] == "Suspended")["status"] == "False"
    assert [j["spec"]["suspend"] for j in (a.obj for a in plan.of(Apply) if a.resource == JOBS)] == [False, False]


def test_under_kueue_a_pytorchjob_without_a_queue_name_fails_naming_the_label():
    plan = dp.decide(dataclasses.replace(snap(pytorchjob(), groups={"kueue": None}), gang_scheduler="kueue"))
    failed = next(c for c in plan.status["conditions"] if c["type"] == "Failed")
    assert failed["status"] == "True" and failed["message"].startswith("metadata.labels[kueue.x-k8s.io/queue-name]")
    assert not [a for a in plan.of(Apply) if a.resource == JOBS]


def test_a_nudge_touches_a_waiting_gangs_podgroup_only():
    group = {"metadata": {"name": "ddp-pytorch", "namespace": "team-a", "uid": "pg-1", "ownerReferences": [OWNER]}}
    plan = dp.decide(snap(pytorchjob(), groups={"coscheduling": group}, nudge=True))
    [touch] = [p for p in plan.of(Patch) if p.resource == POD_GROUPS]
    assert touch.name == "ddp-pytorch" and touch.missing_ok
    assert "gangctl.io/retry-requested-at" in touch.patch["metadata"]["annotations"] and plan.clear_nudge
    running = {**pytorchjob(), "status": {"conditions": [{"type": "Running", "status": "True"}]}}
    plan = dp.decide(snap(running, groups={"coscheduling": group}, nudge=True))
    assert not [p for p in plan.of(Patch) if p.resource == POD_GROUPS] and plan.clear_nudge
    assert dp.waiting_for_gang(pytorchjob()) and not dp.waiting_for_gang(running)
    held = dp.decide(snap(pytorchjob(), gate=GateView(None, HOLD), nudge=True))
    assert not [p for p in held.of(Patch) if p.resource == POD_GROUPS], "a job the gate holds has no gang to nudge"
    assert not dp.waiting_for_gang({**pytorchjob(), "status": held.status})


# --- OnFailure: the kubelet restarts in place, gangctl charges the episodes ----------------------------------
def restarted(name: str, owner_uid: str, rtype: str, index: int, count: int, exit_code: int = 3) -> dict:
    p = pod(name, owner_uid, rtype, index)
    p["status"]["containerStatuses"] = [{"name": "pytorch", "restartCount": count, "ready": True,
                                         "lastState": {"terminated": {"exitCode": exit_code}}}]
    return p


def on_failure_child(name: str, uid: str) -> dict:
    job = child(name, uid)
    job["spec"]["template"] = {"spec": {"restartPolicy": "OnFailure"}}
    return job


def in_place_record(obj: dict, action: str, seen: int, user: int) -> dict:
    obj = copy.deepcopy(obj)
    obj["metadata"]["annotations"] = {dp.RESTARTS_ANNOTATION: json.dumps({
        "user": user, "infrastructure": 0, "ignored": 0, "lastFailure": {
            "jobUID": "m1", "action": action, "attemptRestarts": seen, "reason": "RestartedInPlace",
            "decision": "MaxRestartsExceeded" if action == "Fail" else "RestartedInPlace",
            "decisionMessage": "restart budget exhausted (1/1 restarts used)" if action == "Fail" else "restart 1/1"}})}
    return obj


def test_an_on_failure_restart_in_place_is_charged_once_and_keeps_the_jobs():
    jobs = (on_failure_child("ddp-master", "m1"), on_failure_child("ddp-worker", "w1"))
    pods = (restarted("ddp-master-0-a", "m1", "master", 0, 0), restarted("ddp-worker-0-a", "w1", "worker", 0, 1),
            restarted("ddp-worker-1-a", "w1", "worker", 1, 1, exit_code=1))
    plan = dp.decide(snap(pytorchjob(runPolicy={"backoffLimit": 2}), jobs=jobs, pods=pods))
    record, event = plan.steps
    counters = json.loads(record.patch["metadata"]["annotations"][dp.RESTARTS_ANNOTATION])
    assert record.patch["metadata"]["resourceVersion"] == "7", "charged once: a stale cache gets 409"
    assert counters["user"] == 1 and counters["lastFailure"]["action"] == "RestartInPlace", counters
    assert (counters["lastFailure"]["jobUID"], counters["lastFailure"]["attemptRestarts"]) == ("m1", 1)
    assert counters["lastFailure"]["exitCode"] in (3, 1)
    assert (event.reason, event.type) == ("RestartedInPlace", "Warning") and "1/2" in event.message, event
    charged = dp.decide(snap(in_place_record(pytorchjob(runPolicy={"backoffLimit": 2}), "RestartInPlace", 1, 1),
                             jobs=jobs, pods=pods))
    assert not [s for s in charged.of(Patch) if s.resource == PYTORCHJOBS], "the same episode is not charged again"
    assert not charged.of(Delete), "the attempt's Jobs and pods stay"


def test_in_place_restarts_past_the_budget_fail_the_job_and_stop_its_pods():
    jobs = (on_failure_child("ddp-master", "m1"), on_failure_child("ddp-worker", "w1"))
    pods = (restarted("ddp-worker-0-a", "w1", "worker", 0, 3),)
    obj = pytorchjob(runPolicy={"backoffLimit": 1})   # cleanPodPolicy None: v1 would keep the pods
    (record, _) = dp.decide(snap(obj, jobs=jobs, pods=pods)).steps
    counters = json.loads(record.patch["metadata"]["annotations"][dp.RESTARTS_ANNOTATION])
    assert (counters["lastFailure"]["action"], counters["user"]) == ("Fail", 1), counters
    plan = dp.decide(snap(in_place_record(obj, "Fail", 3, 1), jobs=jobs, pods=pods))
    failed = next(c for c in plan.status["conditions"] if c["type"] == "Failed")
    assert failed["reason"] == "PyTorchJobFailed" and "1/1 restarts used" in failed["message"], failed
    assert {(p.name, json.dumps(p.patch["spec"])) for p in plan.of(Patch) if p.resource == JOBS} == {
        ("ddp-master", '{"suspend": true}'), ("ddp-worker", '{"suspend": true}')}, "the kubelet would restart them forever"


def test_a_second_attempt_failing_soon_after_it_started_is_paced_before_its_jobs_are_made_again():
    obj = pytorchjob(restart="Always")   # unlimited restarts (no backoffLimit), as under v1: paced
    obj["metadata"]["annotations"] = {dp.RESTARTS_ANNOTATION: json.dumps({
        "user": 1, "infrastructure": 0, "ignored": 0,
        "lastFailure": {"jobUID": "w1", "action": "Restart", "streak": 1, "time": "2026-11-23T11:58:00Z"}})}
    worker = child("ddp-worker", "w2", failed=("BackoffLimitExceeded", ""))
    worker["metadata"]["creationTimestamp"] = "2026-11-23T11:59:40Z"   # failed 20 s after it was made
    plan = dp.decide(snap(obj, jobs=(child("ddp-master", "m2"), worker)))
    counters = json.loads(plan.steps[0].patch["metadata"]["annotations"][dp.RESTARTS_ANNOTATION])
    last = counters["lastFailure"]
    assert (last["action"], last["streak"], last["backoffSeconds"]) == ("Restart", 2, 10)
    assert last["decisionMessage"].endswith("next attempt in 10s (2 attempts in a row failed within 10 min of starting)")
    # Carried out (both Jobs gone): nothing is made again until the pace allows, then both Jobs are.
    obj["metadata"]["annotations"] = plan.steps[0].patch["metadata"]["annotations"]
    waiting = dp.decide(Snapshot("team-a/ddp", NOW + timedelta(seconds=3), obj, scheduler_name="sched",
                                 gang_scheduler="coscheduling", groups={"coscheduling": None}))
    assert not waiting.steps and waiting.requeue_after == 7
    made = dp.decide(Snapshot("team-a/ddp", NOW + timedelta(seconds=10), obj, scheduler_name="sched",
                              gang_scheduler="coscheduling", groups={"coscheduling": None}))
    assert {a.obj["metadata"]["name"] for a in made.of(Apply) if a.resource == JOBS} == {"ddp-master", "ddp-worker"}
