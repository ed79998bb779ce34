"""`gangctl convert`'s pure core: PyTorchJob manifests -> TrainJob (+ TrainingRuntime) and the gaps."""
from __future__ import annotations

import copy

import pytest

from gangctl.api.pytorchjob import PyTorchJobError
from gangctl.api.runtime import TrainingRuntimeSpec
from gangctl.api.trainjob import TrainJobSpec
from gangctl.policy.convert import convert
from gangctl.model.resolve import resolve
from gangctl.sim.objects import pytorchjob, replica
from tests.unit.test_pytorchjob import DDP, ELASTIC


def _valid(conv) -> None:
    """The output is accepted by gangctl's own TrainJob / TrainingRuntime models and resolves."""
    TrainJobSpec.model_validate(conv.trainjob["spec"])
    if conv.runtime is not None:
        TrainingRuntimeSpec.model_validate(conv.runtime["spec"])
        tj = {**copy.deepcopy(conv.trainjob), "metadata": {**conv.trainjob["metadata"], "uid": "u"}}
        return resolve(tj, conv.runtime)
    return None


def test_plain_never_job_uses_the_shipped_runtime():
    image = "docker.io/pytorch/pytorch:2.5.1"
    m = pytorchjob("plain", {"Master": replica(1, image=image, restartPolicy="Never", command=["torchrun", "train.py"]),
                             "Worker": replica(2, image=image, restartPolicy="Never", command=["torchrun", "train.py"])})
    conv = convert(m)
    assert conv.runtime is None
    spec = conv.trainjob["spec"]
    assert spec["runtimeRef"] == {"apiGroup": "trainer.kubeflow.org", "kind": "ClusterTrainingRuntime",
                                  "name": "torch-distributed"}
    assert spec["trainer"] == {"numNodes": 3, "numProcPerNode": "auto", "image": "docker.io/pytorch/pytorch:2.5.1",
                               "command": ["torchrun", "train.py"],
                               "resourcesPerNode": {"requests": {"cpu": "2", "memory": "1Gi"}}}
    assert not any("command" in g for g in conv.gaps)
    _valid(conv)


def test_ddp_with_on_failure_gets_a_runtime_with_the_restart_budget():
    m = copy.deepcopy(DDP)
    m["spec"]["runPolicy"] = {"backoffLimit": 3, "suspend": True, "activeDeadlineSeconds": 600}
    conv = convert(m)
    assert conv.trainjob["spec"]["runtimeRef"] == {"apiGroup": "trainer.kubeflow.org", "kind": "TrainingRuntime",
                                                   "name": "ddp"}
    assert conv.trainjob["spec"]["suspend"] is True and conv.trainjob["spec"]["activeDeadlineSeconds"] == 600
    rt = conv.runtime["spec"]
    assert rt["template"]["spec"]["failurePolicy"] == {"maxRestarts": 3}
    assert rt["mlPolicy"]["numNodes"] == 4
    (container,) = rt["template"]["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]["containers"]
    assert container["name"] == "node" and "ports" not in container
    assert any(g.startswith("containers[pytorch].command") for g in conv.gaps)   # python, not torchrun
    resolved = _valid(conv)
    assert resolved.num_nodes == 4 and resolved.pod_template["spec"]["containers"][0]["image"].endswith("2.5.1")


def test_exit_code_becomes_a_pod_failure_policy_rule():
    conv = convert(pytorchjob("x", {"Worker": replica(2, restartPolicy="ExitCode")}))
    job = conv.runtime["spec"]["template"]["spec"]["replicatedJobs"][0]["template"]["spec"]
    assert job["podFailurePolicy"]["rules"][0]["onExitCodes"]["values"] == list(range(1, 128))
    assert conv.runtime["spec"]["template"]["spec"]["failurePolicy"]["rules"][0]["onJobFailureReasons"] == [
        "PodFailurePolicy"]
    _valid(conv)


def test_elastic_maps_onto_gangctl_elastic_policy_and_reports_rdzv_settings():
    m = copy.deepcopy(ELASTIC)
    m["spec"]["elasticPolicy"].update(rdzvHost="etcd", metrics=[{"type": "Resource"}])
    conv = convert(m)
    assert conv.trainjob["spec"]["trainer"]["elasticPolicy"] == {"minNodes": 2, "maxNodes": 4, "maxRestarts": 10}
    assert any(g.startswith("spec.elasticPolicy.{rdzvHost}") for g in conv.gaps)
    assert any(g.startswith("spec.elasticPolicy.metrics") for g in conv.gaps)
    resolved = _valid(conv)
    assert (resolved.min_nodes, resolved.num_nodes) == (2, 4)


def test_run_policy_without_equivalent_is_reported():
    m = copy.deepcopy(DDP)
    m["spec"]["runPolicy"] = {"cleanPodPolicy": "All", "ttlSecondsAfterFinished": 60,
                              "schedulingPolicy": {"minAvailable": 2, "queue": "q", "scheduleTimeoutSeconds": 30}}
    m["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["nodeSelector"] = {"pool": "a"}
    conv = convert(m)
    fields = {g.split(":")[0].split(" ")[0] for g in conv.gaps}
    assert {"spec.runPolicy.cleanPodPolicy", "spec.runPolicy.ttlSecondsAfterFinished",
            "spec.runPolicy.schedulingPolicy.minAvailable", "spec.runPolicy.schedulingPolicy.queue",
            "spec.pytorchReplicaSpecs"} <= fields
    assert conv.runtime["spec"]["podGroupPolicy"] == {"coscheduling": {"scheduleTimeoutSeconds": 30}}
    _valid(conv)


def test_kueue_queue_label_is_carried():
    m = copy.deepcopy(DDP)
    m["metadata"]["labels"] = {"kueue.x-k8s.io/queue-name": "team-a", "other": "x"}
    assert convert(m).trainjob["metadata"]["labels"] == {"kueue.x-k8s.io/queue-name": "team-a"}


def test_invalid_manifest_is_refused():
    with pytest.raises(PyTorchJobError, match=r"^spec\.pytorchReplicaSpecs\[Master\]\.replicas"):
        convert(pytorchjob(replicas={"Master": replica(2)}))


def test_mixed_restart_policies_take_the_strictest():
    m = pytorchjob("mix", {"Master": replica(1, restartPolicy="Never", command=["torchrun", "t.py"]),
                           "Worker": replica(2, restartPolicy="OnFailure", command=["torchrun", "t.py"])})
    conv = convert(m)
    assert conv.runtime is None          # Never: the shipped runtime's fail-on-first-failure is v1's behaviour
    assert any(g.startswith("spec.pytorchReplicaSpecs[*].restartPolicy") and g.endswith("Never") for g in conv.gaps)
    m["spec"]["pytorchReplicaSpecs"]["Master"]["restartPolicy"] = "Always"
    assert convert(m).runtime["spec"]["template"]["spec"]["failurePolicy"] == {"maxRestarts": 2147483647}
