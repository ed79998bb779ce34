"""gangctl as a Deployment inside the local cluster (`deploy/overlays/local`, pods on process nodes):
install it, read its pods and its leader Lease, and remove what the install added.

Used by tests/integration/test_in_cluster.py and benchmarks/leader_failover.py. The install is
`kubectl apply --server-side -k deploy/overlays/local`, as a user runs it; `uninstall` deletes only
the objects that were not there before (so the CRDs and the ClusterTrainingRuntimes `cluster up`
installed, and any namespace that existed, stay) and the replicas' Lease, and waits until they are gone.
"""
from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import yaml

from gangctl.config import REPO_ROOT
from gangctl.kube.client import ApiError, Kube

OVERLAY = REPO_ROOT / "deploy" / "overlays" / "local"
NAMESPACE = "gangctl-system"
LEASE = "gangctl-controller"
DEPLOYMENT = "gangctl-controller"
SERVICE_ACCOUNT = "gangctl"
POD_SELECTOR = "app.kubernetes.io/name=gangctl,app.kubernetes.io/component=controller"
LEASE_PATH = f"/apis/coordination.k8s.io/v1/namespaces/{NAMESPACE}/leases/{LEASE}"
KEEP_KINDS = ("CustomResourceDefinition",)  # never removed: other tests and TrainJobs need them


def kubectl(kubeconfig: Path, *args: str, stdin: str | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(["kubectl", *args], input=stdin, capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, "KUBECONFIG": str(kubeconfig)})


def manifests(overlay: Path = OVERLAY) -> list[dict]:
    out = subprocess.run(["kubectl", "kustomize", str(overlay)], check=True, capture_output=True, text=True).stdout
    return [d for d in yaml.safe_load_all(out) if d]


def _key(obj: dict) -> tuple[str, str, str]:
    meta = obj["metadata"]
    return obj["kind"], meta.get("namespace") or "", meta["name"]


def install(kubeconfig: Path, overlay: Path = OVERLAY) -> list[dict]:
    """Apply the overlay; returns the objects it created (the ones to remove afterwards)."""
    docs = manifests(overlay)
    listed = kubectl(kubeconfig, "get", "--ignore-not-found", "-o", "json", "-f", "-", stdin=yaml.safe_dump_all(docs))
    if listed.returncode != 0:
        raise RuntimeError(f"kubectl get -f: {listed.stderr}")
    out = json.loads(listed.stdout) if listed.stdout.strip() else {"items": []}
    existing = {_key(o) for o in (out.get("items") if out.get("kind") == "List" else [out])}
    applied = kubectl(kubeconfig, "apply", "--server-side", "-k", str(overlay))
    if applied.returncode != 0:
        raise RuntimeError(f"kubectl apply --server-side -k {overlay}: {applied.stderr}")
    return [d for d in docs if _key(d) not in existing]


def uninstall(kubeconfig: Path, made: list[dict], timeout: float = 90) -> None:
    """Delete what `install` created (not the CRDs), the Deployment first so its pods stop while their
    namespace still exists, and wait until every object is gone."""
    removable = [d for d in made if d["kind"] not in KEEP_KINDS]
    first = [d for d in removable if d["kind"] == "Deployment"]
    later = [d for d in removable if d["kind"] != "Deployment"]
    for batch in (first, later):
        if batch:
            done = kubectl(kubeconfig, "delete", "--ignore-not-found", "--wait=true", f"--timeout={timeout:.0f}s",
                           "-f", "-", stdin=yaml.safe_dump_all(batch), timeout=timeout + 30)
            if done.returncode != 0:
                raise RuntimeError(f"kubectl delete: {done.stderr}")
    # the replicas' Lease is no manifest's: when gangctl-system was there before, it would stay
    lease = kubectl(kubeconfig, "delete", "lease", "-n", NAMESPACE, LEASE, "--ignore-not-found")
    if lease.returncode != 0 and "NotFound" not in lease.stderr:
        raise RuntimeError(f"kubectl delete lease: {lease.stderr}")


async def controller_pods(kube: Kube) -> list[dict]:
    """The Deployment's pods that are not being deleted."""
    pods = (await kube.get(f"/api/v1/namespaces/{NAMESPACE}/pods", labelSelector=POD_SELECTOR))["items"]
    return [p for p in pods if not p["metadata"].get("deletionTimestamp")]


async def lease_holder(kube: Kube) -> str | None:
    """The pod name in the Lease's holderIdentity (`<pod>_<random>`), None if nobody holds it."""
    try:
        lease = await kube.get(LEASE_PATH)
    except ApiError as err:
        if err.not_found:
            return None
        raise
    holder = (lease.get("spec") or {}).get("holderIdentity") or ""
    return holder.rsplit("_", 1)[0] or None


def descendants(pid: int) -> list[int]:
    """Every process below `pid` (the shim of a process-node container), through /proc children."""
    found, todo = [], [pid]
    while todo:
        p = todo.pop()
        try:
            tasks = os.listdir(f"/proc/{p}/task")
        except OSError:
            continue
        for task in tasks:
            try:
                kids = [int(c) for c in Path(f"/proc/{p}/task/{task}/children").read_text().split()]
            except OSError:
                continue
            found += kids
            todo += kids
    return found


def controller_process(pod: dict) -> tuple[int, list[str], dict[str, str]] | None:
    """pid, argv and environment of the `gangctl controller` process of a pod on a process node."""
    cid = ((pod.get("status") or {}).get("containerStatuses") or [{}])[0].get("containerID") or ""
    if not cid.startswith("process://"):
        return None
    for pid in descendants(int(cid.split("://", 1)[1])):
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")
            environ = Path(f"/proc/{pid}/environ").read_bytes().decode(errors="replace").split("\0")
        except OSError:
            continue
        if "controller" in argv and any(a.endswith("gangctl") for a in argv[:2]):
            return pid, argv, dict(e.split("=", 1) for e in environ if "=" in e)
    return None
