"""The `gangctl cluster` commands a person uses to find and inspect the local cluster."""
from __future__ import annotations

import json
import os
import subprocess

import pytest

from tests.integration.helpers import gangctl_cli

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


def test_up_then_down_leaves_no_process_behind(kubeconfig):
    # A second, small cluster beside the session's (kubeconfig makes sure the binaries are built).
    from gangctl.cluster.lifecycle import UpOptions, down, up
    from gangctl.config import ClusterSettings

    settings = ClusterSettings(cluster_name="gangctl-downtest")
    cluster = up(settings, UpOptions(gpu_nodes=1, gpus_per_node=8), lambda m: None)
    pids = [int(p.read_text()) for p in (cluster.state_dir / "pids").glob("*.pid")]
    assert len(pids) == 5
    down(settings, lambda m: None)
    alive = []
    for pid in pids:
        try:
            os.kill(pid, 0)
            alive.append(pid)
        except ProcessLookupError:
            pass
    assert alive == [], f"processes left running after down: {alive}"
    assert not cluster.state_dir.exists()
