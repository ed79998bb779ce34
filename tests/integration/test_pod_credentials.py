"""Process nodes give pods what kubelet gives them to reach the API, on the real cluster: a
ServiceAccount token from the TokenRequest API (bound to the pod, refreshed), ca.crt and namespace
at /var/run/secrets/kubernetes.io/serviceaccount, KUBERNETES_SERVICE_HOST/PORT that reach the
apiserver with TLS verified; never the agent's own kubeconfig; and a kubelet API that only the
apiserver (a client certificate of the cluster CA, authorized) may call.
"""
from __future__ import annotations

import asyncio
import json
import os
import ssl
import subprocess
import sys
import textwrap
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from gangctl.api.resources import NODES, PODS
from gangctl.cluster.build import ensure_coredns
from gangctl.config import ClusterSettings
from gangctl.kube.client import Kube
from gangctl.nodeagent import launch
from tests.integration.conftest import process_node_test_state
from tests.integration.helpers import eventually

pytestmark = pytest.mark.integration

SA_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"
ROTATING_NODE_INDEX = 30  # pod subnet 10.244.31.0/24, clear of the other tests' agents
TOKEN_MAX_AGE = 3  # seconds: that agent replaces tokens this often (kubelet: 24 h, or 80 % of 3607 s)

# Lists the pods of its namespace the way an in-cluster controller does; also reports what it can
# see of the agent's credentials.
IN_CLUSTER = """
import asyncio, json, os
from kubernetes_asyncio import client, config

def peek(path):
    try:
        return os.listdir(path) if os.path.isdir(path) else open(path).read()
    except OSError as err:
        return f"error {err.errno}"

async def main():
    config.load_incluster_config()
    async with client.ApiClient() as api:
        ns = open("/var/run/secrets/kubernetes.io/serviceaccount/namespace").read()
        pods = await client.CoreV1Api(api).list_namespaced_pod(ns)
    print("RESULT " + json.dumps({
        "pods": [p.metadata.name for p in pods.items],
        "files": sorted(os.listdir("/var/run/secrets/kubernetes.io/serviceaccount")),
        "env": {k: v for k, v in os.environ.items() if k.startswith("KUBE") or "CERT" in k or "TOKEN" in k},
        "kubeconfig": peek(os.environ["AGENT_KUBECONFIG"]),
        "pki": peek(os.environ["AGENT_PKI"]),
    }))

asyncio.run(main())
"""

# Waits for the token file to change, then proves the new token works (plain urllib, verified TLS).
ROTATION = """
import base64, json, os, ssl, time, urllib.request
d = "/var/run/secrets/kubernetes.io/serviceaccount"
first = open(f"{d}/token").read()
deadline = time.time() + 60
while open(f"{d}/token").read() == first and time.time() < deadline:
    time.sleep(0.2)
token = open(f"{d}/token").read()
claims = json.loads(base64.urlsafe_b64decode(token.split(".")[1] + "=="))
ctx = ssl.create_default_context(cafile=f"{d}/ca.crt")
host, port = os.environ["KUBERNETES_SERVICE_HOST"], os.environ["KUBERNETES_SERVICE_PORT"]
req = urllib.request.Request(f"https://{host}:{port}/api/v1/namespaces/{open(f'{d}/namespace').read()}/pods",
                             headers={"Authorization": f"Bearer {token}"})
items = json.load(urllib.request.urlopen(req, context=ctx))["items"]
print("RESULT " + json.dumps({"rotated": token != first, "bound_pod": claims["kubernetes.io"]["pod"]["name"],
                              "pods": len(items)}))
"""

NO_TOKEN = """
import json, os
print("RESULT " + json.dumps({"secrets": os.path.exists("/var/run/secrets/kubernetes.io")}))
"""


def pod(name: str, script: str, *, sa: str = "default", node: str | None = None, env: dict | None = None,
        automount: bool | None = None) -> dict:
    spec: dict = {
        "serviceAccountName": sa,
        "restartPolicy": "Never",
        "terminationGracePeriodSeconds": 2,
        "nodeSelector": {"gangctl.io/process-node": "true", **({"kubernetes.io/hostname": node} if node else {})},
        "tolerations": [{"key": "gangctl.io/process-node", "operator": "Exists", "effect": "NoSchedule"}],
        "containers": [{"name": "main", "image": "python", "command": ["python", "-c", textwrap.dedent(script)],
                        "env": [{"name": k, "value": v} for k, v in (env or {}).items()]}],
    }
    if automount is not None:
        spec["automountServiceAccountToken"] = automount
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec}


def kubectl(kubeconfig: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["kubectl", *args], env=dict(os.environ, KUBECONFIG=str(kubeconfig)),
                          capture_output=True, text=True, timeout=60)


async def finished(kube: Kube, ns: str, name: str, timeout: float = 60) -> dict:
    seen: dict = {}

    async def done() -> bool:
        seen["pod"] = await kube.get(PODS.path(ns, name))
        return seen["pod"]["status"].get("phase") in ("Succeeded", "Failed")
    try:
        await eventually(done, timeout, f"pod {name} to finish")
    except AssertionError as err:
        raise AssertionError(f"{err}; its status: {json.dumps(seen.get('pod', {}).get('status'))}") from None
    return seen["pod"]


def result(kubeconfig: Path, ns: str, name: str) -> dict:
    """The pod's RESULT line, read with `kubectl logs` (through the apiserver and the kubelet API)."""
    logs = kubectl(kubeconfig, "logs", "-n", ns, name)
    assert logs.returncode == 0, logs.stderr
    line = next((ln for ln in logs.stdout.splitlines() if ln.startswith("RESULT ")), None)
    assert line, f"pod {name} printed no RESULT:\n{logs.stdout}"
    return json.loads(line[len("RESULT "):])


async def service_account_with_view(kube: Kube, ns: str, name: str) -> None:
    await kube.create(f"/api/v1/namespaces/{ns}/serviceaccounts",
                      {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": name}})
    await kube.create(f"/apis/rbac.authorization.k8s.io/v1/namespaces/{ns}/rolebindings", {
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding", "metadata": {"name": f"{name}-view"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "view"},
        "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": ns}]})


@pytest.fixture(scope="module")
def rotating_node(cluster_settings: ClusterSettings, kubeconfig: Path, process_nodes):
    """One more agent that replaces tokens every few seconds (the pod network is process_nodes')."""
    state = process_node_test_state(cluster_settings) / "creds"
    coredns = ensure_coredns(cluster_settings.integrations_dir, cluster_settings.bin_root)
    [name] = launch.start(cluster_settings.cluster_name, kubeconfig, 1, state, coredns, prefix="creds-rotating",
                          first_index=ROTATING_NODE_INDEX, token_max_age=TOKEN_MAX_AGE)
    yield name
    launch.stop(cluster_settings.cluster_name, state)
    subprocess.run(["kubectl", "delete", "node", name, "--wait=false"],
                   env=dict(os.environ, KUBECONFIG=str(kubeconfig)), capture_output=True)


async def test_in_cluster_client_lists_pods_and_never_sees_the_agents_credentials(kube, namespace, kubeconfig,
                                                                                 process_nodes):
    await service_account_with_view(kube, namespace, "reader")
    pki = Path(kubeconfig).parent / "pki"
    await kube.create(PODS.path(namespace), pod("lister", IN_CLUSTER, sa="reader", env={
        "AGENT_KUBECONFIG": str(kubeconfig), "AGENT_PKI": str(pki)}))
    p = await finished(kube, namespace, "lister")
    out = result(kubeconfig, namespace, "lister")
    assert p["status"]["phase"] == "Succeeded", out
    assert out["pods"] == ["lister"]
    assert out["files"] == ["ca.crt", "namespace", "token"]
    env = out["env"]
    assert env["KUBERNETES_SERVICE_HOST"] == (await kube.get("/api/v1/namespaces/default/services/kubernetes")
                                              )["spec"]["clusterIP"]
    assert env["KUBERNETES_SERVICE_PORT"] == "443" and env["KUBERNETES_PORT_443_TCP_PROTO"] == "tcp"
    assert not {"KUBECONFIG"} & set(env) and not [k for k in env if "CERT" in k or "TOKEN" in k]
    assert out["kubeconfig"] == "" and out["pki"] == []  # covered up: /dev/null and an empty tmpfs
    assert "client-key" in Path(kubeconfig).read_text()  # …only inside the pod


async def test_token_is_refreshed_and_the_new_one_works(kube, namespace, kubeconfig, rotating_node):
    await service_account_with_view(kube, namespace, "rotator")
    await eventually(lambda: _ready(kube, rotating_node), 30, f"node {rotating_node} Ready")
    await kube.create(PODS.path(namespace), pod("rotate", ROTATION, sa="rotator", node=rotating_node))
    p = await finished(kube, namespace, "rotate", timeout=90)
    out = result(kubeconfig, namespace, "rotate")
    assert p["status"]["phase"] == "Succeeded", out
    assert out == {"rotated": True, "bound_pod": "rotate", "pods": 1}


async def _ready(kube: Kube, node: str) -> bool:
    try:
        n = await kube.get(NODES.path(name=node))
    except Exception:
        return False
    return any(c["type"] == "Ready" and c["status"] == "True" for c in n["status"].get("conditions", []))


async def test_no_token_when_automount_is_off(kube, namespace, kubeconfig, process_nodes):
    await kube.create(f"/api/v1/namespaces/{namespace}/serviceaccounts",
                      {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "quiet"},
                       "automountServiceAccountToken": False})
    await asyncio.gather(
        kube.create(PODS.path(namespace), pod("pod-off", NO_TOKEN, automount=False)),
        kube.create(PODS.path(namespace), pod("sa-off", NO_TOKEN, sa="quiet")))
    for name in ("pod-off", "sa-off"):
        p = await finished(kube, namespace, name)
        assert p["status"]["phase"] == "Succeeded"
        assert not any("serviceaccount" in (m["mountPath"]) for m in p["spec"]["containers"][0].get("volumeMounts", []))
        assert result(kubeconfig, namespace, name) == {"secrets": False}


async def test_a_pod_waits_for_a_missing_configmap_and_starts_once_it_exists(kube, namespace, kubeconfig,
                                                                             process_nodes):
    # kubelet keeps such a pod Pending and tries again. Every pod meets this for a moment: its token
    # volume names the kube-root-ca.crt ConfigMap, which kube-controller-manager publishes into a new
    # namespace shortly after the namespace exists.
    spec = pod("early", "print('RESULT ' + open('/var/run/secrets/late/greeting').read())")
    spec["spec"]["volumes"] = [{"name": "late", "projected": {"sources": [{"configMap": {"name": "late-config"}}]}}]
    spec["spec"]["containers"][0]["volumeMounts"] = [{"name": "late", "mountPath": "/var/run/secrets/late"}]
    await kube.create(PODS.path(namespace), spec)

    async def waiting() -> bool:
        p = await kube.get(PODS.path(namespace, "early"))
        states = [cs["state"].get("waiting") or {} for cs in p["status"].get("containerStatuses") or []]
        return any(w.get("reason") == "CreateContainerConfigError" and "late-config" in w.get("message", "")
                   for w in states)
    await eventually(waiting, 60, "pod early waiting on its missing ConfigMap")
    assert (await kube.get(PODS.path(namespace, "early")))["status"]["phase"] == "Pending"
    await kube.create(f"/api/v1/namespaces/{namespace}/configmaps", {
        "apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "late-config"}, "data": {"greeting": "1"}})
    p = await finished(kube, namespace, "early")
    assert p["status"]["phase"] == "Succeeded"
    assert result(kubeconfig, namespace, "early") == 1


def _kubelet_get(url: str, cafile: Path, cert: tuple[Path, Path] | None) -> int:
    ctx = ssl.create_default_context(cafile=str(cafile))  # the agent's own serving certificate
    if cert:
        ctx.load_cert_chain(*map(str, cert))
    try:
        return urllib.request.urlopen(url, context=ctx, timeout=10).status
    except urllib.error.HTTPError as err:
        return err.code


def _sign(tmp: Path, name: str, ca: tuple[Path, Path] | None) -> tuple[Path, Path]:
    """A client certificate CN=<name>, signed by `ca` (cert, key) or self-signed."""
    crt, key = tmp / f"{name}.crt", tmp / f"{name}.key"
    if ca is None:
        cmd = ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", key, "-out", crt, "-days", "1",
               "-subj", f"/O=system:masters/CN={name}"]
    else:
        csr = tmp / f"{name}.csr"
        subprocess.run(["openssl", "req", "-new", "-newkey", "rsa:2048", "-nodes", "-keyout", key, "-out", csr,
                        "-subj", f"/CN={name}"], check=True, capture_output=True)
        cmd = ["openssl", "x509", "-req", "-in", csr, "-CA", ca[0], "-CAkey", ca[1], "-CAcreateserial", "-out", crt,
               "-days", "1"]
    subprocess.run(list(map(str, cmd)), check=True, capture_output=True)
    return crt, key


async def test_kubelet_api_answers_only_the_apiserver(kube, namespace, kubeconfig, cluster_settings, process_nodes,
                                                      tmp_path):
    # pinned: the module's rotating node keeps its serving certificate elsewhere
    await kube.create(PODS.path(namespace), pod("talker", "print('RESULT {\"hello\": 1}')", node=process_nodes[0]))
    p = await finished(kube, namespace, "talker")
    assert result(kubeconfig, namespace, "talker") == {"hello": 1}  # kubectl logs: the apiserver's cert works
    node = await kube.get(NODES.path(name=p["spec"]["nodeName"]))
    port = node["status"]["daemonEndpoints"]["kubeletEndpoint"]["Port"]
    url = f"https://127.0.0.1:{port}/containerLogs/{namespace}/talker/main"
    serving = process_node_test_state(cluster_settings) / p["spec"]["nodeName"] / "pki" / "kubelet.crt"
    pki = Path(kubeconfig).parent / "pki"
    assert await asyncio.to_thread(_kubelet_get, url, serving, None) == 401
    stranger = _sign(tmp_path, "stranger", (pki / "ca.crt", pki / "ca.key"))  # cluster CA, no RBAC
    assert await asyncio.to_thread(_kubelet_get, url, serving, stranger) == 403
    forged = _sign(tmp_path, "forged", None)  # claims system:masters, another CA: no handshake
    with pytest.raises((ssl.SSLError, ConnectionError, urllib.error.URLError)):
        await asyncio.to_thread(_kubelet_get, url, serving, forged)
    assert await asyncio.to_thread(_kubelet_get, url, serving, (pki / "admin.crt", pki / "admin.key")) == 200


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-x", "-q"]))
