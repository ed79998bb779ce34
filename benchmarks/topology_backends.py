"""Topology-aware gangs on every backend, side by side: the same gangs on 4 racks of 8 hosts x 8 GPUs.

    .venv/bin/python benchmarks/topology_backends.py                                  # four backends, 3 rounds
    .venv/bin/python benchmarks/topology_backends.py --backends coscheduling,kueue --jobs 40 --rounds 1

For each backend it brings up a cluster of its own (`gangctl-bench-topo-<backend>`, `--topology 2x2x8`:
32 KWOK GPU nodes labelled in 2 blocks of 2 racks of 8 hosts), starts `gangctl controller`, and replays the
first `--jobs` gangs of simulations/topology-racks.yaml (8-64 GPUs each, whole 8-GPU nodes; 40 % require a
rack, 20 % prefer one, the rest ask nothing) with `gangctl sim-check --backend <backend> --quota`: the
scenario's policy is one team whose quota never binds, with the `topology:` section `policy apply` makes
Kueue's Topology and flavor and KAI's Topology from. Durations and gaps are divided by `--compression`.

Per backend: required gangs that ran over more than one rack (goal: 0 on every backend), racks per
multi-pod gang that prefers one (gangctl's own choice on coscheduling against Kueue's TAS: goal no more),
the stranded GPUs (free, but in racks and blocks that hold none of the gangs waiting for a required level;
the mean over the run, sampled as the simulator samples its own),
the queueing delay's p50 and p95 over all jobs (goal: coscheduling's p95 no more than Kueue's), the time
until the last finished, and beside each the simulator's model of the same replay with the same backend
(its mean over draws). Every backend runs `--rounds` times (default 3), the backends' order reversed every
other round; the table gives medians and ranges, and `--record` writes benchmarks/results/topology_backends.json.
Volcano is left out by default: its HyperNodes need Volcano after v1.10, which the module proxy refuses.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gangctl.cluster.lifecycle import UpOptions  # noqa: E402
from gangctl.cluster.setup import parse_shape  # noqa: E402
from gangctl.config import REPO_ROOT  # noqa: E402
from gangctl.harness import results as published, rounds  # noqa: E402
from benchmarks.local import cluster_with_controller  # noqa: E402

SCENARIO = REPO_ROOT / "simulations/topology-racks.yaml"
FIGURES = ("violations", "preferred_racks", "stranded_gpus", "wait_p50", "wait_p95", "last_finish")


def say(msg: str) -> None:
    print(f"[bench] {msg}", file=sys.stderr, flush=True)


def figures(result: dict, per_job: list[dict]) -> dict:
    """One replay's figures, real and the model's, from `gangctl sim-check -o json` and its --dump rows."""
    real, model = result["real_topology"], result["model_topology"]
    r2 = lambda v: None if v is None else round(v, 2)  # noqa: E731
    ends = [row["real"]["end"] for row in per_job if row.get("real") and row["real"].get("end") is not None]
    return {"backend": result["backend"], "jobs": result["jobs"], "done": result["real"]["jobs"]["done"],
            "violations": real["required_violations"],
            "preferred_racks": r2((real["by_ask"].get("preferred rack") or {}).get("mean_domains")),
            "stranded_gpus": r2(real["stranded_gpus_mean"]),
            "wait_p50": r2(result["real"]["queue_delay_seconds"]["p50"]),
            "wait_p95": r2(result["real"]["queue_delay_seconds"]["p95"]),
            "last_finish": round(max(ends), 1) if ends else None,
            "measured_latency": result["measured_latency"],   # what the model was given from this run
            "model": {"violations": model["required_violations"],
                      "preferred_racks": r2((model["by_ask"].get("preferred rack") or {}).get("mean_domains")),
                      "stranded_gpus": r2(model["stranded_gpus_mean"]),
                      "wait_p50": r2(result["model"]["queue_delay_seconds"]["p50"]),
                      "wait_p95": r2(result["model"]["queue_delay_seconds"]["p95"])},
            "passed": result["passed"]}


def one_backend(backend: str, args) -> dict:
    shape = parse_shape(args.topology)
    options = UpOptions(gpu_nodes=shape.nodes, gpus_per_node=8, scheduler=backend, topology=shape)
    with cluster_with_controller(f"gangctl-bench-topo-{backend}", options, say) as (settings, cluster, _):
        env = dict(os.environ, KUBECONFIG=str(cluster.kubeconfig), GANGCTL_CLUSTER_NAME=settings.cluster_name)
        with tempfile.TemporaryDirectory() as tmp:
            dump = Path(args.keep or tmp) / f"{backend}-{time.strftime('%Y%m%dT%H%M%S')}.jsonl"
            dump.parent.mkdir(parents=True, exist_ok=True)
            cmd = [sys.executable, "-m", "gangctl.cli", "sim-check", str(SCENARIO), "--backend", backend, "--quota",
                   "--jobs", str(args.jobs), "--compression", str(args.compression), "--timeout", str(args.timeout),
                   "-o", "json", "--dump", str(dump)]
            say(f"{backend}: {' '.join(cmd[3:])}")
            done = subprocess.run(cmd, cwd=REPO_ROOT, env=env, capture_output=True, text=True)
            if done.returncode not in (0, 2):   # 2: ran, the model outside the tolerance
                raise SystemExit(f"{backend}: sim-check exited {done.returncode}: {done.stderr[-3000:]}")
            per_job = [json.loads(line) for line in dump.read_text().splitlines()]
    out = figures(json.loads(done.stdout), per_job)
    say(f"{backend}: {json.dumps(out)}")
    return out


def median_rows(runs: dict[str, list[dict]]) -> tuple[list[str], list[list]]:
    columns = ["backend", "jobs done", "required over >1 rack", "racks per preferred gang", "stranded GPUs (mean)",
               "wait p50 (s)", "wait p95 (s)", "last finished (s)", "model: racks per preferred gang",
               "model: stranded GPUs", "model: wait p95 (s)"]
    rows = []
    for backend, rs in runs.items():
        s = rounds.aggregate(rs, FIGURES)
        m = rounds.aggregate([r["model"] for r in rs], ("preferred_racks", "stranded_gpus", "wait_p95"))
        rows.append([backend, " ".join(f"{r['done']}/{r['jobs']}" for r in rs),
                     " ".join(str(r["violations"]) for r in rs), s["preferred_racks"], s["stranded_gpus"], s["wait_p50"],
                     s["wait_p95"], s["last_finish"], m["preferred_racks"], m["stranded_gpus"], m["wait_p95"]])
    return columns, rows


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--backends", default="coscheduling,kueue,kai,native")
    p.add_argument("--jobs", type=int, default=200)
    p.add_argument("--topology", default="2x2x8", metavar="BLOCKSxRACKSxHOSTS")
    p.add_argument("--compression", type=float, default=180.0, help="divide durations and gaps by this")
    p.add_argument("--timeout", type=float, default=3600)
    p.add_argument("--keep", metavar="DIR", help="keep each replay's per-job rows (sim-check --dump) in DIR")
    args = rounds.parse_args(p, "topology_backends")
    runs = rounds.run_sides(args.backends.split(","), args.rounds, lambda backend: one_backend(backend, args), say)
    every = published.report_sides(
        "topology_backends", args, runs,
        f"the first {args.jobs} gangs of {SCENARIO.name} on {args.topology} (blocks x racks x hosts, 8 GPUs each), "
        f"compression {args.compression:g}, {args.rounds} round(s) per backend: median (min-max, n runs)",
        median_rows, f"{args.rounds} rounds per backend, the order reversed every other round; figures the median "
        "(range)", say)
    return 0 if all(r["violations"] == 0 and r["done"] == r["jobs"] for r in every) else 1


if __name__ == "__main__":
    sys.exit(main())
