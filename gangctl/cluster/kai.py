"""NVIDIA KAI Scheduler on the local cluster: its scheduler, binder and status controllers as local processes.

- CRDs: `deployments/kai-scheduler/crds/*.yaml` of github.com/NVIDIA/KAI-scheduler at the version
  pinned in integrations/kai/go.mod, read from the Go module cache.
- `scheduler` (pods with `schedulerName: kai-scheduler`; KAI's default actions and plugins) decides;
  it writes a BindRequest per pod, and `binder` binds the pod to its node. It runs with
  `--update-pod-eviction-condition`, so a pod it preempts carries `DisruptionTarget` (reason
  PreemptionByScheduler) before it is deleted: gangctl restarts the job without charging its budget.
- `podgroupcontroller` and `queuecontroller` keep PodGroup and Queue status (phase, allocated) up to
  date, with their admission webhooks off. KAI's podgrouper is not run: it would regroup gangctl's
  pods by their owner; gangctl creates the PodGroups itself. Nor is its operator: gangctl is the installer.
- Queues: `default-parent-queue` and its leaf `default-queue`, unlimited, as KAI's quickstart makes them
  (`gangctl policy apply --backend kai` adds the teams' queues).
The metrics and health listeners are on 127.0.0.1 at free ports. Two KAI listeners take no address
flag: the podgroupcontroller never passes its --metrics-bind-address on, so controller-runtime's
default (`:8080`, the port `gangctl controller` serves /metrics on) applies; integrations/kai/build.json
links that default as 127.0.0.1:0. The scheduler's plugin server binds `":<port>"` in KAI's code: every
interface, on a port picked free (the one listener of the local cluster beyond loopback).
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

MODULE = "github.com/NVIDIA/KAI-scheduler"
NAMESPACE = "kai-scheduler"   # the namespace its binder keeps resource-reservation pods in (GPU sharing)
UNLIMITED = {"quota": -1, "limit": -1, "overQuotaWeight": 1}


def module_dir(integrations: Path) -> Path:
    version = pinned_version(integrations / "kai", MODULE)
    return go_module_dir(MODULE, version or "", integrations / "kai")


def crds(integrations: Path) -> list[dict]:
    root = module_dir(integrations) / "deployments" / "kai-scheduler" / "crds"
    return [d for p in sorted(root.glob("*.yaml")) for d in yaml.safe_load_all(p.read_text()) if d]


def default_queues() -> list[dict]:
    def queue(name: str, parent: str | None) -> dict:
        spec: dict = {"resources": {r: dict(UNLIMITED) for r in ("cpu", "gpu", "memory")}}
        if parent:
            spec["parentQueue"] = parent
        return {"apiVersion": "scheduling.run.ai/v2", "kind": "Queue", "metadata": {"name": name}, "spec": spec}
    return [queue("default-parent-queue", None), queue("default-queue", "default-parent-queue")]


def processes(settings: ClusterSettings, bin_dir: Path, kubeconfig: Path) -> tuple[list[schedulers.Process], dict]:
    (sched_metrics, plugin_port, binder_metrics, binder_health, pg_metrics, pg_health,
     queue_metrics) = free_ports(7)
    env = dict(os.environ, KUBECONFIG=str(kubeconfig))  # controller-runtime's GetConfig reads it
    loop = "127.0.0.1"
    scheduler = [str(bin_dir / "kai-scheduler"), "--schedule-period=500ms", f"--listen-address={loop}:{sched_metrics}",
                 f"--plugin-server-port={plugin_port}", "--leader-elect=false", "--update-pod-eviction-condition=true",
                 "--qps=100", "--burst=200", "--v=2"]
    binder = [str(bin_dir / "kai-binder"), f"--metrics-bind-address={loop}:{binder_metrics}",
              f"--health-probe-bind-address={loop}:{binder_health}", f"--resource-reservation-namespace={NAMESPACE}",
              "--leader-elect=false", "--qps=100", "--burst=200"]
    podgroups = [str(bin_dir / "kai-podgroupcontroller"), f"--metrics-bind-address={loop}:{pg_metrics}",
                 f"--health-probe-bind-address={loop}:{pg_health}", "--enable-podgroup-webhook=false",
                 "--leader-elect=false"]
    queues = [str(bin_dir / "kai-queuecontroller"), f"--metrics-listen-address={loop}:{queue_metrics}",
              "--enable-webhook=false", "--leader-elect=false"]
    ports = {"binder_metrics": binder_metrics, "scheduler_metrics": sched_metrics}
    return [schedulers.Process("kai-scheduler", scheduler, env), schedulers.Process("kai-binder", binder, env),
            schedulers.Process("kai-podgroupcontroller", podgroups, env),
            schedulers.Process("kai-queuecontroller", queues, env)], ports
