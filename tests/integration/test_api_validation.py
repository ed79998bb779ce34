"""A bad-input corpus for every API gangctl serves (TrainJob, TrainingRuntime, ClusterTrainingRuntime).

Every field is pushed past its limits (overflow, negative, zero, malformed, wrong type, empty, over-long,
contradictory, absent references) and each case ends in exactly one of:
- Rejected: the real API server refuses the create (or update) with 422, naming the field path;
- Fails: the object is accepted, and only that TrainJob gets Failed=True with a reason and message
  naming the problem;
- NotCreated: accepted, and the TrainJob says Created=False with a reason (it can still start once
  what it references appears: a missing runtime, a backend not installed).
All objects are created at once, beside one canary TrainJob that must still Complete: gangctl keeps
serving the rest. Waits are on the conditions gangctl writes, never on fixed sleeps.
"""
from __future__ import annotations

import asyncio
import copy
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
import yaml

from gangctl.api.resources import CLUSTER_TRAINING_RUNTIMES, TRAINING_RUNTIMES, TRAINJOBS
from gangctl.kube.client import ApiError
from tests.integration.helpers import (condition, delete_namespace, eventually, gang_state, get_trainjob, is_true,
                                       trainjob)

pytestmark = [pytest.mark.integration, pytest.mark.asyncio(loop_scope="session")]

RUNTIME = yaml.safe_load((Path(__file__).parents[2] / "deploy/runtimes/torch-distributed.yaml").read_text())
NODE = "spec.template.spec.replicatedJobs.0.template.spec.template.spec"  # the node job's pod spec
CONTAINER = f"{NODE}.containers.0"
DELETE = object()  # as a change's value: remove the field
WAIT = 30  # seconds for a condition gangctl writes in its first passes


@dataclass(frozen=True)
class Rejected:
    """422 at create (or at the update), the message naming each of `fields`, containing each of `texts`."""
    fields: tuple[str, ...]
    texts: tuple[str, ...] = ()


@dataclass(frozen=True)
class Fails:
    """Accepted; the TrainJob gets Failed=True with this reason, the message containing each of `texts`."""
    reason: str
    texts: tuple[str, ...] = ()


@dataclass(frozen=True)
class NotCreated:
    """Accepted; the TrainJob gets Created=False with this reason, the message containing each of `texts`."""
    reason: str
    texts: tuple[str, ...] = ()


@dataclass(frozen=True)
class Case:
    """`kind` is the object created with `changes` applied: a TrainJob over the shipped runtime, a
    TrainingRuntime or ClusterTrainingRuntime (the shipped one, renamed). `runtime` (changes to the
    shipped runtime) gives the TrainJob a TrainingRuntime of its own, created first. `update` is a merge
    patch applied to the created object (the outcome is then the update's)."""
    kind: str
    changes: dict[str, Any]
    outcome: Rejected | Fails | NotCreated
    runtime: dict[str, Any] | None = None
    update: dict[str, Any] | None = None
    known_gap: str | None = None  # why this case does not end as it should yet (strict xfail)


def tj(changes: dict, outcome, **kw) -> Case:
    return Case("TrainJob", changes, outcome, **kw)


def rt(changes: dict, outcome, **kw) -> Case:
    return Case("TrainingRuntime", changes, outcome, **kw)


def crt(changes: dict, outcome, **kw) -> Case:
    return Case("ClusterTrainingRuntime", changes, outcome, **kw)


R = Rejected
TR = "spec.trainer"
ML = "spec.mlPolicy"
FP = "spec.template.spec.failurePolicy"
ELASTIC = {"spec.mlPolicy.torch.elasticPolicy": {"minNodes": 1, "maxNodes": 2}}
SDK = "trainer.kubeflow.org/kubeflow-sdk"  # the manager the kubeflow SDK writes
PATCH_POD = "spec.runtimePatches[0].trainingRuntimeSpec.template.spec.replicatedJobs[0].template.spec.template.spec"


def node_patch(**pod_spec) -> dict:
    """The SDK's runtime patch of the node job's pod spec."""
    return {"manager": SDK, "trainingRuntimeSpec": {"template": {"spec": {"replicatedJobs": [
        {"name": "node", "template": {"spec": {"template": {"spec": pod_spec}}}}]}}}}

CASES: dict[str, Case] = {
    # --- TrainJob: metadata -------------------------------------------------------------------
    "name 51 chars (pod hostnames > 63 at numNodes 100,000)": tj({"metadata.name": "a" * 51},
                                                                  R(("metadata.name",), ("at most 50",))),
    "name too long for the runtime's dataset-initializer Job": tj(
        {"metadata.name": "d" * 42},
        Fails("NameTooLong", (f"dataset-initializer Job '{'d' * 42}-dataset-initializer-0' would have 64 characters",
                              "shorten metadata.name by 1")),
        runtime={"spec.template.spec.replicatedJobs.1": {"name": "dataset-initializer", "template": {"spec": {
            "template": {"spec": {"restartPolicy": "Never", "containers": [
                {"name": "dataset-initializer", "image": "busybox"}]}}}}}}),
    "name 253 chars": tj({"metadata.name": "a" * 253}, R(("metadata.name",))),
    "name starts with digit": tj({"metadata.name": "1abc"}, R(("metadata.name",), ("DNS-1035",))),
    "name with dot": tj({"metadata.name": "a.b"}, R(("metadata.name",), ("DNS-1035",))),
    # --- TrainJob: runtimeRef -----------------------------------------------------------------
    "runtimeRef missing": tj({"spec.runtimeRef": DELETE}, R(("spec.runtimeRef",), ("Required",))),
    "runtimeRef.name empty": tj({"spec.runtimeRef.name": ""}, R(("spec.runtimeRef.name",))),
    "runtimeRef.name wrong type": tj({"spec.runtimeRef.name": 7}, R(("spec.runtimeRef.name",))),
    "runtimeRef.kind unknown": tj({"spec.runtimeRef.kind": "Foo"}, R(("spec.runtimeRef.kind",), ('"Foo"',))),
    "runtimeRef.apiGroup other": tj({"spec.runtimeRef.apiGroup": "example.com"}, R(("spec.runtimeRef.apiGroup",))),
    "runtimeRef to a missing runtime": tj({"spec.runtimeRef.name": "does-not-exist"},
                                          NotCreated("RuntimeNotFound", ("does-not-exist", "spec.runtimeRef"))),
    "runtimeRef to a missing namespaced runtime": tj(
        {"spec.runtimeRef": {"name": "torch-distributed", "kind": "TrainingRuntime"}},
        NotCreated("RuntimeNotFound", ("TrainingRuntime 'torch-distributed'",))),
    # --- TrainJob: trainer.numNodes -----------------------------------------------------------
    "numNodes 0": tj({f"{TR}.numNodes": 0}, R((f"{TR}.numNodes",), ("greater than or equal to 1",))),
    "numNodes negative": tj({f"{TR}.numNodes": -1}, R((f"{TR}.numNodes",))),
    "numNodes 2**31": tj({f"{TR}.numNodes": 2**31}, R((f"{TR}.numNodes",))),
    "numNodes 2**63": tj({f"{TR}.numNodes": 2**63}, R((f"{TR}.numNodes",))),
    "numNodes 200000 (above Indexed Job)": tj({f"{TR}.numNodes": 200_000}, R((f"{TR}.numNodes",))),
    "numNodes string": tj({f"{TR}.numNodes": "two"}, R((f"{TR}.numNodes",))),
    "numNodes fraction": tj({f"{TR}.numNodes": 1.5}, R((f"{TR}.numNodes",))),
    # --- TrainJob: trainer.numProcPerNode -----------------------------------------------------
    "numProcPerNode 0": tj({f"{TR}.numProcPerNode": 0}, R((f"{TR}.numProcPerNode",))),
    "numProcPerNode negative": tj({f"{TR}.numProcPerNode": -4}, R((f"{TR}.numProcPerNode",))),
    "numProcPerNode garbage": tj({f"{TR}.numProcPerNode": "many"}, R((f"{TR}.numProcPerNode",))),
    "numProcPerNode empty": tj({f"{TR}.numProcPerNode": ""}, R((f"{TR}.numProcPerNode",))),
    "numProcPerNode 2**63": tj({f"{TR}.numProcPerNode": 2**63}, R((f"{TR}.numProcPerNode",))),
    "numProcPerNode fraction": tj({f"{TR}.numProcPerNode": 1.5}, R((f"{TR}.numProcPerNode",))),
    "numProcPerNode bool": tj({f"{TR}.numProcPerNode": True}, R((f"{TR}.numProcPerNode",))),
    # --- TrainJob: trainer container ----------------------------------------------------------
    "image wrong type": tj({f"{TR}.image": 3}, R((f"{TR}.image",))),
    "image empty": tj({f"{TR}.image": ""}, R((f"{TR}.image",))),
    "command a string": tj({f"{TR}.command": "python train.py"}, R((f"{TR}.command",))),
    "args not strings": tj({f"{TR}.args": [1, 2]}, R((f"{TR}.args[0]",))),
    "env not a list": tj({f"{TR}.env": "LR=0.1"}, R((f"{TR}.env",))),
    "env name empty": tj({f"{TR}.env": [{"name": "", "value": "x"}]}, R((f"{TR}.env[0].name",))),
    "env name missing": tj({f"{TR}.env": [{"value": "x"}]}, R((f"{TR}.env[0].name",))),
    "env name duplicated": tj({f"{TR}.env": [{"name": "A", "value": "1"}, {"name": "A", "value": "2"}]},
                              R((f"{TR}.env[1]",), ("Duplicate",))),
    "env value not a string": tj({f"{TR}.env": [{"name": "LR", "value": 0.1}]}, R((f"{TR}.env[0].value",))),
    "env valueFrom field path unknown": tj(
        {f"{TR}.env": [{"name": "LR", "valueFrom": {"fieldRef": {"fieldPath": "spec.bogus"}}}]},
        Fails("JobRejected", ("env[0].valueFrom.fieldRef.fieldPath",))),
    "env name invalid": tj({f"{TR}.env": [{"name": "LR=0.1", "value": "x"}]},
                           Fails("JobRejected", ("env[0].name", "LR=0.1"))),
    # --- TrainJob: trainer.resourcesPerNode ---------------------------------------------------
    "cpu malformed": tj({f"{TR}.resourcesPerNode": {"requests": {"cpu": "two"}}},
                        R((f"{TR}.resourcesPerNode.requests.cpu",))),
    "memory malformed": tj({f"{TR}.resourcesPerNode": {"limits": {"memory": "4GB"}}},
                           R((f"{TR}.resourcesPerNode.limits.memory",))),
    "quantity empty": tj({f"{TR}.resourcesPerNode": {"limits": {"memory": ""}}},
                         R((f"{TR}.resourcesPerNode.limits.memory",))),
    "quantity wrong type": tj({f"{TR}.resourcesPerNode": {"limits": {"cpu": True}}},
                              R((f"{TR}.resourcesPerNode.limits.cpu",))),
    "quantity negative": tj({f"{TR}.resourcesPerNode": {"limits": {"cpu": "-1"}}},
                            R((f"{TR}.resourcesPerNode.limits.cpu",))),
    "quantity negative integer": tj({f"{TR}.resourcesPerNode": {"requests": {"cpu": -2}}},
                                    R((f"{TR}.resourcesPerNode.requests.cpu",))),
    "quantity overflow": tj({f"{TR}.resourcesPerNode": {"limits": {"nvidia.com/gpu": "1e400"}}},
                            Fails("InvalidSpec", (f"{TR}.resourcesPerNode.limits.nvidia.com/gpu", "at most"))),
    "resources not an object": tj({f"{TR}.resourcesPerNode": "8 GPUs"}, R((f"{TR}.resourcesPerNode",))),
    "requests above limits": tj({f"{TR}.resourcesPerNode": {"requests": {"cpu": "4"}, "limits": {"cpu": "2"}}},
                                Fails("JobRejected", ("resources.requests", "less than or equal to cpu limit"))),
    "fractional GPU": tj({f"{TR}.resourcesPerNode": {"limits": {"nvidia.com/gpu": "500m"}}},
                         Fails("JobRejected", ("nvidia.com/gpu",))),
    # --- TrainJob: trainer.elasticPolicy ------------------------------------------------------
    "elastic minNodes > maxNodes": tj({f"{TR}.elasticPolicy": {"minNodes": 3, "maxNodes": 2}},
                                      R((f"{TR}.elasticPolicy",), ("minNodes must be less than or equal to maxNodes",))),
    "elastic minNodes 0": tj({f"{TR}.elasticPolicy": {"minNodes": 0}}, R((f"{TR}.elasticPolicy.minNodes",))),
    "elastic maxNodes 2**31": tj({f"{TR}.elasticPolicy": {"maxNodes": 2**31}}, R((f"{TR}.elasticPolicy.maxNodes",))),
    "elastic maxRestarts negative": tj({f"{TR}.elasticPolicy": {"maxRestarts": -1}},
                                       R((f"{TR}.elasticPolicy.maxRestarts",))),
    "elastic maxRestarts 2**63": tj({f"{TR}.elasticPolicy": {"maxRestarts": 2**63}},
                                    R((f"{TR}.elasticPolicy.maxRestarts",))),
    "elastic minNodes above the runtime's maxNodes": tj(
        {f"{TR}.elasticPolicy": {"minNodes": 3}, f"{TR}.numNodes": DELETE},
        Fails("InvalidSpec", ("minNodes (3)", "maxNodes (2)")), runtime=ELASTIC),
    # --- TrainJob: other spec fields ----------------------------------------------------------
    "spec missing": tj({"spec": DELETE}, R(("spec",), ("Required",))),
    "trainer not an object": tj({TR: ["x"]}, R((TR,))),
    "suspend a string": tj({"spec.suspend": "yes"}, R(("spec.suspend",))),
    "activeDeadlineSeconds 0": tj({"spec.activeDeadlineSeconds": 0}, R(("spec.activeDeadlineSeconds",))),
    "activeDeadlineSeconds negative": tj({"spec.activeDeadlineSeconds": -5}, R(("spec.activeDeadlineSeconds",))),
    "activeDeadlineSeconds 2**63": tj({"spec.activeDeadlineSeconds": 2**63}, R(("spec.activeDeadlineSeconds",))),
    "labels values not strings": tj({"spec.labels": {"team": 1}}, R(("spec.labels.team",))),
    "labels key invalid": tj({"spec.labels": {"bad key!": "v"}}, R(("spec.labels",), ("qualified names",))),
    "labels value over 63 chars": tj({"spec.labels": {"team": "x" * 64}}, R(("spec.labels.team",), ("Too long",))),
    "annotations key invalid": tj({"spec.annotations": {"/x": "v"}}, R(("spec.annotations",), ("qualified names",))),
    "annotations not an object": tj({"spec.annotations": ["a"]}, R(("spec.annotations",))),
    "initializer not an object": tj({"spec.initializer": "s3://x"}, R(("spec.initializer",))),
    "runtimePatches not a list": tj({"spec.runtimePatches": {"a": 1}}, R(("spec.runtimePatches",))),
    "runtimePatches same manager twice": tj({"spec.runtimePatches": [{"manager": SDK}, {"manager": SDK}]},
                                            R(("spec.runtimePatches[1]",), ("Duplicate",))),
    "runtimePatch manager not a domain path": tj({"spec.runtimePatches": [{"manager": "me"}]},
                                                 R(("spec.runtimePatches[0].manager",), ("domain-prefixed",))),
    "runtimePatch env for the node container": tj(
        {"spec.runtimePatches": [node_patch(containers=[{"name": "node", "env": [{"name": "A", "value": "1"}]}])]},
        R((f"{PATCH_POD}.containers[0]",), ("take env from spec.trainer.env",))),
    "runtimePatch names a job the runtime lacks": tj(
        {"spec.runtimePatches": [{"manager": SDK, "trainingRuntimeSpec": {"template": {"spec": {
            "replicatedJobs": [{"name": "launcher"}]}}}}]},
        Fails("InvalidSpec", ("spec.runtimePatches[0].trainingRuntimeSpec.template.spec.replicatedJobs[0].name",
                              "'launcher'"))),
    "runtimePatch names a container the runtime lacks": tj(
        {"spec.runtimePatches": [node_patch(containers=[{"name": "trainer", "securityContext": {"privileged": False}}])]},
        Fails("InvalidSpec", (f"{PATCH_POD}.containers[0].name", "no container 'trainer'"))),
    "runtimePatches changed while running": tj(
        {"spec.runtimePatches": [node_patch(nodeSelector={"a": "b"})]}, R(("spec",), ("suspended",)),
        update={"spec": {"runtimePatches": [node_patch(nodeSelector={"a": "c"})]}}),
    "initializer storageUri not a URI": tj({"spec.initializer": {"dataset": {"storageUri": "bucket/path"}}},
                                           R(("spec.initializer.dataset.storageUri",), ("URI",))),
    "initializer without its job in the runtime": tj(
        {"spec.initializer": {"model": {"storageUri": "hf://org/model"}}},
        Fails("InvalidSpec", ("spec.initializer.model", "'model-initializer'"))),
    "managedBy over 63 chars": tj({"spec.managedBy": "example.com/" + "x" * 60}, R(("spec.managedBy",))),
    "managedBy changed": tj({"spec.managedBy": "example.com/other", "spec.suspend": True},
                            R(("spec.managedBy",), ("immutable",)), update={"spec": {"managedBy": "example.com/b"}}),
    "managedBy removed": tj({"spec.managedBy": "example.com/other", "spec.suspend": True},
                            R(("spec",), ("spec.managedBy is immutable",)), update={"spec": {"managedBy": None}}),
    # Trainer v2.3's CEL: runtimeRef and initializer never change (its rule and message).
    "runtimeRef changed": tj({"spec.suspend": True}, R(("spec.runtimeRef",), ("field is immutable",)),
                             update={"spec": {"runtimeRef": {"name": "another-runtime"}}}),
    "initializer changed": tj({"spec.suspend": True, "spec.initializer": {"dataset": {"storageUri": "hf://org/a"}}},
                              R(("spec.initializer",), ("field is immutable",)),
                              update={"spec": {"initializer": {"dataset": {"storageUri": "hf://org/b"}}}}),
    "runtimeRef.kind changed to unknown": tj({"spec.suspend": True}, R(("spec.runtimeRef.kind",)),
                                             update={"spec": {"runtimeRef": {"kind": "Job"}}}),
    # --- TrainJob: podTemplateOverrides -------------------------------------------------------
    "podTemplateOverrides not a list": tj({"spec.podTemplateOverrides": {"targetJobs": []}},
                                          R(("spec.podTemplateOverrides",))),
    "podTemplateOverride without targetJobs": tj({"spec.podTemplateOverrides": [{"spec": {"nodeSelector": {"a": "b"}}}]},
                                                 R(("spec.podTemplateOverrides[0].targetJobs",))),
    "podTemplateOverride targetJobs empty": tj({"spec.podTemplateOverrides": [{"targetJobs": []}]},
                                               R(("spec.podTemplateOverrides[0].targetJobs",))),
    "podTemplateOverride serviceAccountName empty": tj(
        {"spec.podTemplateOverrides": [{"targetJobs": [{"name": "node"}], "spec": {"serviceAccountName": ""}}]},
        R(("spec.podTemplateOverrides[0].spec.serviceAccountName",))),
    "podTemplateOverride targetJobs name empty": tj(
        {"spec.podTemplateOverrides": [{"targetJobs": [{"name": ""}]}]},
        R(("spec.podTemplateOverrides[0].targetJobs[0].name",))),
    "podTemplateOverride nodeSelector not an object": tj(
        {"spec.podTemplateOverrides": [{"targetJobs": [{"name": "node"}], "spec": {"nodeSelector": "gpu"}}]},
        R(("spec.podTemplateOverrides[0].spec.nodeSelector",))),
    "podTemplateOverride tolerations not a list": tj(
        {"spec.podTemplateOverrides": [{"targetJobs": [{"name": "node"}], "spec": {"tolerations": "all"}}]},
        R(("spec.podTemplateOverrides[0].spec.tolerations",))),
    "podTemplateOverride targets a job the runtime lacks": tj(
        {"spec.podTemplateOverrides": [{"targetJobs": [{"name": "launcher"}],
                                        "spec": {"nodeSelector": {"a": "b"}}}]},
        Fails("InvalidSpec", ("spec.podTemplateOverrides[0].targetJobs[0].name", "launcher"))),
    "podTemplateOverride toleration operator unknown": tj(
        {"spec.podTemplateOverrides": [{"targetJobs": [{"name": "node"}], "spec": {"tolerations": [{"operator": "Maybe"}]}}]},
        # (after the runtime's own tolerations: torch-kwok-gpu tolerates KWOK's taint)
        Fails("JobRejected", ("spec.template.spec.tolerations[", '.operator: Invalid value: "Maybe"'))),
    "podTemplateOverride serviceAccountName invalid": tj(
        {"spec.podTemplateOverrides": [{"targetJobs": [{"name": "node"}], "spec": {"serviceAccountName": "Bad_SA"}}]},
        Fails("JobRejected", ("serviceAccountName",))),
    "podTemplateOverride priorityClassName absent": tj(
        {"spec.podTemplateOverrides": [{"targetJobs": [{"name": "node"}], "spec": {"priorityClassName": "nope"}}]},
        Fails("JobRejected", ("nope", "priorityClassName"))),
    "podTemplateOverride invalid label": tj(
        {"spec.podTemplateOverrides": [{"targetJobs": [{"name": "node"}], "metadata": {"labels": {"bad key!": "v"}}}]},
        Fails("JobRejected", ("bad key!",))),
    # --- runtimes: mlPolicy -------------------------------------------------------------------
    "runtime numNodes 0": rt({f"{ML}.numNodes": 0}, R((f"{ML}.numNodes",))),
    "runtime numNodes 2**31": crt({f"{ML}.numNodes": 2**31}, R((f"{ML}.numNodes",))),
    "runtime numNodes string": rt({f"{ML}.numNodes": "1"}, R((f"{ML}.numNodes",))),
    "runtime torch and mpi": rt({f"{ML}.mpi": {"numProcPerNode": 1}}, R((ML,), ("at most one of torch, mpi",))),
    "runtime envInjection into node": rt(
        {f"{ML}.torch.envInjection": {"targets": [{"jobName": "node", "containerNames": ["node"]}]}},
        R((f"{ML}.torch.envInjection.targets[0].containerNames",), ("must not include 'node'",))),
    "runtime failurePolicy message pattern empty": rt(
        {FP: {"rules": [{"action": "FailJobSet", "onJobFailureMessagePatterns": [""]}]}},
        R((f"{FP}.rules[0].onJobFailureMessagePatterns[0]",))),
    "runtime numProcPerNode garbage": rt({f"{ML}.torch.numProcPerNode": "lots"}, R((f"{ML}.torch.numProcPerNode",))),
    "runtime numProcPerNode 0": crt({f"{ML}.torch.numProcPerNode": 0}, R((f"{ML}.torch.numProcPerNode",))),
    "runtime elastic minNodes > maxNodes": rt({f"{ML}.torch.elasticPolicy": {"minNodes": 4, "maxNodes": 2}},
                                              R((f"{ML}.torch.elasticPolicy",))),
    "runtime elastic maxNodes 0": rt({f"{ML}.torch.elasticPolicy": {"maxNodes": 0}},
                                     R((f"{ML}.torch.elasticPolicy.maxNodes",))),
    # --- runtimes: podGroupPolicy -------------------------------------------------------------
    "two gang backends": crt({"spec.podGroupPolicy": {"coscheduling": {}, "volcano": {"queue": "q"}}},
                             R(("spec.podGroupPolicy",), ("set exactly one of coscheduling, volcano, kueue, native, kai",))),
    "no gang backend": rt({"spec.podGroupPolicy": {}}, R(("spec.podGroupPolicy",), ("exactly one",))),
    "scheduleTimeoutSeconds negative": rt({"spec.podGroupPolicy.coscheduling.scheduleTimeoutSeconds": -1},
                                          R(("spec.podGroupPolicy.coscheduling.scheduleTimeoutSeconds",))),
    "scheduleTimeoutSeconds 2**31": rt({"spec.podGroupPolicy.coscheduling.scheduleTimeoutSeconds": 2**31},
                                       R(("spec.podGroupPolicy.coscheduling.scheduleTimeoutSeconds",))),
    "scheduleTimeoutSeconds 2**63": crt({"spec.podGroupPolicy.coscheduling.scheduleTimeoutSeconds": 2**63},
                                        R(("spec.podGroupPolicy.coscheduling.scheduleTimeoutSeconds",))),
    "scheduleTimeoutSeconds string": rt({"spec.podGroupPolicy.coscheduling.scheduleTimeoutSeconds": "2m"},
                                        R(("spec.podGroupPolicy.coscheduling.scheduleTimeoutSeconds",))),
    "kueue on a cluster without it": tj({}, NotCreated("BackendNotInstalled", ("kueue",)),
                                        runtime={"spec.podGroupPolicy": {"kueue": {"queueName": "q"}}}),
    "volcano on a cluster without it": tj({}, NotCreated("BackendNotInstalled", ("volcano",)),
                                          runtime={"spec.podGroupPolicy": {"volcano": {}}}),
    "native gangs on a cluster without them": tj({}, NotCreated("BackendNotInstalled", ("native", "--scheduler native")),
                                                 runtime={"spec.podGroupPolicy": {"native": {}}}),
    "kai on a cluster without it": tj({}, NotCreated("BackendNotInstalled", ("kai", "--scheduler kai")),
                                      runtime={"spec.podGroupPolicy": {"kai": {"queue": "team-a"}}}),
    "kai preemptibility unknown": rt({"spec.podGroupPolicy": {"kai": {"preemptibility": "sometimes"}}},
                                     R(("spec.podGroupPolicy.kai.preemptibility",))),
    "native schedulerName empty": rt({"spec.podGroupPolicy.native.schedulerName": ""},
                                     R(("spec.podGroupPolicy.native.schedulerName",))),
    # --- runtimes: template -------------------------------------------------------------------
    "runtime template missing": rt({"spec.template": DELETE}, R(("spec.template",), ("Required",))),
    "replicatedJobs duplicate names": rt(
        {"spec.template.spec.replicatedJobs.1": {"name": "node", "template": {}}},
        R(("spec.template.spec.replicatedJobs[1]",), ("Duplicate",))),
    "replicatedJob name empty": rt({"spec.template.spec.replicatedJobs.0.name": ""},
                                   R(("spec.template.spec.replicatedJobs[0].name",))),
    "replicatedJob name over 20 chars (Trainer v2.4)": rt({"spec.template.spec.replicatedJobs.0.name": "n" * 21},
                                                          R(("spec.template.spec.replicatedJobs[0].name",),
                                                            ("may not be more than 20",))),
    "replicatedJob replicas 2**31": rt({"spec.template.spec.replicatedJobs.0.replicas": 2**31},
                                       R(("spec.template.spec.replicatedJobs[0].replicas",))),
    "replicatedJob replicas negative": rt({"spec.template.spec.replicatedJobs.0.replicas": -1},
                                          R(("spec.template.spec.replicatedJobs[0].replicas",))),
    "replicatedJobs not a list": rt({"spec.template.spec.replicatedJobs": {"name": "node"}},
                                    R(("spec.template.spec.replicatedJobs",))),
    "runtime without a node job": tj({}, Fails("InvalidRuntime", ("no job named 'node'",)),
                                     runtime={"spec.template.spec.replicatedJobs.0.name": "launcher"}),
    "node job without a node container": tj(
        {}, Fails("InvalidRuntime", ("no container named 'node'",)),
        runtime={f"{NODE}.containers": [{"name": "a", "image": "x"}, {"name": "b", "image": "y"}]}),
    "node pod spec containers not a list": tj({}, Fails("InvalidRuntime", ("containers",)),
                                              runtime={f"{NODE}.containers": "node"}),
    "node job template not an object": tj({}, Fails("InvalidRuntime", ("template",)),
                                           runtime={"spec.template.spec.replicatedJobs.0.template": {"spec": 3}}),
    "node container resources malformed": tj(
        {f"{TR}.resourcesPerNode": DELETE}, Fails("InvalidRuntime", ("resources",)),
        runtime={f"{CONTAINER}.resources": {"limits": {"cpu": "lots"}}}),
    "node pod tolerations not a list": tj({}, Fails("InvalidRuntime", ("spec.template.spec.tolerations",)),
                                          runtime={f"{NODE}.tolerations": "all"}),
    "node container env not a list": tj({}, Fails("InvalidRuntime", ("containers[0].env",)),
                                        runtime={f"{CONTAINER}.env": "LR=1"}),
    "node container env entry without name": tj({}, Fails("InvalidRuntime", ("containers[0].env[0].name",)),
                                                runtime={f"{CONTAINER}.env": [{"value": "1"}]}),
    "node pod restartPolicy Always": tj({}, Fails("JobRejected", ("restartPolicy",)),
                                        runtime={f"{NODE}.restartPolicy": "Always"}),
    "runtime backoffLimit negative": tj({}, Fails("JobRejected", ("backoffLimit",)),
                                        runtime={"spec.template.spec.replicatedJobs.0.template.spec.backoffLimit": -1}),
    # --- runtimes: failurePolicy / successPolicy ----------------------------------------------
    "failurePolicy maxRestarts negative": rt({f"{FP}.maxRestarts": -1}, R((f"{FP}.maxRestarts",))),
    "failurePolicy maxRestarts 2**31": rt({f"{FP}.maxRestarts": 2**31}, R((f"{FP}.maxRestarts",))),
    "failurePolicy restartStrategy unknown": rt({f"{FP}.restartStrategy": "Sometimes"},
                                                R((f"{FP}.restartStrategy",))),
    "failurePolicy rule action unknown": rt({f"{FP}.rules": [{"action": "Explode"}]}, R((f"{FP}.rules[0].action",))),
    "failurePolicy rule action missing": rt({f"{FP}.rules": [{"name": "r"}]}, R((f"{FP}.rules[0].action",))),
    "failurePolicy rule reason unknown": rt({f"{FP}.rules": [{"action": "FailJobSet",
                                                              "onJobFailureReasons": ["Bogus"]}]},
                                            R((f"{FP}.rules[0].onJobFailureReasons[0]",))),
    "failurePolicy rule names duplicated": rt(
        {f"{FP}.rules": [{"name": "r", "action": "FailJobSet"}, {"name": "r", "action": "RestartJobSet"}]},
        R((f"{FP}.rules",), ("unique",))),
    "failurePolicy rule targets a job the runtime lacks": rt(
        {f"{FP}.rules": [{"action": "FailJobSet", "targetReplicatedJobs": ["launcher"]}]},
        R(("spec.template.spec",), ("failurePolicy.rules[].targetReplicatedJobs must name jobs",))),
    "successPolicy operator unknown": rt({"spec.template.spec.successPolicy": {"operator": "Most"}},
                                         R(("spec.template.spec.successPolicy.operator",))),
    "successPolicy targets a job the runtime lacks": rt(
        {"spec.template.spec.successPolicy": {"operator": "All", "targetReplicatedJobs": ["launcher"]}},
        R(("spec.template.spec",), ("successPolicy.targetReplicatedJobs must name jobs",))),
}


def apply_changes(obj: dict, changes: dict[str, Any]) -> dict:
    """A copy of `obj` with each dotted path set (numeric parts index lists; DELETE removes)."""
    obj = copy.deepcopy(obj)
    for path, value in changes.items():
        target: Any = obj
        *parents, leaf = path.split(".")
        for part in parents:
            if isinstance(target, list):
                target = target[int(part)]
            else:
                target = target.setdefault(part, {})
        if isinstance(target, list):
            index = int(leaf)
            if index == len(target):
                target.append(value)
            else:
                target[index] = value
        elif value is DELETE:
            target.pop(leaf, None)
        else:
            target[leaf] = value
    return obj


@dataclass
class Created:
    obj: dict
    error: ApiError | None = None  # the create's (or the update's) refusal


async def _create_case(kube, namespace: str, name: str, case: Case) -> Created:
    try:
        if case.kind == "TrainJob":
            body = trainjob(name, namespace, nodes=1, run_for=None)
            if case.runtime is not None:
                runtime = apply_changes(RUNTIME, case.runtime)
                runtime["kind"] = "TrainingRuntime"
                runtime["metadata"] = {"name": f"{name}-rt", "namespace": namespace}
                await kube.create(TRAINING_RUNTIMES.path(namespace), runtime)
                body["spec"]["runtimeRef"] = {"name": f"{name}-rt", "kind": "TrainingRuntime"}
            body = apply_changes(body, case.changes)
            path = TRAINJOBS.path(namespace)
        else:
            body = apply_changes({**RUNTIME, "kind": case.kind}, case.changes)
            meta = {"name": name}
            if case.kind == "TrainingRuntime":
                meta["namespace"] = namespace
            body["metadata"] = {**meta, **{k: v for k, v in body["metadata"].items() if k == "labels"}}
            resource = TRAINING_RUNTIMES if case.kind == "TrainingRuntime" else CLUSTER_TRAINING_RUNTIMES
            path = resource.path(namespace) if case.kind == "TrainingRuntime" else resource.path()
        created = await kube.create(path, body)
    except ApiError as err:
        return Created(body, err)
    if case.update is not None:
        meta = created["metadata"]
        resource = {"TrainJob": TRAINJOBS, "TrainingRuntime": TRAINING_RUNTIMES}.get(case.kind)
        try:
            created = await kube.merge_patch(resource.path(namespace, meta["name"]), case.update)
        except ApiError as err:
            return Created(created, err)
    return Created(created)


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def corpus(kube, controller):
    """Every case created at once, beside one canary TrainJob; yields (namespace, {case: Created})."""
    namespace = f"bad-{uuid.uuid4().hex[:6]}"
    await kube.create("/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}})
    names = {case: f"c{i:03d}-{uuid.uuid4().hex[:4]}" for i, case in enumerate(CASES)}
    canary = trainjob("canary", namespace, nodes=2, run_for="2s")
    results = await asyncio.gather(kube.create(TRAINJOBS.path(namespace), canary),
                                   *(_create_case(kube, namespace, names[c], CASES[c]) for c in CASES))
    longest = trainjob("a" * 50, namespace, nodes=1, run_for=None, suspend=True)
    results.append(await kube.create(TRAINJOBS.path(namespace), longest))
    yield namespace, dict(zip(CASES, results[1:]))
    # TrainJobs first, then their namespace: a reconcile racing the namespace's termination gets 403.
    await kube.request("DELETE", TRAINJOBS.path(namespace))

    async def trainjobs_gone() -> bool:
        return not (await kube.get(TRAINJOBS.path(namespace)))["items"]
    await eventually(trainjobs_gone, 30, "the corpus's TrainJobs deleted")
    for case, created in zip(CASES, results[1:]):  # a cluster-scoped runtime the API should have refused
        if CASES[case].kind == "ClusterTrainingRuntime" and created.error is None:
            await kube.delete(CLUSTER_TRAINING_RUNTIMES.path(name=created.obj["metadata"]["name"]))
    await delete_namespace(kube, namespace)


KNOWN_GAP_WAIT = 10  # a fix fails the TrainJob within seconds of the first refused pod create


@pytest.mark.parametrize("case", [
    pytest.param(name, marks=pytest.mark.xfail(reason=c.known_gap, strict=True)) if c.known_gap else name
    for name, c in CASES.items()
])
async def test_bad_input(kube, corpus, case):
    namespace, results = corpus
    spec, created = CASES[case], results[case]
    outcome = spec.outcome
    if isinstance(outcome, Rejected):
        assert created.error is not None, f"{case}: accepted, expected a rejection naming {outcome.fields}"
        assert created.error.status == 422, f"{case}: {created.error.status} {created.error.message}"
        for text in outcome.fields + outcome.texts:
            assert text in created.error.message, f"{case}: {text!r} not in {created.error.message!r}"
        return
    assert created.error is None, f"{case}: refused ({created.error}); expected {outcome}"
    name = created.obj["metadata"]["name"]
    # Fails: Trainer's Failed condition; otherwise gangctl's state stays Pending (no child created).
    fails = isinstance(outcome, Fails)

    def decision(obj: dict) -> dict | None:
        if fails:
            return condition(obj, "Failed")
        state = gang_state(obj)
        return state if state.get("state") == "Pending" and state.get("reason") != "Creating" else None

    async def decided() -> bool:
        obj = await get_trainjob(kube, namespace, name)
        return decision(obj) is not None or is_true(obj, "Failed")
    try:
        await eventually(decided, KNOWN_GAP_WAIT if spec.known_gap else WAIT,
                         f"{case}: {'Failed' if fails else 'Pending'}")
    except AssertionError as err:
        raise AssertionError(f"{err}; status: {(await get_trainjob(kube, namespace, name)).get('status')}") from None
    obj = await get_trainjob(kube, namespace, name)
    cond = decision(obj)
    assert cond is not None and cond["reason"] == outcome.reason, f"{case}: {obj.get('status')}"
    for text in outcome.texts:
        assert text in cond["message"], f"{case}: {text!r} not in {cond['message']!r}"


async def test_canary_beside_the_corpus_is_served(kube, corpus, controller):
    namespace, _ = corpus

    async def done() -> bool:
        return is_true(await get_trainjob(kube, namespace, "canary"), "Complete")
    await eventually(done, 60, "the canary TrainJob beside the bad ones Complete")
    assert controller.alive(), "the controller process exited"


async def test_longest_allowed_name_is_accepted_and_served(kube, corpus):
    namespace, _ = corpus

    async def suspended() -> bool:
        return is_true(await get_trainjob(kube, namespace, "a" * 50), "Suspended")
    await eventually(suspended, WAIT, "the TrainJob with a 50-character name served (Suspended)")
