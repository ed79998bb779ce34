"""decide for a PyTorchJob on hand-built snapshots: what one pass writes, and in which order."""
from __future__ import annotations

import copy
import json
from datetime import datetime, timedelta, timezone

from gangctl.api.resources import JOBS, PODS, POD_GROUPS, PYTORCHJOBS, SERVICES
from gangctl.policy import decide_pytorchjob as dp
from gangctl.policy import pytorchjob as pj
from gangctl.policy.decide import Apply, Create, Delete, Event, Patch, WriteStatus

NOW = datetime(2026, 11, 23, 12, 0, 0, tzinfo=timezone.utc)


def replica(replicas: int, restart: str = "OnFailure", cpu: str = "1") -> dict:
    return {"replicas": replicas, "restartPolicy": restart, "template": {"spec": {"containers": [{
        "name": "pytorch", "image": "x", "command": ["python", "train.py"],
        "resources": {"requests": {"cpu": cpu}}}]}}}


def pytorchjob(name: str = "ddp", workers: int = 3, restart: str = "OnFailure", **spec) -> dict:
    specs = {"Master": replica(1, restart), "Worker": replica(workers, restart)}
    return {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob",
            "metadata": {"name": name, "namespace": "team-a", "uid": "pj-1", "resourceVersion": "7"},
            "spec": {"pytorchReplicaSpecs": specs, **spec}}


def snap(obj: dict | None, **kw) -> dp.Snapshot:
    kw.setdefault("groups", {"coscheduling": None})
    return dp.Snapshot("team-a/ddp", NOW, obj, scheduler_name="sched", gang_scheduler="coscheduling", **kw)


def child(name: str, uid: str, failed: tuple[str, str] | None = None, complete: bool = False) -> dict:
    conds = []
    if failed:
        conds.append({"type": "Failed", "status": "True", "reason": failed[0], "message": failed[1]})
    if complete:
        conds.append({"type": "Complete", "status": "True"})
    return {"metadata": {"name": name, "namespace": "team-a", "uid": uid,
                         "labels": {pj.JOB_NAME: "ddp"}},
            "spec": {"parallelism": 1}, "status": {"conditions": conds}}


def pod(name: str, owner_uid: str, rtype: str, index: int, phase: str = "Running", gated: bool = False,
        exit_code: int | None = None) -> dict:
    p = {"metadata": {"name": name, "namespace": "team-a",
                      "labels": {pj.JOB_NAME: "ddp", pj.REPLICA_TYPE: rtype, pj.COMPLETION_INDEX: str(index)},
                      "annotations": {pj.COMPLETION_INDEX: str(index)},
                      "ownerReferences": [{"kind": "Job", "uid": owner_uid, "name": f"ddp-{rtype}"}]},
         "spec": {"schedulingGates": [{"name": pj.RANK_GATE}]} if gated else {},
         "status": {"phase": phase}}
    if exit_code is not None:
        p["status"]["containerStatuses"] = [{"name": "pytorch", "state": {"terminated": {
            "exitCode": exit_code, "reason": "Error", "finishedAt": "2026-11-23T11:59:00Z"}}}]
    return p


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
                          groups={"coscheduling": {"metadata": {"name": "ddp-pytorch"}}}))
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
                          groups={"coscheduling": {"metadata": {"name": "ddp-pytorch"}}}))
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
    later = dp.decide(dp.Snapshot("team-a/ddp", NOW + timedelta(seconds=31), obj))
    assert [(d.resource, d.name, d.uid) for d in later.of(Delete)] == [(PYTORCHJOBS, "ddp", "pj-1")]


def test_a_deleted_pytorchjob_needs_nothing():
    assert dp.decide(snap(None)).steps == ()


# --- gangctl's rendezvous store (elastic c10d without rdzvHost) -----------------------------------
ELASTIC = {"minReplicas": 2, "maxReplicas": 3, "rdzvBackend": "c10d"}


def store(name: str, phase: str = "Running", deleting: bool = False) -> dict:
    meta = {"name": name, "namespace": "team-a", "labels": pj.store_labels("ddp")}
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
    term = pod_["spec"]["affinity"]["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][0]
    assert term["labelSelector"]["matchLabels"] == {pj.JOB_NAME: "ddp", pj.REPLICA_TYPE: "worker"}
    svc = next(a.obj for a in plan.of(Apply) if a.obj["metadata"]["name"] == "ddp-rdzv-pt")
    assert svc["spec"]["selector"] == pj.store_labels("ddp") and svc["spec"]["ports"][0]["port"] == 29400
    env = {e["name"]: e.get("value") for e in next(a.obj for a in plan.of(Apply) if a.obj["metadata"]["name"] ==
                                                   "ddp-worker")["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["PET_RDZV_ENDPOINT"] == "ddp-rdzv-pt:29400"


def test_no_store_with_rdzv_host_or_while_suspended():
    assert not dp.decide(snap(pytorchjob(elasticPolicy={**ELASTIC, "rdzvHost": "etcd", "rdzvPort": 2379}))).of(Create)
    assert not dp.decide(snap(pytorchjob(elasticPolicy=ELASTIC, runPolicy={"suspend": True}))).of(Create)


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
