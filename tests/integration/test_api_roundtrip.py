"""A TrainJob and runtimes carrying every field of Kubeflow Trainer v2.3 (per `kubeflow_trainer_api`
2.3.0) are stored by the real API server as sent: nothing pruned, nothing refused.

The objects are written by hand; a coverage check walks the generated models so that a field Trainer
adds cannot be missed here silently. The TrainJob names `managedBy: kueue.x-k8s.io/multikueue`, which
gangctl leaves alone, so only the API server touches it.
"""
from __future__ import annotations

import copy
import typing
import uuid
from typing import Any

import pytest
from kubeflow_trainer_api import models
from pydantic import BaseModel

from gangctl.api.resources import CLUSTER_TRAINING_RUNTIMES, TRAINING_RUNTIMES, TRAINJOBS
from tests.integration.helpers import delete_namespace
from tests.unit.test_api_parity import unwrap

pytestmark = [pytest.mark.integration, pytest.mark.asyncio(loop_scope="session")]

SUFFIX = uuid.uuid4().hex[:6]
ENV = [{"name": "LOG_LEVEL", "value": "debug"}]
MOUNT = {"name": "initializer", "mountPath": "/workspace"}
POD_PATCH = {
    "serviceAccountName": "trainer",
    "volumes": [{"name": "cache", "emptyDir": {"sizeLimit": "1Gi"}}],
    "initContainers": [{"name": "prepare", "env": ENV, "volumeMounts": [{"name": "cache", "mountPath": "/cache"}],
                        "securityContext": {"runAsNonRoot": True}}],
    "containers": [{"name": "sidecar", "env": ENV, "volumeMounts": [{"name": "cache", "mountPath": "/cache"}],
                    "securityContext": {"allowPrivilegeEscalation": False}}],
    "imagePullSecrets": [{"name": "registry"}],
    "securityContext": {"fsGroup": 1000},
    "nodeSelector": {"zone": "a"},
    "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchExpressions": [{"key": "gpu", "operator": "In", "values": ["a100"]}]}]}}},
    "tolerations": [{"key": "spot", "operator": "Exists", "effect": "NoSchedule"}],
    "schedulingGates": [{"name": "example.com/gate"}],
    "terminationGracePeriodSeconds": 45,
}
META = {"labels": {"team": "nlp"}, "annotations": {"note": "every field"}}


def trainjob(namespace: str) -> dict:
    asset = {"storageUri": "s3://bucket/path", "env": ENV, "secretRef": {"name": "creds"}}
    return {
        "apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob",
        "metadata": {"name": "every-field", "namespace": namespace},
        "spec": {
            "runtimeRef": {"name": f"torch-{SUFFIX}", "apiGroup": "trainer.kubeflow.org", "kind": "TrainingRuntime"},
            "initializer": {"dataset": asset, "model": {**asset, "storageUri": "hf://org/model"}},
            "trainer": {"image": "example/train:1", "command": ["torchrun"], "args": ["train.py"], "env": ENV,
                        "numNodes": 2, "numProcPerNode": 4,
                        "resourcesPerNode": {"requests": {"cpu": "2"}, "limits": {"nvidia.com/gpu": 1}}},
            "runtimePatches": [{
                "manager": "trainer.kubeflow.org/kubeflow-sdk", "time": "2026-01-01T00:00:00Z",
                "trainingRuntimeSpec": {"template": {"metadata": META, "spec": {"replicatedJobs": [{
                    "name": "node", "template": {"metadata": META, "spec": {"template": {
                        "metadata": META, "spec": POD_PATCH}}}}]}}}}],
            "suspend": True,
            "activeDeadlineSeconds": 3600,
            "managedBy": "kueue.x-k8s.io/multikueue",
        },
    }


STATUS = {
    "conditions": [{"type": "Suspended", "status": "True", "reason": "Suspended", "message": "by the test",
                    "lastTransitionTime": "2026-01-01T00:00:00Z", "observedGeneration": 1}],
    "jobsStatus": [{"name": "node", "ready": 0, "succeeded": 0, "failed": 0, "active": 0, "suspended": 1}],
    "trainerStatus": {"progressPercentage": 40, "estimatedRemainingSeconds": 600,
                      "metrics": [{"name": "loss", "value": "0.42"}], "lastUpdatedTime": "2026-01-01T00:05:00Z"},
}


def replicated_job(name: str, container: str, **extra: Any) -> dict:
    return {"name": name, "replicas": 1, **extra, "template": {
        "metadata": {"labels": {"trainer.kubeflow.org/trainjob-ancestor-step": name}},
        "spec": {"template": {"spec": {
            "volumes": [{"name": "initializer", "emptyDir": {}}],
            "initContainers": [{"name": "prepare", "image": "busybox"}],
            "containers": [{"name": container, "image": "example/img:1", "volumeMounts": [MOUNT]},
                           {"name": "sidecar", "image": "busybox"}]}}}}}


def runtime(kind: str, name: str, ml_policy: dict, pod_group_policy: dict) -> dict:
    jobs = [replicated_job("dataset-initializer", "dataset-initializer"),
            replicated_job("model-initializer", "model-initializer", groupName="init",
                           dependsOn=[{"name": "dataset-initializer", "status": "Complete"}]),
            replicated_job("node", "node", dependsOn=[{"name": "model-initializer", "status": "Complete"}])]
    return {
        "apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": kind,
        "metadata": {"name": name, "labels": {"trainer.kubeflow.org/framework": "torch"}},
        "spec": {
            "mlPolicy": {"numNodes": 2, **ml_policy},
            "podGroupPolicy": pod_group_policy,
            "template": {"metadata": META, "spec": {
                "replicatedJobs": jobs,
                "failurePolicy": {"maxRestarts": 2, "restartStrategy": "Recreate", "rules": [
                    {"name": "fatal", "action": "FailJobSet", "onJobFailureReasons": ["PodFailurePolicy"],
                     "onJobFailureMessagePatterns": ["exit code 42"], "targetReplicatedJobs": ["node"]}]},
                "successPolicy": {"operator": "All", "targetReplicatedJobs": ["node"]},
                "network": {"enableDNSHostnames": True, "publishNotReadyAddresses": True, "subdomain": name},
                "coordinator": {"replicatedJob": "node", "jobIndex": 0, "podIndex": 0},
                "startupPolicy": {"startupPolicyOrder": "AnyOrder"},
                "suspend": False,
                "ttlSecondsAfterFinished": 600,
                "managedBy": "jobset.sigs.k8s.io/jobset-controller",
            }},
        },
    }


TORCH = {"torch": {"numProcPerNode": "auto", "envInjection": {
    "targets": [{"jobName": "node", "containerNames": ["sidecar"]}]}}}
COSCHEDULING = {"coscheduling": {"scheduleTimeoutSeconds": 60}}
VOLCANO = {"volcano": {"networkTopology": {"mode": "hard", "highestTierAllowed": 2}}}


def runtimes(namespace: str) -> list[dict]:
    """One runtime per framework (Trainer allows one framework per runtime), both kinds, both PodGroup kinds."""
    out = [runtime("TrainingRuntime", f"torch-{SUFFIX}", TORCH, COSCHEDULING),
           runtime("TrainingRuntime", f"mpi-{SUFFIX}", {"mpi": {"numProcPerNode": 2, "mpiImplementation": "OpenMPI",
                                                                "sshAuthMountPath": "/root/.ssh",
                                                                "runLauncherAsNode": True}}, VOLCANO),
           runtime("TrainingRuntime", f"flux-{SUFFIX}", {"flux": {"numProcPerNode": 2}}, COSCHEDULING),
           runtime("TrainingRuntime", f"jax-{SUFFIX}", {"jax": {}}, COSCHEDULING),
           runtime("TrainingRuntime", f"xgboost-{SUFFIX}", {"xgboost": {}}, COSCHEDULING)]
    for obj in out:
        obj["metadata"]["namespace"] = namespace
    return out + [runtime("ClusterTrainingRuntime", f"torch-volcano-{SUFFIX}", TORCH, VOLCANO)]


# --- coverage: the objects above carry every field of Trainer's own types ----------------------


def _element(annotation: Any) -> Any:
    """The type of a field, or of its items for a list."""
    annotation = unwrap(annotation)
    if typing.get_origin(annotation) in (list, typing.List):
        return unwrap(typing.get_args(annotation)[0])
    return annotation


def trainer_paths(model: type[BaseModel], prefix: str) -> set[str]:
    """Dotted paths of every field of Trainer's own types (lists flattened), not into embedded types."""
    out = set()
    for name, info in model.model_fields.items():
        path = f"{prefix}.{info.alias or name}"
        out.add(path)
        inner = _element(info.annotation)
        if isinstance(inner, type) and issubclass(inner, BaseModel) and inner.__name__.startswith("TrainerV1alpha1"):
            out |= trainer_paths(inner, path)
    return out


def sample_paths(value: Any, prefix: str) -> set[str]:
    out = set()
    if isinstance(value, dict):
        for key, item in value.items():
            out |= {f"{prefix}.{key}"} | sample_paths(item, f"{prefix}.{key}")
    elif isinstance(value, list):
        for item in value:
            out |= sample_paths(item, prefix)
    return out


def test_the_objects_carry_every_trainer_v2_3_field():
    job = trainjob("ns")
    missing = trainer_paths(models.TrainerV1alpha1TrainJobSpec, "spec") - sample_paths(job["spec"], "spec")
    missing |= trainer_paths(models.TrainerV1alpha1TrainJobStatus, "status") - sample_paths(STATUS, "status")
    runtime_fields = set().union(*(sample_paths(r["spec"], "spec") for r in runtimes("ns")))
    missing |= trainer_paths(models.TrainerV1alpha1TrainingRuntimeSpec, "spec") - runtime_fields
    assert sorted(missing) == []
    for obj in runtimes("ns"):  # and Trainer's models take them
        models.TrainerV1alpha1TrainingRuntime.from_dict(obj)
    models.TrainerV1alpha1TrainJob.from_dict({**job, "status": STATUS})


async def test_every_field_survives_the_api_server(kube):
    namespace = f"every-{SUFFIX}"
    await kube.create("/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}})
    created_cluster: list[str] = []
    try:
        for obj in runtimes(namespace):
            if obj["kind"] == "ClusterTrainingRuntime":
                stored = await kube.create(CLUSTER_TRAINING_RUNTIMES.path(), copy.deepcopy(obj))
                created_cluster.append(obj["metadata"]["name"])
                stored = await kube.get(CLUSTER_TRAINING_RUNTIMES.path(name=obj["metadata"]["name"]))
            else:
                await kube.create(TRAINING_RUNTIMES.path(namespace), copy.deepcopy(obj))
                stored = await kube.get(TRAINING_RUNTIMES.path(namespace, obj["metadata"]["name"]))
            assert stored["spec"] == obj["spec"], f"{obj['kind']} {obj['metadata']['name']} changed when stored"
        job = trainjob(namespace)
        await kube.create(TRAINJOBS.path(namespace), copy.deepcopy(job))
        path = TRAINJOBS.path(namespace, "every-field")
        await kube.merge_patch(TRAINJOBS.path(namespace, "every-field", sub="status"), {"status": STATUS})
        stored = await kube.get(path)
        assert stored["spec"] == job["spec"], "the TrainJob's spec changed when stored"
        assert stored["status"] == STATUS, "the TrainJob's status changed when stored"
    finally:
        for name in created_cluster:
            await kube.delete(CLUSTER_TRAINING_RUNTIMES.path(name=name))
        await kube.request("DELETE", TRAINJOBS.path(namespace))
        await delete_namespace(kube, namespace)
