"""The `gangctl cluster` commands a person uses to find and inspect the local cluster."""
from __future__ import annotations

import asyncio
import json
import subprocess
from pathlib import Path

import pytest

from gangctl.api.resources import CONFIGMAPS, TRAINJOBS
from gangctl.kube.client import Kube
from gangctl.processes import running
from tests.integration.helpers import eventually, gangctl_cli

pytestmark = pytest.mark.integration


def gangctl(*args: str, cluster: str) -> subprocess.CompletedProcess:
    return gangctl_cli(*args, cluster_name=cluster, timeout=60)


def test_status_and_env_describe_the_running_cluster(kubeconfig, cluster_settings):
    result = gangctl("cluster", "status", "-o", "json", cluster=cluster_settings.cluster_name)
    assert result.returncode == 0, result.stderr
    info = json.loads(result.stdout)
    assert info["running"] is True
    assert {c["name"] for c in info["components"]} >= {"etcd", "kube-apiserver", "kube-controller-manager",
                                                         "kube-scheduler", "kwok-controller"}
    assert info["nodes"]["kwok_ready"] == 64
    env = gangctl("cluster", "env", cluster=cluster_settings.cluster_name)
    assert env.stdout.strip() == f"export KUBECONFIG={kubeconfig}"


def test_status_of_a_missing_cluster_says_so():
    result = gangctl("cluster", "status", cluster="no-such-cluster")
    assert result.returncode == 0
    assert "'no-such-cluster' does not exist" in result.stdout
    assert "gangctl cluster up" in result.stdout


def test_a_fresh_cluster_collects_a_deleted_trainjobs_children_and_down_leaves_no_process_behind(kubeconfig):
    # A second, small cluster beside the session's (kubeconfig makes sure the binaries are built).
    from gangctl.cluster.lifecycle import UpOptions, down, up
    from gangctl.config import ClusterSettings

    settings = ClusterSettings(cluster_name="gangctl-downtest")
    cluster = up(settings, UpOptions(gpu_nodes=1, gpus_per_node=8), lambda m: None)
    try:
        # The garbage collector knows the kinds `up` installed from the start: a TrainJob deleted
        # at once takes its children with it (kube-controller-manager alone would rediscover
        # them only after up to 30 s, and retry the child with a growing backoff meanwhile).
        asyncio.run(_delete_owner_and_wait_for_child(cluster.kubeconfig))
        pids = [int(p.read_text()) for p in (cluster.state_dir / "pids").glob("*.pid")]
        assert len(pids) == 5
    finally:
        down(settings, lambda m: None)
    alive = [pid for pid in pids if running(pid)]  # a zombie of a restarted component is not running
    assert alive == [], f"processes left running after down: {alive}"
    assert not cluster.state_dir.exists()


async def _delete_owner_and_wait_for_child(kubeconfig: Path) -> None:
    kube = await Kube.connect(kubeconfig)
    try:
        owner = await kube.create(TRAINJOBS.path("default"), {
            "apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob", "metadata": {"name": "owner"},
            "spec": {"runtimeRef": {"name": "torch-distributed"}, "suspend": True}})
        ref = {"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob", "name": "owner",
               "uid": owner["metadata"]["uid"]}
        await kube.create(CONFIGMAPS.path("default"), {"apiVersion": "v1", "kind": "ConfigMap",
                                                       "metadata": {"name": "child", "ownerReferences": [ref]}})
        await kube.delete(TRAINJOBS.path("default", "owner"))

        async def child_gone() -> bool:
            return not await kube.exists(CONFIGMAPS.path("default", "child"))
        await eventually(child_gone, 10, "the deleted TrainJob's ConfigMap collected by the garbage collector")
    finally:
        await kube.close()


def test_controller_on_a_taken_port_names_the_process_that_holds_it(controller_kubeconfig):
    """As after `cluster up` with a component on 8080: the controller exits 1 with the holder and the flag."""
    import sys

    hold = "'port-holder'; import socket, sys; s = socket.socket(); s.bind(('0.0.0.0', 0)); s.listen(); " \
           "print(s.getsockname()[1], flush=True); sys.stdin.read()"
    holder = subprocess.Popen([sys.executable, "-c", hold], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        port = int(holder.stdout.readline())
        result = gangctl_cli("controller", "--metrics-bind-address", f"127.0.0.1:{port}",
                             kubeconfig=controller_kubeconfig, timeout=60)
    finally:
        holder.kill()
        holder.wait()
    message = " ".join(result.stderr.split())
    assert result.returncode == 1, result.stderr[-2000:]
    assert f"--metrics-bind-address 127.0.0.1:{port}: the port is in use, held by pid {holder.pid} (" in message, message
    assert "port-holder" in message and f"--metrics-bind-address 127.0.0.1:{port + 1}" in message, message
    assert "Traceback" not in result.stderr, result.stderr[-2000:]
