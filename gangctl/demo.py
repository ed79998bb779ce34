"""`gangctl demo`: two gangs on a 64-node x 8-GPU KWOK cluster, watched live, then summarised.

The first gang takes every GPU; the second cannot fit and binds no pod until the first finishes.
"""
from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import aiohttp
import yaml
from rich.console import Console
from rich.live import Live
from rich.table import Table

from gangctl.api.resources import PODS, TRAINJOBS
from gangctl.cluster.lifecycle import UpOptions, up
from gangctl.config import REPO_ROOT, ClusterSettings
from gangctl.kube.client import Kube
from gangctl.policy.status import finished, phase

NAMESPACE = "demo"
MANIFESTS = ("pretrain-64x8.yaml", "finetune-16x8.yaml")


def run_demo(console: Console, gpu_nodes: int = 64, gpus_per_node: int = 8, timeout: float = 300) -> int:
    settings = ClusterSettings()
    cluster = up(settings, UpOptions(gpu_nodes, gpus_per_node), lambda m: console.print(f"• {m}"))
    port = _free_port()
    log = settings.cache_dir / "demo-controller.log"
    controller = subprocess.Popen(
        [sys.executable, "-m", "gangctl.cli", "controller", "--metrics-port", str(port)],
        env=dict(os.environ, KUBECONFIG=str(cluster.kubeconfig)), stdout=log.open("w"), stderr=subprocess.STDOUT)
    console.print(f"• controller started (log: {log})")
    try:
        return asyncio.run(_run(console, cluster.kubeconfig, port, timeout))
    finally:
        controller.terminate()
        controller.wait(10)


async def _run(console: Console, kubeconfig: Path, port: int, timeout: float) -> int:
    kube = await Kube.connect(kubeconfig)
    try:
        await _wait_ready(port)
        await kube.delete(f"/api/v1/namespaces/{NAMESPACE}")
        await _recreate_namespace(kube)
        names = []
        for manifest in MANIFESTS:
            obj = yaml.safe_load((REPO_ROOT / "examples" / manifest).read_text())
            obj["metadata"]["namespace"] = NAMESPACE
            if names:  # the second gang goes in once the first holds the cluster
                await _wait_running(kube, names[-1], timeout)
            await kube.create(TRAINJOBS.path(NAMESPACE), obj)
            names.append(obj["metadata"]["name"])
            console.print(f"• submitted TrainJob {NAMESPACE}/{obj['metadata']['name']} "
                          f"({obj['spec']['trainer']['numNodes']} nodes x 8 GPUs)")
        start = time.monotonic()
        with Live(console=console, refresh_per_second=4) as live:
            while True:
                jobs = [await kube.get(TRAINJOBS.path(NAMESPACE, n)) for n in names]
                pods = (await kube.get(PODS.path(NAMESPACE)))["items"]
                live.update(_table(jobs, pods, time.monotonic() - start))
                if all(finished(j.get("status")) for j in jobs) or time.monotonic() - start > timeout:
                    break
                await asyncio.sleep(0.5)
        console.print(_summary(jobs, port))
        return 0 if all(phase(j.get("status")) == "Complete" for j in jobs) else 1
    finally:
        await kube.close()


def _table(jobs: list[dict], pods: list[dict], elapsed: float) -> Table:
    table = Table(title=f"TrainJobs in namespace {NAMESPACE} ({elapsed:.0f}s)")
    for col in ("TrainJob", "phase", "pods bound", "gang wait", "why"):
        table.add_column(col)
    for job in jobs:
        name = job["metadata"]["name"]
        mine = [p for p in pods if p["metadata"].get("labels", {}).get("jobset.sigs.k8s.io/jobset-name") == name]
        bound = sum(1 for p in mine if p["spec"].get("nodeName"))
        status = job.get("status") or {}
        wait = (status.get("gang") or {}).get("waitSeconds")
        running = next((c for c in status.get("conditions") or [] if c["type"] == "Running"), None)
        why = running["message"] if running and running.get("reason") == "WaitingForGang" else ""
        table.add_row(name, phase(status), f"{bound}/{job['spec']['trainer']['numNodes']}",
                      "" if wait is None else f"{wait:.1f}s", why)
    return table


def _summary(jobs: list[dict], port: int) -> str:
    lines = ["", "[bold]Summary[/]"]
    for job in jobs:
        gang = (job.get("status") or {}).get("gang") or {}
        lines.append(f"  {job['metadata']['name']:<10} {phase(job.get('status')):<9} "
                     f"gang wait {gang.get('waitSeconds', float('nan')):.1f}s "
                     f"(pods created {gang.get('createdAt', '?')}, all bound {gang.get('boundAt', '?')})")
    lines += ["", f"Metrics were served at http://127.0.0.1:{port}/metrics (gangctl_gang_wait_seconds, "
                  "gangctl_trainjobs, gangctl_reconcile_duration_seconds, gangctl_workqueue_depth).",
              "The cluster is still up: eval $(gangctl cluster env); kubectl get trainjobs,pods -n demo",
              "Run `gangctl controller` to keep reconciling, and `gangctl cluster down` to stop everything."]
    return "\n".join(lines)


async def _wait_running(kube: Kube, name: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while phase((await kube.get(TRAINJOBS.path(NAMESPACE, name))).get("status")) != "Running":
        if time.monotonic() > deadline:
            raise TimeoutError(f"TrainJob {name} did not start running")
        await asyncio.sleep(0.3)


async def _wait_ready(port: int, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    async with aiohttp.ClientSession() as session:
        while time.monotonic() < deadline:
            try:
                async with session.get(f"http://127.0.0.1:{port}/readyz") as resp:
                    if resp.status == 200:
                        return
            except aiohttp.ClientError:
                pass
            await asyncio.sleep(0.3)
    raise TimeoutError("the controller did not become ready; see its log")


async def _recreate_namespace(kube: Kube) -> None:
    deadline = time.monotonic() + 60
    while True:
        try:
            await kube.create("/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace",
                                                     "metadata": {"name": NAMESPACE}})
            return
        except Exception:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.5)  # the previous run's namespace is still terminating


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]
