"""Kueue on the local cluster: its manager as a local process, CRDs and webhooks from the pinned module.

- CRDs: `config/components/crd/bases/*.yaml` of sigs.k8s.io/kueue at the version pinned in
  integrations/kueue/go.mod, read from the Go module cache.
- Webhooks: Kueue's own webhook manifests, kept for `batch` Jobs and Kueue's objects only (no pod,
  Deployment or other framework webhooks, so a stopped Kueue never blocks pods), each pointed at
  `https://127.0.0.1:<port>/<path>` through `clientConfig.url` with gangctl's self-signed certificate
  (IP SAN 127.0.0.1) as `caBundle`. Kueue's internal cert management is off: it would issue
  certificates for an in-cluster Service name.
- Configuration (`integrations/kueue/controller-manager-config.yaml` with the ports and cert folder
  filled in): `waitForPodsReady` on (all-or-nothing at pod level), `manageJobsWithoutQueueName:
  false` (only Jobs with a queue-name label are Kueue's), the `batch/job` integration only.
"""
from __future__ import annotations

from pathlib import Path

import yaml

from gangctl.cluster import schedulers, webhooks
from gangctl.cluster.build import pinned_version
from gangctl.cluster.local import go_module_dir
from gangctl.config import ClusterSettings
from gangctl.processes import free_ports

MODULE = "sigs.k8s.io/kueue"
NAMESPACE = "kueue-system"
WEBHOOK_GROUPS = {"batch", "kueue.x-k8s.io"}
WEBHOOK_NAMES = {"MutatingWebhookConfiguration": "kueue-mutating-webhook-configuration",
                 "ValidatingWebhookConfiguration": "kueue-validating-webhook-configuration"}


def module_dir(integrations: Path) -> Path:
    version = pinned_version(integrations / "kueue", MODULE)
    return go_module_dir(MODULE, version or "", integrations / "kueue")


def crds(integrations: Path) -> list[dict]:
    root = module_dir(integrations) / "config" / "components" / "crd" / "bases"
    return [d for p in sorted(root.glob("*.yaml")) for d in yaml.safe_load_all(p.read_text()) if d]


def self_signed(cert_dir: Path) -> tuple[Path, Path]:
    """tls.crt / tls.key (controller-runtime's file names) for 127.0.0.1; the cert is its own CA."""
    return webhooks.self_signed(cert_dir, "kueue-webhook.gangctl.local")


def webhook_configurations(integrations: Path, port: int, ca_pem: bytes) -> list[dict]:
    """Kueue's webhook configurations for Jobs and Kueue objects, reached on 127.0.0.1:`port`."""
    src = module_dir(integrations) / "config" / "components" / "webhook" / "manifests.yaml"

    def ours(hook: dict) -> bool:
        groups = {g for rule in hook.get("rules") or [] for g in rule.get("apiGroups") or []}
        return bool(groups) and groups <= WEBHOOK_GROUPS

    return [webhooks.on_loopback(doc, WEBHOOK_NAMES[doc["kind"]], port, ca_pem, keep=ours)
            for doc in webhooks.load(src)]


def configuration(integrations: Path, ports: dict[str, int], cert_dir: Path) -> dict:
    conf = yaml.safe_load((integrations / "kueue" / "controller-manager-config.yaml").read_text())
    conf["health"]["healthProbeBindAddress"] = f"127.0.0.1:{ports['health']}"
    conf["metrics"]["bindAddress"] = f"127.0.0.1:{ports['metrics']}"
    conf["webhook"].update(port=ports["webhook"], host="127.0.0.1", certDir=str(cert_dir))
    return conf


def process(settings: ClusterSettings, bin_dir: Path, kubeconfig: Path) -> tuple[schedulers.Process, dict]:
    """The Kueue manager process and what it listens on ({"webhook", "health", "metrics"} ports)."""
    import os

    state = schedulers.state_dir(settings)
    cert_dir = state / "kueue-certs"
    self_signed(cert_dir)
    webhook, health, metrics = free_ports(3)
    ports = {"webhook": webhook, "health": health, "metrics": metrics}
    conf_path = state / "kueue-config.yaml"
    conf_path.parent.mkdir(parents=True, exist_ok=True)
    conf_path.write_text(yaml.safe_dump(configuration(settings.integrations_dir, ports, cert_dir), sort_keys=False))
    env = dict(os.environ, KUBECONFIG=str(kubeconfig))
    argv = [str(bin_dir / "kueue"), f"--config={conf_path}", "--zap-log-level=2"]
    return schedulers.Process("kueue", argv, env), ports
