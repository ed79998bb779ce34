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


def old_job(name: str, uid: str) -> dict:
    """A Job an older gangctl made for a replica type (before pods were named as v1's)."""
    return {"kind": "Job", "metadata": {"name": name, "namespace": "team-a", "uid": uid,
                                        "labels": {pj.JOB_NAME: "ddp"}, "ownerReferences": [OWNER]},
            "spec": {"parallelism": 1}, "status": {}}


def pod(rtype: str, index: int, phase: str = "Running", exit_code: int | None = None, *,
        uid: str | None = None, created: str | None = None, deleting: bool = False) -> dict:
    """Replica `index` of type `rtype` as gangctl made it for the PyTorchJob (pj-1): `ddp-<rtype>-<index>`."""
    p = objects.pytorchjob_pod(pytorchjob(), rtype, index, phase=phase,
                               deleted_at="2026-11-23T11:59:50Z" if deleting else None)
    if uid is not None:
        p["metadata"]["uid"] = uid
    if created is not None:
        p["metadata"]["creationTimestamp"] = created
    if exit_code is not None:
        p["status"]["containerStatuses"] = [objects.terminated(exit_code, container="pytorch", reason="Error",
                                                               at="2026-11-23T11:59:00Z")]
    return p


def made(plan, rtype: str | None = None) -> list[dict]:
    """The replica pods the plan creates (of `rtype`, when given)."""
    return [c.obj for c in plan.of(Create) if c.resource == PODS and (c.obj["metadata"]["labels"] or {}).get(
        pj.REPLICA_TYPE) in ((rtype,) if rtype else ("master", "worker"))]


def test_first_pass_applies_services_podgroup_and_makes_the_pods_under_v1s_names():
    plan = dp.decide(snap(pytorchjob()))
    applies = plan.of(Apply)
    assert [(a.resource, a.obj["metadata"]["name"]) for a in applies] == [
        (SERVICES, "ddp-master-0"), (SERVICES, "ddp-worker-0"), (SERVICES, "ddp-worker-1"), (SERVICES, "ddp-worker-2"),
        (POD_GROUPS, "ddp-pytorch")]
    group = applies[4].obj
    assert group["spec"]["minMember"] == 4
    assert group["spec"]["minResources"] == {"cpu": "4"}
    assert applies[1].obj["spec"]["selector"] == {pj.OPERATOR_NAME: pj.CONTROLLER_NAME, pj.JOB_NAME: "ddp",
                                                  pj.REPLICA_TYPE: "worker", pj.REPLICA_INDEX: "0"}
    pods = made(plan)
    assert [p["metadata"]["name"] for p in pods] == ["ddp-master-0", "ddp-worker-0", "ddp-worker-1", "ddp-worker-2"]
    worker = pods[2]
    assert worker["spec"]["schedulerName"] == "sched" and "schedulingGates" not in worker["spec"]
    assert worker["metadata"]["labels"]["scheduling.x-k8s.io/pod-group"] == "ddp-pytorch"
    assert {k: worker["metadata"]["labels"][k] for k in (pj.REPLICA_TYPE, pj.REPLICA_INDEX)} == {
        pj.REPLICA_TYPE: "worker", pj.REPLICA_INDEX: "1"}
    env = {e["name"]: e.get("value") for e in worker["spec"]["containers"][0]["env"]}
    assert env["MASTER_ADDR"] == "ddp-master-0" and env["WORLD_SIZE"] == "4"
    assert (env["RANK"], env["PET_NODE_RANK"]) == ("2", "2"), "a worker's index + 1, as v1"
    master = {e["name"]: e.get("value") for e in pods[0]["spec"]["containers"][0]["env"]}
    assert master["RANK"] == "0" and pods[0]["metadata"]["labels"][pj.JOB_ROLE] == "master"
    assert all(o["metadata"]["ownerReferences"][0]["kind"] == "PyTorchJob" for o in [*(a.obj for a in applies), *pods])
    status = plan.status
    assert [c["type"] for c in status["conditions"]] == ["Created"]
    assert status["conditions"][0]["reason"] == "PyTorchJobCreated"


def test_only_the_missing_pods_are_made_and_a_name_is_never_taken_twice():
    plan = dp.decide(snap(pytorchjob(), pods=(pod("master", 0), pod("worker", 0), pod("worker", 2, deleting=True))))
    assert [p["metadata"]["name"] for p in made(plan)] == ["ddp-worker-1"], "worker-2's name is held until it is gone"
    plan = dp.decide(snap(pytorchjob(), pods=(pod("master", 0), pod("worker", 0), pod("worker", 1),
                                              pod("worker", 2, phase="Succeeded"))))
    assert not made(plan), "a finished pod keeps its index"


def test_jobs_an_older_gangctl_made_are_deleted_before_any_pod_is_made():
    plan = dp.decide(snap(pytorchjob(), jobs=(old_job("ddp-master", "m1"), old_job("ddp-worker", "w1"))))
    assert {(d.resource, d.name, d.uid, d.propagation) for d in plan.of(Delete)} == {
        (JOBS, "ddp-master", "m1", "Foreground"), (JOBS, "ddp-worker", "w1", "Foreground")}
    assert not plan.of(Create) and plan.status is None, "uncharged, nothing else this pass"
    foreign = old_job("ddp-worker", "w9")
    foreign["metadata"]["ownerReferences"] = [{**OWNER, "uid": "someone-else"}]
    assert not dp.decide(snap(pytorchjob(), jobs=(foreign,))).of(Delete), "a Job it did not make is not touched"


def test_native_gangs_pods_name_the_gang_scheduler_profile():
    """On the native backend the pods go to the kube-scheduler profile with GangScheduling, which the
    controller is told (GANGCTL_PYTORCHJOB_SCHEDULER_NAME), not to Coscheduling's profile."""
    base = Snapshot("team-a/ddp", NOW, pytorchjob(), scheduler_name="sched", gang_scheduler="native",
                    groups={"native": None})
    for snapshot, expected in ((base, "sched"), (dataclasses.replace(base, gang_scheduler_name="gangs"), "gangs")):
        plan = dp.decide(snapshot)
        assert {p["spec"]["schedulerName"] for p in made(plan)} == {expected}
        assert [a.obj["metadata"]["name"] for a in plan.of(Apply) if a.resource == NATIVE_POD_GROUPS] == ["ddp-pytorch"]


def test_elastic_floor_is_min_replicas():
    obj = pytorchjob(workers=4, elasticPolicy={"minReplicas": 2, "maxReplicas": 4, "rdzvHost": "etcd", "rdzvPort": 2379})
    group = next(a.obj for a in dp.decide(snap(obj)).of(Apply) if a.resource == POD_GROUPS)
    assert group["spec"]["minMember"] == 3   # Master + minReplicas workers, not every replica (v1 #1571)


def test_no_gang_when_the_backend_is_not_served():
    plan = dp.decide(snap(pytorchjob(), groups={}))
    assert POD_GROUPS not in {a.resource for a in plan.of(Apply)}
    assert made(plan) and all("schedulerName" not in p["spec"] for p in made(plan))


def test_other_managers_are_left_alone():
    assert dp.decide(snap(pytorchjob(runPolicy={"managedBy": "kueue.x-k8s.io/multikueue"}))).steps == ()
    assert dp.decide(snap(pytorchjob(runPolicy={"managedBy": "kubeflow.org/training-operator"}))).steps


def test_without_a_master_v1_sets_no_rank_and_worker_0_has_the_master_role():
    obj = pytorchjob()
    del obj["spec"]["pytorchReplicaSpecs"]["Master"]
    pods = made(dp.decide(snap(obj)))
    assert [p["metadata"]["labels"].get(pj.JOB_ROLE) for p in pods] == ["master", None, None]
    assert not [e for e in pods[1]["spec"]["containers"][0]["env"] if e["name"] in ("RANK", "PET_NODE_RANK")]


def test_master_success_succeeds_the_job_and_releases_the_gang():
    obj = pytorchjob()
    obj["status"] = {"conditions": [{"type": "Created", "status": "True", "reason": "PyTorchJobCreated",
                                     "lastTransitionTime": "2026-11-23T11:00:00Z"}],
                     "startTime": "2026-11-23T11:00:00Z"}
    plan = dp.decide(snap(obj, pods=(pod("master", 0, phase="Succeeded"), pod("worker", 0), pod("worker", 1),
                                     pod("worker", 2)),
                          groups={"coscheduling": {"metadata": {"name": "ddp-pytorch", "namespace": "team-a", "uid": "pg-1", "ownerReferences": [OWNER]}}}))
    status = plan.status
    assert {c["type"]: c["status"] for c in status["conditions"]}["Succeeded"] == "True"
    assert status["replicaStatuses"]["Master"]["succeeded"] == 1
    steps = list(plan.steps)
    write = steps.index(next(s for s in steps if isinstance(s, WriteStatus)))
    release = steps.index(next(s for s in steps if isinstance(s, Delete) and s.resource == POD_GROUPS
                               and s.name == "ddp-pytorch"))
    assert write < release
    assert not made(plan), "nothing is made for a job that finishes"


def test_a_failed_attempt_is_judged_into_the_annotation_alone():
    obj = pytorchjob(runPolicy={"backoffLimit": 2})
    plan = dp.decide(snap(obj, pods=(pod("master", 0), pod("worker", 0, phase="Failed", exit_code=3, uid="w1"),
                                     pod("worker", 1), pod("worker", 2))))
    assert len(plan.steps) == 1
    step = plan.steps[0]
    assert isinstance(step, Patch) and step.resource == PYTORCHJOBS
    assert step.patch["metadata"]["resourceVersion"] == "7"   # judged once: a stale cache gets 409
    counters = json.loads(step.patch["metadata"]["annotations"][dp.RESTARTS_ANNOTATION])
    assert counters["user"] == 1 and counters["lastFailure"]["jobUID"] == "w1"
    assert counters["lastFailure"]["action"] == "Restart" and counters["lastFailure"]["job"] == "ddp-worker-0"
    assert counters["lastFailure"]["exitCode"] == 3


def judged(obj: dict, action: str, uid: str = "w1", user: int = 1) -> dict:
    obj = copy.deepcopy(obj)
    obj["metadata"]["annotations"] = {dp.RESTARTS_ANNOTATION: json.dumps({
        "user": user, "infrastructure": 0, "ignored": 0,
        "lastFailure": {"jobUID": uid, "action": action, "decision": "UserFailure", "decisionMessage": "restart 1/2"}})}
    return obj


ATTEMPT = (pod("master", 0, uid="m1"), pod("worker", 0, phase="Failed", exit_code=3, uid="w1"), pod("worker", 1, uid="w2"))


def test_a_judged_restart_reports_restarting_and_deletes_the_whole_attempt_the_judged_pod_last():
    obj = judged(pytorchjob(runPolicy={"backoffLimit": 2}), "Restart")
    plan = dp.decide(snap(obj, pods=ATTEMPT))
    assert {c["type"]: c["reason"] for c in plan.status["conditions"]}["Restarting"] == "PyTorchJobRestarting"
    deletes = plan.of(Delete)
    assert [(d.resource, d.name, d.uid) for d in deletes] == [
        (PODS, "ddp-master-0", "m1"), (PODS, "ddp-worker-1", "w2"), (PODS, "ddp-worker-0", "w1")]
    assert not made(plan)
    # while the judged pod is going, nothing; once it is gone, the missing pods are made again
    going = (pod("master", 0, uid="m1", deleting=True), pod("worker", 0, uid="w1", deleting=True))
    assert dp.decide(snap(obj, pods=going)).steps == ()
    plan = dp.decide(snap(obj, pods=(pod("master", 0, uid="m1", deleting=True),)))
    assert [p["metadata"]["name"] for p in made(plan)] == ["ddp-worker-0", "ddp-worker-1", "ddp-worker-2"]
    assert not plan.of(Delete) and not [p for p in plan.of(Patch) if p.resource == PYTORCHJOBS], \
        "the old attempt's last pod is not judged again"


def test_the_restart_budget_survives_in_the_annotation():
    obj = judged(pytorchjob(runPolicy={"backoffLimit": 1}), "Restart", uid="old", user=1)
    plan = dp.decide(snap(obj, pods=(pod("master", 0), pod("worker", 1, phase="Failed", exit_code=1))))
    counters = json.loads(plan.steps[0].patch["metadata"]["annotations"][dp.RESTARTS_ANNOTATION])
    assert counters["lastFailure"]["action"] == "Fail" and counters["user"] == 1
    assert "budget" in counters["lastFailure"]["decisionMessage"]


def test_a_judged_failure_fails_with_v1_reason_then_releases():
    obj = judged(pytorchjob(runPolicy={"backoffLimit": 1}), "Fail", uid="w1")
    plan = dp.decide(snap(obj, pods=ATTEMPT,
                          groups={"coscheduling": {"metadata": {"name": "ddp-pytorch", "namespace": "team-a", "uid": "pg-1", "ownerReferences": [OWNER]}}}))
    failed = next(c for c in plan.status["conditions"] if c["type"] == "Failed")
    assert failed["reason"] == "PyTorchJobFailed" and failed["status"] == "True"
    assert isinstance(plan.steps[0], WriteStatus) and isinstance(plan.steps[1], Event)
    assert any(isinstance(s, Delete) and s.resource == POD_GROUPS for s in plan.steps[2:])


def test_never_fails_at_once():
    obj = pytorchjob(restart="Never", runPolicy={"backoffLimit": 5})
    plan = dp.decide(snap(obj, pods=(pod("master", 0), pod("worker", 1, phase="Failed", exit_code=1))))
    counters = json.loads(plan.steps[0].patch["metadata"]["annotations"][dp.RESTARTS_ANNOTATION])
    assert counters["lastFailure"]["action"] == "Fail" and counters["user"] == 0


def test_exit_code_fails_on_a_permanent_code_and_restarts_on_a_signal():
    obj = pytorchjob(restart="ExitCode", runPolicy={"backoffLimit": 5})
    for code, action in ((3, "Fail"), (137, "Restart")):
        plan = dp.decide(snap(obj, pods=(pod("master", 0), pod("worker", 1, phase="Failed", exit_code=code))))
        counters = json.loads(plan.steps[0].patch["metadata"]["annotations"][dp.RESTARTS_ANNOTATION])
        assert counters["lastFailure"]["action"] == action, (code, counters)


def test_finished_job_is_deleted_after_its_ttl_and_cleaned_per_policy():
    obj = pytorchjob(runPolicy={"ttlSecondsAfterFinished": 60, "cleanPodPolicy": "All"})
    done = (NOW - timedelta(seconds=30)).strftime("%Y-%m-%dT%H:%M:%SZ")
    obj["status"] = {"conditions": [{"type": "Succeeded", "status": "True"}], "completionTime": done}
    plan = dp.decide(snap(obj, pods=(pod("master", 0, phase="Succeeded"), pod("worker", 0))))
    assert [(d.resource, d.name) for d in plan.of(Delete)] == [(PODS, "ddp-master-0"), (PODS, "ddp-worker-0")]
    assert plan.requeue_after == 30
    later = dp.decide(Snapshot("team-a/ddp", NOW + timedelta(seconds=31), obj))
    assert [(d.resource, d.name, d.uid) for d in later.of(Delete)] == [(PYTORCHJOBS, "ddp", "pj-1")]
    running = pytorchjob(runPolicy={"cleanPodPolicy": "Running"})
    running["status"] = obj["status"]
    plan = dp.decide(snap(running, pods=(pod("master", 0, phase="Succeeded"), pod("worker", 0))))
    assert [(d.resource, d.name) for d in plan.of(Delete)] == [(PODS, "ddp-worker-0")], "finished pods are kept"


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
    [create] = [c for c in plan.of(Create) if c.obj["metadata"]["name"] == "ddp-rdzv-pt"]
    pod_ = create.obj
    assert pod_["metadata"]["name"] == "ddp-rdzv-pt" and pod_["metadata"]["labels"][pj.JOB_NAME] == "ddp"
    assert "trainer.kubeflow.org/trainjob-name" not in pod_["metadata"]["labels"]  # not a TrainJob's store
    assert pod_["spec"]["schedulerName"] == "sched"
    term = pod_["spec"]["affinity"]["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"][0]
    assert term["podAffinityTerm"]["labelSelector"]["matchLabels"] == {pj.JOB_NAME: "ddp", pj.REPLICA_TYPE: "worker"}
    svc = next(a.obj for a in plan.of(Apply) if a.obj["metadata"]["name"] == "ddp-rdzv-pt")
    assert svc["spec"]["selector"] == pj.store_labels("ddp") and svc["spec"]["ports"][0]["port"] == 29400
    env = {e["name"]: e.get("value") for e in made(plan, "worker")[0]["spec"]["containers"][0]["env"]}
    assert env["PET_RDZV_ENDPOINT"] == "ddp-rdzv-pt:29400"


def test_no_store_with_rdzv_host_or_while_suspended():
    assert not [c for c in dp.decide(snap(pytorchjob(elasticPolicy={**ELASTIC, "rdzvHost": "etcd", "rdzvPort": 2379})))
                .of(Create) if "rdzv" in c.obj["metadata"]["name"]]
    assert not dp.decide(snap(pytorchjob(elasticPolicy=ELASTIC, runPolicy={"suspend": True}))).of(Create)


def test_suspending_lets_go_of_the_gang_and_deletes_the_pods():
    obj = pytorchjob(elasticPolicy=ELASTIC, runPolicy={"suspend": True})
    group = {"metadata": {"name": "ddp-pytorch", "namespace": "team-a", "uid": "pg-1", "ownerReferences": [OWNER]}}
    plan = dp.decide(snap(obj, groups={"coscheduling": group}, pods=(store("ddp-rdzv-pt"), pod("master", 0),
                                                                     pod("worker", 0))))
    assert sorted((d.resource.plural, d.name) for d in plan.of(Delete)) == [
        ("podgroups", "ddp-pytorch"), ("pods", "ddp-master-0"), ("pods", "ddp-rdzv-pt"), ("pods", "ddp-worker-0")]
    assert not plan.of(Create)
    resumed = pytorchjob(elasticPolicy=ELASTIC)
    plan = dp.decide(snap(resumed))
    assert [c.obj["metadata"]["name"] for c in plan.of(Create)] == [
        "ddp-rdzv-pt", "ddp-master-0", "ddp-worker-0", "ddp-worker-1", "ddp-worker-2"]
    assert any(a.resource == POD_GROUPS for a in plan.of(Apply)) and not plan.of(Delete)


def test_a_live_store_is_kept_and_a_lost_one_replaced_under_a_new_name():
    obj = pytorchjob(elasticPolicy=ELASTIC)
    running = (pod("master", 0), *(pod("worker", i) for i in range(3)))
    assert not dp.decide(snap(obj, pods=(store("ddp-rdzv-pt"), *running))).of(Create)
    plan = dp.decide(snap(obj, pods=(store("ddp-rdzv-pt", phase="Failed"), store("ddp-rdzv-pt-1", deleting=True),
                                     *running)))
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


# --- elastic sizing of the Worker group ----------------------------------------------------------
WORKERS_4 = {"minReplicas": 2, "maxReplicas": 4, "rdzvHost": "etcd", "rdzvPort": 2379}


def worker(index: int, *, node: str | None = "n", phase: str = "Running",
           unschedulable_for: float | None = None, disrupted: bool = False) -> dict:
    p = pod("worker", index, phase=phase)
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


def worker_changes(plan) -> tuple[list[str], list[str]]:
    """(Worker pods made, Worker pods deleted) by the plan."""
    return ([p["metadata"]["name"] for p in made(plan, "worker")],
            [d.name for d in plan.of(Delete) if d.resource == PODS and d.name.startswith("ddp-worker-")])


MASTER = pod("master", 0)


def test_a_worker_whose_replacement_finds_no_node_is_cut_and_recorded_alone():
    running = [worker(i) for i in range(3)]
    waiting = worker(3, node=None, phase="Pending", unschedulable_for=10)
    plan = dp.decide(snap(elastic_job(), pods=(MASTER, *running, waiting)))
    [patch] = plan.of(Patch)
    assert patch.resource == PYTORCHJOBS and patch.patch["metadata"]["resourceVersion"] == "7"
    [memo] = resizes(plan)
    assert memo["size"] == 3 and memo["lastResizeReason"] == "Unschedulable" and memo["lastShrinkTime"]
    assert not plan.of(Apply) and not plan.of(Create) and not plan.of(WriteStatus), "the resize is recorded alone"
    assert [e.reason for e in plan.of(Event)] == ["Resized"]
    # the next pass brings the Workers to the recorded size: the unscheduled one goes
    after = dp.decide(snap(elastic_job(memo), pods=(MASTER, *running, waiting)))
    assert worker_changes(after) == ([], ["ddp-worker-3"])
    assert after.requeue_after == dp.ELASTIC_RECHECK_SECONDS, "short of its replicas: it looks again soon"


def test_a_lost_worker_is_replaced_under_a_free_index_and_cut_when_its_replacement_finds_no_node():
    lost = worker(3, disrupted=True)
    healthy = [worker(i) for i in range(3)]
    plan = dp.decide(snap(elastic_job(), pods=(MASTER, *healthy, lost)))
    assert not resizes(plan)
    assert worker_changes(plan) == (["ddp-worker-4"], []), "replaced at once; worker-3's pod still holds its name"
    refused = worker(4, node=None, phase="Pending", unschedulable_for=10)
    plan = dp.decide(snap(elastic_job(), pods=(MASTER, *healthy, lost, refused)))
    [memo] = resizes(plan)
    assert memo["size"] == 3 and memo["lastResizeReason"] == "NodeLost"
    # at the floor: two workers left, the rest lost, nothing more is cut
    memo2 = {"size": 2, "lastShrinkTime": NOW.strftime("%Y-%m-%dT%H:%M:%SZ")}
    plan = dp.decide(snap(elastic_job(memo2), pods=(
        MASTER, worker(0), worker(1, disrupted=True), worker(5, node=None, phase="Pending", unschedulable_for=10))))
    assert not resizes(plan) and worker_changes(plan) == ([], [])


def test_a_worker_deleted_by_hand_is_made_again_under_its_name_once_it_is_gone():
    going = worker(1)
    going["metadata"]["deletionTimestamp"] = "2026-11-23T11:59:50Z"
    rest = (MASTER, worker(0), worker(2), worker(3))
    assert worker_changes(dp.decide(snap(elastic_job(), pods=(*rest, going)))) == ([], []), "its name frees in seconds"
    assert worker_changes(dp.decide(snap(elastic_job(), pods=rest))) == (["ddp-worker-1"], [])


def test_all_healthy_below_the_replicas_grows_by_one_after_the_backoff():
    shrunk = (NOW - timedelta(seconds=60)).strftime("%Y-%m-%dT%H:%M:%SZ")
    three = (MASTER, *(worker(i) for i in range(3)))
    plan = dp.decide(snap(elastic_job({"size": 3, "lastShrinkTime": shrunk}), pods=three))
    [memo] = resizes(plan)
    assert memo["size"] == 4 and memo["lastResizeReason"] == "CapacityProbe" and memo["resizes"] == 1
    assert worker_changes(dp.decide(snap(elastic_job(memo), pods=three))) == (["ddp-worker-3"], [])
    recent = (NOW - timedelta(seconds=5)).strftime("%Y-%m-%dT%H:%M:%SZ")
    plan = dp.decide(snap(elastic_job({"size": 3, "lastShrinkTime": recent}), pods=three))
    assert not resizes(plan), "no probe within the backoff after a shrink"
    assert plan.requeue_after == dp.ELASTIC_RECHECK_SECONDS


def test_a_full_elastic_job_is_left_alone_and_a_new_one_starts_at_its_replicas():
    plan = dp.decide(snap(elastic_job(), pods=(MASTER, *(worker(i) for i in range(4)))))
    assert not resizes(plan) and plan.requeue_after is None and worker_changes(plan) == ([], [])
    first = dp.decide(snap(elastic_job()))
    assert len(made(first, "worker")) == 4
    # a memo bigger than the replicas (scaled down since) is clamped to them
    job = elastic_job({"size": 4})
    job["spec"]["pytorchReplicaSpecs"]["Worker"]["replicas"] = 3
    assert len(made(dp.decide(snap(job)), "worker")) == 3


def test_an_elastic_worker_that_exits_non_zero_is_judged_against_the_budget():
    failed = worker(1, phase="Failed")
    failed["status"]["containerStatuses"] = [{"name": "pytorch", "state": {"terminated": {
        "exitCode": 3, "reason": "Error", "finishedAt": "2026-11-23T11:59:00Z"}}}]
    obj = elastic_job()
    obj["spec"]["runPolicy"] = {"backoffLimit": 2}
    plan = dp.decide(snap(obj, pods=(MASTER, worker(0), failed, worker(2), worker(3))))
    [patch] = [p for p in plan.of(Patch) if p.resource == PYTORCHJOBS]
    restarts = json.loads(patch.patch["metadata"]["annotations"][dp.RESTARTS_ANNOTATION])
    assert restarts["lastFailure"]["action"] == "Restart" and "exit code 3" in restarts["lastFailure"]["message"]
    assert restarts["lastFailure"]["jobUID"] == failed["metadata"]["uid"]
    # a Worker evicted from a lost node is the sizing's business, not a failure
    evicted = worker(1, phase="Failed", disrupted=True)
    plan = dp.decide(snap(elastic_job(), pods=(MASTER, worker(0), evicted, worker(2), worker(3))))
    assert not [p for p in plan.of(Patch) if p.resource == PYTORCHJOBS and dp.RESTARTS_ANNOTATION in
                p.patch["metadata"]["annotations"]]


def test_a_priority_class_that_does_not_exist_fails_the_pytorchjob_naming_the_replica():
    obj = pytorchjob()
    obj["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]["priorityClassName"] = "nope"
    plan = dp.decide(snap(obj, priority_classes=frozenset({"high"})))
    failed = next(c for c in plan.status["conditions"] if c["type"] == "Failed")
    assert failed["reason"] == "PyTorchJobFailed"
    assert "spec.pytorchReplicaSpecs.Worker.template.spec.priorityClassName" in failed["message"] and "'nope'" in failed["message"]
    assert not made(plan)
    assert made(dp.decide(snap(obj, priority_classes=frozenset({"nope"}))))


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
    assert not made(plan), "no pod while it waits"
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
    assert len(made(plan)) == 4
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
    assert len(made(plan, "worker")) == 3
    assert [type(i) for i in plan.gate] == [GateMayGrow]


def test_an_elastic_job_with_a_master_is_charged_and_run_at_its_floor():
    obj = pytorchjob(workers=4, elasticPolicy=WORKERS_4)
    [wants] = dp.decide(snap(obj, gate=GateView(None, HOLD))).gate
    assert wants.min_resources == {"cpu": 3} and wants.nodes is None   # Master + 2 workers
    assert len(made(dp.decide(snap(obj, gate=admitted())), "worker")) == 2


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
    lets it run once admitted: until then no pod is made, and the reason is the Workload's; the pods
    carry no Kueue label (Kueue would make a Workload of each)."""
    obj = pytorchjob(workers=2, runPolicy={"suspend": True})
    obj["metadata"]["labels"] = {"kueue.x-k8s.io/queue-name": "team-a"}
    plan = dp.decide(snap(obj, groups={"kueue": None}))
    assert not made(plan)
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
    pods = made(plan)
    assert [p["metadata"]["name"] for p in pods] == ["ddp-master-0", "ddp-worker-0", "ddp-worker-1"]
    assert not [k for p in pods for k in p["metadata"]["labels"] if k.startswith("kueue.x-k8s.io/")]


def test_under_kueue_a_pytorchjob_without_a_queue_name_fails_naming_the_label():
    plan = dp.decide(dataclasses.replace(snap(pytorchjob(), groups={"kueue": None}), gang_scheduler="kueue"))
    failed = next(c for c in plan.status["conditions"] if c["type"] == "Failed")
    assert failed["status"] == "True" and failed["message"].startswith("metadata.labels[kueue.x-k8s.io/queue-name]")
    assert not made(plan)


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
def restarted(rtype: str, index: int, count: int, exit_code: int = 3, uid: str | None = None) -> dict:
    p = pod(rtype, index, uid=uid)
    p["spec"]["restartPolicy"] = "OnFailure"
    p["status"]["containerStatuses"] = [{"name": "pytorch", "restartCount": count, "ready": True,
                                         "lastState": {"terminated": {"exitCode": exit_code}}}]
    return p


def in_place_record(obj: dict, action: str, seen: int, user: int) -> dict:
    obj = copy.deepcopy(obj)
    obj["metadata"]["annotations"] = {dp.RESTARTS_ANNOTATION: json.dumps({
        "user": user, "infrastructure": 0, "ignored": 0, "lastFailure": {
            "jobUID": "m1", "action": action, "attemptRestarts": seen, "reason": "RestartedInPlace",
            "decision": "MaxRestartsExceeded" if action == "Fail" else "RestartedInPlace",
            "decisionMessage": "restart budget exhausted (1/1 restarts used)" if action == "Fail" else "restart 1/1"}})}
    return obj


def test_an_on_failure_restart_in_place_is_charged_once_and_keeps_the_pods():
    pods = (restarted("master", 0, 0, uid="m1"), restarted("worker", 0, 1), restarted("worker", 1, 1, exit_code=1),
            restarted("worker", 2, 0))
    plan = dp.decide(snap(pytorchjob(runPolicy={"backoffLimit": 2}), pods=pods))
    record, event = plan.steps
    counters = json.loads(record.patch["metadata"]["annotations"][dp.RESTARTS_ANNOTATION])
    assert record.patch["metadata"]["resourceVersion"] == "7", "charged once: a stale cache gets 409"
    assert counters["user"] == 1 and counters["lastFailure"]["action"] == "RestartInPlace", counters
    assert (counters["lastFailure"]["jobUID"], counters["lastFailure"]["attemptRestarts"]) == ("m1", 1)
    assert counters["lastFailure"]["exitCode"] in (3, 1)
    assert (event.reason, event.type) == ("RestartedInPlace", "Warning") and "1/2" in event.message, event
    charged = dp.decide(snap(in_place_record(pytorchjob(runPolicy={"backoffLimit": 2}), "RestartInPlace", 1, 1),
                             pods=pods))
    assert not [s for s in charged.of(Patch) if s.resource == PYTORCHJOBS], "the same episode is not charged again"
    assert not charged.of(Delete) and not made(charged), "the attempt's pods stay"


def test_in_place_restarts_past_the_budget_fail_the_job_and_stop_its_pods():
    pods = (restarted("master", 0, 0, uid="m1"), restarted("worker", 0, 3), restarted("worker", 1, 0),
            restarted("worker", 2, 0))
    obj = pytorchjob(runPolicy={"backoffLimit": 1})   # cleanPodPolicy None: v1 would keep the pods
    (record, _) = dp.decide(snap(obj, pods=pods)).steps
    counters = json.loads(record.patch["metadata"]["annotations"][dp.RESTARTS_ANNOTATION])
    assert (counters["lastFailure"]["action"], counters["user"]) == ("Fail", 1), counters
    plan = dp.decide(snap(in_place_record(obj, "Fail", 3, 1), pods=pods))
    failed = next(c for c in plan.status["conditions"] if c["type"] == "Failed")
    assert failed["reason"] == "PyTorchJobFailed" and "1/1 restarts used" in failed["message"], failed
    assert {(d.name, d.uid) for d in plan.of(Delete) if d.resource == PODS} == {
        (p["metadata"]["name"], p["metadata"]["uid"]) for p in pods}, "the kubelet would restart them forever"


def test_a_second_attempt_failing_soon_after_it_started_is_paced_before_its_pods_are_made_again():
    obj = pytorchjob(restart="Always")   # unlimited restarts (no backoffLimit), as under v1: paced
    obj["metadata"]["annotations"] = {dp.RESTARTS_ANNOTATION: json.dumps({
        "user": 1, "infrastructure": 0, "ignored": 0,
        "lastFailure": {"jobUID": "w1", "action": "Restart", "streak": 1, "time": "2026-11-23T11:58:00Z"}})}
    failed = pod("worker", 1, phase="Failed", exit_code=1, uid="w2", created="2026-11-23T11:59:40Z")   # 20 s old
    plan = dp.decide(snap(obj, pods=(pod("master", 0), failed)))
    counters = json.loads(plan.steps[0].patch["metadata"]["annotations"][dp.RESTARTS_ANNOTATION])
    last = counters["lastFailure"]
    assert (last["action"], last["streak"], last["backoffSeconds"]) == ("Restart", 2, 10)
    assert last["decisionMessage"].endswith("next attempt in 10s (2 attempts in a row failed within 10 min of starting)")
    # Carried out (every pod gone): nothing is made again until the pace allows, then every pod is.
    obj["metadata"]["annotations"] = plan.steps[0].patch["metadata"]["annotations"]
    waiting = dp.decide(Snapshot("team-a/ddp", NOW + timedelta(seconds=3), obj, scheduler_name="sched",
                                 gang_scheduler="coscheduling", groups={"coscheduling": None}))
    assert not waiting.steps and waiting.requeue_after == 7
    again = dp.decide(Snapshot("team-a/ddp", NOW + timedelta(seconds=10), obj, scheduler_name="sched",
                               gang_scheduler="coscheduling", groups={"coscheduling": None}))
    assert [p["metadata"]["name"] for p in made(again)] == ["ddp-master-0", "ddp-worker-0", "ddp-worker-1",
                                                            "ddp-worker-2"]


# --- stalls (gangctl's extension: annotation gangctl.io/stall-timeout, reports in gangctl.io/trainer-status)
def stalling(reported_ago: float | None, timeout: str = "300s", backoff_limit: int = 2, **counters) -> dict:
    """A running PyTorchJob made 2 hours ago with a stall timeout, last reporting `reported_ago` seconds ago."""
    from gangctl.model import progress
    obj = pytorchjob(runPolicy={"backoffLimit": backoff_limit})
    obj["metadata"]["creationTimestamp"] = "2026-11-23T10:00:00Z"
    obj["metadata"]["annotations"] = {progress.STALL_TIMEOUT_ANNOTATION: timeout}
    if reported_ago is not None:
        when = (NOW - timedelta(seconds=reported_ago)).strftime("%Y-%m-%dT%H:%M:%SZ")
        obj["metadata"]["annotations"][progress.REPORT_ANNOTATION] = json.dumps(
            {"progressPercentage": 40, "lastUpdatedTime": when})
    if counters:
        obj["metadata"]["annotations"][dp.RESTARTS_ANNOTATION] = json.dumps(
            {"user": 0, "infrastructure": counters.get("stalled", 0), "ignored": 0, **counters})
    obj["status"] = {"conditions": [{"type": "Running", "status": "True", "reason": "PyTorchJobRunning"}]}
    return obj


RUNNING = tuple(pod(rtype, i, uid=f"{rtype[0]}{i}", created="2026-11-23T10:01:00Z")
                for rtype, i in (("master", 0), ("worker", 0), ("worker", 1), ("worker", 2)))


def test_a_pytorchjob_whose_reports_stop_is_judged_stalled_as_infrastructure_on_its_first_pod():
    plan = dp.decide(snap(stalling(reported_ago=400), pods=RUNNING))
    [step] = plan.steps
    counters = json.loads(step.patch["metadata"]["annotations"][dp.RESTARTS_ANNOTATION])
    assert (counters["user"], counters["infrastructure"], counters["stalled"]) == (0, 1, 1), counters
    last = counters["lastFailure"]
    assert (last["reason"], last["action"], last["jobUID"], last["job"]) == ("Stalled", "Restart", "m0", "ddp-master-0")
    assert "no progress report for 400s (stall timeout 300s" in last["message"]
    # the next pass carries it out as any judged restart: every pod deleted, the judged one last
    obj = stalling(reported_ago=400)
    obj["metadata"]["annotations"][dp.RESTARTS_ANNOTATION] = step.patch["metadata"]["annotations"][dp.RESTARTS_ANNOTATION]
    deletes = dp.decide(snap(obj, pods=RUNNING)).of(Delete)
    assert [d.name for d in deletes][-1] == "ddp-master-0" and len(deletes) == 4


def test_a_reporting_pytorchjob_is_looked_at_again_when_its_timeout_would_pass():
    plan = dp.decide(snap(stalling(reported_ago=100), pods=RUNNING))
    assert not plan.of(Delete) and not [p for p in plan.of(Patch) if p.resource == PYTORCHJOBS]
    assert plan.requeue_after is not None and 200 <= plan.requeue_after <= 202
    [metric] = [m for m in plan.metrics if m.name == "pytorchjob_last_progress"]
    assert metric.value == (NOW - timedelta(seconds=100)).timestamp()


def test_a_pytorchjob_that_never_reported_or_sets_no_timeout_is_never_stalled():
    for obj in (stalling(reported_ago=None), stalling(reported_ago=5000, timeout="")):
        if obj["metadata"]["annotations"].get("gangctl.io/stall-timeout") == "":
            del obj["metadata"]["annotations"]["gangctl.io/stall-timeout"]
        plan = dp.decide(snap(obj, pods=RUNNING))
        assert not [p for p in plan.of(Patch) if p.resource == PYTORCHJOBS] and not plan.of(Delete)
        assert not [m for m in plan.metrics if m.name == "pytorchjob_last_progress"]


def test_a_restarted_attempt_gets_the_whole_timeout():
    fresh = tuple(pod(rtype, i, created=(NOW - timedelta(seconds=60)).strftime("%Y-%m-%dT%H:%M:%SZ"))
                  for rtype, i in (("master", 0), ("worker", 0), ("worker", 1), ("worker", 2)))
    plan = dp.decide(snap(stalling(reported_ago=4000), pods=fresh))
    assert not [p for p in plan.of(Patch) if p.resource == PYTORCHJOBS]
    assert plan.requeue_after is not None and 240 <= plan.requeue_after <= 242


def test_stalls_past_the_backoff_limit_fail_the_pytorchjob_with_reason_stalled():
    obj = stalling(reported_ago=400, backoff_limit=1, stalled=1)
    [step] = dp.decide(snap(obj, pods=RUNNING)).steps
    last = json.loads(step.patch["metadata"]["annotations"][dp.RESTARTS_ANNOTATION])["lastFailure"]
    assert (last["action"], last["decision"]) == ("Fail", "Stalled")


def test_a_bad_stall_timeout_fails_the_pytorchjob_naming_the_annotation():
    plan = dp.decide(snap(stalling(reported_ago=400, timeout="soon"), pods=RUNNING))
    failed = next(c for c in plan.status["conditions"] if c["type"] == "Failed")
    assert "metadata.annotations[gangctl.io/stall-timeout]: 'soon'" in failed["message"]


def test_where_progress_is_served_the_pods_get_the_endpoint_and_its_ca():
    from gangctl.api.resources import CONFIGMAPS
    from gangctl.model import progress
    endpoint = progress.Endpoint("https://gangctl.gangctl-system.svc:8443", "-----CA-----")
    plan = dp.decide(snap(pytorchjob(), progress=endpoint))
    [ca] = [c.obj for c in plan.of(Create) if c.resource == CONFIGMAPS]
    assert ca["metadata"]["name"] == "ddp-pytorchjob-tls-config" and ca["data"] == {"ca.crt": "-----CA-----"}
    assert ca["metadata"]["ownerReferences"][0]["uid"] == "pj-1"
    for p in made(plan):
        env = {e["name"]: e.get("value") for e in p["spec"]["containers"][0]["env"]}
        assert env["KUBEFLOW_TRAINER_STATUS_URL"] == (
            "https://gangctl.gangctl-system.svc:8443/apis/kubeflow.org/v1/namespaces/team-a/pytorchjobs/ddp/status")
        assert progress.injected_url(p) == env["KUBEFLOW_TRAINER_STATUS_URL"]
    assert not [c for c in dp.decide(snap(pytorchjob())).of(Create) if c.resource == CONFIGMAPS]


def test_a_stall_is_judged_on_the_lowest_live_pod_when_worker_0_is_gone():
    obj = stalling(reported_ago=400)
    del obj["spec"]["pytorchReplicaSpecs"]["Master"]
    pods = tuple(pod("worker", i, uid=f"w{i}", created="2026-11-23T10:01:00Z") for i in (1, 2))
    [step] = dp.decide(snap(obj, pods=pods)).steps
    last = json.loads(step.patch["metadata"]["annotations"][dp.RESTARTS_ANNOTATION])["lastFailure"]
    assert (last["reason"], last["jobUID"], last["job"]) == ("Stalled", "w1", "ddp-worker-1")


def test_a_restarted_gang_waiting_for_nodes_is_not_stalled_and_its_silence_counts_from_its_pods_start():
    """v1's Running counts pods that are only created: the silence starts when the last pod started."""
    waiting = [copy.deepcopy(p) for p in RUNNING]
    waiting[1]["status"]["phase"] = "Pending"
    plan = dp.decide(snap(stalling(reported_ago=4000), pods=tuple(waiting)))
    assert not [p for p in plan.of(Patch) if p.resource == PYTORCHJOBS], "judged while a pod waits for a node"
    started = [copy.deepcopy(p) for p in RUNNING]
    started[2]["status"]["containerStatuses"] = [{"name": "pytorch", "state": {"running": {
        "startedAt": (NOW - timedelta(seconds=100)).strftime("%Y-%m-%dT%H:%M:%SZ")}}}]
    plan = dp.decide(snap(stalling(reported_ago=4000), pods=tuple(started)))
    assert not [p for p in plan.of(Patch) if p.resource == PYTORCHJOBS]
    assert plan.requeue_after is not None and 200 <= plan.requeue_after <= 202
