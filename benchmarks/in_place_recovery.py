"""A rank's failure to training resumed, in place against recreated, on the real 3-node DDP job.

    .venv/bin/python benchmarks/in_place_recovery.py --rounds 3 [--cluster gangctl-bench-inplace] [--record]

Brings up its own cluster (1 KWOK GPU node, 3 process nodes) and controller, and two TrainingRuntimes
that differ only in `gangctl.io/restart` (InPlace, Recreate; maxRestarts 5). Each round runs
examples/ddp (rank 1 exits with code 3 once after step 60, `--fail-once`) under one runtime, then the
other (interleaved), and measures from the failure (the marker file rank 1 writes just before it
exits) to the first step every rank completes after it (`kubectl logs --timestamps` of the current
containers: on each rank the first `step=` line printed after the failure for a step before the
failing one, i.e. the resumed run's first step, the latest of the three). Both
resume from the step-50 checkpoint, so the figure is recovery only. Goal (issue 38): in place ≤ 5 s.
Where the time goes, per mode (medians): from the failure until every rank's trainer container is
running again (the containers' `startedAt`, to the second), until every rank printed `resumed from
checkpoint` (torchrun started, torch imported, the process group formed, the checkpoint loaded), and
until every rank completed a step. The cluster is deleted at the end.
"""
from __future__ import annotations

import argparse
import asyncio
import copy
import os
import re
import shutil
import statistics
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gangctl.api.resources import NAMESPACES, PODS, TRAINING_RUNTIMES, TRAINJOBS  # noqa: E402
from gangctl.cluster.lifecycle import UpOptions  # noqa: E402
from gangctl.config import REPO_ROOT  # noqa: E402
from gangctl.harness import results  # noqa: E402
from gangctl.kube.client import Kube  # noqa: E402
from gangctl.model.resolve import RESTART_ANNOTATION  # noqa: E402
from benchmarks.local import cluster_with_controller  # noqa: E402

NS = "bench"
MANIFEST = REPO_ROOT / "examples" / "ddp" / "trainjob.yaml"
STEP = re.compile(r"^(\S+) \[rank (\d)/3 [^\]]*\] step=(\d+) ", re.M)
RESUMED = re.compile(r"^(\S+) \[rank (\d)/3 [^\]]*\] resumed from checkpoint ", re.M)
PHASES = ("containers running", "ranks resumed", "a step on every rank")
MODES = ("InPlace", "Recreate")
FAIL_STEP = 60


def say(msg: str) -> None:
    print(f"[bench] {msg}", file=sys.stderr, flush=True)


def ts(text: str) -> float:
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def runtime(shipped: dict, mode: str) -> dict:
    spec = copy.deepcopy(shipped["spec"])
    spec["template"]["spec"]["failurePolicy"] = {"maxRestarts": 5}
    return {"apiVersion": shipped["apiVersion"], "kind": "TrainingRuntime",
            "metadata": {"name": mode.lower(), "namespace": NS, "annotations": {RESTART_ANNOTATION: mode}},
            "spec": spec}


def trainjob(name: str, mode: str) -> dict:
    obj = yaml.safe_load(MANIFEST.read_text())
    obj["metadata"] = {"name": name, "namespace": NS}
    obj["spec"]["runtimeRef"] = {"name": mode.lower(), "kind": "TrainingRuntime"}
    obj["spec"]["trainer"]["env"].append({"name": "FAIL_ONCE", "value": f"1:{FAIL_STEP}:3"})
    return obj


def logs(kubeconfig: Path, pod: str) -> str:
    r = subprocess.run(["kubectl", "logs", "--timestamps", "-n", NS, pod], capture_output=True, text=True,
                       timeout=30, env=dict(os.environ, KUBECONFIG=str(kubeconfig)))
    return r.stdout if r.returncode == 0 else ""


def started(pod: dict) -> float | None:
    """When the pod's trainer container (its first) last started running."""
    statuses = (pod.get("status") or {}).get("containerStatuses") or []
    at = ((statuses[0].get("state") or {}).get("running") or {}).get("startedAt") if statuses else None
    return ts(at) if at else None


async def one(kube: Kube, kubeconfig: Path, name: str, mode: str) -> tuple[float, float, float]:
    """Seconds from rank 1's failure until every rank's trainer runs again, every rank resumed from
    the checkpoint, and every rank completed its first step after it."""
    marker = Path("/tmp/gangctl-ddp") / NS / name / "failed-once-rank1"
    # An earlier invocation's job of this name may have saved a checkpoint after its folder was removed
    # (its pods were still stopping): resuming from it, this one would start past the failing step.
    shutil.rmtree(marker.parent, ignore_errors=True)
    await kube.create(TRAINJOBS.path(NS), trainjob(name, mode))
    try:
        end = time.monotonic() + 300
        while time.monotonic() < end:
            if marker.exists():
                failed = marker.stat().st_mtime
                pods = (await kube.get(PODS.path(NS), labelSelector=f"jobset.sigs.k8s.io/jobset-name={name}"))["items"]
                firsts: dict[int, float] = {}
                resumed: dict[int, float] = {}
                running: list[float] = []
                for pod in pods:
                    if pod["metadata"].get("deletionTimestamp"):
                        continue
                    if (at := started(pod)) is not None:
                        running.append(at)
                    text = await asyncio.to_thread(logs, kubeconfig, pod["metadata"]["name"])
                    for stamp, rank, step in STEP.findall(text):
                        # A step before the failing one, printed after it: the resumed run's.
                        if ts(stamp) > failed and int(step) < FAIL_STEP and int(rank) not in firsts:
                            firsts[int(rank)] = ts(stamp)
                    for stamp, rank in RESUMED.findall(text):
                        if ts(stamp) > failed:
                            resumed[int(rank)] = ts(stamp)
                if len(firsts) == 3 and len(resumed) == 3 and len(running) == 3:
                    return max(running) - failed, max(resumed.values()) - failed, max(firsts.values()) - failed
            await asyncio.sleep(0.5)
        raise TimeoutError(f"{name}: no step on every rank after the failure within 300 s")
    finally:
        await kube.delete(TRAINJOBS.path(NS, name))
        shutil.rmtree(Path("/tmp/gangctl-ddp") / NS / name, ignore_errors=True)


async def run(kubeconfig: Path, rounds: int) -> dict[str, list[tuple[float, float, float]]]:
    kube = await Kube.connect(kubeconfig)
    out: dict[str, list[tuple[float, float, float]]] = {m: [] for m in MODES}
    try:
        await kube.create(NAMESPACES.path(), {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}})
        shipped = await kube.get("/apis/trainer.kubeflow.org/v1alpha1/clustertrainingruntimes/torch-process-nodes")
        for mode in MODES:
            await kube.create(TRAINING_RUNTIMES.path(NS), runtime(shipped, mode))
        for k in range(rounds):
            for mode in (MODES if k % 2 == 0 else MODES[::-1]):
                phases = await one(kube, kubeconfig, f"r{k}-{mode.lower()}", mode)
                out[mode].append(phases)
                say(f"round {k + 1} {mode}: " + ", ".join(f"{what} {x:.1f} s" for what, x in zip(PHASES, phases))
                    + " after the failure")
    finally:
        await kube.close()
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--cluster", default="gangctl-bench-inplace")
    p.add_argument("--record", action="store_true", help="write benchmarks/results/in_place_recovery.json")
    args = p.parse_args()
    with cluster_with_controller(args.cluster, UpOptions(1, 8, process_nodes=3), say) as (_, cluster, _ctl):
        phases = asyncio.run(run(cluster.kubeconfig, args.rounds))
    got = {mode: [p[-1] for p in v] for mode, v in phases.items()}   # the figure: to a step on every rank
    rows = [[mode, round(statistics.median(v), 1), round(min(v), 1), round(max(v), 1)] for mode, v in got.items()]
    ratio = statistics.median(got["InPlace"]) / statistics.median(got["Recreate"])
    print("| restart | median | min | max |\n|---|---|---|---|")
    for row in rows:
        print(f"| {row[0]} | {row[1]} s | {row[2]} s | {row[3]} s |")
    print(f"in place / recreate (medians): {ratio:.2f}")
    split = "Where the time goes (medians, s after the failure: " + ", ".join(PHASES) + "): " + "; ".join(
        f"{m}: " + " / ".join(f"{statistics.median(p[i] for p in v):.1f}" for i in range(len(PHASES)))
        for m, v in phases.items()) + ". Containers' startedAt is to the second."
    print(split)
    if args.record:
        path = results.record("in_place_recovery", ["restart", "median s", "min s", "max s"], rows,
                              f"{args.rounds} rounds per mode, interleaved", peer="Recreate",
                              notes=[f"In place / recreate (medians): {ratio:.2f}. Per round: " + "; ".join(
                                  f"{m}: " + ", ".join(f"{x:.1f}" for x in v) for m, v in got.items()) + ".", split])
        say(f"recorded {path}; run benchmarks/results_page.py to regenerate the page")
    return 0


if __name__ == "__main__":
    sys.exit(main())
