"""gangctl.sim.objects: the hand-made pods, jobs, runtimes and nodes the simulator and the tests share."""
from __future__ import annotations

from gangctl.model.names import TRAINJOB_NAME
from gangctl.sim import objects
from gangctl.sim.controller import worker


def test_a_builder_writes_only_the_fields_it_is_given():
    assert objects.pod() == {"metadata": {}, "spec": {}, "status": {}}
    assert objects.node("n") == {"metadata": {"name": "n"}, "spec": {},
                                 "status": {"conditions": [{"type": "Ready", "status": "True"}]}}
    tj = objects.trainjob()
    assert set(tj) == {"apiVersion", "kind", "metadata", "spec"} and tj["spec"] == {"runtimeRef": {"name": "torch-distributed"}}
    assert objects.pod(node="", conditions=[])["spec"] == {"nodeName": ""}, "an empty value is a value"


def test_the_simulators_worker_is_the_pod_the_job_controller_and_kubelet_show():
    job = {"metadata": {"name": "j-node-0", "namespace": "team", "uid": "job-9", "labels": {TRAINJOB_NAME: "j"}}}
    assert worker(job, 2, phase="Failed", disrupted=True, exit_code=1) == {
        "metadata": {"name": "j-node-0-2", "namespace": "team", "labels": {TRAINJOB_NAME: "j"},
                     "ownerReferences": [{"uid": "job-9"}],
                     "annotations": {"batch.kubernetes.io/job-completion-index": "2"}},
        "spec": {"nodeName": "node-2"},
        "status": {"phase": "Failed",
                   "conditions": [{"type": "DisruptionTarget", "status": "True", "reason": "DeletionByPodGC"}],
                   "containerStatuses": [{"name": "node", "state": {"terminated": {"exitCode": 1}}}]}}
    assert worker(job, 0)["status"] == {"phase": "Running", "conditions": []}


def test_each_runtime_is_a_copy_of_the_shipped_one():
    first = objects.runtime(gang={"volcano": {}}, failure_policy={"maxRestarts": 2},
                            elastic={"minNodes": 1, "maxNodes": 4})
    assert first["spec"]["podGroupPolicy"] == {"volcano": {}}
    assert first["spec"]["template"]["spec"]["failurePolicy"] == {"maxRestarts": 2}
    assert first["spec"]["mlPolicy"]["torch"]["elasticPolicy"] == {"minNodes": 1, "maxNodes": 4}
    fresh = objects.runtime()
    assert "volcano" not in fresh["spec"]["podGroupPolicy"] and "elasticPolicy" not in fresh["spec"]["mlPolicy"]["torch"]
