"""What a process node gives a pod to reach the API (pure translations; one real shim run as root)."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from gangctl.nodeagent.kubeletauth import access_review, caller_from_cert, kubeconfig_ca, node_attributes
from gangctl.nodeagent.spec import SpecError, process_specs
from gangctl.nodeagent.volumes import (ConfigMapFiles, config_map_files, container_mounts, hidden_paths,
                                       kubernetes_service_env, projected_volumes, refresh_after, service_account,
                                       token_request, under_secrets_root)
from gangctl.sim import objects

# The volume the ServiceAccount admission plugin adds (as read back from the apiserver).
KUBE_API_ACCESS = {"name": "kube-api-access-x7k2p", "projected": {"defaultMode": 420, "sources": [
    {"serviceAccountToken": {"expirationSeconds": 3607, "path": "token"}},
    {"configMap": {"name": "kube-root-ca.crt", "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
    {"downwardAPI": {"items": [{"path": "namespace", "fieldRef": {"apiVersion": "v1",
                                                                  "fieldPath": "metadata.namespace"}}]}}]}}
SA_MOUNT = {"name": "kube-api-access-x7k2p", "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount",
            "readOnly": True}


def pod(volumes=(KUBE_API_ACCESS,), mounts=(SA_MOUNT,), **spec) -> dict:
    return objects.pod("p", namespace="team-a", uid="u-1", serviceAccountName="trainer", volumes=list(volumes),
                       containers=[{"name": "main", "command": ["python"], "volumeMounts": list(mounts)}], **spec)


def test_the_admission_plugins_volume_becomes_token_ca_and_namespace_files():
    vols = projected_volumes(pod(), allocatable={})
    vol = vols["kube-api-access-x7k2p"]
    assert [(t.path, t.audience, t.expiration_seconds) for t in vol.tokens] == [("token", None, 3607)]
    assert vol.config_maps == (ConfigMapFiles("kube-root-ca.crt", (("ca.crt", "ca.crt"),), False),)
    assert [(f.path, f.value) for f in vol.fields] == [("namespace", "team-a")]
    assert vol.mode == 0o644
    mounts = container_mounts(pod()["spec"]["containers"][0], vols)
    assert [(m.volume, m.path, m.read_only) for m in mounts] == [
        ("kube-api-access-x7k2p", "/var/run/secrets/kubernetes.io/serviceaccount", True)]
    assert under_secrets_root(mounts[0].path) and not under_secrets_root("/var/lib/x")


def test_no_volume_no_mount():
    """automountServiceAccountToken: false: the admission plugin adds no volume, so nothing is mounted."""
    p = pod(volumes=(), mounts=())
    assert projected_volumes(p, allocatable={}) == {}
    assert container_mounts(p["spec"]["containers"][0], {}) == []


def test_token_request_is_bound_to_the_pod_with_the_sources_audience():
    vols = projected_volumes(pod(volumes=[{"name": "vault", "projected": {"sources": [
        {"serviceAccountToken": {"audience": "vault", "expirationSeconds": 7200, "path": "t"}}]}}],
        mounts=[{"name": "vault", "mountPath": "/var/run/secrets/tokens"}]), allocatable={})
    body = token_request(pod(), vols["vault"].tokens[0])
    assert body["spec"] == {"expirationSeconds": 7200, "audiences": ["vault"],
                            "boundObjectRef": {"apiVersion": "v1", "kind": "Pod", "name": "p", "uid": "u-1"}}
    default = token_request(pod(), projected_volumes(pod(), allocatable={})["kube-api-access-x7k2p"].tokens[0])
    assert "audiences" not in default["spec"]  # the apiserver's own audience
    assert service_account(pod()) == "trainer" and service_account({"spec": {}}) == "default"


def test_refresh_at_80_percent_or_max_age():
    assert refresh_after(3607) == pytest.approx(2885.6)
    assert refresh_after(3607, max_age=5) == 5
    assert refresh_after(365 * 86400) == 24 * 3600  # kubelet's 24 h cap


@pytest.mark.parametrize("source", [{"secret": {"name": "s"}}, {"clusterTrustBundle": {"path": "b"}}])
def test_unsupported_projected_sources_are_config_errors(source):
    with pytest.raises(SpecError, match="not supported"):
        projected_volumes(pod(volumes=[{"name": "v", "projected": {"sources": [source]}}]), allocatable={})


def test_paths_stay_inside_the_volume_and_subpath_is_refused():
    bad = {"name": "v", "projected": {"sources": [{"serviceAccountToken": {"path": "../token"}}]}}
    with pytest.raises(SpecError, match="inside the volume"):
        projected_volumes(pod(volumes=[bad]), allocatable={})
    vols = projected_volumes(pod(), allocatable={})
    with pytest.raises(SpecError, match="subPath"):
        container_mounts({"name": "c", "volumeMounts": [dict(SA_MOUNT, subPath="token")]}, vols)


def test_config_map_items_and_optional():
    src = ConfigMapFiles("kube-root-ca.crt", (("ca.crt", "ca.crt"),), False)
    assert config_map_files(src, {"ca.crt": "PEM", "other": "x"}) == {"ca.crt": "PEM"}
    assert config_map_files(ConfigMapFiles("c", (), False), {"a": "1", "b": "2"}) == {"a": "1", "b": "2"}
    assert config_map_files(ConfigMapFiles("c", (), True), None) == {}
    with pytest.raises(SpecError, match="not found"):
        config_map_files(src, None)


def test_kubernetes_service_env_like_kubelet_and_container_env_wins():
    env = kubernetes_service_env("10.96.0.1", 443)
    assert env == {"KUBERNETES_SERVICE_HOST": "10.96.0.1", "KUBERNETES_SERVICE_PORT": "443",
                   "KUBERNETES_SERVICE_PORT_HTTPS": "443", "KUBERNETES_PORT": "tcp://10.96.0.1:443",
                   "KUBERNETES_PORT_443_TCP": "tcp://10.96.0.1:443", "KUBERNETES_PORT_443_TCP_PROTO": "tcp",
                   "KUBERNETES_PORT_443_TCP_PORT": "443", "KUBERNETES_PORT_443_TCP_ADDR": "10.96.0.1"}
    p = pod()
    p["spec"]["containers"][0]["env"] = [{"name": "KUBERNETES_SERVICE_PORT", "value": "6443"}]
    spec = process_specs(p, pod_ip="10.244.1.2", host_ip="127.0.0.1", allocatable={}, base_env={"PATH": "/v/bin"},
                         service_env=env)[0]
    assert spec.env["KUBERNETES_SERVICE_HOST"] == "10.96.0.1" and spec.env["KUBERNETES_SERVICE_PORT"] == "6443"
    assert "KUBECONFIG" not in spec.env


def test_pods_do_not_see_the_kubeconfig_or_its_keys():
    conf = {"users": [{"name": "admin", "user": {"client-certificate": "pki/admin.crt",
                                                 "client-key": "/abs/keys/admin.key"}}]}
    assert hidden_paths("/c/kubeconfig.yaml", conf, ["/state/pki", "/state/pki/"]) == [
        "/c/kubeconfig.yaml", "/c/pki", "/abs/keys", "/state/pki"]


def test_kubelet_api_callers():
    cert = {"subject": ((("organizationName", "system:masters"),), (("commonName", "kwok-admin"),))}
    caller = caller_from_cert(cert)
    assert caller.user == "kwok-admin" and caller.groups == ("system:masters",)
    assert caller_from_cert(None) is None and caller_from_cert({}) is None
    assert node_attributes("GET", "/containerLogs/ns/p/c") == ("get", "proxy")
    assert node_attributes("GET", "/stats/summary") == ("get", "stats")
    assert node_attributes("POST", "/exec/ns/p/c") == ("create", "proxy")
    review = access_review(caller, "n1", "get", "proxy")
    assert review["spec"]["resourceAttributes"] == {"verb": "get", "resource": "nodes", "subresource": "proxy",
                                                    "name": "n1"}
    assert review["spec"]["user"] == "kwok-admin"


def test_client_ca_from_the_kubeconfig():
    conf = {"current-context": "b", "clusters": [{"name": "a", "cluster": {"certificate-authority": "/a.crt"}},
                                                 {"name": "B", "cluster": {"certificate-authority": "pki/ca.crt"}}],
            "contexts": [{"name": "b", "context": {"cluster": "B"}}]}
    assert kubeconfig_ca(conf, "/c") == ("/c/pki/ca.crt", None)
    inline = {"clusters": [{"name": "a", "cluster": {"certificate-authority-data": "QUJD"}}]}
    assert kubeconfig_ca(inline, "/c") == (None, "QUJD")


@pytest.mark.skipif(os.geteuid() != 0, reason="mount namespaces need root")
def test_shim_mounts_volumes_read_only_and_hides_credentials(tmp_path):
    vol = tmp_path / "vol"
    vol.mkdir()
    (vol / "token").write_text("t1")
    secret = tmp_path / "kubeconfig.yaml"
    secret.write_text("client-key-data: SECRET")
    keys = tmp_path / "pki"
    keys.mkdir()
    (keys / "ca.key").write_text("KEY")
    target = "/var/run/secrets/kubernetes.io/serviceaccount"
    script = (f"import os; print(open('{target}/token').read()); print(repr(open('{secret}').read())); "
              f"print(os.listdir('{keys}'));\n"
              f"try:\n open('{target}/token','w')\nexcept OSError as e: print('ro', e.errno)")
    log, status = tmp_path / "0.log", tmp_path / "s.json"
    os.makedirs("/run/secrets", exist_ok=True)
    proc = subprocess.run([sys.executable, "-m", "gangctl.nodeagent.shim", "--log", str(log), "--status", str(status),
                           "--bind", f"{vol}:{target}", "--hide", str(secret), "--hide", str(keys), "--",
                           sys.executable, "-c", script], timeout=30)
    assert proc.returncode == 0, json.loads(status.read_text())
    out = [line.split(" ", 3)[3] for line in log.read_text().splitlines()]
    assert out == ["t1", "''", "[]", "ro 30"]  # EROFS
    assert not os.path.exists(target)  # nothing leaked to the host's mount namespace
    assert secret.read_text() == "client-key-data: SECRET"
