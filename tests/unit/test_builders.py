"""TrainJob + runtime → the objects gangctl applies (pure builders, no cluster)."""
from __future__ import annotations

from fractions import Fraction

import pytest
import yaml

from gangctl.plugins.coscheduling import Coscheduling
from gangctl.plugins.workload import headless_service, node_job, owner_reference
from gangctl.model.gang import size_gang
from gangctl.model.resolve import ResolveError, resolve
from gangctl.sim.objects import runtime, trainjob

RUNTIME = runtime()


def test_trainer_overrides_runtime_and_sizes_the_gang():
    tj = trainjob("mnist", trainer={"numNodes": 4, "image": "example/train:1",
                                   "resourcesPerNode": {"limits": {"nvidia.com/gpu": "8", "cpu": "32"}}})
    job = resolve(tj, RUNTIME)
    assert job.num_nodes == 4 and job.num_proc_per_node == "8"
    assert job.gang_backend == "coscheduling" and job.gang_settings["scheduleTimeoutSeconds"] == 120
    gang = size_gang(job.num_nodes, job.requests, schedule_timeout_seconds=job.gang_settings["scheduleTimeoutSeconds"])
    assert gang.min_member == 4
    assert gang.min_resources == {"nvidia.com/gpu": Fraction(32), "cpu": Fraction(128)}

    group = Coscheduling().group(job, gang, owner_reference(tj))
    assert group["spec"] == {"minMember": 4, "minResources": {"cpu": "128", "nvidia.com/gpu": "32"},
                             "scheduleTimeoutSeconds": 120}


def test_node_job_is_an_indexed_job_with_sdk_labels_and_torch_env():
    tj = trainjob("mnist", trainer={"numNodes": 3, "resourcesPerNode": {"requests": {"cpu": "2"}}})
    job = resolve(tj, RUNTIME)
    obj = node_job(job, owner_reference(tj), Coscheduling(), "scheduler-plugins-scheduler")
    spec = obj["spec"]
    assert obj["metadata"]["name"] == "mnist-node-0"
    assert (spec["completionMode"], spec["completions"], spec["parallelism"]) == ("Indexed", 3, 3)
    pod = spec["template"]
    labels = pod["metadata"]["labels"]
    assert labels["jobset.sigs.k8s.io/jobset-name"] == "mnist"
    assert labels["jobset.sigs.k8s.io/replicatedjob-name"] == "node"
    assert labels["scheduling.x-k8s.io/pod-group"] == "mnist"
    assert pod["spec"]["subdomain"] == "mnist" and pod["spec"]["schedulerName"] == "scheduler-plugins-scheduler"
    env = {e["name"]: e for e in pod["spec"]["containers"][0]["env"]}
    assert env["PET_NNODES"]["value"] == "3"
    assert env["PET_NPROC_PER_NODE"]["value"] == "2", "without GPUs, the CPU count (Kubeflow's rule)"
    assert env["PET_MASTER_ADDR"]["value"] == "mnist-node-0-0.mnist"
    assert obj["metadata"]["ownerReferences"][0]["uid"] == "u-1"
    assert headless_service(job, owner_reference(tj))["spec"]["clusterIP"] == "None"


def test_builders_are_deterministic_so_unchanged_jobs_are_not_reapplied():
    tj = trainjob("mnist", trainer={"numNodes": 2})
    job = resolve(tj, RUNTIME)
    a = node_job(job, owner_reference(tj), Coscheduling(), "s")
    b = node_job(resolve(tj, RUNTIME), owner_reference(tj), Coscheduling(), "s")
    assert a == b
    c = node_job(resolve(trainjob("mnist", trainer={"numNodes": 3}), RUNTIME), owner_reference(tj), Coscheduling(), "s")
    assert a["metadata"]["annotations"]["gangctl.io/spec-hash"] != c["metadata"]["annotations"]["gangctl.io/spec-hash"]


def test_runtime_without_node_job_is_an_error_naming_it():
    broken = yaml.safe_load(yaml.safe_dump(RUNTIME))
    broken["spec"]["template"]["spec"]["replicatedJobs"][0]["name"] = "launcher"
    with pytest.raises(ResolveError, match="replicatedJobs has no job named 'node'"):
        resolve(trainjob("mnist", trainer={"numNodes": 1}), broken)


def test_override_targeting_a_job_the_runtime_lacks_is_an_error_naming_the_field():
    tj = trainjob("mnist", trainer={"numNodes": 1})
    tj["spec"]["podTemplateOverrides"] = [{"targetJobs": [{"name": "node"}, {"name": "launcher"}]}]
    with pytest.raises(ResolveError, match=r"spec.podTemplateOverrides\[0\].targetJobs\[1\].name: .*'launcher' "
                                           r"\(it has: node\)"):
        resolve(tj, RUNTIME)


@pytest.mark.parametrize(("where", "value", "named"), [
    ("containers", "node", "spec.template.spec.containers must be a list"),
    ("tolerations", "all", "spec.template.spec.tolerations must be a list"),
    ("nodeSelector", ["a"], "spec.template.spec.nodeSelector must be an object"),
    ("containers", [{"name": "node", "env": "LR=1"}], r"containers\[0\].env must be a list"),
    ("containers", [{"name": "node", "env": [{"value": "1"}]}], r"containers\[0\].env\[0\].name must be a string"),
    ("containers", [{"name": "node", "resources": {"limits": ["cpu"]}}], r"containers\[0\].resources.limits must be"),
    ("containers", [{"name": "node", "resources": {"limits": {"cpu": "lots"}}}], "resources .*invalid quantity 'lots'"),
])
def test_runtime_pod_template_of_the_wrong_shape_is_an_error_naming_the_field(where, value, named):
    broken = yaml.safe_load(yaml.safe_dump(RUNTIME))
    broken["spec"]["template"]["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"][where] = value
    with pytest.raises(ResolveError, match=named):
        resolve(trainjob("mnist", trainer={"numNodes": 1}), broken)


def test_elastic_policy_sets_the_gang_floor():
    elastic = yaml.safe_load(yaml.safe_dump(RUNTIME))
    elastic["spec"]["mlPolicy"]["torch"]["elasticPolicy"] = {"minNodes": 2, "maxNodes": 4}
    job = resolve(trainjob("mnist", trainer={}), elastic)
    gang = size_gang(job.num_nodes, job.requests, min_nodes=job.min_nodes)
    assert (gang.min_member, gang.size, gang.surplus) == (2, 4, 2)
