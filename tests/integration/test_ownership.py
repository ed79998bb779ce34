"""Objects gangctl does not own, on the real cluster (docs/runtime.md): a user's PVC named like a
runtime's claim survives ttlSecondsAfterFinished while the claim gangctl made goes; a user's Service
named like a TrainJob's headless Service, or like a PyTorchJob's replica Service, keeps its selector,
gains no ownerReference, survives the job's deletion, and the job says why it cannot start."""
from __future__ import annotations

import copy

import pytest
import yaml

from gangctl.api.resources import CONFIGMAPS, PERSISTENT_VOLUME_CLAIMS, PYTORCHJOBS, SERVICES, TRAINING_RUNTIMES
from gangctl.config import REPO_ROOT
from gangctl.policy import pytorchjob as pj
from tests.integration.helpers import (condition, eventually, gang_state, get_trainjob, is_true, jobs_in,
                                       on_kwok_nodes, submit, trainjob)
from tests.integration.test_initializers import volume_for, volumes  # noqa: F401 (a fixture)

pytestmark = pytest.mark.integration
RUNTIME = yaml.safe_load((REPO_ROOT / "deploy/runtimes/torch-kwok-gpu.yaml").read_text())
SELECTOR = {"app": "users-own"}


def users_service(namespace: str, name: str) -> dict:
    return {"apiVersion": "v1", "kind": "Service", "metadata": {"name": name, "namespace": namespace},
            "spec": {"selector": dict(SELECTOR), "ports": [{"port": 8080}]}}


def claim(namespace: str, name: str) -> dict:
    return {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": name, "namespace": namespace},
            "spec": {"accessModes": ["ReadWriteOnce"], "storageClassName": "",
                     "resources": {"requests": {"storage": "1Gi"}}}}


async def untouched(kube, namespace: str, name: str) -> None:
    svc = await kube.get(SERVICES.path(namespace, name))
    assert svc["spec"]["selector"] == SELECTOR, "its selector is the user's"
    assert not svc["metadata"].get("ownerReferences"), "gangctl adopted nothing"
    assert not svc["metadata"].get("deletionTimestamp")


async def canary(kube, owner: dict) -> str:
    """A ConfigMap owned by `owner`: once the garbage collector has removed it, it has processed the
    owner's deletion (so whatever it left is left for good)."""
    meta = owner["metadata"]
    name = f"{meta['name']}-canary"
    await kube.create(CONFIGMAPS.path(meta["namespace"]), {
        "apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name, "ownerReferences": [{
            "apiVersion": owner["apiVersion"], "kind": owner["kind"], "name": meta["name"], "uid": meta["uid"]}]}})
    return name


async def test_a_users_pvc_named_like_a_claim_survives_the_ttl_and_the_claim_gangctl_made_goes(
        kube, controller, namespace, volumes):  # noqa: F811
    rt = copy.deepcopy(RUNTIME)
    rt["kind"] = "TrainingRuntime"
    rt["metadata"] = {"name": "claims", "namespace": namespace}
    spec = rt["spec"]["template"]["spec"]
    spec["ttlSecondsAfterFinished"] = 3
    # The user's claim first: gangctl before this change deleted the claims in this order, by name.
    spec["volumeClaimPolicies"] = [{"templates": [
        {"metadata": {"name": name}, "spec": claim(namespace, name)["spec"]} for name in ("data", "scratch")]}]
    container = spec["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]["containers"][0]
    container["volumeMounts"] = [{"name": "data", "mountPath": "/data"}, {"name": "scratch", "mountPath": "/scratch"}]
    await kube.create(TRAINING_RUNTIMES.path(namespace), rt)
    for name in ("data-pvc", "scratch-pvc"):
        await volume_for(kube, volumes, namespace, name)
    await kube.create(PERSISTENT_VOLUME_CLAIMS.path(namespace), claim(namespace, "data-pvc"))  # pre-seeded data
    await submit(kube, trainjob("pvc", namespace, nodes=1, runtime="claims", runtime_kind="TrainingRuntime",
                                run_for="2s"))

    async def complete() -> bool:
        return is_true(await get_trainjob(kube, namespace, "pvc"), "Complete")
    await eventually(complete, 90, "the TrainJob Complete on both claims")
    made = await kube.get(PERSISTENT_VOLUME_CLAIMS.path(namespace, "scratch-pvc"))
    assert made["metadata"]["ownerReferences"][0]["name"] == "pvc", "gangctl made the claim it lacked"

    async def expired() -> bool:  # ttlSecondsAfterFinished: 3; the claims go after the Jobs and the Service
        return (not await jobs_in(kube, namespace) and not await kube.exists(SERVICES.path(namespace, "pvc"))
                and not await kube.exists(PERSISTENT_VOLUME_CLAIMS.path(namespace, "scratch-pvc")))
    await eventually(expired, 60, "the children and the claim gangctl made deleted at ttlSecondsAfterFinished")
    users = await kube.get(PERSISTENT_VOLUME_CLAIMS.path(namespace, "data-pvc"))
    assert not users["metadata"].get("deletionTimestamp"), "the user's claim is used as it is, never deleted"
    assert not users["metadata"].get("ownerReferences")


async def test_a_users_service_named_like_a_trainjob_is_left_alone_and_the_trainjob_says_why(
        kube, controller, namespace):
    await kube.create(SERVICES.path(namespace), users_service(namespace, "svc"))
    tj = await submit(kube, trainjob("svc", namespace, nodes=1))

    async def waits() -> bool:
        return gang_state(await get_trainjob(kube, namespace, "svc")).get("reason") == "ChildNotOwned"
    await eventually(waits, 30, "the TrainJob waiting, reason ChildNotOwned")
    gang = gang_state(await get_trainjob(kube, namespace, "svc"))
    assert gang["message"] == f"Service {namespace}/svc exists and is not owned by this TrainJob; delete or rename it"
    await untouched(kube, namespace, "svc")
    assert not await jobs_in(kube, namespace), "the trainer did not start"

    name = await canary(kube, tj)
    await kube.delete(f"/apis/trainer.kubeflow.org/v1alpha1/namespaces/{namespace}/trainjobs/svc")
    await eventually(lambda: _gone(kube, CONFIGMAPS.path(namespace, name)), 30, "the TrainJob's dependents collected")
    await untouched(kube, namespace, "svc")


async def _gone(kube, path: str) -> bool:
    return not await kube.exists(path)


def kwok_pytorchjob(name: str, namespace: str) -> dict:
    pod = on_kwok_nodes({"containers": [{"name": "pytorch", "image": "pytorch/pytorch:2.7.1", "command": ["torchrun", "t.py"],
                                         "resources": {"limits": {"nvidia.com/gpu": "8"}}}]})
    return {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "metadata": {"name": name, "namespace": namespace},
            "spec": {"pytorchReplicaSpecs": {"Worker": {"replicas": 2, "restartPolicy": "OnFailure",
                                                        "template": {"spec": pod}}}}}


async def test_a_users_service_named_like_a_pytorchjob_replica_is_left_alone_and_the_job_says_why(
        kube, controller, namespace):
    await kube.create(SERVICES.path(namespace), users_service(namespace, "ddp-worker-1"))
    obj = await kube.create(PYTORCHJOBS.path(namespace), kwok_pytorchjob("ddp", namespace))

    async def waits() -> bool:
        held = condition(await kube.get(PYTORCHJOBS.path(namespace, "ddp")), "Suspended") or {}
        return held.get("reason") == "ChildNotOwned"
    await eventually(waits, 30, "the PyTorchJob held, reason ChildNotOwned")
    held = condition(await kube.get(PYTORCHJOBS.path(namespace, "ddp")), "Suspended")
    assert held["status"] == "True"
    assert held["message"] == (f"Service {namespace}/ddp-worker-1 exists and is not owned by this PyTorchJob; "
                               "delete or rename it")
    await untouched(kube, namespace, "ddp-worker-1")
    assert not await jobs_in(kube, namespace), "no Worker started"
    mine = await kube.get(SERVICES.path(namespace, "ddp-worker-0"))
    assert mine["metadata"]["ownerReferences"][0]["uid"] == obj["metadata"]["uid"], "its own Service was made"
    assert mine["metadata"]["labels"][pj.JOB_NAME] == "ddp"

    await kube.delete(PYTORCHJOBS.path(namespace, "ddp"))
    await eventually(lambda: _gone(kube, SERVICES.path(namespace, "ddp-worker-0")), 30,
                     "the PyTorchJob's own Service collected with it")
    await untouched(kube, namespace, "ddp-worker-1")
