"""Elastic recovery on real node loss: SIGKILL of the process node hosting rank 0 -> first training step
after recovery, over repeated kills, beside what torchrun's default rendezvous settings would give.

    .venv/bin/python benchmarks/elastic_recovery.py --kills 5 [--victim index0|rotate] [--cluster gangctl-bench-elastic] [--json]

Brings up its own cluster (2 KWOK GPU nodes, 5 process nodes: 4 workers + the rendezvous store),
its own controller, and one elastic TrainJob (min 2, max 4, one worker per node) running
examples/elastic/train.py for as long as the benchmark needs. Each round: wait for 4 workers to be
training, SIGKILL the agent of the node that hosts the lowest completion index running, and read from the pods'
logs (`kubectl logs --timestamps`, torchrun's agents at LOGLEVEL=INFO):
  detect  = kill -> first survivor agent reports its worker group failed (gloo connection reset)
  rdzv    = that -> the survivors' new rendezvous round complete
  start   = that -> first training step (workers start, import torch, gloo init, DCP load)
  total   = kill -> first training step with 3 workers
then start a new process node and measure `regrow` = node start -> first step with 4 workers.
`--victim rotate` kills the node of the k-th lowest index (mod 4) in round k instead (node losses spread
over the job, as in a long run; the default, index0, loses the lowest index every round: a lost
worker's replacement gets a fresh index, so that is a different pod each time).
torchrun's defaults (keep-alive 5 s x 3 before a dead agent is dropped, last_call 30 s) would add
15 s + 30 s = 45 s to the rendezvous: `default ~= detect + 45 s + start` (gangctl: 1 s x 3 and 2 s).
The cluster is deleted at the end.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gangctl.api.resources import NAMESPACES, NODES, PODS, TRAINJOBS  # noqa: E402
from gangctl.cluster.lifecycle import UpOptions, process_node_state, start_process_nodes  # noqa: E402
from gangctl.config import REPO_ROOT, ClusterSettings  # noqa: E402
from gangctl.kube.client import Kube  # noqa: E402
from benchmarks.local import cluster_with_controller  # noqa: E402
from gangctl.harness import results  # noqa: E402
from gangctl.nodeagent import launch  # noqa: E402

SCRIPT = REPO_ROOT / "examples" / "elastic" / "train.py"
NS, NAME = "bench", "el"
STEP = re.compile(r"^(\S+) step=(\d+) loss=(\S+) world=(\d+) restart=(\d+) t=([0-9.]+)$", re.M)
AGENT_FAILED = re.compile(r"^(\S+) .*(Worker group FAILED|Detected \d+ new nodes)", re.M)
RDZV_DONE = re.compile(r"^(\S+) .*Rendezvous complete for workers", re.M)
DEFAULT_EXTRA = 5 * 3 + 30  # torchrun defaults: keep-alive 5 s x 3, last_call 30 s
OURS_EXTRA = 1 * 3 + 2


def say(msg: str) -> None:
    print(f"[bench] {msg}", file=sys.stderr, flush=True)


def ts(text: str) -> float:
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def trainjob(ckpt: Path) -> dict:
    command = (f"set -e\nprogram=`mktemp /tmp/gangctl-elastic-train-XXXXXX.py`\ntrap 'rm -f \"$program\"' EXIT\n"
               f"cat > \"$program\" <<'PY'\n{SCRIPT.read_text()}PY\n"
               f"torchrun \"$program\" --steps 1000000 --ckpt-every 10 --step-seconds 0.1 --lr 0.01 --ckpt-dir {ckpt}")
    return {"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob",
            "metadata": {"name": NAME, "namespace": NS},
            "spec": {"runtimeRef": {"name": "torch-process-nodes", "kind": "ClusterTrainingRuntime"},
                     "trainer": {"numNodes": 4, "numProcPerNode": 1, "elasticPolicy": {"minNodes": 2, "maxNodes": 4},
                                 "command": ["bash", "-c", command],
                                 "env": [{"name": "OMP_NUM_THREADS", "value": "1"}, {"name": "LOGLEVEL", "value": "INFO"}],
                                 "resourcesPerNode": {"requests": {"cpu": "1500m"}, "limits": {"cpu": "1500m"}}}}}


class Logs:
    """Every pod's log as last read (a lost node's pod logs go with it)."""

    def __init__(self, kube: Kube, kubeconfig: Path):
        self.kube, self.kubeconfig, self.texts = kube, kubeconfig, {}

    async def read(self) -> str:
        pods = (await self.kube.get(PODS.path(NS), labelSelector=f"jobset.sigs.k8s.io/jobset-name={NAME}"))["items"]
        for p in pods:
            name = p["metadata"]["name"]
            r = await asyncio.to_thread(subprocess.run, ["kubectl", "logs", "--timestamps", "-n", NS, name],
                                        env=dict(os.environ, KUBECONFIG=str(self.kubeconfig)),
                                        capture_output=True, text=True, timeout=30)
            if r.returncode == 0 and len(r.stdout) >= len(self.texts.get(name, "")):
                self.texts[name] = r.stdout
        return "\n".join(self.texts.values())

    async def steps(self) -> list[tuple[int, int, float]]:
        """(step, world, time printed) of every step line, by time."""
        return sorted(((int(s), int(w), float(t)) for _, s, _, w, _, t in STEP.findall(await self.read())),
                      key=lambda x: x[2])


async def wait_for(check, timeout: float, what: str):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        found = await check()
        if found:
            return found
        await asyncio.sleep(0.5)
    raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what}")


def pct(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, max(0, round(q * (len(s) - 1))))]


async def run(settings: ClusterSettings, kubeconfig: Path, kills: int, victim: str = "index0") -> list[dict]:
    state = process_node_state(settings) / "bench"
    kube = await Kube.connect(kubeconfig)
    ckpt = Path("/tmp/gangctl-elastic-bench") / settings.cluster_name
    shutil.rmtree(ckpt, ignore_errors=True)
    index = 20
    nodes = await asyncio.to_thread(start_process_nodes, settings, kubeconfig, 5, lambda m: None,
                                    state=state, prefix="bench", first_index=index)
    index += 5
    rounds = []
    try:
        await kube.create(NAMESPACES.path(), {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}})
        await kube.create(TRAINJOBS.path(NS), trainjob(ckpt))
        logs = Logs(kube, kubeconfig)
        since = 0.0
        for k in range(kills):
            async def four() -> bool:
                return any(w == 4 and t > since + 2 for _, w, t in await logs.steps())
            await wait_for(four, 180, "4 workers training")
            pods = (await kube.get(PODS.path(NS), labelSelector=f"jobset.sigs.k8s.io/jobset-name={NAME}"))["items"]
            running = sorted((p for p in pods if p["status"].get("phase") == "Running"
                              and not p["metadata"].get("deletionTimestamp")), key=_index)
            # a lost worker's replacement gets a fresh index: "index0" is the lowest index running
            target = running[0 if victim == "index0" else k % len(running)]
            node = target["spec"]["nodeName"]
            await logs.read()
            os.kill(launch.agent_pid(state, node), signal.SIGKILL)
            killed = time.time()

            async def three():
                return next(((s, t) for s, w, t in await logs.steps() if w == 3 and t > killed), None)
            step, first = await wait_for(three, 120, "the survivors' first step")
            text = await logs.read()
            failed = min(ts(m[0]) for m in AGENT_FAILED.findall(text) if ts(m[0]) > killed)
            rdzv = min(ts(m) for m in RDZV_DONE.findall(text) if ts(m) > failed)
            grow = time.time()
            nodes += await asyncio.to_thread(start_process_nodes, settings, kubeconfig, 1, lambda m: None,
                                             state=state, prefix="bench", first_index=index)
            index += 1

            async def regrown():
                return next((t for _, w, t in await logs.steps() if w == 4 and t > first), None)
            back = await wait_for(regrown, 180, "4 workers again")
            await kube.delete(NODES.path(name=node))
            r = {"kill": k + 1, "index": _index(target), "step": step, "detect": failed - killed, "rdzv": rdzv - failed,
                 "start": first - rdzv, "total": first - killed, "regrow": back - grow}
            r["default_estimate"] = r["detect"] + r["start"] + max(r["rdzv"], DEFAULT_EXTRA)
            say(" ".join(f"{key}={v:.1f}" if isinstance(v, float) else f"{key}={v}" for key, v in r.items()))
            rounds.append(r)
            since = back
    finally:
        await kube.delete(TRAINJOBS.path(NS, NAME))
        await kube.close()
        launch.stop(settings.cluster_name, state)
        shutil.rmtree(ckpt, ignore_errors=True)
    return rounds


def _index(pod: dict) -> int:
    return int(pod["metadata"]["annotations"]["batch.kubernetes.io/job-completion-index"])


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--kills", type=int, default=5)
    p.add_argument("--cluster", default="gangctl-bench-elastic")
    p.add_argument("--json", action="store_true")
    p.add_argument("--victim", choices=("index0", "rotate"), default="index0",
                   help="whose node each round kills: the lowest running completion index's, or the k-th lowest's (mod 4) in round k")
    p.add_argument("--lost-pod-seconds", type=float, default=None,
                   help="start the controller with GANGCTL_LOST_POD_SECONDS (the opt-in lost-pod reaper)")
    p.add_argument("--record", action="store_true", help="write the table to benchmarks/results/elastic_recovery.json")
    args = p.parse_args()
    env = {"GANGCTL_LOST_POD_SECONDS": str(args.lost_pod_seconds)} if args.lost_pod_seconds else None
    with cluster_with_controller(args.cluster, UpOptions(2, 8), say, env=env) as (settings, cluster, _):
        rounds = asyncio.run(run(settings, cluster.kubeconfig, args.kills, args.victim))
    keys = ("detect", "rdzv", "start", "total", "default_estimate", "regrow")
    summary = {k: {"p50": statistics.median(r[k] for r in rounds), "p95": pct([r[k] for r in rounds], 0.95)}
               for k in keys}
    if args.json:
        print(json.dumps({"rounds": rounds, "summary": summary}, indent=2))
    else:
        print(f"| what ({len(rounds)} kills of the rank-0 node) | p50 | p95 |\n|---|---|---|")
        for k in keys:
            print(f"| {k} | {summary[k]['p50']:.1f} s | {summary[k]['p95']:.1f} s |")
    if args.record:
        path = results.record("elastic_recovery", ["seconds", "p50", "p95 (max)"],
                              [[k, round(summary[k]["p50"], 1), round(summary[k]["p95"], 1)] for k in keys],
                              f"{len(rounds)} kills ({args.victim})",
                              notes=["Per round (total / regrow): " + ", ".join(
                                  f"{r['total']:.1f} / {r['regrow']:.1f}" for r in rounds) + "."])
        say(f"recorded {path}; run benchmarks/results_page.py to regenerate the page")
    return 0


if __name__ == "__main__":
    sys.exit(main())
