"""Kubernetes' own gang scheduling on the local cluster: upstream kube-scheduler 1.36 as a second scheduler.

The base cluster's scheduler is scheduler-plugins' (built on older Kubernetes libraries, without
KEP-4671). `cluster up --scheduler native` creates the cluster with the apiserver serving
scheduling.k8s.io/v1alpha2 (gangctl.cluster.local.NATIVE_GANG_ARGS), builds kube-scheduler from the
same pinned k8s.io/kubernetes module as the apiserver (once, cached), and runs it beside the base
scheduler with the GenericWorkload and GangScheduling feature gates, as the profile
`NATIVE_SCHEDULER`. A runtime names that profile in `podGroupPolicy.native.schedulerName`; on a
cluster whose default scheduler has the gates on, it leaves it unset.
"""
from __future__ import annotations

from pathlib import Path

import yaml

from gangctl.cluster import schedulers
from gangctl.cluster.local import NATIVE_GANG_ARGS
from gangctl.config import ClusterSettings
from gangctl.processes import free_ports

NATIVE_SCHEDULER = "native-gang-scheduler"


def configuration(kubeconfig: Path) -> dict:
    # With --config, kube-scheduler ignores --kubeconfig: the configuration names it.
    return {"apiVersion": "kubescheduler.config.k8s.io/v1", "kind": "KubeSchedulerConfiguration",
            "clientConnection": {"kubeconfig": str(kubeconfig)},
            "leaderElection": {"leaderElect": False},
            "profiles": [{"schedulerName": NATIVE_SCHEDULER}]}


def process(settings: ClusterSettings, bin_dir: Path, kubeconfig: Path) -> tuple[schedulers.Process, dict]:
    """The kube-scheduler process and its health port ({"health": port})."""
    import os

    state = schedulers.state_dir(settings)
    (port,) = free_ports(1)
    conf = state / "native-scheduler-config.yaml"
    conf.parent.mkdir(parents=True, exist_ok=True)
    conf.write_text(yaml.safe_dump(configuration(kubeconfig), sort_keys=False))
    argv = [str(bin_dir / "kube-scheduler"), f"--config={conf}",
            f"--authentication-kubeconfig={kubeconfig}", f"--authorization-kubeconfig={kubeconfig}",
            f"--feature-gates={NATIVE_GANG_ARGS['feature-gates']}", "--bind-address=127.0.0.1", f"--secure-port={port}",
            f"--cert-dir={state / 'native-scheduler-certs'}", "-v=2"]
    return schedulers.Process("kube-scheduler-native", argv, dict(os.environ)), {"health": port}
