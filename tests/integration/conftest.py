"""One real local cluster per test session, and the gangctl controller running against it.

The cluster is the real thing: etcd, kube-apiserver, kube-controller-manager, the coscheduling
kube-scheduler and KWOK, built from the pinned Go modules. The controller runs as its own process
(`gangctl controller`), so tests can kill and restart it like an operator would.
"""
from __future__ import annotations

import asyncio
import os
import uuid
from pathlib import Path

import pytest
import pytest_asyncio

from gangctl.api.resources import NODES
from gangctl.cluster.lifecycle import UpOptions, down, process_node_state, start_process_nodes, up
from gangctl.config import ClusterSettings
from gangctl.kube.client import Kube
from gangctl.processes import ControllerProcess
from tests.integration.helpers import delete_namespace

pytestmark = pytest.mark.integration

GPU_NODES = 64
GPUS_PER_NODE = 8


@pytest.fixture(scope="session")
def cluster_settings() -> ClusterSettings:
    # GANGCTL_TEST_CLUSTER: run the suite against another cluster name (one per engineer/CI job).
    return ClusterSettings(cluster_name=os.environ.get("GANGCTL_TEST_CLUSTER", "gangctl-test"))


@pytest.fixture(scope="session")
def kubeconfig(cluster_settings: ClusterSettings) -> Path:
    down(cluster_settings, lambda m: None)  # a cluster left by an interrupted run
    cluster = up(cluster_settings, UpOptions(GPU_NODES, GPUS_PER_NODE), lambda m: print(f"[cluster] {m}"))
    yield cluster.kubeconfig
    down(cluster_settings, lambda m: print(f"[cluster] {m}"))


@pytest_asyncio.fixture(scope="session")
async def kube(kubeconfig: Path):
    client = await Kube.connect(kubeconfig)
    yield client
    await client.close()


@pytest_asyncio.fixture(scope="session")
async def controller(kubeconfig: Path, tmp_path_factory: pytest.TempPathFactory):
    ctl = ControllerProcess(kubeconfig, tmp_path_factory.mktemp("controller") / "controller.log")
    ctl.start()
    await wait_ready(ctl)
    yield ctl
    ctl.stop()
    print(f"[controller] log: {ctl.log_path}")


async def wait_ready(ctl: ControllerProcess) -> None:
    await asyncio.to_thread(ctl.wait_ready)


# Process nodes (`gangctl node-agent`) the tests add to the session cluster: started by the first
# test that asks for them, shared by test_process_nodes.py, test_sdk.py and test_training.py.
PROCESS_NODES = 3
PROCESS_NODE_PREFIX = "itest-node"
PROCESS_NODE_FIRST_INDEX = 10  # pod subnets 10.244.11-13.0/24; further agents take the next indexes
PROCESS_RUNTIME = "torch-process-nodes"  # deploy/runtimes/torch-process-nodes.yaml, applied by `cluster up`


def process_node_test_state(settings: ClusterSettings) -> Path:
    return process_node_state(settings) / "itest"


@pytest.fixture(scope="session")
def process_nodes(cluster_settings: ClusterSettings, kubeconfig: Path):
    from gangctl.nodeagent import launch

    state = process_node_test_state(cluster_settings)
    names = start_process_nodes(cluster_settings, kubeconfig, PROCESS_NODES, lambda m: print(f"[nodes] {m}"),
                                state=state, prefix=PROCESS_NODE_PREFIX, first_index=PROCESS_NODE_FIRST_INDEX)
    yield names
    launch.stop(cluster_settings.cluster_name, state)
    _delete_nodes(kubeconfig, names)


def _delete_nodes(kubeconfig: Path, names: list[str]) -> None:
    async def go() -> None:
        kube = await Kube.connect(kubeconfig)
        try:
            for name in names:
                await kube.delete(NODES.path(name=name))
        finally:
            await kube.close()
    asyncio.run(go())


@pytest_asyncio.fixture(scope="session")
async def process_runtime(kube: Kube, process_nodes) -> str:
    """The shipped process-node runtime's name (installed with the cluster, from deploy/runtimes)."""
    await kube.get(f"/apis/trainer.kubeflow.org/v1alpha1/clustertrainingruntimes/{PROCESS_RUNTIME}")
    return PROCESS_RUNTIME


@pytest_asyncio.fixture
async def namespace(kube: Kube):
    name = f"t-{uuid.uuid4().hex[:8]}"
    await kube.create("/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})
    yield name
    await delete_namespace(kube, name)

