"""Gangs on the real scheduler: bound whole, or not at all until capacity appears."""
from __future__ import annotations

import time

import pytest

from gangctl.api.resources import TRAINJOBS
from tests.integration.conftest import GPU_NODES, GPUS_PER_NODE
from tests.integration.helpers import (bound, eventually, get_trainjob, is_running, jobs_in, pod_group, pods_of,
                                       submit, trainjob, waiting_with)

pytestmark = [pytest.mark.integration, pytest.mark.asyncio(loop_scope="session")]


async def test_whole_cluster_gang_is_bound_whole_and_cleaned_up(kube, controller, namespace):
    await submit(kube, trainjob("big", namespace, nodes=GPU_NODES, gpus=GPUS_PER_NODE))

    async def all_bound() -> bool:
        return len(bound(await pods_of(kube, namespace, "big"))) == GPU_NODES
    await eventually(all_bound, 120, f"all {GPU_NODES} pods of the gang bound")

    pods = await pods_of(kube, namespace, "big")
    assert len(pods) == GPU_NODES
    assert len({p["spec"]["nodeName"] for p in pods}) == GPU_NODES, "one 8-GPU pod per node"
    assert {p["spec"]["schedulerName"] for p in pods} == {"scheduler-plugins-scheduler"}
    group = await pod_group(kube, namespace, "big")
    assert group["spec"]["minMember"] == GPU_NODES
    assert group["spec"]["minResources"]["nvidia.com/gpu"] == str(GPU_NODES * GPUS_PER_NODE)
    assert {p["metadata"]["labels"]["scheduling.x-k8s.io/pod-group"] for p in pods} == {"big"}

    env = {e["name"]: e for e in pods[0]["spec"]["containers"][0]["env"]}
    assert env["PET_NNODES"]["value"] == str(GPU_NODES)
    assert env["PET_NPROC_PER_NODE"]["value"] == str(GPUS_PER_NODE)
    assert env["PET_MASTER_ADDR"]["value"] == "big-node-0-0.big"
    assert env["PET_MASTER_PORT"]["value"] == "29500"
    assert "job-completion-index" in env["PET_NODE_RANK"]["valueFrom"]["fieldRef"]["fieldPath"]

    async def running() -> bool:
        return is_running(await get_trainjob(kube, namespace, "big"))
    await eventually(running, 30, "TrainJob Running")
    gang = (await get_trainjob(kube, namespace, "big"))["status"]["gang"]
    assert gang["waitSeconds"] >= 0

    await kube.delete(TRAINJOBS.path(namespace, "big"), propagation="Foreground")

    async def nothing_left() -> bool:
        return (not await pods_of(kube, namespace, "big") and not await jobs_in(kube, namespace)
                and await pod_group(kube, namespace, "big") is None)
    await eventually(nothing_left, 60, "pods, Jobs and PodGroup of the deleted TrainJob to be gone")


async def test_gang_larger_than_free_capacity_binds_nothing_until_capacity_appears(kube, controller, namespace):
    first_nodes, second_nodes = 40, 32  # 40 + 32 > 64 nodes: the second gang cannot fit beside the first
    await submit(kube, trainjob("first", namespace, nodes=first_nodes))

    async def first_bound() -> bool:
        return len(bound(await pods_of(kube, namespace, "first"))) == first_nodes
    await eventually(first_bound, 90, "the first gang bound")

    await submit(kube, trainjob("second", namespace, nodes=second_nodes))

    async def second_pods_exist() -> bool:
        return len(await pods_of(kube, namespace, "second")) == second_nodes
    await eventually(second_pods_exist, 30, "the second gang's pods created")

    pods_seen = time.monotonic()

    async def refused_whole() -> bool:
        # Sampled all along: no pod of the second gang is ever bound while it does not fit.
        pods = await pods_of(kube, namespace, "second")
        assert bound(pods) == [], "a gang that does not fit binds no pod"
        # Done once the scheduler has tried every pod and refused it (PodScheduled=False), and
        # gangctl reports the gang as waiting.
        refused = [p for p in pods if any(c["type"] == "PodScheduled" and c["status"] == "False"
                                          for c in (p.get("status") or {}).get("conditions") or [])]
        return len(refused) == second_nodes and waiting_with(await get_trainjob(kube, namespace, "second"),
                                                             "WaitingForGang")
    await eventually(refused_whole, 60, "every pod of the second gang refused by the scheduler, none bound")
    assert bound(await pods_of(kube, namespace, "second")) == [], "a gang that does not fit binds no pod"
    waiting = await get_trainjob(kube, namespace, "second")
    assert waiting_with(waiting, "WaitingForGang"), waiting["status"]
    assert not waiting["status"].get("conditions"), "Trainer's conditions say nothing of a waiting gang"

    await kube.delete(TRAINJOBS.path(namespace, "first"), propagation="Background")
    without_capacity = time.monotonic() - pods_seen

    async def second_bound() -> bool:
        return len(bound(await pods_of(kube, namespace, "second"))) == second_nodes
    await eventually(second_bound, 150, "the second gang bound whole once capacity appeared")

    async def second_running() -> bool:
        return is_running(await get_trainjob(kube, namespace, "second"))
    await eventually(second_running, 30, "the second TrainJob Running")
    gang = (await get_trainjob(kube, namespace, "second"))["status"]["gang"]
    # It could not bind before the first gang's deletion (see above): it waited at least that long
    # (1 s of slack for the controller seeing the pods later than this test did).
    assert gang["waitSeconds"] >= without_capacity - 1.0, (gang, without_capacity)
    assert gang["waitSeconds"] > 3, "the second gang waited for the first to go"
