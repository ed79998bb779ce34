"""Elastic TrainJobs on the real cluster (KWOK GPU nodes): start on what fits, shrink when a node is
lost, grow back when capacity returns; the rendezvous store beside them.

A filler gang takes all GPU nodes of the session cluster but 4: room for the elastic job's 4 workers,
wherever its rendezvous store went (its anti-affinity to them is preferred, so it keeps none out).
"""
from __future__ import annotations

import uuid

import aiohttp
import pytest

from gangctl.api.resources import CLUSTER_TRAINING_RUNTIMES, JOBS, PODS, TRAINJOBS
from gangctl.kube.client import ApiError
from tests.integration.conftest import GPU_NODES
from tests.integration.helpers import (bound, eventually, get_trainjob, is_running, is_true, node_not_ready, node_ready,
                                       on_kwok_nodes, pod_group, pods_of, submit, trainjob)

pytestmark = [pytest.mark.integration, pytest.mark.asyncio(loop_scope="session")]

def long_running(obj: dict) -> dict:
    """KWOK completes a pod between the delay and the jitter-delay annotations (jitter 5 s by default)."""
    obj["spec"]["podTemplateOverrides"][0]["metadata"]["annotations"]["pod-complete.stage.kwok.x-k8s.io/jitter-delay"] = "3601s"
    return obj


def elastic_runtime(name: str) -> dict:
    return {"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "ClusterTrainingRuntime",
            "metadata": {"name": name, "labels": {"trainer.kubeflow.org/framework": "torch"}},
            "spec": {"mlPolicy": {"numNodes": 1, "torch": {"numProcPerNode": "auto",
                                                          "elasticPolicy": {"minNodes": 2, "maxNodes": 4}}},
                     "podGroupPolicy": {"coscheduling": {"scheduleTimeoutSeconds": 60}},
                     "template": {"spec": {"replicatedJobs": [{"name": "node", "replicas": 1, "template": {
                         "metadata": {"labels": {"trainer.kubeflow.org/trainjob-ancestor-step": "trainer"}},
                         "spec": {"template": {"spec": on_kwok_nodes({"restartPolicy": "Never", "containers": [
                             {"name": "node", "image": "pytorch", "command": ["torchrun", "t.py"]}]})}}}}]}}}}


@pytest.fixture
async def runtime_name(kube):
    name = f"elastic-{uuid.uuid4().hex[:6]}"
    await kube.create(CLUSTER_TRAINING_RUNTIMES.path(), elastic_runtime(name))
    yield name
    await kube.delete(CLUSTER_TRAINING_RUNTIMES.path(name=name))


async def test_api_rejects_min_above_max_in_the_trainjob_override(kube, namespace, runtime_name):
    obj = trainjob("bad", namespace, nodes=1, runtime=runtime_name)
    obj["spec"]["trainer"]["elasticPolicy"] = {"minNodes": 5, "maxNodes": 3}
    with pytest.raises(ApiError) as err:
        await submit(kube, obj)
    assert err.value.status == 422
    assert "spec.trainer.elasticPolicy" in err.value.message and "minNodes" in err.value.message


async def test_elastic_job_shrinks_on_node_loss_and_grows_back(kube, controller, namespace, runtime_name):
    filler = GPU_NODES - 4  # leaves 4 free GPU nodes
    await submit(kube, long_running(trainjob("filler", namespace, nodes=filler)))

    async def filler_bound() -> bool:
        return len(bound(await pods_of(kube, namespace, "filler"))) == filler
    await eventually(filler_bound, 120, "the filler gang bound")

    await submit(kube, long_running(trainjob("el", namespace, nodes=1, runtime=runtime_name)))

    async def job() -> dict:
        try:
            return await kube.get(JOBS.path(namespace, "el-node-0"))
        except ApiError as err:
            if err.not_found:
                return {"spec": {}}
            raise

    async def healthy() -> list[dict]:
        return [p for p in bound(await pods_of(kube, namespace, "el"))
                if not p["metadata"].get("deletionTimestamp") and p["status"].get("phase") == "Running"]

    async def store_node() -> str | None:
        try:
            return (await kube.get(PODS.path(namespace, "el-rdzv")))["spec"].get("nodeName")
        except ApiError:
            return None
    await eventually(lambda: _true(store_node()), 60, "the rendezvous store pod scheduled")
    # Wherever the store went, it keeps no worker off its node (its anti-affinity is preferred): all 4 fit.
    start = 4

    async def started() -> bool:
        j = await job()
        return j["spec"].get("parallelism") == start and len(await healthy()) == start
    await eventually(started, 90, f"the elastic job running on the {start} nodes that fit")
    spec = (await job())["spec"]
    assert (spec["completions"], spec["backoffLimitPerIndex"]) == (1_000, 0), "a pool of indexes, each tried once"
    group = await pod_group(kube, namespace, "el")
    assert group["spec"]["minMember"] == 2, "the gang floor is minNodes"
    tj = await get_trainjob(kube, namespace, "el")
    assert tj["status"]["elastic"]["currentNodes"] == start
    assert is_running(tj)

    pods = await healthy()
    env = {e["name"]: e.get("value") for e in pods[0]["spec"]["containers"][0]["env"]}
    assert env["PET_NNODES"] == "2:4" and env["PET_RDZV_BACKEND"] == "c10d"
    assert env["PET_RDZV_ENDPOINT"] == "el-rdzv.el:29400"

    # Node loss: the node of the highest index goes NotReady; its pod is evicted (DisruptionTarget) and
    # its replacement cannot be placed (every node is taken), so the job shrinks instead of waiting.
    victim = max(pods, key=lambda p: int(p["metadata"]["annotations"]["batch.kubernetes.io/job-completion-index"]))
    node = victim["spec"]["nodeName"]
    survivors = {p["metadata"]["uid"] for p in pods} - {victim["metadata"]["uid"]}
    await node_not_ready(kube, node)
    try:
        at_shrink: dict = {}

        async def shrunk() -> bool:
            # The TrainJob as it is when the shrink shows: 30 s later gangctl may already probe to grow,
            # and lastResizeReason then names that probe.
            if (await job())["spec"].get("parallelism") != start - 1:
                return False
            # gangctl resizes the Job before it writes the TrainJob's status: wait for the status that
            # records this shrink (its size), not an older one that only saw a worker go.
            tj = await get_trainjob(kube, namespace, "el")
            at_shrink["tj"] = tj
            el = tj.get("status", {}).get("elastic") or {}
            return el.get("size") == start - 1 and el.get("currentNodes") == start - 1
        await eventually(shrunk, 90, f"the job shrunk to {start - 1} after the node loss")
        tj = at_shrink["tj"]
        # The cause is NodeLost when gangctl saw the evicted pod (or the Job's failed count) before the
        # cut; a lost pod deleted between two looks can still be labelled Unschedulable (known gap).
        assert tj["status"]["elastic"]["lastResizeReason"] in ("NodeLost", "Unschedulable")
        assert survivors <= {p["metadata"]["uid"] for p in await healthy()}, "no healthy worker was killed"
        assert not is_true(tj, "Failed")
        assert (tj["status"].get("restarts") or {}).get("user", 0) == 0

        # Capacity returns: the filler goes; the job probes back to 4.
        await kube.delete(TRAINJOBS.path(namespace, "filler"), propagation="Background")

        async def grown() -> bool:
            return (await job())["spec"].get("parallelism") == 4 and len(await healthy()) == 4
        await eventually(grown, 120, "the job grown back to 4")
        assert survivors <= {p["metadata"]["uid"] for p in await healthy()}, "growing kills no worker"
        tj = await get_trainjob(kube, namespace, "el")
        assert tj["status"]["elastic"]["currentNodes"] == 4
        for p in await pods_of(kube, namespace, "el"):
            assert p["spec"].get("nodeName") != node or p["metadata"].get("deletionTimestamp")

        async with aiohttp.ClientSession() as s, s.get(controller.url + "/metrics") as r:
            text = await r.text()
        assert 'direction="shrink"' in text
        assert 'gangctl_elastic_resizes_total{cause="CapacityProbe",direction="grow"}' in text
        assert 'gangctl_elastic_world_size{namespace="%s",trainjob="el"} 4.0' % namespace in text
    finally:
        await node_ready(kube, node)


async def _true(value) -> bool:
    return bool(await value)
