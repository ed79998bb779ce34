"""Kubeflow Training Operator v1 on a local cluster: the PyTorchJob peer of benchmarks/pytorchjob_peer.py.

Nothing here is part of `cluster up`:

- Binary: `cmd/training-operator.v1`, built once from the pinned wrapper module
  integrations/training-operator (`build.PEER_MODULES`, under nice -n 19, cached like the others).
- CRDs: Training Operator's own PyTorchJob CRD (`manifests/base/crds`, read from the Go module cache at
  the pin) and scheduler-plugins' PodGroup CRD (its gangs).
- Configuration: `--enable-scheme=pytorchjob`, `--gang-scheduler-name=scheduler-plugins` (it then
  makes a scheduler-plugins PodGroup per PyTorchJob, minMember the sum of all replicas), metrics off,
  the health probe on loopback, leader election off, client QPS 20 / burst 30 and one worker thread
  as shipped. Its controllers start only once its certificate rotator is done: it fills the Secret
  `training-operator-webhook-cert` in namespace `kubeflow` (created empty here), waits for kubelet to
  mount it at /tmp/k8s-webhook-server/serving-certs (its fixed CertDir; this harness copies the files
  there, playing kubelet) and injects its CA into the ValidatingWebhookConfiguration
  `validator.training-operator.kubeflow.org`, registered here with no webhooks: its webhook server
  listens on a free port on every interface (its flags cannot narrow it) and nothing calls it, so
  the peer skips v1's admission validation (gangctl's CRD validates with CEL).

The process is spawned into the cluster's scheduler state folder, so `gangctl cluster down` stops it.
"""
from __future__ import annotations

import asyncio
import base64
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import yaml

from gangctl.api import pytorchjob as api
from gangctl.api.resources import NAMESPACES
from gangctl.cluster import schedulers, setup
from gangctl.cluster.build import PEER_MODULES, Progress, ensure_module, pinned_version
from gangctl.cluster.local import coscheduling_crd, go_module_dir
from gangctl.config import ClusterSettings
from gangctl.kube.client import Kube
from gangctl.processes import free_ports, running, wait_http_ok

NAMESPACE = "kubeflow"
WEBHOOK_SECRET = "training-operator-webhook-cert"
WEBHOOK_CONFIGURATION = "validator.training-operator.kubeflow.org"
CERT_DIR = Path("/tmp/k8s-webhook-server/serving-certs")  # cert-controller's CertDir in Training Operator
Say = Callable[[str], None]


def version(integrations: Path) -> str:
    return pinned_version(integrations / "training-operator", api.UPSTREAM_MODULE) or "?"


def crds(integrations: Path) -> list[dict]:
    root = go_module_dir(api.UPSTREAM_MODULE, version(integrations), integrations / "training-operator")
    return [yaml.safe_load((root / api.UPSTREAM_CRD).read_text()), coscheduling_crd(integrations)]


@dataclass(frozen=True)
class Running:
    pids: dict[str, int]


async def _install(kubeconfig: Path, crd_docs: list[dict]) -> None:
    kube = await Kube.connect(kubeconfig)
    try:
        await kube.apply(NAMESPACES.path(name=NAMESPACE), {"apiVersion": "v1", "kind": "Namespace",
                                                           "metadata": {"name": NAMESPACE}}, setup.FIELD_MANAGER)
        await kube.apply(f"/api/v1/namespaces/{NAMESPACE}/secrets/{WEBHOOK_SECRET}",
                         {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": WEBHOOK_SECRET}},
                         setup.FIELD_MANAGER)
        await kube.apply(f"/apis/admissionregistration.k8s.io/v1/validatingwebhookconfigurations/{WEBHOOK_CONFIGURATION}",
                         {"apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingWebhookConfiguration",
                          "metadata": {"name": WEBHOOK_CONFIGURATION}}, setup.FIELD_MANAGER)
        await setup.install_crds(kube, crd_docs)
    finally:
        await kube.close()


async def _mount_certs(kubeconfig: Path, timeout: float) -> None:
    """Play kubelet for the webhook Secret: once the rotator has filled it, its files go to CERT_DIR."""
    kube = await Kube.connect(kubeconfig)
    try:
        async def filled() -> bool:
            data = (await kube.get(f"/api/v1/namespaces/{NAMESPACE}/secrets/{WEBHOOK_SECRET}")).get("data") or {}
            if "tls.crt" not in data or "tls.key" not in data:
                return False
            CERT_DIR.mkdir(parents=True, exist_ok=True)
            for name, value in data.items():
                path = CERT_DIR / name
                path.write_bytes(base64.b64decode(value))
                path.chmod(0o600)
            return True
        await setup.wait_for(filled, timeout, "training-operator to fill its webhook Secret")
    finally:
        await kube.close()


def start(settings: ClusterSettings, kubeconfig: Path, say: Say, progress: Progress | None = None,
          timeout: float = 120) -> Running:
    bin_dir = ensure_module(PEER_MODULES["training-operator"], settings.integrations_dir, settings.bin_root, progress)
    asyncio.run(_install(kubeconfig, crds(settings.integrations_dir)))
    state = schedulers.state_dir(settings)
    probe, webhook = free_ports(2)
    argv = [str(bin_dir / "training-operator"), "--enable-scheme=pytorchjob", "--gang-scheduler-name=scheduler-plugins",
            "--metrics-bind-address=0", f"--health-probe-bind-address=127.0.0.1:{probe}",
            f"--webhook-server-port={webhook}", "--leader-elect=false"]
    proc = schedulers.Process("training-operator", argv, dict(os.environ, KUBECONFIG=str(kubeconfig)))
    pid = schedulers.spawn(state, proc)
    asyncio.run(_mount_certs(kubeconfig, timeout))
    # /readyz turns 200 once the certificates are in place and the controllers are set up.
    wait_http_ok(f"http://127.0.0.1:{probe}/readyz", timeout, "training-operator to be ready", lambda: running(pid))
    say(f"training-operator {version(settings.integrations_dir)} running (pid {pid}); "
        f"log {state / 'logs' / 'training-operator.log'}")
    return Running({"training-operator": pid})
