"""Clusters of their own for the scheduler backends' tests (test_schedulers.py), and TrainJob-built gangs.

Each backend gets its own small cluster (5 KWOK nodes x 8 GPUs) under a distinct name with
`--scheduler <backend>`, so it never disturbs the session's coscheduling cluster; the extra
schedulers are built on first use (cached like the control plane) and the cluster is deleted once
the backend's tests are done. The gangs are what gangctl's builders make of a TrainJob (resolve ->
size_gang -> backend + node_job), created directly, or TrainJobs run by a gangctl controller
started against the backend's cluster (`serve_backend`).
"""
from __future__ import annotations

import contextlib
import copy
import subprocess
from pathlib import Path
from typing import Awaitable, Callable

import yaml

from gangctl.api.resources import JOBS, Resource
from gangctl.cluster import schedulers
from gangctl.cluster.lifecycle import UpOptions, down, up
from gangctl.cluster.native import NATIVE_SCHEDULER
from gangctl.config import REPO_ROOT, ClusterSettings
from gangctl.kube.client import Kube
from gangctl.processes import ControllerProcess, running
from gangctl.plugins import base
from gangctl.plugins.base import GangBackend
from gangctl.plugins.workload import node_job
from gangctl.model.gang import size_gang
from gangctl.model.resolve import resolve
from gangctl.sim import objects
from tests.integration.helpers import gangctl_cli

GPU_NODES = 5
GPUS_PER_NODE = 8
RUNTIME = yaml.safe_load((REPO_ROOT / "deploy/runtimes/torch-kwok-gpu.yaml").read_text())  # KWOK GPU gangs
EXAMPLE_POLICY = REPO_ROOT / "policies/example-teams.yaml"
# KWOK finishes a Job pod after `delay` (at most `jitter-delay`): long enough to outlive the test.
RUN_FOREVER = {"pod-complete.stage.kwok.x-k8s.io/delay": "3600s",
               "pod-complete.stage.kwok.x-k8s.io/jitter-delay": "3600s"}


def start(name: str, scheduler: str) -> tuple[ClusterSettings, Path]:
    settings = ClusterSettings(cluster_name=name)
    down(settings, lambda m: None)  # left by an interrupted run
    cluster = up(settings, UpOptions(GPU_NODES, GPUS_PER_NODE, scheduler=scheduler), lambda m: print(f"[{name}] {m}"))
    return settings, cluster.kubeconfig


def stop(settings: ClusterSettings) -> list[int]:
    """Delete the cluster; returns the pids of its extra scheduler processes still alive (none, we hope)."""
    recorded = schedulers.pids(schedulers.state_dir(settings))
    down(settings, lambda m: print(f"[{settings.cluster_name}] {m}"))
    return [pid for pid in recorded.values() if running(pid)]


def exposed_listeners(settings: ClusterSettings) -> dict[str, list[str]]:
    """The cluster's processes (control plane, extra schedulers) that listen beyond loopback or on a
    port `gangctl controller` takes by default, with those addresses: {} when there is none."""
    from gangctl.cluster.lifecycle import local_cluster
    from gangctl.config import ControllerSettings
    from gangctl.obs import ports

    taken = {ControllerSettings().metrics_port, ControllerSettings().trainer_status_port}
    procs = {ports.command(pid).split(" ")[0].rpartition("/")[2] or f"pid {pid}": pid
             for pid in local_cluster(settings).pids()}
    procs.update(schedulers.pids(schedulers.state_dir(settings)))
    assert procs, "no process of the cluster found"
    out = {}
    for name, pid in procs.items():
        bad = [a for a in ports.listening(pid) if not a.startswith(("127.", "[::1]:"))
               or int(a.rpartition(":")[2]) in taken]
        if bad:
            out[name] = bad
    return out


def gang_objects(backend: GangBackend, name: str, namespace: str, nodes: int, policy: dict) -> tuple[dict | None, dict]:
    """The group (or None) and the child Job gangctl builds for a TrainJob of `nodes` x 8 GPUs."""
    rt = copy.deepcopy(RUNTIME)
    rt["spec"]["podGroupPolicy"] = policy
    tj = objects.trainjob(name, namespace=namespace, uid="not-created", runtime=RUNTIME["metadata"]["name"],
                          trainer={"numNodes": nodes, "resourcesPerNode": {"limits": {"nvidia.com/gpu": "8"}}})
    job = resolve(tj, rt)
    meta = job.pod_template.setdefault("metadata", {})
    meta["annotations"] = {**(meta.get("annotations") or {}), **RUN_FOREVER}
    gang = size_gang(job.num_nodes, job.requests)
    owner = {"apiVersion": "v1", "kind": "ConfigMap", "name": "unused", "uid": "unused"}
    group = backend.group(job, gang, owner) if base.wants_group(backend) else None
    child = node_job(job, owner, backend, "scheduler-plugins-scheduler")
    # What the reconciler is to do with the optional hooks (see gangctl/plugins/base.py):
    child["metadata"]["labels"].update(base.job_labels(backend, job, gang))
    child["metadata"].setdefault("annotations", {}).update(base.job_annotations(backend, job, gang))
    for obj in (group, child):  # no TrainJob exists here: nothing owns them
        if obj:
            obj["metadata"].pop("ownerReferences", None)
    return group, child


@contextlib.asynccontextmanager
async def serve_backend(cluster: tuple[ClusterSettings, Path], backend: str, log_dir: Path,
                        prepare: Callable[[Kube], Awaitable[None]] | None = None):
    """A backend module's cluster ready for TrainJobs: the backend tests' policy applied with the CLI,
    their runtimes installed, `prepare` run, and `gangctl controller` serving it until exit."""
    from tests.integration.conftest import wait_ready
    from tests.integration.quota_common import apply_policy_cli, install_runtimes

    settings, kubeconfig = cluster
    apply_policy_cli(kubeconfig, backend, settings.cluster_name)
    kube = await Kube.connect(kubeconfig)
    try:
        await install_runtimes(kube, backend)
        if prepare is not None:
            await prepare(kube)
    finally:
        await kube.close()
    # Volcano's, KAI's and native's clusters run PyTorchJobs' gangs through them, as v1's
    # --gang-scheduler-name (Kueue's: a PyTorchJob with a queue-name label is Kueue's).
    env = {"GANGCTL_PYTORCHJOB_GANG_SCHEDULER": backend} if backend in ("volcano", "kai", "native") else {}
    if backend == "native":   # the cluster's second kube-scheduler, the one with GangScheduling
        env["GANGCTL_PYTORCHJOB_SCHEDULER_NAME"] = NATIVE_SCHEDULER
    ctl = ControllerProcess(kubeconfig, log_dir / "controller.log", env=env)
    ctl.start()
    try:
        await wait_ready(ctl)
        yield ctl
    finally:
        ctl.stop()
        print(f"[controller] log: {ctl.log_path}")


def remove_builder_gangs(group: Resource, namespace: str, *names: str) -> Callable[[Kube], Awaitable[None]]:
    """A `serve_backend` preparation that deletes the gangs a builder test created directly."""
    async def remove(kube: Kube) -> None:
        for name in names:
            await kube.delete(JOBS.path(namespace, f"{name}-node-0"), propagation="Foreground")
            await kube.delete(group.path(namespace, name))
    return remove


def cli(cluster: tuple[ClusterSettings, Path], *args: str) -> subprocess.CompletedProcess:
    """`gangctl ARGS` against a backend module's cluster."""
    return gangctl_cli(*args, kubeconfig=cluster[1], cluster_name=cluster[0].cluster_name)
