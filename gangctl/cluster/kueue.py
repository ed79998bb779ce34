"""Kueue on the local cluster: its manager as a local process, CRDs and webhooks from the pinned module.

- CRDs: `config/components/crd/bases/*.yaml` of sigs.k8s.io/kueue at the version pinned in
  integrations/kueue/go.mod, read from the Go module cache. The CRDs that Kueue's kustomization
  gives a conversion webhook (`config/components/crd/kustomization.yaml`, `patches/webhook_in_*`:
  in v0.19 ClusterQueue, LocalQueue, Cohort, Workload and MultiKueueCluster, served as v1beta1 and
  v1beta2) get it here too, at `https://127.0.0.1:<port>/convert` with gangctl's certificate: a
  v1beta1 client's renamed fields (ClusterQueue `spec.cohort` -> `cohortName`, ...) are converted,
  not dropped.
- Webhooks: Kueue's own webhook manifests, kept for `batch` Jobs, PyTorchJobs and Kueue's objects only
  (no pod, Deployment or other framework webhooks, so a stopped Kueue never blocks pods), each pointed at
  `https://127.0.0.1:<port>/<path>` through `clientConfig.url` with gangctl's self-signed certificate
  (IP SAN 127.0.0.1) as `caBundle`. Kueue's internal cert management is off: it would issue
  certificates for an in-cluster Service name. With it off, Kueue (since v0.17) also reads its metrics
  server's certificate from the fixed folder /etc/kueue/metrics/certs and exits when it is missing,
  so gangctl copies the same certificate there.
- Configuration (`integrations/kueue/controller-manager-config.yaml` with the ports and cert folder
  filled in): `waitForPodsReady` on (all-or-nothing at pod level), `manageJobsWithoutQueueName:
  false` (only Jobs and PyTorchJobs with a queue-name label are Kueue's), the `batch/job` and
  `kubeflow.org/pytorchjob` integrations (their webhooks kept, the other kinds' dropped).
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
# Of Kueue's webhooks for other kinds, the PyTorchJob ones (kubeflow.org/pytorchjob integration).
WEBHOOK_KINDS = {("kubeflow.org", "pytorchjobs")}
METRICS_CERT_DIR = Path("/etc/kueue/metrics/certs")   # fixed in Kueue's cmd/kueue (no flag)
WEBHOOK_NAMES = {"MutatingWebhookConfiguration": "kueue-mutating-webhook-configuration",
                 "ValidatingWebhookConfiguration": "kueue-validating-webhook-configuration"}


def module_dir(integrations: Path) -> Path:
    version = pinned_version(integrations / "kueue", MODULE)
    return go_module_dir(MODULE, version or "", integrations / "kueue")


def crds(integrations: Path, port: int, ca_pem: bytes) -> list[dict]:
    """Kueue's CRDs; those Kueue converts get their conversion webhook on https://127.0.0.1:`port`/convert."""
    root = module_dir(integrations) / "config" / "components" / "crd"
    docs = [d for p in sorted((root / "bases").glob("*.yaml")) for d in yaml.safe_load_all(p.read_text()) if d]
    converted = conversion_webhooks(root)
    for doc in docs:
        if (conversion := converted.get(doc["metadata"]["name"])) is not None:
            doc["spec"]["conversion"] = on_loopback_conversion(conversion, port, ca_pem)
    return docs


def conversion_webhooks(crd_root: Path) -> dict[str, dict]:
    """CRD name -> `spec.conversion` of each `patches/webhook_in_*` patch Kueue's CRD kustomization uses."""
    kustomization = yaml.safe_load((crd_root / "kustomization.yaml").read_text()) or {}
    out = {}
    for entry in kustomization.get("patches") or []:
        path = entry.get("path", "") if isinstance(entry, dict) else str(entry)
        if not Path(path).name.startswith("webhook_in_"):
            continue
        patch = yaml.safe_load((crd_root / path).read_text())
        conversion = (patch.get("spec") or {}).get("conversion") or {}
        if conversion.get("strategy") == "Webhook":
            out[patch["metadata"]["name"]] = conversion
    return out


def on_loopback_conversion(conversion: dict, port: int, ca_pem: bytes) -> dict:
    import base64

    hook = conversion.get("webhook") or {}
    path = ((hook.get("clientConfig") or {}).get("service") or {}).get("path") or "/convert"
    return {"strategy": "Webhook",
            "webhook": {"clientConfig": {"url": f"https://127.0.0.1:{port}{path}",
                                         "caBundle": base64.b64encode(ca_pem).decode()},
                        "conversionReviewVersions": hook.get("conversionReviewVersions") or ["v1"]}}


def self_signed(cert_dir: Path) -> tuple[Path, Path]:
    """tls.crt / tls.key (controller-runtime's file names) for 127.0.0.1; the cert is its own CA."""
    return webhooks.self_signed(cert_dir, "kueue-webhook.gangctl.local")


def webhook_configurations(integrations: Path, port: int, ca_pem: bytes) -> list[dict]:
    """Kueue's webhook configurations for Jobs and Kueue objects, reached on 127.0.0.1:`port`."""
    src = module_dir(integrations) / "config" / "components" / "webhook" / "manifests.yaml"

    def ours(hook: dict) -> bool:
        rules = hook.get("rules") or []
        groups = {g for rule in rules for g in rule.get("apiGroups") or []}
        kinds = {(g, r) for rule in rules for g in rule.get("apiGroups") or [] for r in rule.get("resources") or []}
        return bool(groups) and (groups <= WEBHOOK_GROUPS or kinds <= WEBHOOK_KINDS)

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
    cert, key = self_signed(cert_dir)
    METRICS_CERT_DIR.mkdir(parents=True, exist_ok=True)
    for src in (cert, key):   # the one machine-wide file a local Kueue needs; each cluster's own cert is as good
        target = METRICS_CERT_DIR / src.name
        if not target.exists() or target.read_bytes() != src.read_bytes():
            target.write_bytes(src.read_bytes())
            target.chmod(0o600)
    webhook, health, metrics = free_ports(3)
    ports = {"webhook": webhook, "health": health, "metrics": metrics}
    conf_path = state / "kueue-config.yaml"
    conf_path.parent.mkdir(parents=True, exist_ok=True)
    conf_path.write_text(yaml.safe_dump(configuration(settings.integrations_dir, ports, cert_dir), sort_keys=False))
    env = dict(os.environ, KUBECONFIG=str(kubeconfig))
    argv = [str(bin_dir / "kueue"), f"--config={conf_path}", "--zap-log-level=2"]
    return schedulers.Process("kueue", argv, env), ports
