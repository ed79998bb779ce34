"""`gangctl demo`: two gangs on a 64-node x 8-GPU KWOK cluster beside real DDP training on 3 process nodes.

The first KWOK gang takes every GPU; the second cannot fit and binds no pod until the first
finishes. Meanwhile examples/ddp/trainjob.yaml trains a small model with real torchrun workers (DDP
over gloo) on 3 process nodes until its loss target; its log is read through the pods/log API,
the same path `kubectl logs` takes.
"""
from __future__ import annotations

import asyncio
import re
import shutil
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
from gangctl.kube.client import ApiError, Kube
from gangctl.policy.status import finished, phase
from gangctl.processes import ControllerProcess

NAMESPACE = "demo"
MANIFESTS = ("pretrain-64x8.yaml", "finetune-16x8.yaml")
DDP_MANIFEST = Path("ddp") / "trainjob.yaml"  # real training on process nodes
CHECKPOINTS = Path("/tmp/gangctl-ddp")  # the manifest's CHECKPOINT_DIR: /tmp/gangctl-ddp/<namespace>/<trainjob>
COMPLETION_INDEX = "batch.kubernetes.io/job-completion-index"
JOBSET_NAME = "jobset.sigs.k8s.io/jobset-name"
STEP_LINE = re.compile(r"step=(\d+) loss=\S+ global_loss=([0-9.]+)")
REACHED = re.compile(r"reached target: global_loss=([0-9.]+) < ([0-9.]+) at step (\d+)")


def run_demo(console: Console, gpu_nodes: int = 64, gpus_per_node: int = 8, timeout: float = 300,
             process_nodes: int = 3) -> int:
    settings = ClusterSettings()
    cluster = up(settings, UpOptions(gpu_nodes, gpus_per_node, process_nodes), lambda m: console.print(f"• {m}"))
    log = settings.cache_dir / "demo-controller.log"
    log.unlink(missing_ok=True)
    controller = ControllerProcess(cluster.kubeconfig, log)
    controller.start()
    console.print(f"• controller started (log: {log})")
    try:
        controller.wait_ready()
        return asyncio.run(_run(console, cluster.kubeconfig, controller.metrics_port, timeout))
    finally:
        controller.stop()


async def _run(console: Console, kubeconfig: Path, port: int, timeout: float) -> int:
    kube = await Kube.connect(kubeconfig)
    try:
        await kube.delete(f"/api/v1/namespaces/{NAMESPACE}")
        await _recreate_namespace(kube)
        ddp = yaml.safe_load((REPO_ROOT / "examples" / DDP_MANIFEST).read_text())
        ddp["metadata"]["namespace"] = NAMESPACE
        ddp_name = ddp["metadata"]["name"]
        shutil.rmtree(CHECKPOINTS / NAMESPACE / ddp_name, ignore_errors=True)  # train from step 0, not resume
        await kube.create(TRAINJOBS.path(NAMESPACE), ddp)
        console.print(f"• submitted TrainJob {NAMESPACE}/{ddp_name} (examples/{DDP_MANIFEST}: real DDP training, "
                      f"{ddp['spec']['trainer']['numNodes']} process nodes x 1 torchrun process)")
        kwok: list[str] = []
        for manifest in MANIFESTS:
            obj = yaml.safe_load((REPO_ROOT / "examples" / manifest).read_text())
            obj["metadata"]["namespace"] = NAMESPACE
            if kwok:  # the second gang goes in once the first holds the cluster
                await _wait_running(kube, kwok[-1], timeout)
            await kube.create(TRAINJOBS.path(NAMESPACE), obj)
            kwok.append(obj["metadata"]["name"])
            console.print(f"• submitted TrainJob {NAMESPACE}/{obj['metadata']['name']} "
                          f"({obj['spec']['trainer']['numNodes']} KWOK nodes x 8 GPUs)")
        names = kwok + [ddp_name]
        start = time.monotonic()
        progress: dict[str, str] = {}
        with Live(console=console, refresh_per_second=4) as live:
            while True:
                jobs = [await kube.get(TRAINJOBS.path(NAMESPACE, n)) for n in names]
                pods = (await kube.get(PODS.path(NAMESPACE)))["items"]
                rank0 = _rank0(pods, ddp_name)
                if rank0 and rank0["status"].get("phase") in ("Running", "Succeeded", "Failed"):
                    progress[ddp_name] = _last_step(await _pod_log(kube, rank0, tail_lines=3)) or progress.get(ddp_name, "")
                live.update(_table(jobs, pods, time.monotonic() - start, progress))
                if all(finished(j.get("status")) for j in jobs) or time.monotonic() - start > timeout:
                    break
                await asyncio.sleep(0.5)
        rank0 = _rank0((await kube.get(PODS.path(NAMESPACE)))["items"], ddp_name)
        training_log = await _pod_log(kube, rank0) if rank0 else ""
        console.print(_summary(jobs, port))
        reached = _print_training(console, ddp_name, training_log)
        ok = all(phase(j.get("status")) == "Complete" for j in jobs) and reached
        return 0 if ok else 1
    finally:
        await kube.close()


def _print_training(console: Console, name: str, log: str) -> bool:
    """The end of rank 0's training log (as `kubectl logs` shows it) and the loss reached."""
    lines = [line for line in log.splitlines() if line.strip()]
    console.print(f"\n[bold]Real training[/] ({name}, rank 0, last lines through the pods/log API):")
    for line in lines[-8:]:
        console.print(f"  {line}", markup=False, highlight=False)
    match = next((m for m in map(REACHED.search, reversed(lines)) if m), None)
    if match:
        console.print(f"  loss reached: global loss {match.group(1)} < target {match.group(2)} "
                      f"at step {match.group(3)} (checkpoints in {CHECKPOINTS / NAMESPACE / name})")
    else:
        console.print("  [red]the loss target was not reached[/]")
    console.print(f"  see every line: kubectl logs -n {NAMESPACE} -l {JOBSET_NAME}={name},{COMPLETION_INDEX}=0 "
                  f"--tail=-1   (ranks 1, 2: {COMPLETION_INDEX}=1, =2)")
    return match is not None


def _rank0(pods: list[dict], name: str) -> dict | None:
    return next((p for p in pods if p["metadata"].get("labels", {}).get(JOBSET_NAME) == name
                 and p["metadata"].get("labels", {}).get(COMPLETION_INDEX) == "0"), None)


async def _pod_log(kube: Kube, pod: dict, tail_lines: int | None = None) -> str:
    """GET pods/log: the apiserver proxies it to the process node's kubelet API (what `kubectl logs` does)."""
    path = PODS.path(NAMESPACE, pod["metadata"]["name"]) + "/log"
    try:
        return await kube.text(path, timeout=10, tailLines=tail_lines)
    except (ApiError, aiohttp.ClientError, asyncio.TimeoutError):
        return ""  # not started yet, or its node is gone: the live table shows nothing for it


def _last_step(log: str) -> str:
    found = [m for m in map(STEP_LINE.search, log.splitlines()) if m]
    if not found:
        return ""
    m = found[-1]
    return f"rank 0: step {m.group(1)}, global loss {float(m.group(2)):.4f}"


def _table(jobs: list[dict], pods: list[dict], elapsed: float, progress: dict[str, str]) -> Table:
    table = Table(title=f"TrainJobs in namespace {NAMESPACE} ({elapsed:.0f}s)")
    for col in ("TrainJob", "nodes", "phase", "pods bound", "gang wait", "why / training"):
        table.add_column(col)
    for job in jobs:
        name = job["metadata"]["name"]
        mine = [p for p in pods if p["metadata"].get("labels", {}).get("jobset.sigs.k8s.io/jobset-name") == name]
        bound = sum(1 for p in mine if p["spec"].get("nodeName"))
        status = job.get("status") or {}
        wait = (status.get("gang") or {}).get("waitSeconds")
        state = status.get("gang") or {}
        why = state.get("message", "") if state.get("reason") == "WaitingForGang" else ""
        where = "process" if job["spec"]["runtimeRef"]["name"] == "torch-process-nodes" else "KWOK GPU"
        table.add_row(name, where, phase(status), f"{bound}/{job['spec']['trainer']['numNodes']}",
                      "" if wait is None else f"{wait:.1f}s", why or progress.get(name, ""))
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

