"""Regenerate the files the repository ships for the simulator:

- simulations/traces/: small generated samples in each real trace format (PAI, Philly, Helios, CSV),
  including rows the loaders must skip (CPU-only, unfinished), so the samples exercise them;
- simulations/schema.json and policies/schema.json from the pydantic models.

Run: `.venv/bin/python -m gangctl.sim.shipped` from the repository root. A unit test checks that
the schemas are current.
"""
from __future__ import annotations

import csv
import json
import random
from datetime import datetime, timezone
from pathlib import Path

from gangctl.model.quota import QuotaPolicy
from gangctl.sim.generate import Shape, generate
from gangctl.sim.scenario import Scenario
from gangctl.sim.traces import HELIOS_COLUMNS, TraceJob

# Each sample's first submission (epoch seconds), like the real traces' start dates.
_T0 = {Shape.PAI: 0.0, Shape.PHILLY: 1506816000.0, Shape.HELIOS: 1585699200.0}
_GPU_TYPES = ["V100", "V100", "T4", "P100", "MISC"]


def schemas() -> dict[str, dict]:
    return {"simulations/schema.json": Scenario.model_json_schema(by_alias=True),
            "policies/schema.json": QuotaPolicy.model_json_schema(by_alias=True)}


def _stamp(t: float) -> str:
    return datetime.fromtimestamp(t, tz=timezone.utc).strftime("%Y-%m-%d %H:%M:%S")


def _recorded_wait(rng: random.Random) -> float:
    return round(rng.expovariate(1 / 120.0), 1)


def write_pai(jobs: list[TraceJob], directory: Path, rng: random.Random) -> None:
    with (directory / "pai_job_table.csv").open("w", newline="") as jf, \
            (directory / "pai_task_table.csv").open("w", newline="") as tf:
        job_rows, task_rows = csv.writer(jf), csv.writer(tf)
        for i, j in enumerate(jobs):
            start = j.submit + _recorded_wait(rng)
            unfinished = i % 97 == 96
            end = "" if unfinished else f"{start + j.duration:.1f}"
            job_rows.writerow([j.id, f"inst-{i}", j.group, "Running" if unfinished else "Terminated",
                               f"{j.submit:.1f}", end])
            cpu_only = i % 41 == 40
            task_rows.writerow([j.id, "worker", j.num_nodes, "Running" if unfinished else "Terminated",
                                f"{start:.1f}", end, f"{j.cpu_per_node * 100:g}", f"{j.memory_per_node:g}",
                                "" if cpu_only else f"{j.gpus_per_node * 100:g}", rng.choice(_GPU_TYPES)])
            if i % 5 == 0:   # a parameter-server task without GPUs: the loader keeps the GPU task
                task_rows.writerow([j.id, "ps", 1, "Terminated", f"{start:.1f}", end, "600", "29.3", "", ""])


def write_philly(jobs: list[TraceJob], path: Path, rng: random.Random) -> None:
    t0 = _T0[Shape.PHILLY]
    lines = []
    for i, j in enumerate(jobs):
        start = t0 + j.submit + _recorded_wait(rng)
        attempts = []
        if i % 53 != 52:   # some jobs were killed before they ever ran
            machines = [{"ip": f"m{rng.randrange(500)}", "gpus": [f"gpu{g}" for g in range(j.gpus_per_node)]}
                        for _ in range(j.num_nodes)]
            if i % 11 == 0:   # a failed first attempt
                attempts.append({"start_time": _stamp(start), "end_time": _stamp(start + 60), "detail": machines})
                start += 120
            attempts.append({"start_time": _stamp(start), "end_time": _stamp(start + j.duration), "detail": machines})
        lines.append(json.dumps({"status": "Pass" if attempts else "Killed", "vc": j.group, "jobid": f"application_{i:06d}",
                                 "attempts": attempts, "submitted_time": _stamp(t0 + j.submit), "user": f"u{i % 17}"}))
    path.write_text("[\n" + ",\n".join(lines) + "\n]\n")


def write_helios(jobs: list[TraceJob], path: Path, rng: random.Random) -> None:
    t0 = _T0[Shape.HELIOS]
    with path.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(HELIOS_COLUMNS + ["duration"])
        for i, j in enumerate(jobs):
            gpus = 0 if i % 37 == 36 else j.gpus
            start = t0 + j.submit + _recorded_wait(rng)
            w.writerow([j.id, f"u{i % 23}", j.group, gpus, int(j.cpu_per_node * j.num_nodes), j.num_nodes,
                        "COMPLETED", _stamp(t0 + j.submit), _stamp(start), _stamp(start + j.duration), round(j.duration)])


def write_csv(jobs: list[TraceJob], path: Path) -> None:
    with path.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["job_id", "submit_time", "duration", "num_nodes", "gpus_per_node", "team", "priority_class",
                    "cpu_per_node", "memory_per_node"])
        for j in jobs:
            w.writerow([j.id, f"{j.submit:.10g}", f"{j.duration:.10g}", j.num_nodes, j.gpus_per_node, j.group,
                        j.priority_class or "", f"{j.cpu_per_node:g}", f"{j.memory_per_node:g}"])


def write_samples(directory: Path, seed: int = 2020) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    rng = random.Random(seed)
    pai_users = {f"user{i:02d}": 1.0 for i in range(12)}
    write_pai(generate(300, 15, seed=seed, shape=Shape.PAI, groups=pai_users, gpus_per_node=8), directory, rng)
    write_philly(generate(200, 8, seed=seed + 1, shape=Shape.PHILLY, groups={f"vc{i}": 1.0 for i in range(6)},
                          gpus_per_node=8), directory / "philly_cluster_job_log.json", rng)
    write_helios(generate(300, 15, seed=seed + 2, shape=Shape.HELIOS, groups={f"vc{i}": 1.0 for i in range(8)},
                          gpus_per_node=8), directory / "helios_cluster_log.csv", rng)
    write_csv(generate(300, 12, seed=seed + 3, shape=Shape.PAI,
                       groups={"ml-a": 2, "ml-b": 2, "prod": 1, "eval": 3},
                       priority_classes={"normal": 8, "high": 1, "low": 1}),
              directory / "jobs.csv")


def main() -> None:
    root = Path.cwd()
    write_samples(root / "simulations" / "traces")
    for rel, schema in schemas().items():
        (root / rel).write_text(json.dumps(schema, indent=2) + "\n")


if __name__ == "__main__":
    main()
