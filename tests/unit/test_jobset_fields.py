"""The JobSet fields of a runtime's template (volumeClaimPolicies, ttlSecondsAfterFinished,
coordinator, network, startupPolicy, managedBy) and podGroupPolicy.volcano.networkTopology, as
JobSet and Kubeflow Trainer apply them, through decide."""
from __future__ import annotations

import copy
from datetime import timedelta

import pytest

from gangctl.api.resources import JOBS, PERSISTENT_VOLUME_CLAIMS, SERVICES
from gangctl.model.names import JOBSET_NAME
from gangctl.policy import status as st
from gangctl.policy.decide import Apply, Create, Delete, LetGo, Snapshot, decide
from tests.unit.test_decide import (ALL_BACKENDS, COMPLETE, NOW, OWNER, RUNTIME, child, condition, snap, step_child, trainjob,
                                    with_initializers)

CLAIM = {"metadata": {"name": "initializer", "labels": {"team": "a"}},
         "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "20Gi"}}}}


def with_claims(retain: bool = False) -> dict:
    """Trainer's LLM runtimes' shape: the initializers and the trainer share the `initializer` PVC."""
    rt = with_initializers()
    spec = rt["spec"]["template"]["spec"]
    policy: dict = {"templates": [copy.deepcopy(CLAIM)]}
    if retain:
        policy["retentionPolicy"] = {"whenDeleted": "Retain"}
    spec["volumeClaimPolicies"] = [policy]
    node = next(j for j in spec["replicatedJobs"] if j["name"] == "node")
    node["template"]["spec"]["template"]["spec"]["containers"][0]["volumeMounts"] = [
        {"name": "initializer", "mountPath": "/workspace"}]
    return rt


def template_spec(rt: dict) -> dict:
    return rt["spec"]["template"]["spec"]


def creates(plan, resource) -> list[dict]:
    return [c.obj for c in plan.of(Create) if c.resource == resource]


def test_a_claim_template_becomes_one_pvc_created_before_the_first_pod_that_mounts_it():
    rt = with_claims()
    tj = trainjob(initializer={"dataset": {"storageUri": "hf://tatsu-lab/alpaca"}})
    first = decide(snap(tj, rt=rt))
    kinds = [c.obj["kind"] for c in first.of(Create)]
    assert kinds == ["PersistentVolumeClaim", "Job"], "the claim exists before the dataset initializer's pods"
    pvc = creates(first, PERSISTENT_VOLUME_CLAIMS)[0]
    assert pvc["metadata"]["name"] == "initializer-llm", "JobSet's name: <claim>-<jobset>"
    assert pvc["metadata"]["labels"] == {"team": "a", "jobset.sigs.k8s.io/jobset-name": "llm"}
    assert pvc["metadata"]["ownerReferences"][0]["uid"] == "tj-1", "deleted with the TrainJob (retention Delete)"
    assert pvc["spec"]["resources"]["requests"]["storage"] == "20Gi"
    dataset = creates(first, JOBS)[0]
    assert {"name": "initializer", "persistentVolumeClaim": {"claimName": "initializer-llm"}} in \
        dataset["spec"]["template"]["spec"]["volumes"]

    done = (step_child("dataset-initializer", COMPLETE), step_child("model-initializer", COMPLETE))
    trainer = decide(snap(trainjob(status=first.status, **tj["spec"]), rt=rt, jobs=done))
    node = next(a.obj for a in trainer.of(Apply) if a.obj["kind"] == "Job")
    assert {"name": "initializer", "persistentVolumeClaim": {"claimName": "initializer-llm"}} in \
        node["spec"]["template"]["spec"]["volumes"], "the trainer reads what the initializers wrote"
    assert not creates(trainer, PERSISTENT_VOLUME_CLAIMS), "made once, with the TrainJob's first child"


def test_a_retained_claim_is_not_owned_by_the_trainjob():
    first = decide(snap(trainjob(), rt=with_claims(retain=True)))
    assert "ownerReferences" not in creates(first, PERSISTENT_VOLUME_CLAIMS)[0]["metadata"]


def test_a_claim_no_job_mounts_is_not_created():
    rt = copy.deepcopy(RUNTIME)
    template_spec(rt)["volumeClaimPolicies"] = [{"templates": [copy.deepcopy(CLAIM)]}]
    assert not creates(decide(snap(trainjob(), rt=rt)), PERSISTENT_VOLUME_CLAIMS)


@pytest.mark.parametrize("change, field", [
    (lambda s: s["network"].update(subdomain="other"), "network.subdomain"),
    (lambda s: s["network"].update(enableDNSHostnames=False), "network.enableDNSHostnames"),
    (lambda s: s.update(managedBy="kueue.x-k8s.io/multikueue"), "managedBy"),
    (lambda s: s.update(startupPolicy={"startupPolicyOrder": "InOrder"}), "startupPolicy.startupPolicyOrder"),
    (lambda s: s["replicatedJobs"][0]["template"]["spec"]["template"]["spec"].update(
        volumes=[{"name": "initializer", "emptyDir": {}}]), "volumeClaimPolicies"),
])
def test_a_jobset_field_gangctl_cannot_honour_fails_only_that_trainjob_naming_the_field(change, field):
    rt = with_claims()
    template_spec(rt)["network"] = {}
    change(template_spec(rt))
    plan = decide(snap(trainjob(), rt=rt))
    failed = condition(plan.status, "Failed")
    assert failed["reason"] == "InvalidRuntime" and field in failed["message"], failed
    assert not plan.of(Create) and not plan.of(Apply)


def test_jobset_fields_gangctl_runs_as_jobset_does_are_accepted():
    rt = copy.deepcopy(RUNTIME)
    template_spec(rt).update(network={"subdomain": "llm", "enableDNSHostnames": True, "publishNotReadyAddresses": False},
                             startupPolicy={"startupPolicyOrder": "InOrder"},  # one replicated job: nothing to order
                             coordinator={"replicatedJob": "node", "jobIndex": 0, "podIndex": 0})
    plan = decide(snap(trainjob(), rt=rt))
    applied = {a.obj["kind"]: a.obj for a in plan.of(Apply)}
    assert applied["Service"]["spec"]["publishNotReadyAddresses"] is False
    job = applied["Job"]
    key = "jobset.sigs.k8s.io/coordinator"
    for meta in (job["metadata"], job["spec"]["template"]["metadata"]):
        assert meta["labels"][key] == meta["annotations"][key] == "llm-node-0-0.llm"


def observed(kind: str, name: str, uid: str, owned: bool = True) -> dict:
    """A child as the caches show it; `owned`: its controller ownerReference is the TrainJob's."""
    meta: dict = {"name": name, "namespace": "team-a", "uid": uid, "labels": {JOBSET_NAME: "llm"}}
    if owned:
        meta["ownerReferences"] = [OWNER]
    return {"apiVersion": "v1", "kind": kind, "metadata": meta}


def finished_snapshot(ttl: int | None, seconds_since: float, *, rt: dict | None = None, service: bool = True,
                      jobs: bool = True, claims: tuple[dict, ...] = (), svc: dict | None = None) -> Snapshot:
    rt = copy.deepcopy(rt or RUNTIME)
    if ttl is not None:
        template_spec(rt)["ttlSecondsAfterFinished"] = ttl
    done = st.derive_status({}, [st.ChildJob.from_job(child(conditions=COMPLETE), "node")], None, False, NOW)
    job = child(conditions=COMPLETE)
    if svc is None and service:
        svc = observed("Service", "llm", "svc-1")
    return Snapshot("team-a/llm", NOW + timedelta(seconds=seconds_since), trainjob(status=done), runtime=rt,
                    groups=ALL_BACKENDS, node_job=job if jobs else None, jobs=(job,) if jobs else (), service=svc,
                    claims=claims)


def test_before_ttl_seconds_after_finished_the_children_stay_and_the_key_comes_back_when_it_passes():
    plan = decide(finished_snapshot(ttl=60, seconds_since=10))
    assert not plan.of(Delete)
    assert plan.requeue_after == pytest.approx(50)


def test_after_ttl_seconds_after_finished_the_children_go_and_the_trainjob_stays():
    claim = observed("PersistentVolumeClaim", "initializer-llm", "pvc-1")
    plan = decide(finished_snapshot(ttl=60, seconds_since=61, rt=with_claims(), claims=(claim,)))
    deleted = {(d.resource, d.name, d.uid) for d in plan.of(Delete)}
    assert deleted == {(JOBS, "llm-node-0", "job-1"), (SERVICES, "llm", "svc-1"),
                       (PERSISTENT_VOLUME_CLAIMS, "initializer-llm", "pvc-1")}, "each by its uid"
    assert [s.job["metadata"]["name"] for s in plan.of(LetGo)] == ["llm-node-0"], "its result is recorded"
    assert plan.status is None, "the TrainJob keeps its status"
    kept = observed("PersistentVolumeClaim", "initializer-llm", "pvc-1", owned=False)  # Retain: no ownerReference
    retained = decide(finished_snapshot(ttl=60, seconds_since=61, rt=with_claims(retain=True), claims=(kept,)))
    assert PERSISTENT_VOLUME_CLAIMS not in {d.resource for d in retained.of(Delete)}
    gone = decide(finished_snapshot(ttl=60, seconds_since=120, service=False, jobs=False))
    assert gone.steps == (), "once the children are gone nothing more is sent"


def test_without_a_ttl_a_finished_trainjob_keeps_its_children():
    plan = decide(finished_snapshot(ttl=None, seconds_since=10_000))
    assert not plan.of(Delete) and plan.requeue_after is None


def test_volcano_network_topology_goes_on_the_podgroup_as_trainer_puts_it():
    rt = copy.deepcopy(RUNTIME)
    rt["spec"]["podGroupPolicy"] = {"volcano": {"networkTopology": {"mode": "hard", "highestTierAllowed": 1}}}
    plan = decide(snap(trainjob(), rt=rt))
    group = next(a.obj for a in plan.of(Apply) if a.obj["kind"] == "PodGroup")
    assert group["spec"]["networkTopology"] == {"mode": "hard", "highestTierAllowed": 1}


def test_at_ttl_a_claim_or_service_of_a_childs_name_the_trainjob_does_not_own_stays():
    """A user's PVC named like the claim (made before the job, used as it was) and a Service of the
    TrainJob's name that is someone else's are never deleted; what the TrainJob owns still goes."""
    users_claim = observed("PersistentVolumeClaim", "initializer-llm", "pvc-user", owned=False)
    users_service = observed("Service", "llm", "svc-user", owned=False)
    plan = decide(finished_snapshot(ttl=60, seconds_since=61, rt=with_claims(), claims=(users_claim,),
                                    svc=users_service))
    assert [(d.resource, d.name, d.uid) for d in plan.of(Delete)] == [(JOBS, "llm-node-0", "job-1")]
    gone = decide(finished_snapshot(ttl=60, seconds_since=120, rt=with_claims(), jobs=False, claims=(users_claim,),
                                    svc=users_service))
    assert gone.steps == (), "what is left is not the TrainJob's: nothing more is sent"


def test_a_claim_of_the_same_name_made_before_the_job_is_used_as_it_is():
    plan = decide(snap(trainjob(), rt=with_claims()))
    claim = next(c for c in plan.of(Create) if c.resource == PERSISTENT_VOLUME_CLAIMS)
    assert claim.exists_ok, "an existing claim is never taken over or refused"
