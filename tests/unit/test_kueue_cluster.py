"""gangctl.cluster.kueue: the CRDs Kueue converts get their conversion webhook on 127.0.0.1."""
from __future__ import annotations

import base64
from pathlib import Path

import yaml

from gangctl.cluster import kueue


def _crd_root(tmp_path: Path) -> Path:
    root = tmp_path / "crd"
    (root / "patches").mkdir(parents=True)
    (root / "kustomization.yaml").write_text(yaml.safe_dump({
        "resources": ["bases/kueue.x-k8s.io_clusterqueues.yaml", "bases/kueue.x-k8s.io_resourceflavors.yaml"],
        "patches": [{"path": "patches/webhook_in_clusterqueues.yaml"}],   # resourceflavors' is commented out
    }))
    for name in ("clusterqueues", "resourceflavors"):
        (root / "patches" / f"webhook_in_{name}.yaml").write_text(yaml.safe_dump({
            "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
            "metadata": {"name": f"{name}.kueue.x-k8s.io"},
            "spec": {"conversion": {"strategy": "Webhook", "webhook": {
                "clientConfig": {"service": {"namespace": "system", "name": "webhook-service", "path": "/convert"}},
                "conversionReviewVersions": ["v1"]}}}}))
    return root


def test_only_the_patches_the_kustomization_uses_give_a_conversion_webhook(tmp_path):
    assert set(kueue.conversion_webhooks(_crd_root(tmp_path))) == {"clusterqueues.kueue.x-k8s.io"}


def test_conversion_webhook_points_at_loopback():
    conv = kueue.on_loopback_conversion({"strategy": "Webhook", "webhook": {
        "clientConfig": {"service": {"name": "webhook-service", "path": "/convert"}},
        "conversionReviewVersions": ["v1"]}}, 9443, b"PEM")
    assert conv == {"strategy": "Webhook", "webhook": {
        "clientConfig": {"url": "https://127.0.0.1:9443/convert", "caBundle": base64.b64encode(b"PEM").decode()},
        "conversionReviewVersions": ["v1"]}}


def test_a_kustomization_without_patches_converts_nothing(tmp_path):
    root = tmp_path / "crd"
    root.mkdir()
    (root / "kustomization.yaml").write_text("resources: []\n")
    assert kueue.conversion_webhooks(root) == {}
