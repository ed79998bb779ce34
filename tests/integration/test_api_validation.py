"""The real API server rejects invalid TrainJobs and runtimes with messages that name the field;
an invalid runtime that gets in fails only the jobs that use it."""
from __future__ import annotations

import copy
from pathlib import Path

import pytest
import yaml

from gangctl.api.resources import CLUSTER_TRAINING_RUNTIMES, TRAINING_RUNTIMES, TRAINJOBS
from gangctl.kube.client import ApiError
from tests.integration.helpers import condition, eventually, get_trainjob, is_true, submit, trainjob

pytestmark = [pytest.mark.integration, pytest.mark.asyncio(loop_scope="session")]

RUNTIME = yaml.safe_load((Path(__file__).parents[2] / "deploy/runtimes/torch-distributed.yaml").read_text())


def bad_trainjob(namespace: str, **changes) -> dict:
    obj = trainjob("bad", namespace, nodes=1, run_for=None)
    for path, value in changes.items():
        target = obj
        *parents, leaf = path.split(".")
        for part in parents:
            target = target.setdefault(part, {})
        target[leaf] = value
    return obj


TRAINJOB_CASES = {
    "numNodes < 1": ({"spec.trainer.numNodes": 0}, ["spec.trainer.numNodes", "greater than or equal to 1"]),
    "unknown runtime kind": ({"spec.runtimeRef.kind": "Foo"}, ["spec.runtimeRef.kind", 'Unsupported value: "Foo"']),
    "malformed cpu quantity": ({"spec.trainer.resourcesPerNode": {"requests": {"cpu": "two"}}},
                               ["spec.trainer.resourcesPerNode.requests.cpu", "should match"]),
    "malformed memory quantity": ({"spec.trainer.resourcesPerNode": {"limits": {"memory": "4GB"}}},
                                  ["spec.trainer.resourcesPerNode.limits.memory", "should match"]),
    "name too long for child names": ({"metadata.name": "a" * 52}, ["at most 51 characters", "-node-0-"]),
    "name not a DNS-1035 label": ({"metadata.name": "1abc"}, ["DNS-1035"]),
}


@pytest.mark.parametrize("case", sorted(TRAINJOB_CASES))
async def test_invalid_trainjob_is_rejected_naming_the_field(kube, namespace, case):
    changes, expected = TRAINJOB_CASES[case]
    with pytest.raises(ApiError) as err:
        await submit(kube, bad_trainjob(namespace, **changes))
    assert err.value.status == 422
    for text in expected:
        assert text in err.value.message, f"{case}: {text!r} not in {err.value.message!r}"


async def test_longest_allowed_name_is_accepted(kube, namespace):
    await submit(kube, bad_trainjob(namespace, **{"metadata.name": "a" * 51, "spec.suspend": True}))


async def test_runtime_naming_two_gang_backends_is_rejected(kube):
    runtime = copy.deepcopy(RUNTIME)
    runtime["metadata"]["name"] = "two-backends"
    runtime["spec"]["podGroupPolicy"] = {"coscheduling": {}, "volcano": {"queue": "q"}}
    with pytest.raises(ApiError) as err:
        await kube.create(CLUSTER_TRAINING_RUNTIMES.path(), runtime)
    assert err.value.status == 422
    assert "spec.podGroupPolicy" in err.value.message
    assert "set exactly one of coscheduling, volcano, kueue" in err.value.message


async def test_managed_by_is_immutable(kube, namespace):
    obj = bad_trainjob(namespace, **{"metadata.name": "owned", "spec.managedBy": "example.com/other"})
    await submit(kube, obj)
    with pytest.raises(ApiError) as err:
        await kube.merge_patch(TRAINJOBS.path(namespace, "owned"), {"spec": {"managedBy": "example.com/another"}})
    assert "spec.managedBy is immutable" in err.value.message


async def test_runtime_without_node_job_fails_only_its_jobs(kube, controller, namespace):
    broken = copy.deepcopy(RUNTIME)
    broken["kind"] = "TrainingRuntime"
    broken["metadata"] = {"name": "no-node-job", "namespace": namespace}
    broken["spec"]["template"]["spec"]["replicatedJobs"][0]["name"] = "launcher"
    await kube.create(TRAINING_RUNTIMES.path(namespace), broken)
    await submit(kube, trainjob("uses-broken", namespace, nodes=1, runtime="no-node-job",
                                runtime_kind="TrainingRuntime"))
    await submit(kube, trainjob("healthy", namespace, nodes=1, run_for="1s"))

    async def failed() -> bool:
        return is_true(await get_trainjob(kube, namespace, "uses-broken"), "Failed")
    await eventually(failed, 30, "the TrainJob with a broken runtime Failed")
    cond = condition(await get_trainjob(kube, namespace, "uses-broken"), "Failed")
    assert cond["reason"] == "InvalidRuntime"
    assert "node" in cond["message"]

    async def healthy_done() -> bool:
        return is_true(await get_trainjob(kube, namespace, "healthy"), "Complete")
    await eventually(healthy_done, 60, "the healthy TrainJob beside it Complete")


async def test_missing_runtime_is_explained(kube, controller, namespace):
    await submit(kube, trainjob("orphan", namespace, nodes=1, runtime="does-not-exist"))

    async def explained() -> bool:
        cond = condition(await get_trainjob(kube, namespace, "orphan"), "Created")
        return bool(cond and cond["reason"] == "RuntimeNotFound")
    await eventually(explained, 30, "a RuntimeNotFound condition")
    cond = condition(await get_trainjob(kube, namespace, "orphan"), "Created")
    assert "does-not-exist" in cond["message"] and cond["status"] == "False"
