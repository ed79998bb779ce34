"""spec.runtimePatches (Trainer v2.2+), spec.initializer and spec.podTemplateOverrides (v2.1) in the
pure resolve step: the pod template a user gets, and the errors that name the field."""
from __future__ import annotations

import pytest
from kubeflow_trainer_api import models

from gangctl.api.trainjob import parse_trainjob
from gangctl.plugins.coscheduling import Coscheduling
from gangctl.plugins.workload import node_job, owner_reference
from gangctl.model.resolve import ResolveError, resolve
from gangctl.sim import objects

RUNTIME = objects.runtime()
SDK = "trainer.kubeflow.org/kubeflow-sdk"
KUEUE = "kueue.x-k8s.io/manager"


def runtime_with_initializer() -> dict:
    """torch-distributed plus a dataset-initializer job sharing the `initializer` volume, and a sidecar."""
    runtime = objects.runtime()
    jobs = runtime["spec"]["template"]["spec"]["replicatedJobs"]
    volume = {"name": "initializer", "emptyDir": {}}
    mount = {"name": "initializer", "mountPath": "/workspace"}
    jobs.insert(0, {"name": "dataset-initializer", "template": {
        "metadata": {"labels": {"trainer.kubeflow.org/trainjob-ancestor-step": "dataset-initializer"}},
        "spec": {"template": {"spec": {"volumes": [volume], "containers": [{
            "name": "dataset-initializer", "image": "kubeflow/dataset-initializer",
            "env": [{"name": "STORAGE_URI", "value": "hf://default"}], "volumeMounts": [mount]}]}}}}})
    node_pod = jobs[1]["template"]["spec"]["template"]["spec"]
    node_pod["volumes"] = [volume]
    node_pod["containers"][0]["volumeMounts"] = [mount]
    node_pod["containers"].append({"name": "sidecar", "image": "busybox", "env": [{"name": "MODE", "value": "a"}]})
    node_pod["tolerations"] = [{"key": "runtime", "operator": "Exists"}]
    node_pod["nodeSelector"] = {"pool": "gpu"}
    node_pod["securityContext"] = {"runAsUser": 1000, "fsGroup": 1000}
    return runtime


def pod_patch(**spec) -> dict:
    """A replicated job patch of the node job's pod spec (and pod labels, with `labels=`)."""
    labels = spec.pop("labels", None)
    template = {"spec": spec}
    if labels:
        template["metadata"] = {"labels": labels}
    return {"name": "node", "template": {"spec": {"template": template}}}


def patch(manager: str, *job_patches: dict, metadata: dict | None = None) -> dict:
    template: dict = {"spec": {"replicatedJobs": list(job_patches)}}
    if metadata:
        template["metadata"] = metadata
    return {"manager": manager, "trainingRuntimeSpec": {"template": template}}


def trainjob(**spec) -> dict:
    obj = objects.trainjob(**{"trainer": {"numNodes": 2}, **spec})
    for p in spec.get("runtimePatches") or []:
        models.TrainerV1alpha1RuntimePatch.from_dict(p)  # the shape Trainer's API (and the SDK) has
    parse_trainjob(obj)  # what the reconciler checks before resolving
    return obj


def test_sdk_patch_then_kueue_patch_give_the_pod_template_in_order():
    sdk = patch(SDK, pod_patch(
        labels={"team": "nlp"}, serviceAccountName="trainer", terminationGracePeriodSeconds=60,
        nodeSelector={"zone": "a"}, tolerations=[{"key": "spot", "operator": "Exists", "effect": "NoSchedule"}],
        volumes=[{"name": "data", "persistentVolumeClaim": {"claimName": "datasets"}}],
        containers=[{"name": "node", "volumeMounts": [{"name": "data", "mountPath": "/data"}],
                     "securityContext": {"runAsNonRoot": True}},
                    {"name": "sidecar", "env": [{"name": "MODE", "value": "b"}, {"name": "EXTRA", "value": "1"}]}],
        securityContext={"runAsUser": 2000}, imagePullSecrets=[{"name": "registry"}],
        affinity={"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
            {"matchExpressions": [{"key": "gpu", "operator": "In", "values": ["a100"]}]}]}}}),
        metadata={"labels": {"cost-center": "42"}})
    kueue = patch(KUEUE, pod_patch(
        nodeSelector={"zone": "b", "flavor": "on-demand"}, schedulingGates=[{"name": "kueue.x-k8s.io/topology"}],
        tolerations=[{"key": "flavor", "operator": "Equal", "value": "on-demand", "effect": "NoSchedule"}]))
    job = resolve(trainjob(runtimePatches=[sdk, kueue]), runtime_with_initializer())

    pod = job.pod_template["spec"]
    assert job.pod_template["metadata"]["labels"]["team"] == "nlp"
    assert (pod["serviceAccountName"], pod["terminationGracePeriodSeconds"]) == ("trainer", 60)
    assert pod["nodeSelector"] == {"pool": "gpu", "zone": "b", "flavor": "on-demand"}, "merged by key, Kueue's last"
    assert pod["tolerations"] == [{"key": "flavor", "operator": "Equal", "value": "on-demand", "effect": "NoSchedule"}], \
        "tolerations are replaced as a whole, by the last patch that sets them"
    assert pod["schedulingGates"] == [{"name": "kueue.x-k8s.io/topology"}]
    assert [v["name"] for v in pod["volumes"]] == ["initializer", "data"]
    assert pod["imagePullSecrets"] == [{"name": "registry"}]
    assert pod["securityContext"] == {"runAsUser": 2000, "fsGroup": 1000}, "merged field by field"
    assert pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"][0][
        "matchExpressions"][0]["values"] == ["a100"]
    node, sidecar = pod["containers"]
    assert node["volumeMounts"] == [{"name": "initializer", "mountPath": "/workspace"},
                                    {"name": "data", "mountPath": "/data"}]
    assert node["securityContext"] == {"runAsNonRoot": True}
    assert sidecar["env"] == [{"name": "MODE", "value": "b"}, {"name": "EXTRA", "value": "1"}]
    assert job.job_metadata == {"labels": {"cost-center": "42",
                                           "trainer.kubeflow.org/trainjob-ancestor-step": "trainer"}}

    # The child Job carries the Job labels the runtime and its patches give, beside gangctl's own.
    child = node_job(job, owner_reference(trainjob()), Coscheduling(), "scheduler")
    assert child["metadata"]["labels"]["cost-center"] == "42"
    assert child["metadata"]["labels"]["trainer.kubeflow.org/trainjob-name"] == job.name
    # What the user's pods finally carry: the builder keeps the patch's tolerations and adds node-loss ones.
    built = child["spec"]["template"]["spec"]
    assert {t["key"] for t in built["tolerations"]} == {"flavor", "node.kubernetes.io/not-ready",
                                                        "node.kubernetes.io/unreachable"}
    assert built["serviceAccountName"] == "trainer" and built["schedulingGates"] == pod["schedulingGates"]


def test_the_trainjobs_labels_and_annotations_go_on_the_child_job_over_the_runtimes():
    runtime = runtime_with_initializer()
    runtime["spec"]["template"]["metadata"] = {"labels": {"cost-center": "1", "tier": "gold"}}
    job = resolve(trainjob(labels={"cost-center": "42"}, annotations={"owner": "nlp"}), runtime)
    meta = node_job(job, owner_reference(trainjob()), Coscheduling(), "scheduler")["metadata"]
    assert meta["labels"]["cost-center"] == "42" and meta["labels"]["tier"] == "gold"
    assert meta["annotations"]["owner"] == "nlp"


def test_env_injection_gives_the_named_containers_of_the_node_job_the_pet_variables():
    def env_of(runtime: dict) -> dict[str, set[str]]:
        pod = node_job(resolve(trainjob(), runtime), owner_reference(trainjob()), Coscheduling(), "s")["spec"]["template"]["spec"]
        return {c["name"]: {e["name"] for e in c.get("env") or []} for c in pod["containers"]}
    plain = env_of(runtime_with_initializer())
    assert "PET_NNODES" in plain["node"] and "PET_NNODES" not in plain["sidecar"]
    runtime = runtime_with_initializer()
    runtime["spec"].setdefault("mlPolicy", {}).setdefault("torch", {})["envInjection"] = {"targets": [
        {"jobName": "node", "containerNames": ["sidecar"]},
        {"jobName": "dataset-initializer", "containerNames": ["node-helper"]}]}
    injected = env_of(runtime)
    assert {"PET_NNODES", "PET_NODE_RANK", "PET_MASTER_ADDR"} <= injected["sidecar"] and "MODE" in injected["sidecar"]


def test_no_patch_leaves_the_runtime_template_as_it_was():
    runtime = runtime_with_initializer()
    job = resolve(trainjob(runtimePatches=[{"manager": SDK}]), runtime)
    node_pod = runtime["spec"]["template"]["spec"]["replicatedJobs"][1]["template"]["spec"]["template"]["spec"]
    assert job.pod_template["spec"]["tolerations"] == node_pod["tolerations"]
    assert job.pod_template["spec"]["nodeSelector"] == {"pool": "gpu"}
    assert "serviceAccountName" not in job.pod_template["spec"]


def test_pod_template_overrides_still_apply_and_runtime_patches_go_after_them():
    override = {"targetJobs": [{"name": "node"}], "metadata": {"labels": {"v": "2.1"}},
                "spec": {"serviceAccountName": "from-override", "nodeSelector": {"zone": "o"}}}
    job = resolve(trainjob(podTemplateOverrides=[override]), RUNTIME)
    assert job.pod_template["spec"]["serviceAccountName"] == "from-override"
    assert job.pod_template["metadata"]["labels"]["v"] == "2.1"
    both = resolve(trainjob(podTemplateOverrides=[override],
                            runtimePatches=[patch(SDK, pod_patch(serviceAccountName="from-patch"))]), RUNTIME)
    assert both.pod_template["spec"]["serviceAccountName"] == "from-patch"
    assert both.pod_template["spec"]["nodeSelector"] == {"zone": "o"}


def test_a_patch_of_an_initializer_job_and_the_initializer_settings_land_in_its_step():
    init_patch = {"name": "dataset-initializer", "template": {"spec": {"template": {"spec": {
        "nodeSelector": {"disk": "ssd"}}}}}}
    tj = trainjob(initializer={"dataset": {"storageUri": "s3://bucket/set", "env": [{"name": "SPLIT", "value": "train"}],
                                           "secretRef": {"name": "s3-creds"}}},
                  runtimePatches=[patch(SDK, init_patch)], activeDeadlineSeconds=600)
    job = resolve(tj, runtime_with_initializer())
    (step,) = job.steps
    assert step.name == "dataset-initializer" and step.replicas == 1
    container = step.pod_template["spec"]["containers"][0]
    assert container["env"] == [{"name": "STORAGE_URI", "value": "s3://bucket/set"}, {"name": "SPLIT", "value": "train"}]
    assert container["envFrom"] == [{"secretRef": {"name": "s3-creds"}}]
    assert step.pod_template["spec"]["nodeSelector"] == {"disk": "ssd"}
    assert step.job_metadata["labels"]["trainer.kubeflow.org/trainjob-ancestor-step"] == "dataset-initializer"
    assert "disk" not in (job.pod_template["spec"].get("nodeSelector") or {}), "the node job is not touched"
    assert job.initializer == tj["spec"]["initializer"] and job.active_deadline_seconds == 600
    plain = resolve(trainjob(), runtime_with_initializer())
    assert plain.initializer is None and plain.active_deadline_seconds is None
    assert plain.steps[0].pod_template["spec"]["containers"][0]["env"] == [{"name": "STORAGE_URI", "value": "hf://default"}]


@pytest.mark.parametrize(("spec", "message"), [
    ({"runtimePatches": [patch(SDK, {"name": "launcher"})]},
     r"spec\.runtimePatches\[0\]\.trainingRuntimeSpec\.template\.spec\.replicatedJobs\[0\]\.name: the runtime "
     r"'torch-distributed' has no replicated job 'launcher' \(it has: dataset-initializer, node\)"),
    ({"runtimePatches": [patch(SDK), patch(KUEUE, pod_patch(containers=[{"name": "trainer"}]))]},
     r"spec\.runtimePatches\[1\]\.trainingRuntimeSpec\.template\.spec\.replicatedJobs\[0\]\.template\.spec\.template"
     r"\.spec\.containers\[0\]\.name: the runtime's 'node' job has no container 'trainer' \(it has: node, sidecar\)"),
    ({"runtimePatches": [patch(SDK, pod_patch(initContainers=[{"name": "node"}]))]},
     r"\.initContainers\[0\]\.name: the runtime's 'node' job has no init container 'node' \(it has: none\)"),
    ({"runtimePatches": [patch(SDK, pod_patch(containers=[{"name": "node", "volumeMounts": [
        {"name": "cache", "mountPath": "/cache"}]}]))]},
     r"\.containers\[0\]\.volumeMounts\[0\]\.name: the 'node' pods have no volume 'cache' \(volumes: initializer\)"),
    ({"initializer": {"model": {"storageUri": "hf://org/model"}}},
     r"spec\.initializer\.model: the runtime 'torch-distributed' has no 'model-initializer' replicated job"),
])
def test_a_patch_or_initializer_the_runtime_cannot_take_fails_the_trainjob_naming_the_field(spec, message):
    with pytest.raises(ResolveError, match=message) as err:
        resolve(trainjob(**spec), runtime_with_initializer())
    assert err.value.reason == "InvalidSpec"


def test_an_initializer_job_without_the_shared_volume_mount_is_refused():
    runtime = runtime_with_initializer()
    del runtime["spec"]["template"]["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"][
        "containers"][0]["volumeMounts"]
    with pytest.raises(ResolveError, match=r"spec\.initializer\.dataset: .* needs a container named "
                                           r"'dataset-initializer' mounting the volume 'initializer'"):
        resolve(trainjob(initializer={"dataset": {"storageUri": "s3://b/k"}}), runtime)


@pytest.mark.parametrize(("patches", "message"), [
    ([patch(SDK), patch(SDK)], r"spec\.runtimePatches: entries 0 and 1 have the same manager"),
    ([patch("my-controller")], r"spec\.runtimePatches\[0\]\.manager: .*domain-prefixed path"),
    ([patch(SDK, pod_patch(containers=[{"name": "node", "env": [{"name": "A", "value": "1"}]}]))],
     r"containers\[0\]: runtimePatches: containers named node, dataset-initializer or model-initializer take env"),
])
def test_patches_trainer_refuses_are_refused_before_resolve(patches, message):
    obj = objects.trainjob(runtimePatches=patches)
    with pytest.raises(ValueError, match=message):
        parse_trainjob(obj)


@pytest.mark.parametrize("framework", ["mpi", "jax", "xgboost", "flux"])
def test_a_runtime_of_another_framework_fails_naming_it(framework):
    runtime = objects.runtime()
    del runtime["spec"]["mlPolicy"]["torch"]
    runtime["spec"]["mlPolicy"][framework] = {}
    with pytest.raises(ResolveError, match=rf"runtime spec\.mlPolicy\.{framework}: gangctl runs PyTorch") as err:
        resolve(trainjob(), runtime)
    assert err.value.reason == "InvalidRuntime"


def test_resources_per_node_merge_into_the_runtime_resources_by_name():
    runtime = objects.runtime()
    container = runtime["spec"]["template"]["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"][
        "containers"][0]
    container["resources"] = {"requests": {"cpu": "1", "memory": "8Gi"}, "limits": {"memory": "8Gi"}}
    job = resolve(trainjob(trainer={"numNodes": 2, "resourcesPerNode": {"requests": {"cpu": "4"},
                                                                       "limits": {"nvidia.com/gpu": 2}}}), runtime)
    assert job.pod_template["spec"]["containers"][0]["resources"] == {
        "requests": {"cpu": "4", "memory": "8Gi"}, "limits": {"memory": "8Gi", "nvidia.com/gpu": 2}}
    assert {k: str(v) for k, v in job.requests.items()} == {"cpu": "4", "memory": str(8 * 2**30), "nvidia.com/gpu": "2"}
