"""The CRD models (gangctl.api), the generated CRDs and the shipped torch-distributed runtime."""

import copy
import re
from pathlib import Path

import pytest
import yaml

from gangctl.api import crds
from gangctl.api.quantity import QUANTITY_PATTERN
from gangctl.api.runtime import (
    ANCESTOR_LABEL,
    FRAMEWORK_LABEL,
    NODE_JOB,
    RESOURCE_QUANTITY_PATTERN,
    ClusterTrainingRuntime,
    TrainingRuntime,
    parse_runtime,
)
from gangctl.api.trainjob import (
    DNS1035_LABEL,
    MAX_NAME_LENGTH,
    ConditionType,
    TrainJob,
    parse_trainjob,
)

ROOT = Path(__file__).resolve().parents[2]
RUNTIME_FILE = ROOT / "deploy" / "runtimes" / "torch-distributed.yaml"
CRD_DIR = ROOT / "deploy" / "crds"


def stored_trainjob() -> dict:
    """A TrainJob as the API server returns it (defaults applied, status written by gangctl)."""
    return {
        "apiVersion": "trainer.kubeflow.org/v1alpha1",
        "kind": "TrainJob",
        "metadata": {
            "name": "mnist-ddp",
            "namespace": "team-a",
            "uid": "0b7c6a1e-1111-2222-3333-444455556666",
            "generation": 2,
            "resourceVersion": "1234",
            "creationTimestamp": "2025-06-01T10:00:00Z",
            "labels": {"team": "a"},
            "managedFields": [{"manager": "kubectl", "operation": "Update"}],
        },
        "spec": {
            "runtimeRef": {"name": "torch-distributed", "apiGroup": "trainer.kubeflow.org", "kind": "ClusterTrainingRuntime"},
            "initializer": {"dataset": {"storageUri": "hf://tatsu-lab/alpaca", "env": [{"name": "X", "value": "1"}]}},
            "trainer": {
                "image": "pytorch/pytorch:2.7.1-cuda12.8-cudnn9-runtime",
                "command": ["torchrun", "/workspace/train.py"],
                "args": ["--epochs", "3"],
                "env": [
                    {"name": "NCCL_DEBUG", "value": "INFO"},
                    {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
                ],
                "numNodes": 4,
                "resourcesPerNode": {
                    "requests": {"cpu": "500m", "memory": "4Gi", "nvidia.com/gpu": 1},
                    "limits": {"nvidia.com/gpu": 1},
                },
                "numProcPerNode": "auto",
            },
            "labels": {"owner": "alice"},
            "annotations": {"note": "x"},
            "podTemplateOverrides": [{"targetJobs": [{"name": "node"}], "spec": {"nodeSelector": {"gpu": "a100"}}}],
            "runtimePatches": [{"manager": "kueue.x-k8s.io/manager", "trainingRuntimeSpec": {"template": {}}}],
            "suspend": False,
            "managedBy": "trainer.kubeflow.org/trainjob-controller",
            "activeDeadlineSeconds": 3600,
        },
        "status": {
            "conditions": [
                {
                    "type": "Suspended",
                    "status": "False",
                    "reason": "Resumed",
                    "message": "TrainJob is resumed",
                    "lastTransitionTime": "2025-06-01T10:00:01Z",
                    "observedGeneration": 2,
                },
            ],
            "jobsStatus": [{"name": "node", "ready": 1, "succeeded": 0, "failed": 0, "active": 1, "suspended": 0}],
            "trainerStatus": {"progressPercentage": 40, "lastUpdatedTime": "2025-06-01T10:05:00Z"},
            "restartCount": 1,
            "gang": {"state": "Running", "reason": "GangScheduled", "message": "all 4 pods of the gang are bound",
                     "lastTransitionTime": "2025-06-01T10:00:30Z", "waitSeconds": 29.5,
                     "boundAt": "2025-06-01T10:00:30Z", "createdAt": "2025-06-01T10:00:01Z"},
        },
    }


# --- TrainJob --------------------------------------------------------------------------------


def test_stored_trainjob_round_trips():
    obj = stored_trainjob()
    job = parse_trainjob(obj)
    assert job.to_dict() == obj
    assert job.spec.trainer.num_nodes == 4 == job.num_nodes
    assert job.spec.trainer.num_proc_per_node == "auto"
    assert job.spec.runtime_ref.name == "torch-distributed" and not job.spec.runtime_ref.namespaced
    assert job.spec.trainer.env[1].value_from == {"fieldRef": {"fieldPath": "status.podIP"}}
    assert job.spec.trainer.resources_per_node.effective_requests().to_dict() == {
        "nvidia.com/gpu": "1",
        "cpu": "500m",
        "memory": str(4 * 2**30),
    }
    assert job.status.gang.state == "Running" and not job.status.is_true(ConditionType.SUSPENDED)
    assert not job.status.finished
    assert job.status.gang.wait_seconds == 29.5


def test_minimal_trainjob_gets_api_defaults():
    job = TrainJob.model_validate({"metadata": {"name": "a"}, "spec": {"runtimeRef": {"name": "torch-distributed"}}})
    assert job.to_dict() == {
        "apiVersion": "trainer.kubeflow.org/v1alpha1",
        "kind": "TrainJob",
        "metadata": {"name": "a"},
        "spec": {
            "runtimeRef": {"name": "torch-distributed", "apiGroup": "trainer.kubeflow.org", "kind": "ClusterTrainingRuntime"}
        },
    }
    assert job.num_nodes is None and job.status is None


def test_snake_case_construction_dumps_camel_case():
    job = TrainJob(metadata={"name": "b"}, spec={"runtime_ref": {"name": "r", "kind": "TrainingRuntime"}, "suspend": True})
    assert job.to_dict()["spec"] == {
        "runtimeRef": {"name": "r", "apiGroup": "trainer.kubeflow.org", "kind": "TrainingRuntime"},
        "suspend": True,
    }
    assert job.spec.runtime_ref.namespaced


def test_unknown_fields_are_tolerated():
    obj = stored_trainjob()
    obj["spec"]["someFutureField"] = {"a": 1}
    obj["spec"]["trainer"]["someFutureField"] = 1
    obj["spec"]["trainer"]["env"][0]["futureEnvField"] = "x"
    obj["status"]["futureStatus"] = 3
    dumped = parse_trainjob(obj).to_dict()
    assert "someFutureField" not in dumped["spec"]  # closed parts: ignored (the API server prunes them too)
    assert "someFutureField" not in dumped["spec"]["trainer"]
    assert dumped["spec"]["trainer"]["env"][0]["futureEnvField"] == "x"  # pass-through parts: kept


# The exact dict shape the kubeflow SDK 0.5 posts (TrainerClient().train(...) in
# kubeflow/trainer/backends/kubernetes/backend.py), built with the SDK's own code.
def sdk_train_func(lr: float = 0.1):
    print("training", lr)


def sdk_posted_trainjob() -> dict:
    import kubeflow.trainer.backends.kubernetes.utils as utils  # the SDK is a dev dependency: no skip
    import kubeflow_trainer_api.models as models
    from kubeflow.trainer.constants import constants
    from kubeflow.trainer.types import types

    runtime = sdk_runtime(yaml.safe_load(RUNTIME_FILE.read_text()))
    trainer = types.CustomTrainer(
        func=sdk_train_func,
        func_args={"lr": 0.01},
        num_nodes=2,
        resources_per_node={"cpu": 2, "memory": "8Gi", "gpu": 1},
        env={"NCCL_DEBUG": "INFO"},
    )
    spec = models.TrainerV1alpha1TrainJobSpec(
        runtimeRef=models.TrainerV1alpha1RuntimeRef(name=runtime.name, kind=runtime.kind.value),
        trainer=utils.get_trainer_cr_from_custom_trainer(runtime, trainer),
        activeDeadlineSeconds=7200,
    )
    job = models.TrainerV1alpha1TrainJob(
        apiVersion=constants.API_VERSION,
        kind=constants.TRAINJOB_KIND,
        metadata=models.IoK8sApimachineryPkgApisMetaV1ObjectMeta(name="x1b2c3d4e5f6", labels={"team": "a"}),
        spec=spec,
    )
    return job.to_dict()


def sdk_runtime(obj: dict):
    """What the SDK makes of a runtime object (KubernetesBackend.__get_runtime_from_cr)."""
    import kubeflow.trainer.backends.kubernetes.utils as utils  # the SDK is a dev dependency: no skip
    import kubeflow_trainer_api.models as models
    from kubeflow.trainer.types import types

    cr = models.TrainerV1alpha1ClusterTrainingRuntime.from_dict(obj)
    assert cr.metadata.name and cr.spec.ml_policy and cr.spec.template.spec.replicated_jobs
    trainer = utils.get_runtime_trainer(
        cr.metadata.labels[FRAMEWORK_LABEL], cr.spec.template.spec.replicated_jobs, cr.spec.ml_policy
    )
    return types.Runtime(name=cr.metadata.name, kind=types.RuntimeKind(cr.kind), trainer=trainer)


def test_sdk_posted_trainjob_parses_and_round_trips():
    posted = sdk_posted_trainjob()
    job = parse_trainjob(posted)
    trainer = job.spec.trainer
    assert trainer.num_nodes == 2
    assert trainer.command[:2] == ["bash", "-c"] and "torchrun" in trainer.command[2]
    assert [e.name for e in trainer.env] == ["NCCL_DEBUG"]
    assert trainer.resources_per_node.effective_requests().to_dict() == {
        "cpu": "2",
        "memory": str(8 * 2**30),
        "nvidia.com/gpu": "1",
    }
    # The SDK sends integer quantities as floats ({"cpu": 2.0}); the API server stores integers,
    # and fills in runtimeRef.apiGroup. Otherwise the object is unchanged.
    expected = copy.deepcopy(posted)
    for part in ("limits", "requests"):
        res = expected["spec"]["trainer"]["resourcesPerNode"][part]
        expected["spec"]["trainer"]["resourcesPerNode"][part] = {
            k: int(v) if isinstance(v, float) else v for k, v in res.items()
        }
    expected["spec"]["runtimeRef"]["apiGroup"] = "trainer.kubeflow.org"
    assert job.to_dict() == expected


@pytest.mark.parametrize(
    ("mutate", "expected"),
    [
        (lambda o: o["spec"]["trainer"].update(numNodes=0), "spec.trainer.numNodes: must be ≥ 1"),
        (lambda o: o["spec"]["runtimeRef"].update(kind="Foo"), "spec.runtimeRef.kind: must be one of"),
        (lambda o: o["spec"].pop("runtimeRef"), "spec.runtimeRef: required"),
        (lambda o: o["spec"]["runtimeRef"].update(name=""), "spec.runtimeRef.name: must not be empty"),
        (
            lambda o: o["spec"]["trainer"]["resourcesPerNode"]["requests"].update(cpu="two"),
            "spec.trainer.resourcesPerNode.requests.cpu: invalid quantity 'two'",
        ),
        (
            lambda o: o["spec"]["trainer"]["resourcesPerNode"]["limits"].update(cpu=0.5),
            "spec.trainer.resourcesPerNode.limits.cpu: must be an integer or a quantity string",
        ),
        (
            lambda o: o["spec"]["trainer"].update(numProcPerNode="many"),
            "spec.trainer.numProcPerNode: numProcPerNode must be an integer >= 1 or one of auto, cpu, gpu",
        ),
        (
            lambda o: o["spec"]["trainer"].update(numProcPerNode=0),
            "spec.trainer.numProcPerNode: numProcPerNode must be an integer >= 1",
        ),
        (lambda o: o["spec"]["trainer"]["env"][1].pop("name"), "spec.trainer.env[1].name: required"),
        (lambda o: o["spec"]["trainer"].update(numNodes="four"), "spec.trainer.numNodes: must be an integer"),
        (lambda o: o["spec"].update(activeDeadlineSeconds=0), "spec.activeDeadlineSeconds: must be ≥ 1"),
        (lambda o: o["status"]["conditions"][0].update(status="Yes"), "status.conditions[0].status: must be one of"),
        (lambda o: o["metadata"].update(name="a" * 64), "metadata.name must be a DNS-1035 label"),
        (lambda o: o["metadata"].update(name="1abc"), "at most 50 characters"),
        (lambda o: o["metadata"].update(name="Abc"), "'<trainjob>-node-0-<index>'"),
        (lambda o: o.pop("spec"), "spec: required"),
    ],
)
def test_parse_trainjob_errors_name_the_field(mutate, expected):
    obj = stored_trainjob()
    mutate(obj)
    with pytest.raises(ValueError) as err:
        parse_trainjob(obj)
    assert expected in str(err.value)


def test_parse_trainjob_reports_every_problem():
    obj = stored_trainjob()
    obj["spec"]["trainer"]["numNodes"] = 0
    obj["spec"]["runtimeRef"]["kind"] = "Foo"
    message = str(pytest.raises(ValueError, parse_trainjob, obj).value)
    assert "spec.trainer.numNodes" in message and "spec.runtimeRef.kind" in message


def test_name_limit_keeps_pod_hostnames_within_63():
    name = "a" * MAX_NAME_LENGTH
    assert len(f"{name}-node-0-99999") == 63
    parse_trainjob({**stored_trainjob(), "metadata": {"name": name}})
    assert re.fullmatch(DNS1035_LABEL, "mnist-ddp-2") and not re.fullmatch(DNS1035_LABEL, "mnist-")


# --- runtimes ----------------------------------------------------------------------------------


def test_shipped_runtime_parses_and_round_trips():
    obj = yaml.safe_load(RUNTIME_FILE.read_text())
    runtime = parse_runtime(obj)
    assert isinstance(runtime, ClusterTrainingRuntime)
    assert runtime.to_dict() == obj
    assert runtime.framework == "torch"
    assert runtime.spec.num_nodes == 1
    assert runtime.spec.ml_policy.torch.num_proc_per_node == "auto"
    assert runtime.spec.pod_group_policy.backend == "coscheduling"
    assert runtime.spec.pod_group_policy.coscheduling.schedule_timeout_seconds == 120
    node = runtime.spec.node_job
    assert node.name == NODE_JOB and node.replicas == 1
    assert node.labels[ANCESTOR_LABEL] == "trainer"
    assert node.pod_spec["restartPolicy"] == "Never"
    container = node.container(NODE_JOB)
    assert container["image"] == "pytorch/pytorch:2.7.1-cuda12.8-cudnn9-runtime"
    assert container["command"] == ["torchrun", "/workspace/train.py"]


def test_shipped_runtime_is_listed_by_the_kubeflow_sdk():
    runtime = sdk_runtime(yaml.safe_load(RUNTIME_FILE.read_text()))
    assert runtime.name == "torch-distributed"
    assert runtime.trainer.framework == "torch"
    assert runtime.trainer.image == "pytorch/pytorch:2.7.1-cuda12.8-cudnn9-runtime"
    assert runtime.trainer.num_nodes == 1
    assert runtime.trainer.command[0] == "bash"  # the SDK's torch entrypoint: it runs torchrun itself


def test_namespaced_runtime_and_pass_through_jobset_fields():
    obj = yaml.safe_load(RUNTIME_FILE.read_text())
    obj["kind"] = "TrainingRuntime"
    obj["metadata"]["namespace"] = "team-a"
    obj["spec"]["template"]["spec"]["failurePolicy"] = {"maxRestarts": 3}
    obj["spec"]["template"]["spec"]["successPolicy"] = {"operator": "All", "targetReplicatedJobs": ["node"]}
    obj["spec"]["mlPolicy"]["torch"]["elasticPolicy"] = {"minNodes": 2, "maxNodes": 4, "maxRestarts": 5}
    obj["spec"]["mlPolicy"]["torch"]["envInjection"] = {"targets": [{"jobName": "node", "containerNames": ["sidecar"]}]}
    runtime = parse_runtime(obj)
    assert type(runtime) is TrainingRuntime
    assert runtime.to_dict() == obj
    assert runtime.spec.ml_policy.torch.elastic_policy.min_nodes == 2


@pytest.mark.parametrize(
    ("mutate", "expected"),
    [
        (
            lambda s: s["podGroupPolicy"].update(volcano={"queue": "q"}),
            "spec.podGroupPolicy: set exactly one of coscheduling, volcano, kueue, native, kai",
        ),
        (lambda s: s.update(podGroupPolicy={}), "spec.podGroupPolicy: set exactly one of coscheduling, volcano, kueue, native, kai"),
        (
            lambda s: s["mlPolicy"]["torch"].update(elasticPolicy={"minNodes": 4, "maxNodes": 2}),
            "spec.mlPolicy.torch.elasticPolicy: minNodes must be less than or equal to maxNodes",
        ),
        (lambda s: s["mlPolicy"].update(numNodes=0), "spec.mlPolicy.numNodes: must be ≥ 1"),
        (
            lambda s: s["podGroupPolicy"]["coscheduling"].update(scheduleTimeoutSeconds=-1),
            "spec.podGroupPolicy.coscheduling.scheduleTimeoutSeconds: must be ≥ 0",
        ),
        (lambda s: s.pop("template"), "spec.template: required"),
        (
            lambda s: s["template"]["spec"]["replicatedJobs"][0].pop("name"),
            "spec.template.spec.replicatedJobs[0].name: required",
        ),
    ],
)
def test_parse_runtime_errors_name_the_field(mutate, expected):
    obj = yaml.safe_load(RUNTIME_FILE.read_text())
    mutate(obj["spec"])
    with pytest.raises(ValueError) as err:
        parse_runtime(obj)
    assert expected in str(err.value)


# --- generated CRDs ------------------------------------------------------------------------------


def test_committed_crds_are_up_to_date():
    assert crds.main(["--check", "--out", str(CRD_DIR)]) == 0


def test_check_fails_on_stale_files(tmp_path, capsys):
    assert crds.main(["--out", str(tmp_path)]) == 0
    path = tmp_path / "trainer.kubeflow.org_trainjobs.yaml"
    path.write_text(path.read_text().replace("minimum: 1", "minimum: 0", 1))
    assert crds.main(["--check", "--out", str(tmp_path)]) == 1
    assert "python -m gangctl.api.crds" in capsys.readouterr().err


def walk(node: dict, path: str = ""):
    """Yield (path, node) for every schema node."""
    yield path, node
    for name, sub in (node.get("properties") or {}).items():
        yield from walk(sub, f"{path}.{name}")
    if isinstance(node.get("additionalProperties"), dict):
        yield from walk(node["additionalProperties"], f"{path}.*")
    if "items" in node:
        yield from walk(node["items"], f"{path}[]")


def crd_schemas():
    # gangctl's own (PyTorchJob's is Training Operator's, checked in tests/unit/test_pytorchjob.py)
    for name in sorted(crds.build_crds()):
        crd = yaml.safe_load((CRD_DIR / name).read_text())
        yield name, crd, crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]


def test_generated_schemas_are_structural():
    names = []
    for name, crd, schema in crd_schemas():
        names.append(name)
        assert crd["apiVersion"] == "apiextensions.k8s.io/v1"
        for path, node in walk(schema):
            where = f"{name}: {path or '<root>'}"
            assert "$ref" not in node and "title" not in node, where
            assert node.get("additionalProperties") is not True, where
            assert not isinstance(node.get("exclusiveMinimum"), (int, float)) or isinstance(
                node.get("exclusiveMinimum"), bool
            ), where
            if node.get("x-kubernetes-int-or-string"):
                assert "type" not in node, where
                assert node["anyOf"] == [{"type": "integer"}, {"type": "string"}], where
            else:
                assert "type" in node, where
                assert "anyOf" not in node and "oneOf" not in node and "allOf" not in node, where
            if node.get("type") == "object" and path != ".metadata":  # root metadata: the API server's own
                assert "properties" in node or "additionalProperties" in node or node.get(
                    "x-kubernetes-preserve-unknown-fields"
                ), where
            if node.get("x-kubernetes-list-type") == "map":
                assert set(node["x-kubernetes-list-map-keys"]) <= set(node["items"].get("required", [])), where
    assert names == [
        "trainer.kubeflow.org_clustertrainingruntimes.yaml",
        "trainer.kubeflow.org_trainingruntimes.yaml",
        "trainer.kubeflow.org_trainjobs.yaml",
    ]


def rules(node: dict) -> dict[str, str]:
    return {r["message"]: r["rule"] for r in node.get("x-kubernetes-validations", [])}


def test_trainjob_crd_validations():
    crd = yaml.safe_load((CRD_DIR / "trainer.kubeflow.org_trainjobs.yaml").read_text())
    assert crd["spec"]["scope"] == "Namespaced"
    version = crd["spec"]["versions"][0]
    assert version["subresources"] == {"status": {}}
    assert [c["name"] for c in version["additionalPrinterColumns"]] == ["State", "Reason", "Progress %", "Runtime", "Nodes", "Age"]
    assert version["additionalPrinterColumns"][0]["jsonPath"] == ".status.gang.state"
    root = version["schema"]["openAPIV3Schema"]
    (name_rule,) = rules(root).values()
    assert "self.metadata.name.size() <= 50" in name_rule
    assert "at most 50 characters" in next(iter(rules(root)))
    spec = root["properties"]["spec"]
    assert spec["required"] == ["runtimeRef"]
    assert spec["properties"]["runtimeRef"]["properties"]["kind"]["enum"] == ["TrainingRuntime", "ClusterTrainingRuntime"]
    trainer = spec["properties"]["trainer"]["properties"]
    assert trainer["numNodes"] == {"type": "integer", "minimum": 1, "maximum": 100000}  # an Indexed Job's limit
    for part in ("limits", "requests"):
        quantity = trainer["resourcesPerNode"]["properties"][part]["additionalProperties"]
        assert quantity["pattern"] == RESOURCE_QUANTITY_PATTERN == QUANTITY_PATTERN.replace(r"^(\+|-)?", r"^\+?")
        assert quantity["minimum"] == 0  # the integer form; the pattern has no sign for the string form
    assert trainer["numProcPerNode"]["x-kubernetes-int-or-string"] is True
    assert rules(spec["properties"]["managedBy"]) == {"spec.managedBy is immutable": "self == oldSelf"}
    assert "spec.managedBy is immutable" in rules(spec)
    status = root["properties"]["status"]["properties"]
    assert {"conditions", "jobsStatus", "restartCount", "gang"} <= set(status)


def test_runtime_crd_validations():
    for kind, scope in (("trainingruntimes", "Namespaced"), ("clustertrainingruntimes", "Cluster")):
        crd = yaml.safe_load((CRD_DIR / f"trainer.kubeflow.org_{kind}.yaml").read_text())
        assert crd["spec"]["scope"] == scope
        spec = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
        pgp = spec["properties"]["podGroupPolicy"]
        assert "podGroupPolicy: set exactly one of coscheduling, volcano, kueue, native, kai" in rules(pgp)
        torch = spec["properties"]["mlPolicy"]["properties"]["torch"]
        elastic = torch["properties"]["elasticPolicy"]
        assert "elasticPolicy: minNodes must be less than or equal to maxNodes" in rules(elastic)
        replicated = spec["properties"]["template"]["properties"]["spec"]["properties"]["replicatedJobs"]
        assert replicated["items"]["properties"]["template"] == {
            "type": "object",
            "x-kubernetes-preserve-unknown-fields": True,
        }


@pytest.mark.parametrize(("change", "named"), [
    ({"runtimeRef": {"name": "x", "apiGroup": "example.com"}}, "spec.runtimeRef.apiGroup"),
    ({"trainer": {"image": ""}}, "spec.trainer.image: must not be empty"),
    ({"trainer": {"resourcesPerNode": {"limits": {"cpu": "-1"}}}}, "limits.cpu: must be greater than or equal to 0"),
    ({"trainer": {"resourcesPerNode": {"limits": {"nvidia.com/gpu": "1e400"}}}}, "nvidia.com/gpu: must be at most"),
    ({"managedBy": "example.com/" + "x" * 60}, "spec.managedBy: must be at most 63"),
    ({"labels": {"bad key!": "v"}}, "spec.labels: keys must be qualified names"),
    ({"labels": {"team": "bad value!"}}, "spec.labels: values must be"),
    ({"annotations": {"/x": "v"}}, "spec.annotations: keys must be qualified names"),
    ({"podTemplateOverrides": [{"spec": {}}]}, r"spec.podTemplateOverrides\[0\].targetJobs: required"),
    ({"podTemplateOverrides": [{"targetJobs": [{"name": "node"}], "spec": {"tolerations": "all"}}]},
     r"spec.podTemplateOverrides\[0\].spec.tolerations: must be a list"),
])
def test_bad_trainjob_fields_are_errors_naming_the_field(change, named):
    obj = {"metadata": {"name": "a", "namespace": "n"}, "spec": {"runtimeRef": {"name": "x"}, **change}}
    with pytest.raises(ValueError, match=named):
        parse_trainjob(obj)


@pytest.mark.parametrize(("template_spec", "named"), [
    ({"failurePolicy": {"rules": [{"name": "r", "action": "FailJobSet"}, {"name": "r", "action": "FailJobSet"}]}},
     "rule names must be unique"),
    ({"failurePolicy": {"rules": [{"action": "FailJobSet", "targetReplicatedJobs": ["launcher"]}]}},
     r"failurePolicy.rules\[\].targetReplicatedJobs must name jobs"),
    ({"successPolicy": {"targetReplicatedJobs": ["launcher"]}}, "successPolicy.targetReplicatedJobs must name jobs"),
])
def test_runtime_references_to_absent_jobs_are_errors(template_spec, named):
    obj = {"kind": "TrainingRuntime", "metadata": {"name": "r"},
           "spec": {"template": {"spec": {"replicatedJobs": [{"name": "node"}], **template_spec}}}}
    with pytest.raises(ValueError, match=named):
        parse_runtime(obj)
