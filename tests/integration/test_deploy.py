"""deploy/ against the real API server: it accepts every object (server-side dry run, Pod Security
admission included), and its RBAC, really applied, gives gangctl's ServiceAccount what the code calls
and nothing like Secrets or wildcards, as the API server's own authorizer answers.
"""
from __future__ import annotations

import asyncio
import copy
import os
import subprocess
from pathlib import Path

import pytest
import yaml

from gangctl.kube.client import Kube
from tests.unit.test_deploy import CLUSTER, DEPLOY, OWN_SECRET, SA, derived_permissions, kustomize

pytestmark = pytest.mark.integration

USER = f"system:serviceaccount:{SA[0]}:{SA[1]}"
GROUPS = ["system:serviceaccounts", f"system:serviceaccounts:{SA[0]}", "system:authenticated"]
FIELD_MANAGER = "gangctl-deploy-test"
RBAC_KINDS = ("ServiceAccount", "Role", "ClusterRole", "RoleBinding", "ClusterRoleBinding")


def kubectl(kubeconfig: Path, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(["kubectl", *args], input=stdin, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "KUBECONFIG": str(kubeconfig)})


async def exists(kube: Kube, path: str) -> bool:
    return await kube.exists(path)


@pytest.fixture(scope="module")
async def installed_rbac(kubeconfig: Path, kube: Kube):
    """deploy/'s namespaces and RBAC objects, really applied; removed afterwards (a namespace only if
    this test made it; one that was there keeps its objects and loses the labels applied here)."""
    docs = kustomize(DEPLOY)
    namespaces = [d for d in docs if d["kind"] == "Namespace"]
    made = [ns["metadata"]["name"] for ns in namespaces
            if not await exists(kube, f"/api/v1/namespaces/{ns['metadata']['name']}")]
    objects = namespaces + [d for d in docs if d["kind"] in RBAC_KINDS]
    applied = kubectl(kubeconfig, "apply", "--server-side", f"--field-manager={FIELD_MANAGER}", "-f", "-",
                      stdin=yaml.safe_dump_all(objects))
    assert applied.returncode == 0, applied.stderr
    yield docs
    rbac = [d for d in docs if d["kind"] in RBAC_KINDS]
    kubectl(kubeconfig, "delete", "--ignore-not-found", "--wait=false", "-f", "-", stdin=yaml.safe_dump_all(rbac))
    for ns in namespaces:
        name = ns["metadata"]["name"]
        if name in made:
            kubectl(kubeconfig, "delete", "namespace", name, "--wait=false")
        else:  # give back the labels: apply the bare namespace under the same field manager
            kubectl(kubeconfig, "apply", "--server-side", f"--field-manager={FIELD_MANAGER}", "-f", "-",
                    stdin=yaml.safe_dump({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}}))


@pytest.mark.parametrize("path", ["deploy", "deploy/overlays/local"])
async def test_api_server_accepts_the_install(kubeconfig: Path, installed_rbac, path: str):
    root = DEPLOY.parent
    result = kubectl(kubeconfig, "apply", "--server-side", "--dry-run=server", "-k", str(root / path))
    assert result.returncode == 0, result.stderr
    applied = [line for line in result.stdout.splitlines() if "(server dry run)" in line]
    assert len(applied) == len(kustomize(root / path)), result.stdout
    # gangctl-system warns on (and enforces) the restricted profile: a Deployment whose pods would
    # be refused gets a warning back
    assert "PodSecurity" not in result.stderr, result.stderr


async def test_pod_security_admission_would_refuse_a_weaker_pod(kubeconfig: Path, installed_rbac):
    """The control for the test above: the same Deployment without its restricted fields is warned about."""
    (dep,) = [copy.deepcopy(d) for d in installed_rbac if d["kind"] == "Deployment"]
    container = dep["spec"]["template"]["spec"]["containers"][0]
    container["securityContext"].pop("allowPrivilegeEscalation")
    container["securityContext"].pop("capabilities")
    result = kubectl(kubeconfig, "apply", "--server-side", "--dry-run=server", "-f", "-", stdin=yaml.safe_dump(dep))
    assert result.returncode == 0, result.stderr
    assert 'would violate PodSecurity "restricted' in result.stderr, result.stderr


def prometheus_operator_crds() -> list[dict]:
    """ServiceMonitor and PrometheusRule CRDs at the version integrations/prometheus-operator pins."""
    from gangctl.cluster.build import pinned_version
    from gangctl.cluster.local import go_module_dir

    wrapper = DEPLOY.parent / "integrations" / "prometheus-operator"
    module = "github.com/prometheus-operator/prometheus-operator"
    root = go_module_dir(module, pinned_version(wrapper, module) or "", wrapper) / "example" / "prometheus-operator-crd"
    return [yaml.safe_load((root / f"monitoring.coreos.com_{plural}.yaml").read_text())
            for plural in ("servicemonitors", "prometheusrules")]


async def test_monitoring_overlay_is_valid_for_prometheus_operator(kubeconfig: Path, kube: Kube, installed_rbac):
    """With prometheus-operator's CRDs installed, the API server accepts deploy/overlays/monitoring
    (strict field validation: a field the CRD does not know fails)."""
    crds = prometheus_operator_crds()
    made = [c["metadata"]["name"] for c in crds
            if not await exists(kube, f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{c['metadata']['name']}")]
    try:
        applied = kubectl(kubeconfig, "apply", "--server-side", f"--field-manager={FIELD_MANAGER}", "-f", "-",
                          stdin=yaml.safe_dump_all(crds))
        assert applied.returncode == 0, applied.stderr
        ready = kubectl(kubeconfig, "wait", "--for=condition=Established", "--timeout=30s",
                        *[f"crd/{c['metadata']['name']}" for c in crds])
        assert ready.returncode == 0, ready.stderr
        path = DEPLOY / "overlays" / "monitoring"
        result = kubectl(kubeconfig, "apply", "--server-side", "--dry-run=server", "-k", str(path))
        assert result.returncode == 0, result.stderr
        applied_kinds = {line.split("/")[0] for line in result.stdout.splitlines() if "(server dry run)" in line}
        assert {"servicemonitor.monitoring.coreos.com", "prometheusrule.monitoring.coreos.com"} <= applied_kinds, result.stdout
        assert len(result.stdout.splitlines()) == len(kustomize(path)), result.stdout
    finally:
        for name in made:
            kubectl(kubeconfig, "delete", "crd", name, "--wait=false")


async def allowed(kube: Kube, attributes: dict) -> bool:
    review = await kube.create("/apis/authorization.k8s.io/v1/subjectaccessreviews", {
        "apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview",
        "spec": {"user": USER, "groups": GROUPS, **attributes}})
    return bool(review["status"].get("allowed"))


async def test_service_account_may_do_what_the_code_calls_and_no_more(kubeconfig: Path, kube: Kube, installed_rbac):
    needed, problems = await asyncio.to_thread(derived_permissions)  # it runs an event loop of its own
    assert not problems
    refused = []
    for scope, group, resource, verb in sorted(needed):
        plural, _, sub = resource.partition("/")
        attrs = {"group": group, "resource": plural, "subresource": sub, "verb": verb}
        if plural == "secrets" and verb != "create":  # granted for gangctl's own Secret only
            attrs["name"] = OWN_SECRET
        # a cluster-wide need: any namespace (the SAR with no namespace asks for all of them)
        if not await allowed(kube, {"resourceAttributes": attrs if scope == CLUSTER else {**attrs, "namespace": scope}}):
            refused.append((scope, group, resource, verb))
    assert not refused, f"the API server refuses {USER}: {refused}"

    # what it must not do, asked the same way
    for attrs in ({"resource": "secrets", "verb": "get"}, {"resource": "secrets", "verb": "list", "namespace": SA[0]},
                  {"resource": "secrets", "verb": "get", "namespace": SA[0], "name": "someone-elses"},
                  {"resource": "secrets", "verb": "watch", "namespace": SA[0], "name": OWN_SECRET},
                  {"resource": "configmaps", "verb": "list"},  # only in gangctl-system
                  {"resource": "configmaps", "verb": "update", "namespace": SA[0]},
                  {"group": "coordination.k8s.io", "resource": "leases", "verb": "update", "namespace": "kube-system"},
                  {"group": "rbac.authorization.k8s.io", "resource": "clusterroles", "verb": "create"},
                  {"resource": "pods", "verb": "update", "namespace": "default"},
                  {"resource": "nodes", "verb": "patch"},  # it reads Nodes (restart mode, placement), never changes them
                  {"resource": "nodes", "subresource": "status", "verb": "patch"},
                  {"resource": "pods", "subresource": "status", "verb": "patch"}):
        assert not await allowed(kube, {"resourceAttributes": attrs}), attrs

    # kubectl's own view of everything it may do, per namespace: no wildcard, and no Secrets but its
    # own in its namespace (the progress endpoint's CA and certificate, which it makes)
    for namespace in ("default", SA[0], "kubeflow-system"):
        listing = kubectl(kubeconfig, "auth", "can-i", "--list", f"--as={USER}", "-n", namespace)
        assert listing.returncode == 0, listing.stderr
        rows = [line.split() for line in listing.stdout.splitlines()[1:] if line.strip()]
        assert rows, listing.stdout
        for row in rows:
            resource, verbs = row[0], " ".join(row[1:])
            if resource.startswith("["):  # a non-resource URL row (/api/*, /healthz…: system:discovery)
                continue
            if resource.split(".")[0].split("/")[0] == "secrets":
                assert namespace == SA[0] and (row[1:] == ["[]", "[]", "[create]"] or
                                               row[1:] == ["[]", f"[{OWN_SECRET}]", "[get", "update]"]), row
            assert "*" not in resource and "[*]" not in verbs and " * " not in f" {verbs} ", row


async def test_a_backend_the_controller_may_not_read_is_skipped_with_one_line(kube: Kube, kubeconfig: Path, tmp_path):
    """Helm's backends.coscheduling.enabled=false on a cluster that serves Coscheduling's PodGroups:
    the controller is not granted them, so it skips that backend (one log line) and gets ready,
    instead of an informer refused with 403 for ever."""
    import uuid

    from gangctl.processes import ControllerProcess, free_port
    from tests.integration.conftest import least_privilege_kubeconfig

    group = "scheduling.x-k8s.io"
    assert await exists(kube, f"/apis/{group}/v1alpha1"), "the session cluster serves Coscheduling's PodGroups"
    config = await least_privilege_kubeconfig(kube, kubeconfig, tmp_path / "no-cosched.yaml", sa="gangctl-suite-nocs",
                                              without_groups=(group,))
    namespace = f"nocs-{uuid.uuid4().hex[:6]}"  # watch an empty namespace: it changes nothing the suite's controller runs
    await kube.create("/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}})
    ctl = ControllerProcess(config, tmp_path / "controller.log", env={
        "GANGCTL_NAMESPACE": namespace, "GANGCTL_TRAINER_STATUS_BIND_ADDRESS": f"127.0.0.1:{free_port()}"})
    try:
        ctl.start()
        await asyncio.to_thread(ctl.wait_ready)  # every informer synced: none is stuck on 403
        log = ctl.log_path.read_text()
    finally:
        ctl.stop()
        await kube.delete(f"/api/v1/namespaces/{namespace}")
    skipped = [line for line in log.splitlines() if "gang backend coscheduling skipped" in line]
    assert len(skipped) == 1 and "backends.coscheduling.enabled" in skipped[0], log[-3000:]
    assert "403" not in log, log[-3000:]
