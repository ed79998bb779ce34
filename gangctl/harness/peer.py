"""The peer controllers on a local cluster: Kubeflow Trainer v2 and the JobSet controller it drives.

Used by benchmarks/controller_peer.py to run the same TrainJobs through the real Kubeflow Trainer
beside gangctl. Nothing here is part of `cluster up`:

- Binaries: built once from the pinned wrapper modules integrations/trainer and integrations/jobset
  (`build.PEER_MODULES`, under nice -n 19, cached like the others), only when asked.
- CRDs: Trainer's `manifests/base/crds` and JobSet's `config/components/crd/bases`, read from the Go
  module cache at the pinned versions (gangctl's own TrainJob CRDs are not installed on a peer cluster).
- Webhooks: both projects' webhook manifests (JobSet's with its kustomize patches, which limit the pod
  webhooks to JobSet pods), pointed at 127.0.0.1 through `clientConfig.url` with a self-signed
  certificate (gangctl/cluster/webhooks.py, shared with Kueue). Their own cert managers are off: they
  would issue certificates for an in-cluster Service name.
- Configuration: each project's shipped manager configuration, with loopback ports, leader election
  off (one replica) and the metrics endpoints off; everything else (Trainer's TrainJob concurrency 5,
  client QPS 50 / burst 100; JobSet's QPS 500 / burst 500) as shipped.
- Runtime: Trainer's own `torch-distributed` ClusterTrainingRuntime with
  `podGroupPolicy.coscheduling` (Trainer then creates a scheduler-plugins PodGroup per TrainJob) and
  `schedulerName: scheduler-plugins-scheduler`, the Coscheduling profile gangctl's pods use, so
  both controllers make gangs on the same scheduler.

The processes are spawned into the cluster's scheduler state folder, so `gangctl cluster down`
(lifecycle.down) stops them with the cluster.
"""
from __future__ import annotations

import asyncio
import copy
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import yaml

from gangctl.cluster import schedulers, setup, webhooks
from gangctl.cluster.build import PEER_MODULES, Progress, ensure_module, pinned_version
from gangctl.cluster.local import KWOK_NODE_SELECTOR, KWOK_TOLERATION, coscheduling_crd, go_module_dir
from gangctl.config import ClusterSettings
from gangctl.processes import free_ports, running, wait_http_ok

TRAINER_MODULE = "github.com/kubeflow/trainer/v2"
JOBSET_MODULE = "sigs.k8s.io/jobset"
TRAINER_NAMESPACE = "kubeflow-system"  # Trainer's operator namespace outside a pod
SCHEDULER_NAME = "scheduler-plugins-scheduler"
Say = Callable[[str], None]


def trainer_dir(integrations: Path) -> Path:
    return go_module_dir(TRAINER_MODULE, pinned_version(integrations / "trainer", TRAINER_MODULE) or "",
                         integrations / "trainer")


def jobset_dir(integrations: Path) -> Path:
    return go_module_dir(JOBSET_MODULE, pinned_version(integrations / "jobset", JOBSET_MODULE) or "",
                         integrations / "jobset")


def versions(integrations: Path) -> dict[str, str]:
    return {"kubeflow-trainer": pinned_version(integrations / "trainer", TRAINER_MODULE) or "?",
            "jobset": pinned_version(integrations / "jobset", JOBSET_MODULE) or "?"}


def _yaml_docs(folder: Path) -> list[dict]:
    return [d for p in sorted(folder.glob("*.yaml")) if p.name != "kustomization.yaml"
            for d in yaml.safe_load_all(p.read_text()) if d]


def crds(integrations: Path) -> list[dict]:
    """Trainer's and JobSet's CRDs, plus the Coscheduling PodGroup CRD of the base cluster."""
    return (_yaml_docs(trainer_dir(integrations) / "manifests" / "base" / "crds")
            + _yaml_docs(jobset_dir(integrations) / "config" / "components" / "crd" / "bases")
            + [coscheduling_crd(integrations)])


def runtime(integrations: Path, schedule_timeout_seconds: int = 120, name: str | None = None) -> dict:
    """Trainer's torch-distributed ClusterTrainingRuntime, gang-scheduled by Coscheduling, for KWOK's fake
    GPU nodes (select type=kwok, tolerate their kwok.x-k8s.io/node taint), renamed to `name` if given."""
    src = trainer_dir(integrations) / "manifests" / "base" / "runtimes" / "torch_distributed.yaml"
    rt = copy.deepcopy(next(d for d in yaml.safe_load_all(src.read_text()) if d))
    if name:
        rt["metadata"]["name"] = name
    rt["spec"]["podGroupPolicy"] = {"coscheduling": {"scheduleTimeoutSeconds": schedule_timeout_seconds}}
    for job in rt["spec"]["template"]["spec"]["replicatedJobs"]:
        pod = job["template"]["spec"]["template"]["spec"]
        pod["schedulerName"] = SCHEDULER_NAME
        pod["nodeSelector"] = {**(pod.get("nodeSelector") or {}), **KWOK_NODE_SELECTOR}
        pod["tolerations"] = [*(pod.get("tolerations") or []), dict(KWOK_TOLERATION)]
    return rt


def trainer_webhooks(integrations: Path, port: int, ca_pem: bytes) -> list[dict]:
    src = trainer_dir(integrations) / "manifests" / "base" / "webhook" / "manifests.yaml"
    names = {"MutatingWebhookConfiguration": "defaulter.trainer.kubeflow.org",
             "ValidatingWebhookConfiguration": "validator.trainer.kubeflow.org"}
    return [webhooks.on_loopback(doc, names[doc["kind"]], port, ca_pem) for doc in webhooks.load(src)]


def jobset_webhooks(integrations: Path, port: int, ca_pem: bytes) -> list[dict]:
    root = jobset_dir(integrations) / "config" / "components" / "webhook"
    patches = {"MutatingWebhookConfiguration": "mutating-patch.yaml",
               "ValidatingWebhookConfiguration": "validating-patch.yaml"}
    names = {"MutatingWebhookConfiguration": "jobset-mutating-webhook-configuration",
             "ValidatingWebhookConfiguration": "jobset-validating-webhook-configuration"}
    out = []
    for doc in webhooks.load(root / "manifests.yaml"):
        patch = root / "patches" / patches[doc["kind"]]
        if patch.exists():
            doc = webhooks.json_patch_replace(doc, yaml.safe_load(patch.read_text()) or [])
        out.append(webhooks.on_loopback(doc, names[doc["kind"]], port, ca_pem))
    return out


def trainer_configuration(integrations: Path, ports: dict[str, int]) -> dict:
    src = trainer_dir(integrations) / "manifests" / "base" / "manager" / "controller_manager_config.yaml"
    conf = yaml.safe_load(src.read_text())
    conf["health"]["healthProbeBindAddress"] = f"127.0.0.1:{ports['trainer_health']}"
    conf["metrics"] = {"bindAddress": "0", "secureServing": False}
    conf["webhook"] = {"port": ports["trainer_webhook"], "host": "127.0.0.1"}
    conf["leaderElection"]["leaderElect"] = False
    conf["certManagement"]["enable"] = False
    conf.pop("statusServer", None)  # only with the alpha TrainJobStatus gate, which stays off
    return conf


def jobset_configuration(ports: dict[str, int], cert_dir: Path) -> dict:
    return {"apiVersion": "config.jobset.x-k8s.io/v1alpha1", "kind": "Configuration",
            "health": {"healthProbeBindAddress": f"127.0.0.1:{ports['jobset_health']}"},
            "metrics": {"bindAddress": "0"},
            "webhook": {"port": ports["jobset_webhook"], "host": "127.0.0.1", "certDir": str(cert_dir)},
            "leaderElection": {"leaderElect": False},
            "internalCertManagement": {"enable": False}}


@dataclass(frozen=True)
class Peer:
    pids: dict[str, int]  # process name -> pid
    logs: Path


def start(settings: ClusterSettings, kubeconfig: Path, say: Say, progress: Progress | None = None,
          timeout: float = 120) -> Peer:
    """Build (once) and start JobSet and Kubeflow Trainer beside the running cluster `settings` names."""
    integrations = settings.integrations_dir
    bins = {name: ensure_module(module, integrations, settings.bin_root, progress)
            for name, module in PEER_MODULES.items()}
    state = schedulers.state_dir(settings)
    schedulers.stop(state)
    state.mkdir(parents=True, exist_ok=True)
    names = ("trainer_webhook", "trainer_health", "jobset_webhook", "jobset_health")
    ports = dict(zip(names, free_ports(len(names))))

    # Trainer's webhook server reads its certificate from controller-runtime's default folder,
    # <TMPDIR>/k8s-webhook-server/serving-certs: give the process a TMPDIR of its own.
    trainer_tmp = state / "trainer-tmp"
    trainer_cert, _ = webhooks.self_signed(trainer_tmp / "k8s-webhook-server" / "serving-certs",
                                           "trainer-webhook.gangctl.local")
    jobset_cert_dir = state / "jobset-certs"
    jobset_cert, _ = webhooks.self_signed(jobset_cert_dir, "jobset-webhook.gangctl.local")
    (state / "trainer-config.yaml").write_text(yaml.safe_dump(trainer_configuration(integrations, ports), sort_keys=False))
    (state / "jobset-config.yaml").write_text(yaml.safe_dump(jobset_configuration(ports, jobset_cert_dir), sort_keys=False))

    asyncio.run(_install(kubeconfig, crds(integrations), [runtime(integrations)]))
    say(f"installed Kubeflow Trainer {versions(integrations)['kubeflow-trainer']} and JobSet "
        f"{versions(integrations)['jobset']} CRDs, ClusterTrainingRuntime torch-distributed (coscheduling)")

    env = dict(os.environ, KUBECONFIG=str(kubeconfig))
    procs = [
        schedulers.Process("jobset", [str(bins["jobset"] / "jobset"), f"--config={state / 'jobset-config.yaml'}",
                                      "--zap-log-level=info", "--zap-devel=false"], env),
        schedulers.Process("trainer-controller-manager",
                           [str(bins["trainer"] / "trainer-controller-manager"),
                            f"--config={state / 'trainer-config.yaml'}", "--zap-log-level=info"],
                           dict(env, TMPDIR=str(trainer_tmp))),
    ]
    pids = {p.name: schedulers.spawn(state, p) for p in procs}
    wait_http_ok(f"http://127.0.0.1:{ports['jobset_health']}/readyz", timeout, "jobset to be ready",
                            lambda: running(pids["jobset"]))
    wait_http_ok(f"http://127.0.0.1:{ports['trainer_health']}/readyz", timeout,
                            "trainer-controller-manager to be ready", lambda: running(pids["trainer-controller-manager"]))
    hooks = (jobset_webhooks(integrations, ports["jobset_webhook"], jobset_cert.read_bytes())
             + trainer_webhooks(integrations, ports["trainer_webhook"], trainer_cert.read_bytes()))
    asyncio.run(_install(kubeconfig, [], [], hooks))
    say(f"jobset (pid {pids['jobset']}) and trainer-controller-manager (pid {pids['trainer-controller-manager']}) "
        f"running, webhooks on 127.0.0.1; logs in {state / 'logs'}")
    return Peer(pids, state / "logs")


async def _install(kubeconfig: Path, crd_docs: list[dict], runtimes: list[dict], hooks: list[dict] = ()) -> None:
    from gangctl.api.resources import NAMESPACES
    from gangctl.kube.client import Kube

    kube = await Kube.connect(kubeconfig)
    try:
        await kube.apply(NAMESPACES.path(name=TRAINER_NAMESPACE),
                         {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": TRAINER_NAMESPACE}},
                         setup.FIELD_MANAGER)
        if crd_docs:
            await setup.install_crds(kube, crd_docs)
        if runtimes:
            await setup.apply_cluster_runtimes(kube, runtimes)
        await setup.apply_webhooks(kube, hooks)
    finally:
        await kube.close()


def stop(settings: ClusterSettings) -> list[str]:
    return schedulers.stop(schedulers.state_dir(settings))
