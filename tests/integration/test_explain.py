"""`gangctl explain` on the real cluster: a gang that cannot fit is explained with its numbers."""
from __future__ import annotations

import json
import subprocess
import uuid

import pytest

from gangctl.api.resources import CLUSTER_TRAINING_RUNTIMES
from gangctl.cluster.local import KWOK_NODE_SELECTOR
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


async def test_explain_names_the_taint_that_keeps_a_gang_off_free_nodes(kube, kubeconfig, controller, namespace):
    """A runtime that selects KWOK's GPU nodes but forgets their taint: the nodes have room, the gang
    waits, and explain says which taint and what to add (not `0 free`)."""
    name = f"untolerated-{uuid.uuid4().hex[:6]}"
    runtime = {"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "ClusterTrainingRuntime",
               "metadata": {"name": name, "labels": {"trainer.kubeflow.org/framework": "torch"}},
               "spec": {"mlPolicy": {"numNodes": 2, "torch": {"numProcPerNode": "auto"}},
                        "podGroupPolicy": {"coscheduling": {"scheduleTimeoutSeconds": 60}},
                        "template": {"spec": {"replicatedJobs": [{"name": "node", "replicas": 1, "template": {
                            "metadata": {"labels": {"trainer.kubeflow.org/trainjob-ancestor-step": "trainer"}},
                            "spec": {"template": {"spec": {
                                "restartPolicy": "Never", "nodeSelector": dict(KWOK_NODE_SELECTOR),
                                "containers": [{"name": "node", "image": "pytorch", "command": ["torchrun", "t.py"],
                                                "resources": {"limits": {"nvidia.com/gpu": "8"}}}]}}}}}]}}}}
    await kube.create(CLUSTER_TRAINING_RUNTIMES.path(), runtime)
    try:
        obj = trainjob("untolerated", namespace, nodes=2, runtime=name)
        await submit(kube, obj)

        async def pods_made() -> bool:
            return len(await pods_of(kube, namespace, "untolerated")) == 2
        await eventually(pods_made, 30, "the gang's pods created")
        result = explain(kubeconfig, f"{namespace}/untolerated", "-o", "json")
        assert result.returncode == 0, result.stderr
        d = json.loads(result.stdout)
        assert d["reason"] == "InsufficientCapacity", d
        taint = next(e for e in d["excluded"] if e["what"] == "taint kwok.x-k8s.io/node=fake:NoSchedule")
        assert taint["nodes"] == GPU_NODES and taint["slots"] > 0, d["excluded"]
        assert "add a toleration" in d["message"] and "kwok.x-k8s.io/node" in d["message"]
        text = explain(kubeconfig, f"{namespace}/untolerated")
        assert "nodes the gang's pods may not use" in text.stdout and "kwok.x-k8s.io/node=fake" in text.stdout
    finally:
        await kube.delete(CLUSTER_TRAINING_RUNTIMES.path(name=name))
