"""Small helpers the integration tests share: waiting, TrainJob manifests, reading pods."""
from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Awaitable, Callable

import aiohttp
import yaml
from prometheus_client.parser import text_string_to_metric_families

from gangctl.api.resources import JOBS, NODES, PODS, POD_GROUPS, PYTORCHJOBS, SERVICES, TRAINJOBS, Resource
from gangctl.cluster.local import KWOK_NODE_SELECTOR, KWOK_RUNTIME, KWOK_TOLERATION, LocalCluster
from gangctl.kube.client import ApiError, Kube
from gangctl.processes import ControllerProcess
from gangctl.runtime.controller import GANG_RESOURCES, served_backends, serves_pytorchjobs

KWOK_COMPLETE_DELAY = "pod-complete.stage.kwok.x-k8s.io/delay"
# KWOK completes a pod between `delay` and `jitter-delay`, and when jitter-delay (5 s unless set) is
# not above delay it uses jitter-delay alone: so both are set, or a "3600s" pod finishes after 5 s.
KWOK_COMPLETE_JITTER = "pod-complete.stage.kwok.x-k8s.io/jitter-delay"


async def eventually(check: Callable[[], Awaitable[bool]], timeout: float, what: str, interval: float = 0.2) -> float:
    """Wait until `check()` is true; returns the seconds it took, fails with `what` on timeout."""
    start = time.monotonic()
    while True:
        if await check():
            return time.monotonic() - start
        if time.monotonic() - start > timeout:
            raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")
        await asyncio.sleep(interval)


async def restart_apiserver(kube: Kube, cluster: LocalCluster, sig: int = signal.SIGTERM) -> tuple[float, float]:
    """Restart the real kube-apiserver (`sig`, SIGKILL after 10 s) and wait for its /readyz; returns
    (down, ready) wall-clock times, for the window in which the controller's 403s are excused."""
    down = time.time()
    await asyncio.to_thread(cluster.restart_component, "kube-apiserver", sig, 10)

    async def ready() -> bool:
        try:
            return await kube.text("/readyz", timeout=2) == "ok"
        except Exception:  # noqa: BLE001 - not listening yet
            return False
    await eventually(ready, 180, "kube-apiserver ready again", interval=0.1)
    return down, time.time()


def reserved_volume(name: str, namespace: str, claim: str) -> dict:
    """A 1 GiB PersistentVolume reserved for `claim` (claimRef), as an admin pre-provisions one (the
    local cluster has no provisioner); kube-controller-manager's PV controller binds them."""
    return {"apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": name},
            "spec": {"capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"], "storageClassName": "",
                     "hostPath": {"path": f"/tmp/gangctl-test-pv/{name}"}, "persistentVolumeReclaimPolicy": "Retain",
                     "claimRef": {"namespace": namespace, "name": claim}}}


async def volume_pod_scheduled(kube: Kube, namespace: str, timeout: float = 240) -> float:
    """After a test restarted the shared cluster's apiserver: wait until the cluster's own clients have
    caught up, so the next test meets the cluster as it found it. client-go's reflectors in
    kube-controller-manager and kube-scheduler back off after an outage, up to [30, 60) s, and keep that
    backoff for two quiet minutes: measured after an etcd compaction and an apiserver restart, a pod on a
    pre-bound claim waited 15 to 105 s (the PV controller binding the claim, then the scheduler). The probe
    is that pod: a PV reserved for a claim, the claim, a pod on a KWOK node mounting it; returns the seconds
    until it is bound to a node. The PV is deleted after; the claim and pod go with `namespace`."""
    pv, claim = f"{namespace}-probe", "probe"
    await kube.create("/api/v1/persistentvolumes", reserved_volume(pv, namespace, claim))
    try:
        await kube.create(f"/api/v1/namespaces/{namespace}/persistentvolumeclaims", {
            "apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": claim},
            "spec": {"accessModes": ["ReadWriteOnce"], "storageClassName": "",
                     "resources": {"requests": {"storage": "1Gi"}}}})
        await kube.create(PODS.path(namespace), {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": claim},
                                                 "spec": on_kwok_nodes({
                                                     "containers": [{"name": "c", "image": "probe",
                                                                     "volumeMounts": [{"name": "v", "mountPath": "/v"}]}],
                                                     "volumes": [{"name": "v", "persistentVolumeClaim": {"claimName": claim}}]})})

        async def scheduled() -> bool:
            return bool((await kube.get(PODS.path(namespace, claim)))["spec"].get("nodeName"))
        return await eventually(scheduled, timeout, "a pod on a pre-bound claim scheduled after the apiserver restart")
    finally:
        await kube.delete(f"/api/v1/persistentvolumes/{pv}")


RECONCILES = "gangctl_reconcile_duration_seconds_count"  # reconciles finished (the histogram's count)
QUEUE_DEPTH = "gangctl_workqueue_depth"                    # keys waiting, refreshed once a second
GAUGE_PERIOD = 1.0  # gangctl.runtime.controller.Controller._gauges sets the queue depth this often


async def scrape(url: str) -> dict[str, float]:
    """The controller's /metrics as {"name{label=value,...}": value} (histogram buckets left out)."""
    async with aiohttp.ClientSession() as session, session.get(url + "/metrics") as resp:
        assert resp.status == 200
        text = await resp.text()
    samples = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            labels = ",".join(f"{k}={v}" for k, v in sorted(s.labels.items()) if k != "le")
            if "le" not in s.labels:
                samples[f"{s.name}{{{labels}}}" if labels else s.name] = s.value
    return samples


async def reconciles(controller: ControllerProcess) -> float:
    """How many reconciles this controller process has finished so far (0 after a restart)."""
    return (await scrape(controller.url))[RECONCILES]


async def settled(controller: ControllerProcess, since: float, *, at_least: int = 1, timeout: float = 60) -> float:
    """Wait until the controller has worked off what a change handed it, so that something it did
    *not* do can be asserted: at least `at_least` reconciles finished past `since` (a `reconciles()`
    count taken before the change, or 0 for a freshly started process), then a quiet window longer
    than the queue gauge's period in which no reconcile finishes and every sample shows an empty work
    queue. Returns the reconcile count then. (A single reconcile running longer than the window would
    not be seen: the controller exports no in-flight gauge.)"""
    quiet_for = 1.5 * GAUGE_PERIOD
    start = time.monotonic()
    quiet_since: float | None = None
    last: float | None = None
    seen: dict[str, float] = {}
    while True:
        seen = await scrape(controller.url)
        now = time.monotonic()
        count, depth = seen[RECONCILES], seen[QUEUE_DEPTH]
        if count >= since + at_least and depth == 0 and count == last and quiet_since is not None:
            if now - quiet_since >= quiet_for:
                return count
        else:
            quiet_since = now
        last = count
        if now - start > timeout:
            raise AssertionError(f"timed out after {timeout:.0f}s waiting for the controller to settle: "
                                 f"{count:g} reconciles (needed {since + at_least:g}, then none for "
                                 f"{quiet_for:g}s), work queue depth {depth:g}")
        await asyncio.sleep(0.2)


def trainjob(name: str, namespace: str, *, nodes: int, gpus: int = 8, runtime: str = KWOK_RUNTIME,
             runtime_kind: str = "ClusterTrainingRuntime", run_for: str | None = "3600s",
             suspend: bool = False) -> dict:
    """A TrainJob as a user writes it for KWOK's GPU nodes (the shipped runtime torch-kwok-gpu, or a
    test's own runtime built with `on_kwok_nodes`); KWOK completes its pods after `run_for`."""
    spec: dict = {
        "runtimeRef": {"name": runtime, "kind": runtime_kind},
        "trainer": {"numNodes": nodes, "resourcesPerNode": {"limits": {"nvidia.com/gpu": str(gpus)}}},
    }
    if run_for:
        spec["podTemplateOverrides"] = [{"targetJobs": [{"name": "node"}],
                                         "metadata": {"annotations": {KWOK_COMPLETE_DELAY: run_for,
                                                                      KWOK_COMPLETE_JITTER: run_for}}}]
    if suspend:
        spec["suspend"] = True
    return {"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob",
            "metadata": {"name": name, "namespace": namespace}, "spec": spec}


def on_kwok_nodes(pod_spec: dict) -> dict:
    """A test runtime's pod spec, made for KWOK's fake nodes as KWOK's convention asks (select type=kwok,
    tolerate the kwok.x-k8s.io/node taint), as the shipped torch-kwok-gpu runtime is."""
    pod_spec["nodeSelector"] = {**(pod_spec.get("nodeSelector") or {}), **KWOK_NODE_SELECTOR}
    pod_spec["tolerations"] = [*(pod_spec.get("tolerations") or []), dict(KWOK_TOLERATION)]
    return pod_spec


async def submit(kube: Kube, obj: dict) -> dict:
    return await kube.create(TRAINJOBS.path(obj["metadata"]["namespace"]), obj)


async def get_trainjob(kube: Kube, namespace: str, name: str) -> dict:
    return await kube.get(TRAINJOBS.path(namespace, name))


async def running(kube: Kube, namespace: str, name: str) -> bool:
    """gangctl reports the TrainJob Running (status.gang.state: every pod of its gang is bound)."""
    return is_running(await get_trainjob(kube, namespace, name))


def gangctl_cli(*args: str, kubeconfig: Path | None = None, cluster_name: str | None = None,
                timeout: float = 120) -> subprocess.CompletedProcess:
    """`gangctl ARGS` as a user runs it (against that kubeconfig and local cluster name, when given)."""
    env = dict(os.environ)
    if kubeconfig is not None:
        env["KUBECONFIG"] = str(kubeconfig)
    if cluster_name is not None:
        env["GANGCTL_CLUSTER_NAME"] = cluster_name
    return subprocess.run([sys.executable, "-m", "gangctl.cli", *args], env=env, capture_output=True, text=True,
                          timeout=timeout)


def condition(obj: dict, ctype: str) -> dict | None:
    return next((c for c in (obj.get("status") or {}).get("conditions") or [] if c["type"] == ctype), None)


TRAINER_CONDITIONS = ("Suspended", "Complete", "Failed")
# Training Operator v1's, which a PyTorchJob's status keeps.
V1_CONDITIONS = ("Created", "Running", "Restarting", "Succeeded", "Failed", "Suspended")


def is_true(obj: dict, ctype: str) -> bool:
    """A condition is True. A TrainJob has only Kubeflow Trainer's (gangctl's own state is in
    `gang_state`); a PyTorchJob has Training Operator v1's."""
    kinds = V1_CONDITIONS if obj.get("kind") == "PyTorchJob" else TRAINER_CONDITIONS
    assert ctype in kinds, f"{ctype} is not a {obj.get('kind')} condition; for a TrainJob read gang_state()"
    cond = condition(obj, ctype)
    return bool(cond and cond["status"] == "True")


def gang_state(obj: dict) -> dict:
    """status.gang: gangctl's state (Pending, Waiting, Running, Suspended, Restarting, Complete, Failed),
    reason and message."""
    return (obj.get("status") or {}).get("gang") or {}


def is_running(obj: dict) -> bool:
    """Every pod of the gang is bound. Trainer's way holds too: no condition (the SDK says Running)."""
    running = gang_state(obj).get("state") == "Running"
    assert not running or not (obj.get("status") or {}).get("conditions"), obj.get("status")
    return running


def waiting_with(obj: dict, reason: str) -> bool:
    state = gang_state(obj)
    return (state.get("state"), state.get("reason")) == ("Waiting", reason)


async def pods_of(kube: Kube, namespace: str, name: str) -> list[dict]:
    listing = await kube.get(PODS.path(namespace), labelSelector=f"jobset.sigs.k8s.io/jobset-name={name}")
    return listing["items"]


def bound(pods: list[dict]) -> list[dict]:
    return [p for p in pods if p["spec"].get("nodeName")]


async def trainjob_state(kube: Kube, namespace: str, name: str) -> str:
    """What a failed wait shows: the TrainJob's conditions and elastic status, and each pod's node,
    phase and scheduling condition."""
    status = (await get_trainjob(kube, namespace, name)).get("status") or {}
    lines = [f"conditions {[(c.get('type'), c.get('status'), c.get('reason')) for c in status.get('conditions') or []]}",
             f"elastic {status.get('elastic')}"]
    lines += [pod_line(pod) for pod in await pods_of(kube, namespace, name)]
    return "\n".join(lines)


def pod_line(pod: dict) -> str:
    """A pod's node, phase and scheduling condition, for a failed wait's message."""
    scheduled = next((c for c in pod["status"].get("conditions") or [] if c.get("type") == "PodScheduled"), {})
    return (f"{pod['metadata']['name']} node={pod['spec'].get('nodeName')} phase={pod['status'].get('phase')} "
            f"deleting={bool(pod['metadata'].get('deletionTimestamp'))} "
            f"scheduled={scheduled.get('status')} {scheduled.get('reason', '')} {scheduled.get('message', '')}")


async def namespace_state(kube: Kube, namespace: str) -> str:
    """What a failed wait on a TrainJob's children shows: every Job of the namespace with its counts and
    conditions, every pod with its node, phase and scheduling condition, every claim with its phase."""
    lines = []
    for job in await jobs_in(kube, namespace):
        status = job.get("status") or {}
        lines.append(f"job {job['metadata']['name']} created={job['metadata']['creationTimestamp']} "
                     f"active={status.get('active', 0)} ready={status.get('ready', 0)} "
                     f"succeeded={status.get('succeeded', 0)} failed={status.get('failed', 0)} "
                     f"conditions={[(c.get('type'), c.get('status'), c.get('reason')) for c in status.get('conditions') or []]}")
    lines += ["pod " + pod_line(pod) for pod in (await kube.get(PODS.path(namespace)))["items"]]
    for claim in (await kube.get(f"/api/v1/namespaces/{namespace}/persistentvolumeclaims"))["items"]:
        lines.append(f"claim {claim['metadata']['name']} phase={(claim.get('status') or {}).get('phase')} "
                     f"volume={claim['spec'].get('volumeName')}")
    return "\n".join(lines)


async def nodes_state(kube: Kube, nodes: list[str], logs: list[Path] = ()) -> str:
    """What holds `nodes`, for a failed wait on a placement: each node's allocatable GPUs, every pod
    of any namespace bound to one of them or pending, and the last lines of `logs` (a scheduler's) that
    name one of them."""
    lines = []
    for name in nodes:
        node = await kube.get(NODES.path(name=name))
        lines.append(f"node {name} allocatable={node['status'].get('allocatable', {}).get('nvidia.com/gpu')} "
                     f"unschedulable={node['spec'].get('unschedulable', False)}")
    for pod in (await kube.get(PODS.path()))["items"]:
        meta, spec, status = pod["metadata"], pod["spec"], pod.get("status") or {}
        if status.get("phase") in ("Succeeded", "Failed") or spec.get("nodeName") not in (*nodes, None):
            continue
        owners = ",".join(f"{o['kind']}/{o['name']}" for o in meta.get("ownerReferences") or [])
        lines.append(f"pod {meta['namespace']}/{meta['name']} owner={owners} node={spec.get('nodeName')} "
                     f"nominated={status.get('nominatedNodeName')} phase={status.get('phase')} "
                     f"deleting={bool(meta.get('deletionTimestamp'))} gates={spec.get('schedulingGates')}")
    for log in logs:
        if log.exists():
            said = [line for line in log.read_text(errors="replace").splitlines() if any(n in line for n in nodes)]
            lines += [f"{log.name}: {line[:400]}" for line in said[-15:]]
    return "\n".join(lines)


async def holds_no_node(kube: Kube, namespace: str, name: str, timeout: float = 60) -> None:
    """Wait until no pod of the TrainJob occupies a node (a preempted gang's pods take a moment to go)."""
    async def released() -> bool:
        return not [p for p in bound(await pods_of(kube, namespace, name))
                    if (p.get("status") or {}).get("phase") not in ("Succeeded", "Failed")]
    await eventually(released, timeout, f"{namespace}/{name} holding no node")


async def pod_group(kube: Kube, namespace: str, name: str, resource: Resource = POD_GROUPS) -> dict | None:
    """The group object (Coscheduling's PodGroup unless `resource` names another backend's), None if absent."""
    try:
        return await kube.get(resource.path(namespace, name))
    except ApiError as err:
        if err.not_found:
            return None
        raise


async def jobs_in(kube: Kube, namespace: str) -> list[dict]:
    return (await kube.get(JOBS.path(namespace)))["items"]


async def delete_namespace(kube: Kube, name: str, timeout: float = 60) -> None:
    """Delete a test's namespace and wait until everything gangctl and the schedulers act on is gone
    from it (its jobs, their pods, services and gang objects), so the next test starts on free nodes
    and quiet controllers. Not for the Namespace object itself: kube-controller-manager waits a fixed
    5 s before it empties a deleted namespace (its namespaceDeletionGracePeriod). What goes then
    (TrainingRuntimes no TrainJob uses any more, ConfigMaps, Secrets, ServiceAccounts, Events) starts
    no pod and holds no quota."""
    await kube.delete(f"/api/v1/namespaces/{name}", propagation="Foreground")  # Terminating: no new content
    # The kinds this cluster serves, as the controller decides what to watch.
    present = [TRAINJOBS, JOBS, SERVICES, *([PYTORCHJOBS] if await serves_pytorchjobs(kube) else []),
               *(GANG_RESOURCES[b] for b in sorted(await served_backends(kube)))]
    for resource in present:
        await kube.request("DELETE", resource.path(name), body={"propagationPolicy": "Background"})
    # Without a grace period its pods (which KWOK would otherwise keep for their 30 s) go at once.
    await kube.request("DELETE", PODS.path(name), body={"gracePeriodSeconds": 0})

    async def empty() -> bool:
        for resource in (PODS, *present):
            if (await kube.get(resource.path(name)))["items"]:
                return False
        return True
    await eventually(empty, timeout, f"the jobs, pods and gangs of namespace {name} to be deleted", interval=0.2)


# --- ServiceAccounts, tokens and kubeconfigs (controllers run with a user's credentials) ------------------
async def service_account(kube: Kube, namespace: str, name: str, cluster_role: str | None) -> str:
    """A ServiceAccount, bound to `cluster_role` cluster-wide when given; returns the binding's name."""
    await kube.create(f"/api/v1/namespaces/{namespace}/serviceaccounts",
                      {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": name}})
    binding = f"{namespace}-{name}"
    if cluster_role:
        await kube.create("/apis/rbac.authorization.k8s.io/v1/clusterrolebindings", {
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
            "metadata": {"name": binding},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": cluster_role},
            "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": namespace}]})
    return binding


async def token_for(kube: Kube, namespace: str, name: str, seconds: int = 600) -> str:
    """A token from the TokenRequest API (what `kubectl create token` calls)."""
    review = await kube.create(f"/api/v1/namespaces/{namespace}/serviceaccounts/{name}/token", {
        "apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": {"expirationSeconds": seconds}})
    return review["status"]["token"]


def user_kubeconfig(admin: Path, path: Path, user: dict) -> Path:
    """A kubeconfig for the admin's cluster (server, CA) with only `user`'s credentials."""
    cluster = yaml.safe_load(admin.read_text())["clusters"][0]["cluster"]
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "sa",
        "clusters": [{"name": "local", "cluster": cluster}],
        "users": [{"name": "sa", "user": user}],
        "contexts": [{"name": "sa", "context": {"cluster": "local", "user": "sa"}}]}))
    return path


async def report_failed(kube, namespace: str, pod: str, exit_code: int) -> None:
    """Report the pod's container as exited with `exit_code` (a kubelet's status update)."""
    current = await kube.get(PODS.path(namespace, pod))
    now = current["status"].get("startTime")
    container = current["spec"]["containers"][0]["name"]
    conditions = [c for c in current["status"].get("conditions") or [] if c["type"] not in ("Ready", "ContainersReady")]
    conditions += [{"type": t, "status": "False", "lastTransitionTime": now} for t in ("Ready", "ContainersReady")]
    await kube.merge_patch(PODS.path(namespace, pod, "status"), {"status": {
        "phase": "Failed", "conditions": conditions,
        "containerStatuses": [{"name": container, "image": current["spec"]["containers"][0]["image"], "imageID": "",
                               "ready": False, "restartCount": 0,
                               "state": {"terminated": {"exitCode": exit_code, "reason": "Error",
                                                        "startedAt": now, "finishedAt": now}}}]}})


NOT_READY_LABEL = "node-not-ready.stage.kwok.x-k8s.io"   # KWOK's stage: the node goes NotReady


async def node_not_ready(kube: Kube, node: str) -> None:
    """The KWOK node goes NotReady (node loss, as KWOK's stage plays it)."""
    await kube.merge_patch(NODES.path(name=node), {"metadata": {"labels": {NOT_READY_LABEL: "true"}}})


async def node_ready(kube: Kube, node: str) -> None:
    """The KWOK node Ready again."""
    await kube.request("PATCH", NODES.path(name=node), body=[
        {"op": "remove", "path": "/metadata/labels/" + NOT_READY_LABEL.replace("/", "~1")}],
        content_type="application/json-patch+json")
