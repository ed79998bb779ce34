"""Admission webhooks of other projects' controllers, served on loopback.

Their manifests point at an in-cluster Service; the local cluster has none, so each webhook's
`clientConfig` is rewritten to `url: https://127.0.0.1:<port><path>` with a self-signed
certificate (IP SAN 127.0.0.1, its own CA) as `caBundle`. Used for Kueue (`cluster up --scheduler
kueue`) and for the peer controllers of the benchmark (Kubeflow Trainer, JobSet).
"""
from __future__ import annotations

import base64
import copy
import subprocess
from pathlib import Path
from typing import Callable, Iterable

import yaml

KINDS = ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration")
MANAGED_LABEL = {"gangctl.io/managed-by": "gangctl-cluster"}


def self_signed(cert_dir: Path, common_name: str = "webhook.gangctl.local") -> tuple[Path, Path]:
    """tls.crt / tls.key (controller-runtime's file names) for 127.0.0.1; the cert is its own CA."""
    cert, key = cert_dir / "tls.crt", cert_dir / "tls.key"
    if not cert.exists() or not key.exists():
        cert_dir.mkdir(parents=True, exist_ok=True)
        subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key),
                        "-out", str(cert), "-days", "3650", "-subj", f"/CN={common_name}",
                        "-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost",
                        "-addext", "basicConstraints=critical,CA:TRUE",
                        "-addext", "keyUsage=critical,digitalSignature,keyEncipherment,keyCertSign",
                        "-addext", "extendedKeyUsage=serverAuth"],
                       check=True, capture_output=True)
    return cert, key


def load(path: Path) -> list[dict]:
    """The webhook configurations in a manifest file (other documents are skipped)."""
    return [d for d in yaml.safe_load_all(path.read_text()) if d and d.get("kind") in KINDS]


def json_patch_replace(doc: dict, ops: Iterable[dict]) -> dict:
    """Apply the `replace`/`add` operations of a kustomize JSON6902 patch (paths like /webhooks/1)."""
    doc = copy.deepcopy(doc)
    for op in ops:
        if op.get("op") not in ("replace", "add"):
            raise ValueError(f"unsupported patch operation {op.get('op')!r}")
        *parents, last = [p for p in op["path"].split("/") if p]
        target = doc
        for part in parents:
            target = target[int(part)] if isinstance(target, list) else target[part]
        if isinstance(target, list):
            index = len(target) if last == "-" else int(last)
            if op["op"] == "add":
                target.insert(index, op["value"])
            else:
                target[index] = op["value"]
        else:
            target[last] = op["value"]
    return doc


def on_loopback(doc: dict, name: str, port: int, ca_pem: bytes,
                keep: Callable[[dict], bool] = lambda hook: True, timeout_seconds: int = 10) -> dict:
    """A copy of one webhook configuration named `name`, whose kept webhooks call 127.0.0.1:`port`."""
    doc = copy.deepcopy(doc)
    doc["metadata"] = {"name": name, "labels": dict(MANAGED_LABEL)}
    kept = []
    for hook in doc.get("webhooks") or []:
        if not keep(hook):
            continue
        path = hook["clientConfig"]["service"]["path"]
        hook["clientConfig"] = {"url": f"https://127.0.0.1:{port}{path}",
                                "caBundle": base64.b64encode(ca_pem).decode()}
        hook["timeoutSeconds"] = timeout_seconds
        kept.append(hook)
    doc["webhooks"] = kept
    return doc
