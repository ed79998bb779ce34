"""`gangctl explain` on the real cluster: a gang that cannot fit is explained with its numbers."""
from __future__ import annotations

import json
import subprocess

import pytest

from tests.integration.conftest import GPU_NODES, GPUS_PER_NODE
from tests.integration.helpers import bound, eventually, gangctl_cli, get_trainjob, is_running, pods_of, submit, trainjob

pytestmark = [pytest.mark.integration, pytest.mark.asyncio(loop_scope="session")]


def explain(kubeconfig, target: str, *args: str) -> subprocess.CompletedProcess:
    return gangctl_cli("explain", target, *args, kubeconfig=kubeconfig, timeout=60)


async def test_explain_gives_the_reason_and_numbers_of_a_waiting_gang(kube, kubeconfig, controller, namespace):
    holder_nodes, waiter_nodes = GPU_NODES - 4, 8   # 4 nodes stay free: half of what the waiter needs
    await submit(kube, trainjob("holder", namespace, nodes=holder_nodes))

    async def held() -> bool:
        return is_running(await get_trainjob(kube, namespace, "holder"))
    await eventually(held, 90, "the holder gang running")
    await submit(kube, trainjob("waiter", namespace, nodes=waiter_nodes))

    async def waiter_pods() -> bool:
        return len(await pods_of(kube, namespace, "waiter")) == waiter_nodes
    await eventually(waiter_pods, 30, "the waiting gang's pods created")
    assert bound(await pods_of(kube, namespace, "waiter")) == []

    async def scheduler_has_spoken() -> bool:
        return bool(json.loads(explain(kubeconfig, f"{namespace}/waiter", "-o", "json").stdout)["scheduler_says"])
    await eventually(scheduler_has_spoken, 30, "a FailedScheduling event for the waiting gang", interval=1)

    result = explain(kubeconfig, f"{namespace}/waiter", "-o", "json")
    assert result.returncode == 0, result.stderr
    d = json.loads(result.stdout)
    assert d["trainjob"] == f"{namespace}/waiter"
    assert d["reason"] == "InsufficientCapacity"
    assert d["pods_missing"] == waiter_nodes
    assert d["slots"] < waiter_nodes
    gpus = next(r for r in d["rows"] if r["resource"] == "nvidia.com/gpu")
    assert gpus["needed"] == waiter_nodes * GPUS_PER_NODE
    assert gpus["free"] < gpus["needed"]

    text = explain(kubeconfig, f"{namespace}/waiter")
    assert text.returncode == 0 and "InsufficientCapacity" in text.stdout and "needed" in text.stdout

    running = json.loads(explain(kubeconfig, f"{namespace}/holder", "-o", "json").stdout)
    assert running["reason"] == "GangScheduled"

    missing = explain(kubeconfig, f"{namespace}/no-such-job")
    assert missing.returncode == 1 and "not found" in missing.stderr
