"""Ownership before any destructive or adopting write (gangctl.policy.ownership), through both
deciders: an object of a child's name that the job does not own is never applied, patched or
deleted, and the job waits naming it; what the job owns is written and deleted by its uid only."""
from __future__ import annotations

from gangctl.api.resources import JOBS, PODS, POD_GROUPS, SERVICES
from gangctl.policy import decide_pytorchjob as dp
from gangctl.policy import ownership
from gangctl.policy.decide import Apply, Create, Delete, Event, Patch, WriteStatus, decide, not_owned
from tests.unit.test_decide import OWNER, child, snap, trainjob
from tests.unit.test_decide_pytorchjob import OWNER as PYTORCHJOB_OWNER
from tests.unit.test_decide_pytorchjob import pytorchjob
from tests.unit.test_decide_pytorchjob import snap as pytorchjob_snap

WRITES = (Apply, Create, Delete, Patch)


def obj(kind: str, name: str, uid: str, owner: dict | None = None, **labels) -> dict:
    meta: dict = {"name": name, "namespace": "team-a", "uid": uid, "labels": labels}
    if owner is not None:
        meta["ownerReferences"] = [owner]
    return {"apiVersion": "v1", "kind": kind, "metadata": meta}


def test_owned_means_the_controller_reference_holds_the_jobs_uid():
    assert ownership.owned(obj("Service", "llm", "s1", OWNER), "tj-1")
    assert not ownership.owned(obj("Service", "llm", "s1", OWNER), "tj-2"), "another incarnation of the name"
    assert not ownership.owned(obj("Service", "llm", "s1", {**OWNER, "controller": False}), "tj-1")
    assert not ownership.owned(obj("Service", "llm", "s1"), "tj-1")
    assert not ownership.owned(obj("Service", "llm", "s1", OWNER), ""), "a job without uid owns nothing"
    assert ownership.controller_uid(obj("PodGroup", "llm", "pg", OWNER)) == "tj-1"
    assert ownership.controller_uid(obj("PodGroup", "llm", "pg")) is None, "no controller: nobody's to evict"


def test_a_trainjob_waits_naming_a_service_of_its_name_it_does_not_own_and_writes_nothing_to_it():
    users = obj("Service", "llm", "svc-user")  # e.g. labelled like gangctl's, but no ownerReference
    plan = decide(snap(trainjob(), service=users))
    assert not [s for s in plan.steps if isinstance(s, WRITES)], "nothing applied, created, patched or deleted"
    gang = plan.status["gang"]
    assert (gang["state"], gang["reason"]) == ("Pending", "ChildNotOwned")
    assert gang["message"] == ("Service team-a/llm exists and is not owned by this TrainJob; delete or rename it")
    assert [e.reason for e in plan.of(Event)] == ["ChildNotOwned"]
    assert plan.requeue_after == ownership.RECHECK_SECONDS, "looks again: its removal sends no event"


def test_a_foreign_object_found_by_a_create_gives_the_same_wait():
    """An object the caches do not hold (not labelled as gangctl's) is found by the create: the
    follow-up decision is the same, and is written once."""
    found = obj("PodGroup", "llm", "pg-user")
    plan = not_owned(snap(trainjob()), found)
    assert [type(s) for s in plan.steps] == [WriteStatus, Event]
    assert "PodGroup team-a/llm exists" in plan.status["gang"]["message"]
    again = not_owned(snap(trainjob(status=plan.status)), found)
    assert not again.steps and again.requeue_after == ownership.RECHECK_SECONDS


def test_an_owned_child_is_applied_onto_its_uid_an_absent_one_is_created():
    first = decide(snap(trainjob()))
    assert all("uid" not in a.obj["metadata"] for a in first.of(Apply)), "no uid: the writer creates, never applies"
    mine = {**obj("Service", "llm", "svc-1", OWNER), "metadata": {**obj("Service", "llm", "svc-1", OWNER)["metadata"],
                                                               "annotations": {"gangctl.io/spec-hash": "old"}}}
    plan = decide(snap(trainjob(), service=mine, node_job=child()))
    [service] = [a for a in plan.of(Apply) if a.resource == SERVICES]
    assert service.obj["metadata"]["uid"] == "svc-1", "applied onto that incarnation only"


def test_release_deletes_only_what_the_trainjob_owns_each_by_uid():
    tj = trainjob(suspend=True)
    users_group = obj("PodGroup", "llm", "pg-user")
    plan = decide(snap(tj, node_job=child(suspend=True), groups={"coscheduling": users_group}))
    assert not [s for s in plan.steps if isinstance(s, WRITES) and getattr(s, "resource", None) == POD_GROUPS]
    assert plan.status["gang"]["reason"] == "ChildNotOwned"
    mine = obj("PodGroup", "llm", "pg-1", OWNER)
    store = obj("Pod", "llm-rendezvous-store", "store-1", OWNER, **{"gangctl.io/role": "rendezvous-store"})
    users_store = obj("Pod", "llm-rendezvous-store-1", "store-u", **{"gangctl.io/role": "rendezvous-store"})
    plan = decide(snap(tj, node_job=child(suspend=True), groups={"coscheduling": mine}, pods=(store, users_store)))
    deletes = [(d.resource, d.name, d.uid) for d in plan.of(Delete)]
    assert (POD_GROUPS, "llm", "pg-1") in deletes and (PODS, "llm-rendezvous-store", "store-1") in deletes
    assert all(d.uid for d in plan.of(Delete)), "every delete names its incarnation"
    assert "llm-rendezvous-store-1" not in [d.name for d in plan.of(Delete)], "a pod it does not own stays"


def test_a_pytorchjob_waits_naming_a_service_of_a_replica_name_it_does_not_own():
    users = obj("Service", "ddp-worker-1", "svc-user", **{"training.kubeflow.org/job-name": "ddp"})
    plan = dp.decide(pytorchjob_snap(pytorchjob(), services=(users,)))
    assert not [s for s in plan.steps if isinstance(s, WRITES)], "nothing applied, created, patched or deleted"
    suspended = next(c for c in plan.status["conditions"] if c["type"] == "Suspended")
    assert (suspended["status"], suspended["reason"]) == ("True", "ChildNotOwned")
    assert suspended["message"] == ("Service team-a/ddp-worker-1 exists and is not owned by this PyTorchJob; "
                                    "delete or rename it")
    assert plan.requeue_after == ownership.RECHECK_SECONDS
    found = dp.not_owned(pytorchjob_snap(pytorchjob()), users)
    assert found.status == plan.status, "found by a create: the same wait"


def test_a_finished_pytorchjob_deletes_its_own_gang_and_pods_by_uid_and_nothing_else():
    job = pytorchjob(runPolicy={"cleanPodPolicy": "All"})
    job["status"] = {"conditions": [{"type": "Succeeded", "status": "True"}]}
    labels = {"training.kubeflow.org/job-name": "ddp", "training.kubeflow.org/replica-type": "worker"}
    mine = obj("Pod", "ddp-worker-0", "w1", PYTORCHJOB_OWNER, **labels)
    users = obj("Pod", "ddp-worker-1", "w-user", **labels)
    group = obj("PodGroup", "ddp-pytorch", "pg-1", PYTORCHJOB_OWNER)
    plan = dp.decide(pytorchjob_snap(job, pods=(mine, users), groups={"coscheduling": group}))
    assert sorted((d.resource.plural, d.name, d.uid) for d in plan.of(Delete)) == [
        (POD_GROUPS.plural, "ddp-pytorch", "pg-1"), (PODS.plural, "ddp-worker-0", "w1")]
