"""Volcano on the local cluster: vc-scheduler and vc-controller-manager as local processes.

- CRDs: `installer/helm/chart/volcano/crd/bases/*.yaml` of volcano.sh/volcano at the version pinned
  in integrations/volcano/go.mod, read from the Go module cache.
- vc-scheduler with `integrations/volcano/scheduler.conf` (gang, capacity, enqueue); it serves pods
  with `schedulerName: volcano` and creates the `default` Queue.
- vc-controller-manager runs the PodGroup, Queue and garbage-collection controllers (Volcano's own
  Job controllers are not needed: gangctl's child is a batch/v1 Job). No admission webhook runs.
Both listen on 127.0.0.1 only (metrics and health ports picked free) and use the cluster kubeconfig.
"""
from __future__ import annotations

import os
from pathlib import Path

import yaml

from gangctl.cluster import schedulers
from gangctl.cluster.build import pinned_version
from gangctl.cluster.local import go_module_dir
from gangctl.config import ClusterSettings
from gangctl.processes import free_ports

MODULE = "volcano.sh/volcano"
CONTROLLERS = "pg-controller,queue-controller,gc-controller"


def module_dir(integrations: Path) -> Path:
    version = pinned_version(integrations / "volcano", MODULE)
    return go_module_dir(MODULE, version or "", integrations / "volcano")


def crds(integrations: Path) -> list[dict]:
    root = module_dir(integrations) / "installer" / "helm" / "chart" / "volcano" / "crd" / "bases"
    return [d for p in sorted(root.glob("*.yaml")) for d in yaml.safe_load_all(p.read_text()) if d]


def processes(settings: ClusterSettings, bin_dir: Path, kubeconfig: Path) -> tuple[list[schedulers.Process], dict]:
    metrics, sched_health, cm_health = free_ports(3)
    env = dict(os.environ, KUBECONFIG=str(kubeconfig))  # its device plugins read the kubeconfig from here
    common = [f"--kubeconfig={kubeconfig}", "--leader-elect=false", "--kube-api-qps=100", "--kube-api-burst=200"]
    scheduler = [str(bin_dir / "vc-scheduler"), *common,
                 f"--scheduler-conf={settings.integrations_dir / 'volcano' / 'scheduler.conf'}",
                 "--scheduler-name=volcano", "--schedule-period=500ms",
                 f"--listen-address=127.0.0.1:{metrics}", f"--healthz-address=127.0.0.1:{sched_health}",
                 "--enable-healthz=true", "--enable-metrics=false", "--cache-dumper=false",
                 "--cache-dump-dir", str(schedulers.state_dir(settings)), "-v=2"]
    controller = [str(bin_dir / "vc-controller-manager"), *common, f"--controllers={CONTROLLERS}",
                  f"--healthz-address=127.0.0.1:{cm_health}", "--enable-healthz=true", "-v=2"]
    ports = {"scheduler_health": sched_health, "controller_health": cm_health, "metrics": metrics}
    return [schedulers.Process("vc-scheduler", scheduler, env),
            schedulers.Process("vc-controller-manager", controller, env)], ports
