"""Simulator speed: simulated jobs per second on one core, for PAI-shaped traces of growing size.

Every event (arrival, completion, failure, repair) runs the controller's quota admission
(`gangctl.model.admission.decide`) over the pending gangs, each sized by `gangctl.model.gang.size_gang`,
then all-or-nothing placement. The workload and cluster are the same at every size (four teams in
two cohorts from policies/example-teams.yaml with preemption, on the 256 GPUs their quotas add up to,
~70% offered load, node
failures and exit failures on), so the figures show how the cost grows with trace length.

    .venv/bin/python benchmarks/sim_speed.py                 # 1k, 10k, 20k, 100k jobs
    .venv/bin/python benchmarks/sim_speed.py --sizes 20000 --json
    .venv/bin/python benchmarks/sim_speed.py --sizes 20000 --profile   # cProfile, top functions

Only the simulation is timed (not generating the trace). Python runs it on one core.
"""
from __future__ import annotations

import argparse
import cProfile
import json
import os
import platform
import pstats
import time
from pathlib import Path

import yaml
from rich.console import Console
from rich.table import Table

from gangctl.harness import results, rounds
from gangctl.model.quota import QuotaPolicy
from gangctl.sim.engine import simulate
from gangctl.sim.generate import Shape, generate
from gangctl.sim.scenario import Scenario

ROOT = Path(__file__).resolve().parents[1]
TARGET_JOBS_PER_SECOND = 10_000  # issue 14: at least 10,000 simulated jobs per CPU second at 20,000 jobs
# Job shares per team: proportional to their nominal GPU quota (steady queues), or "skewed": the
# eval team (32 GPUs nominal) submits 3/8 of the jobs, so its queue grows for the whole run.
TEAM_MIXES = {"quota": {"ml-a": 2, "ml-b": 2, "prod": 3, "eval": 1},
              "skewed": {"ml-a": 2, "ml-b": 2, "prod": 1, "eval": 3}}
CLASSES = {"normal": 8, "high": 1, "low": 1}


def scenario(backend: str) -> Scenario:
    return Scenario.model_validate({
        "name": "bench", "seed": 1, "backend": backend, "quotaPolicy": "unused.yaml",
        "cluster": {"pools": [{"name": "v100", "nodes": 24, "gpusPerNode": 8, "gpuType": "V100"},
                              {"name": "t4", "nodes": 8, "gpusPerNode": 8, "gpuType": "T4"}]},
        "failures": {"nodeMtbfHours": 2000, "repairHours": 6, "exitFailureRate": 0.03, "restartBudget": 3},
        "workload": {"generate": {"jobs": 1, "arrivalsPerHour": 1}},
        "sampleSeconds": 600,
    })


def run(size: int, backend: str, policy: QuotaPolicy, arrivals_per_hour: float, mix: str = "quota",
        profile: bool = False) -> dict:
    jobs = generate(size, arrivals_per_hour, seed=size, shape=Shape.PAI, groups=TEAM_MIXES[mix],
                    priority_classes=CLASSES)
    sc = scenario(backend)
    profiler = cProfile.Profile() if profile else None
    started = time.process_time()
    wall = time.perf_counter()
    if profiler:
        profiler.enable()
    result = simulate(sc, policy, jobs)
    if profiler:
        profiler.disable()
    cpu = time.process_time() - started
    wall = time.perf_counter() - wall
    if profiler:
        pstats.Stats(profiler).sort_stats("tottime").print_stats(25)
    s = result.summary
    return {"jobs": size, "backend": backend, "team_mix": mix, "cpu_seconds": round(cpu, 3), "wall_seconds": round(wall, 3),
            "jobs_per_second": round(size / cpu), "simulated_days": round(s["makespan_seconds"] / 86400, 1),
            "gpu_utilization": round(s["gpu_utilization"], 3),
            "p95_queue_delay_hours": round((s["queue_delay_seconds"]["p95"] or 0) / 3600, 2),
            "preemptions": s["failures"]["preemptions"]}


def machine() -> dict:
    return {"python": platform.python_version(), "machine": platform.machine(), "cpus": os.cpu_count(),
            "processor": _cpu_model()}


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", default="1000,10000,20000,100000", help="comma-separated job counts")
    parser.add_argument("--backend", default="kueue", choices=["kueue", "coscheduling", "volcano"])
    parser.add_argument("--arrivals-per-hour", type=float, default=20.0)
    parser.add_argument("--mix", default="quota", choices=list(TEAM_MIXES), help="job shares per team")
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    parser.add_argument("--profile", action="store_true", help="cProfile each run (slower; for finding hot spots)")
    parser.add_argument("--repeat", type=int, default=1, help="runs of each size; with --record, the median is published")
    parser.add_argument("--record", action="store_true", help="write the medians to benchmarks/results/ "
                        "(sim_speed-team-mix-<mix>.json; --repeat 3 or more)")
    args = parser.parse_args()
    if problem := rounds.check_rounds(args.repeat, args.record):
        parser.error(problem.replace("--rounds", "--repeat"))
    policy = QuotaPolicy.model_validate(yaml.safe_load((ROOT / "policies/example-teams.yaml").read_text()))
    repeated = [[run(int(n), args.backend, policy, args.arrivals_per_hour, args.mix, args.profile)
                 for _ in range(args.repeat)] for n in args.sizes.split(",")]
    rows = [r[0] for r in repeated]
    if args.record:
        path = results.record("sim_speed", ["jobs", "jobs/s", "CPU s"],
                              [[r[0]["jobs"], rounds.summary(x["jobs_per_second"] for x in r),
                                rounds.summary(x["cpu_seconds"] for x in r)] for r in repeated],
                              f"median (range) of {args.repeat} runs of each size", part=f"team mix {args.mix}")
        print(f"recorded {path}; run benchmarks/results_page.py to regenerate the page")
    if args.json:
        print(json.dumps({"machine": machine(), "target_jobs_per_second": TARGET_JOBS_PER_SECOND, "runs": rows}, indent=2))
        return
    table = Table(title=f"gangctl sim speed ({args.backend} backend, {args.mix} team mix, one core)")
    for col in ("jobs", "CPU s", "jobs/s", "simulated days", "GPU util", "p95 queue delay", "preemptions"):
        table.add_column(col, justify="right")
    for r in rows:
        fast = r["jobs_per_second"] >= TARGET_JOBS_PER_SECOND
        table.add_row(f"{r['jobs']:,}", f"{r['cpu_seconds']:.2f}",
                      f"[{'green' if fast else 'red'}]{r['jobs_per_second']:,}[/]", f"{r['simulated_days']}",
                      f"{r['gpu_utilization']:.0%}", f"{r['p95_queue_delay_hours']} h", str(r["preemptions"]))
    console = Console()
    console.print(table)
    m = machine()
    console.print(f"{m['processor']}, {m['cpus']} CPUs, Python {m['python']}; target {TARGET_JOBS_PER_SECOND:,} jobs/s")


if __name__ == "__main__":
    main()
