"""How far to trust the simulator: `gangctl sim-check` on three slices against the real control plane.

    .venv/bin/python benchmarks/sim_fidelity.py --json out.json                   # ~55 min: 3 x 300 jobs
    .venv/bin/python benchmarks/sim_fidelity.py --jobs 60 --json out.json         # a quick look (~12 min)
    .venv/bin/python benchmarks/sim_fidelity.py --report out.json                 # the table again
    .venv/bin/python benchmarks/sim_fidelity.py --report out.json --write-fidelity simulations/fidelity.json
    .venv/bin/python benchmarks/sim_fidelity.py --report out.json --remodel       # stored real runs, this model
    .venv/bin/python benchmarks/sim_fidelity.py --report a.json b.json --remodel  # several runs, pooled per slice
    .venv/bin/python benchmarks/sim_fidelity.py --record-runs 6 --slices simulations/replay-check.yaml   # new runs, stored
    .venv/bin/python benchmarks/sim_fidelity.py --report simulations/fidelity-run-*.json --remodel --held-out
    .venv/bin/python benchmarks/sim_fidelity.py --report simulations/fidelity-run-*.json --sweep permit_hold_race=0.33,0.64
    .venv/bin/python benchmarks/sim_fidelity.py --record-runs 1 --slices simulations/topology-racks.yaml \
        --topology 2x2x8 --jobs 100 --compression 180        # the topology slice, on labelled racks (~15 min)

One local cluster of its own (8 KWOK nodes x 8 GPUs, as the slices' comments say) and `gangctl
controller`; each slice runs through `gangctl sim-check SLICE -o json --dump` as a user would run it
(the quota slice with `--quota`), one after the other. The table shows each slice's real mean and p95
JCT and queueing delay beside the model's (the mean over its draws of the scheduler's random tie-breaks)
with the draws' 5-95 % range and the model's relative error; `--write-fidelity` stores the largest
errors over the slices in the file `gangctl sim` prints as its validated error bars, and the widest
range (how far one run may fall from the model by chance alone).

One real run of a slice is one draw too: which waiting gang gets a node that drains is decided by races
in the scheduler, so runs of the same 300 jobs differ (replay-check's mean queueing by 12 %, one
standard deviation over five runs). Given several runs (`--report` with several files), the table pools them per slice: the
mean of the runs' figures, their run-to-run spread, and the model's error against that mean, which is
what `--write-fidelity` then stores. The pooled error comes with its 95 % interval from a seeded bootstrap
over the runs, and the verdict against issue 17's tolerance (means 5 %, p95s 10 %) is "within tolerance"
only when the whole interval is (`gangctl.validate.measure`). The protocol for a model change
(docs/simulator.md): `--record-runs` stores new runs, `--held-out` scores only those recorded after the
model's last commit, `--sweep` shows how the verdicts move with a fitted constant. Two diagnostics follow the tables: where each real run ranks among
the model's draws (a right model gives ranks spread evenly around 0.5), and, with `--remodel`, the
real p95s had equal gangs been served first come, first served (how much of the tail is that order).
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from benchmarks.local import cluster_with_controller  # noqa: E402
from gangctl.cluster.lifecycle import UpOptions  # noqa: E402
from gangctl.cluster.setup import parse_shape  # noqa: E402
from gangctl.harness import results as published  # noqa: E402
from gangctl.validate.measure import (GOAL_TOLERANCE, MIN_RUNS_FOR_VERDICT, bootstrap_interval,  # noqa: E402
                                     interval_verdict, pooled_error)

SLICES = (("simulations/replay-check.yaml", False), ("simulations/replay-check-philly.yaml", False),
          ("simulations/replay-check-quota.yaml", True))
METRICS = (("jct_seconds", "mean"), ("jct_seconds", "p95"), ("queue_delay_seconds", "mean"),
           ("queue_delay_seconds", "p95"))
MODEL_PATHS = published.BENCHMARKS["sim_fidelity"].paths   # the model: what --remodel runs
# The constants of the model fitted on real runs' logs (gangctl/validate/plan.py), as --sweep names them.
FITTED = {"permit_hold_race": "PERMIT_HOLD_RACE", "attempt_seconds": "ATTEMPT_SECONDS"}
RUNS_DIR = REPO / "simulations"


def say(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def conditions(args: argparse.Namespace) -> dict:
    commit = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True).stdout.strip()
    dirty = subprocess.run(["git", "-C", str(REPO), "status", "--porcelain", "--", "gangctl"], capture_output=True,
                           text=True).stdout.split("\n")
    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), platform.processor())
    return {"date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"), "gangctl": commit,
            "gangctl_uncommitted": sorted(line[3:] for line in dirty if line.strip()),
            "machine": {"cpu": cpu, "cores": os.cpu_count()}, "jobs": args.jobs, "compression": args.compression,
            "gpu_nodes": args.gpu_nodes, "topology": args.topology, "argv": sys.argv[1:]}


def git(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run(["git", "-C", str(REPO), *argv], capture_output=True, text=True)


def model_commit() -> str:
    """The last commit that changed the model (`MODEL_PATHS`) in this checkout: what --remodel scores."""
    return git("log", "-1", "--format=%h", "--", *MODEL_PATHS).stdout.strip() or "unknown"


def after_model(run_commit: str, model: str) -> bool:
    """Whether a run was recorded on a checkout that already had the model commit (held out from it)."""
    return git("merge-base", "--is-ancestor", model, run_commit).returncode == 0


def next_run_path(directory: Path, date: str) -> Path:
    """simulations/fidelity-run-<date>.json, then ...b, ...c: the first name not taken."""
    for suffix in ["", *"bcdefghijklmnopqrstuvwxyz"]:
        path = directory / f"fidelity-run-{date}{suffix}.json"
        if not path.exists():
            return path
    raise RuntimeError(f"26 runs stored for {date} in {directory}")


def run_slice(kubeconfig: Path, scenario: str, quota: bool, args: argparse.Namespace, dumps: Path) -> dict:
    name = Path(scenario).stem
    cmd = [sys.executable, "-m", "gangctl.cli", "sim-check", scenario, "--jobs", str(args.jobs),
           "--compression", str(args.compression), "-o", "json", "--dump", str(dumps / f"{name}.jsonl"),
           *(["--quota"] if quota else [])]
    say(f"{name}: {' '.join(cmd[3:])}")
    started = time.monotonic()
    out = subprocess.run(cmd, cwd=REPO, env={**os.environ, "KUBECONFIG": str(kubeconfig)}, capture_output=True,
                         text=True)
    if out.returncode not in (0, 2):  # 2: ran, and the model is outside the tolerance
        raise RuntimeError(f"{name}: sim-check exited {out.returncode}: {out.stderr[-2000:]}")
    result = json.loads(out.stdout)
    result["slice"], result["quota"], result["wall_seconds"] = name, quota, round(time.monotonic() - started, 1)
    # Each real job's submit, start and end (seconds after the first submission), so that a later model
    # can be judged job by job against this run (`--report FILE --remodel` prints it by gang shape).
    result["real_jobs"] = [{"job": row["job"], **row["real"]} for line in
                           (dumps / f"{name}.jsonl").read_text().splitlines() if (row := json.loads(line))["real"]]
    say(f"{name}: done in {result['wall_seconds']:.0f} s; passed={result['passed']}")
    return result


def remodel(results: list[dict], overrides: dict | None = None, draws: int | None = None) -> None:
    """The model side of stored results again, with this checkout's simulator: the same slices, nodes,
    compression and measured latencies (the plan is a pure function of them), so a model change is
    judged against real runs already made."""
    from gangctl.sim.model import NodePool
    from gangctl.sim.scenario import LevelSpec, load_quota_policy, load_scenario, load_workload
    from gangctl.validate.expectation import expected
    from gangctl.validate.plan import local_control_plane, plan

    for r in results:
        sc = load_scenario(REPO / "simulations" / f"{r['slice']}.yaml")
        policy = load_quota_policy(sc.quota_policy)
        pools = [NodePool(f"gpu-{i}", c["nodes"], c["gpus_per_node"]) for i, c in enumerate(r["cluster"])]
        levels = [LevelSpec(**lv) for lv in r["topology_levels"]] if r.get("topology_levels") else None
        p = plan(sc, policy, load_workload(sc, policy).jobs, pools, count=r["jobs"], compression=r["compression"],
                 quota=r["quota"], levels=levels)
        cp = local_control_plane(**r["measured_latency"]).model_copy(update=overrides or {})
        e = expected(p.scenario.model_copy(update={"control_plane": cp}), p.policy, p.sim_jobs,
                     **({"draws": draws} if draws else {}))
        r.update(e.result_fields())
        if r.get("real_jobs"):
            r["by_shape"] = by_shape(p.sim_jobs, r["real_jobs"], e.outcomes)
            r["oldest_first"] = turns(p.sim_jobs, r["real_jobs"], e.draw_outcomes)
            if not r["quota"]:   # under quota each team's queue has its own order: no single arrival order
                r["arrival_order"] = arrival_order(p.sim_jobs, r["real_jobs"])


def turns(sim_jobs, real_jobs: list[dict], draws) -> list[dict]:
    """Per gang shape, how often the longest-waiting gang of that shape started first: in the real run,
    and over every model draw (see `oldest_first`). Shapes with fewer than five real waits are left out."""
    from gangctl.validate.measure import oldest_first

    real = {j["job"]: j for j in real_jobs}
    jobs = [j for j in sim_jobs if j.id in real]
    shapes = {j.id: (j.num_nodes, j.gpus_per_node) for j in jobs}
    real_turns = oldest_first(shapes, {j: real[j]["submit"] for j in shapes}, {j: real[j]["start"] for j in shapes})
    submits = {j.id: j.submit for j in jobs}   # the simulated submissions, the same in every draw
    model_turns: dict[tuple[int, int], list[int]] = {}
    for outcomes in draws:
        for shape, (first, waited) in oldest_first(shapes, submits, {o.id: o.start for o in outcomes}).items():
            m = model_turns.setdefault(shape, [0, 0])
            m[0], m[1] = m[0] + first, m[1] + waited
    return [{"pods": k[0], "gpus_per_pod": k[1], "real": list(v), "model": model_turns.get(k, [0, 0])}
            for k, v in real_turns.items() if v[1] >= 5]


def arrival_order(sim_jobs, real_jobs: list[dict]) -> dict:
    """The real run's p95 JCT and queueing delay had equal gangs started first come, first served: the
    same start times, each shape's handed out in submission order (`in_arrival_order`). What is left
    between these and the model is when nodes drained; the rest of the real tail is the order."""
    from gangctl.validate.measure import in_arrival_order

    real = {j["job"]: j for j in real_jobs if j.get("start") is not None and j.get("end") is not None}
    jobs = [j for j in sim_jobs if j.id in real]
    starts = in_arrival_order({j.id: (j.num_nodes, j.gpus_per_node) for j in jobs},
                              {j.id: real[j.id]["submit"] for j in jobs}, {j.id: real[j.id]["start"] for j in jobs})
    # A job runs as long from its start whichever start it gets: its end moves with its start.
    queue = [starts[j] - real[j]["submit"] for j in starts]
    jct = [real[j]["end"] - real[j]["start"] + starts[j] - real[j]["submit"] for j in starts]
    return {"queue_delay_seconds": _p95(queue), "jct_seconds": _p95(jct)}


def _p95(values: list[float]) -> float:
    return statistics.quantiles(sorted(values), n=100, method="inclusive")[94]


def by_shape(sim_jobs, real_jobs: list[dict], model_outcomes) -> list[dict]:
    """Mean queueing delay per gang shape (pods x GPUs per pod), real beside the model: where they part."""
    real = {j["job"]: j for j in real_jobs}
    model = {o.id: o for o in model_outcomes}
    groups: dict[tuple[int, int], list[tuple[float, float]]] = {}
    for j in sim_jobs:
        r, m = real.get(j.id), model.get(j.id)
        if r and r.get("start") is not None and m and m.start is not None:
            groups.setdefault((j.num_nodes, j.gpus_per_node), []).append((r["start"] - r["submit"], m.start - j.submit))
    return [{"pods": k[0], "gpus_per_pod": k[1], "jobs": len(v), "real_queueing_mean": sum(a for a, _ in v) / len(v),
             "model_queueing_mean": sum(b for _, b in v) / len(v)} for k, v in sorted(groups.items())]


def placement_lines(results: list[dict]) -> list[str]:
    """A topology slice's placement per kind of ask, real / model: domains per multi-pod gang, p95 queueing."""
    lines = []
    for r in results:
        real, model = r.get("real_topology"), r.get("model_topology")
        if not real or not model:
            continue
        cells = []
        for kind, row in real["by_ask"].items():
            m = model["by_ask"].get(kind) or {}
            spans = "-" if row["mean_domains"] is None else f"{row['mean_domains']:.2f} / {m.get('mean_domains') or 0:.2f}"
            cells.append(f"{kind} ({row['gang_starts']} gangs) domains {spans}, p95 queueing "
                         f"{row['queue_delay_seconds']['p95']:.1f} / {m['queue_delay_seconds']['p95']:.1f} s")
        lines.append(f"{r['slice']} ({r.get('run', '')}): placement real / model: " + "; ".join(cells)
                     + f"; required gangs over >1 domain {real['required_violations']} / {model['required_violations']}")
    return lines


def share(counts: list[int]) -> str:
    return f"{counts[0] / counts[1]:.0%}" if counts[1] else "-"


def error(real: float | None, sim: float | None) -> float | None:
    return None if not real or sim is None else (sim - real) / real


def band(r: dict, key: str, stat: str) -> list[float]:
    """The model draws' 5-95 % range of one metric ([] when the result has none)."""
    b = (r.get("model_band") or {}).get(key, {}).get(stat) or []
    return b if len(b) == 2 else []


def table(results: list[dict], pooled_runs: bool = False) -> str:
    """One row per run of a slice, or (`pooled_runs`, rows from `pooled`) one per slice with its runs' spread."""
    count, real_label = ("runs", "real mean of runs (run-to-run spread)") if pooled_runs else ("jobs", "real")
    head = (f"| slice | {count} | " + " | ".join(f"{k.split('_')[0].replace('queue', 'queueing')} {s} {real_label} / "
                                                 "model [draws 5-95 %] (error)" for k, s in METRICS) + " |")
    lines = [head, "|" + "---|" * (2 + len(METRICS))]
    for r in results:
        cells = []
        for key, stat in METRICS:
            real, model = r["real"][key][stat], r["model"][key][stat]
            e = error(real, model)
            b = band(r, key, stat)
            shown = f" [{b[0]:.1f}-{b[1]:.1f}]" if b else ""
            spread = (r.get("real_spread") or {}).get(key, {}).get(stat)
            real_shown = f"{real:.2f}" + (f" (±{spread:.1%})" if spread is not None else "")
            cells.append(f"{real_shown} / {model:.2f}{shown} ({e:+.1%})" if e is not None else "-")
        run = f" ({r['run']})" if "run" in r else ""
        lines.append(f"| {r['slice']}{' (quota)' if r['quota'] else ''}{run} | {r[count]} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def pooled(results: list[dict]) -> list[dict]:
    """The runs of each slice as one: per metric the mean of the runs' real figures and of the model's
    (each run's model uses that run's measured latencies), and the real runs' spread (standard deviation
    over their mean; None with one run). Only runs of the same slice, job count and compression pool; a
    slice keeps the place of its first run."""
    by_slice: dict[tuple, list[dict]] = {}
    for r in results:
        by_slice.setdefault((r["slice"], r["quota"], r["jobs"], r["compression"]), []).append(r)
    out = []
    for (name, quota, jobs, _), runs in by_slice.items():
        merged = {"slice": name, "quota": quota, "jobs": jobs, "runs": len(runs), "real": {}, "model": {},
                  "real_spread": {}, "model_band": {}}
        for key, stat in METRICS:
            real = [r["real"][key][stat] for r in runs]
            model = [r["model"][key][stat] for r in runs]
            mean = statistics.fmean(real)
            merged["real"].setdefault(key, {})[stat] = mean
            merged["model"].setdefault(key, {})[stat] = statistics.fmean(model)
            merged["real_spread"].setdefault(key, {})[stat] = statistics.stdev(real) / mean if len(runs) > 1 and mean else None
            interval = bootstrap_interval(real, model) if mean else None
            merged.setdefault("error", {}).setdefault(key, {})[stat] = pooled_error(real, model) if mean else None
            merged.setdefault("error_interval", {}).setdefault(key, {})[stat] = list(interval) if interval else None
            merged.setdefault("verdict", {}).setdefault(key, {})[stat] = interval_verdict(interval, GOAL_TOLERANCE[stat], len(runs))
            bands = [b for r in runs if (b := band(r, key, stat))]
            if bands:
                merged["model_band"].setdefault(key, {})[stat] = [statistics.fmean(b[0] for b in bands),
                                                                  statistics.fmean(b[1] for b in bands)]
        out.append(merged)
    return out


def verdict_rows(merged: list[dict]) -> tuple[list[str], list[list]]:
    """Per pooled slice and metric: the pooled error, its 95 % bootstrap interval over the runs, and the
    verdict against the tolerance (within only when the whole interval is)."""
    columns = ["slice", "runs", *(f"{'JCT' if k == 'jct_seconds' else 'queueing'} {s} (tolerance ±"
                                  f"{GOAL_TOLERANCE[s]:.0%})" for k, s in METRICS)]
    rows = []
    for m in merged:
        cells = []
        for key, stat in METRICS:
            e, i = m["error"][key][stat], m["error_interval"][key][stat]
            shown = "-" if e is None else f"{e:+.1%}" + (f" [{i[0]:+.1%}, {i[1]:+.1%}]" if i else "")
            cells.append(f"{shown}: {m['verdict'][key][stat]}")
        rows.append([m["slice"] + (" (quota)" if m["quota"] else ""), m["runs"], *cells])
    return columns, rows


def markdown(columns: list[str], rows: list[list]) -> str:
    return "\n".join("| " + " | ".join(str(c) for c in row) + " |" for row in
                     [columns, ["---"] * len(columns), *rows])


def sweep(results: list[dict], spec: str, draws: int | None) -> tuple[str, list[str], list[list]]:
    """`--sweep NAME=v1,v2,...`: the pooled errors and verdicts with one fitted constant of the model set to
    each value (the stored runs rescored each time): how much the verdicts depend on it. The constant's
    name, the columns and the rows (one per value and slice)."""
    name, _, values = spec.partition("=")
    if name not in FITTED or not values:
        raise SystemExit(f"--sweep: NAME=v1,v2,... with NAME one of {', '.join(FITTED)}")
    rows, columns = [], []
    for value in (float(v) for v in values.split(",")):
        say(f"{name} = {value:g}: rescoring {len(results)} results")
        rescored = [dict(r) for r in results]
        remodel(rescored, {name: value}, draws)
        columns, slice_rows = verdict_rows(pooled(rescored))
        rows += [[f"{value:g}", *row] for row in slice_rows]
    return name, [name, *columns], rows


def arrival_order_lines(results: list[dict]) -> list[str]:
    """Per slice, the runs' mean p95s as run and with equal gangs' starts in arrival order (`arrival_order`),
    each beside the model's: how much of the model's error the order among equal gangs accounts for."""
    orders = [r for r in results if r.get("arrival_order")]
    lines = []
    for name in dict.fromkeys(r["slice"] for r in orders):
        runs = [r for r in orders if r["slice"] == name]
        cells = []
        for key, label in (("jct_seconds", "JCT"), ("queue_delay_seconds", "queueing")):
            real = statistics.fmean(r["real"][key]["p95"] for r in runs)
            fcfs = statistics.fmean(r["arrival_order"][key] for r in runs)
            model = statistics.fmean(r["model"][key]["p95"] for r in runs)
            cells.append(f"p95 {label} real {real:.1f}, with equal gangs' starts in arrival order {fcfs:.1f} "
                         f"({error(fcfs, model):+.1%} from the model's {model:.1f}; as run {error(real, model):+.1%})")
        lines.append(f"{name} ({len(runs)} run{'s' if len(runs) > 1 else ''}, means): " + "; ".join(cells))
    return lines


def ranks(results: list[dict]) -> list[str]:
    """Per slice and metric, where each real run falls among the model's draws (`rank`), and the runs'
    mean rank with its distance from 0.5 in standard deviations (`rank_bias`): whether the real runs
    are typical draws of the model. Runs stored without the draws' figures (before they were kept,
    and not `--remodel`led) are left out."""
    from gangctl.validate.measure import rank, rank_bias

    by_slice: dict[str, list[dict]] = {}
    for r in results:
        if r.get("model_draw_values"):
            by_slice.setdefault(r["slice"] + (" (quota)" if r["quota"] else ""), []).append(r)
    lines = []
    for name, runs in by_slice.items():
        cells = []
        for key, stat in METRICS:
            rs = [rank(r["real"][key][stat], r["model_draw_values"][key][stat]) for r in runs]
            mean, z = rank_bias(rs)
            cells.append(f"{key.split('_')[0].replace('queue', 'queueing')} {stat} {mean:.2f} ({z:+.1f} sd; "
                         + " ".join(f"{x:.2f}" for x in rs) + ")")
        lines.append(f"{name}: rank of the real runs among the model's draws (0.5 = typical), mean over "
                     f"{len(runs)} run{'s' if len(runs) > 1 else ''}: " + ", ".join(cells))
    return lines


def fidelity(results: list[dict], cond: dict) -> dict:
    """The largest absolute error of the model over the slices, per metric: the simulator's error bars.
    Several runs of a slice count as one, by the mean of their figures (see `pooled`)."""
    results = pooled(results)
    worst, chance, spread, interval = {}, {}, {}, {}
    for key, stat in METRICS:
        errors = [abs(e) for r in results if (e := error(r["real"][key][stat], r["model"][key][stat])) is not None]
        worst[f"{key}.{stat}"] = round(max(errors), 4) if errors else None
        halves = [(b[1] - b[0]) / 2 / r["model"][key][stat] for r in results
                  if (b := band(r, key, stat)) and r["model"][key][stat]]
        chance[f"{key}.{stat}"] = round(max(halves), 4) if halves else None
        spreads = [v for r in results if (v := r["real_spread"][key][stat]) is not None]
        spread[f"{key}.{stat}"] = round(max(spreads), 4) if spreads else None
        bounds = [abs(b) for r in results if (i := r["error_interval"][key][stat]) for b in i]
        interval[f"{key}.{stat}"] = round(max(bounds), 4) if bounds else None
    runs = cond.get("runs") or [cond]
    dates = sorted({c["date"] for c in runs})
    return {"measured": dates[0] if len(dates) == 1 else f"{dates[0]} to {dates[-1]}",
            "commit": ", ".join(dict.fromkeys(c["gangctl"] for c in runs)), "model_commit": cond.get("model_recomputed", cond["gangctl"]),
            "validated_scenarios": "coscheduling backend, no failures, not elastic, one zone",
            "slices": [r["slice"] for r in results], "runs_per_slice": {r["slice"]: r["runs"] for r in results},
            "jobs_per_slice": cond["jobs"], "compression": cond["compression"],
            "command": "benchmarks/sim_fidelity.py " + " ".join(cond["argv"]), "max_relative_error": worst,
            "max_relative_chance_spread": chance, "max_real_run_spread": spread,
            "max_abs_error_interval95": interval,
            "verdicts": {r["slice"]: {f"{k}.{s}": r["verdict"][k][s] for k, s in METRICS} for r in results}}


def record_runs(args: argparse.Namespace) -> int:
    """The driver of new real runs: `--record-runs N` runs the slices N times back to back, a fresh cluster
    each time, and stores each run as simulations/fidelity-run-<date>[b, c, ...].json (its commit and
    any uncommitted change to gangctl/ are in its conditions). Refuses a checkout whose model differs
    from its commit: a run must name the code it ran."""
    dirty = git("status", "--porcelain", "--", *MODEL_PATHS, "gangctl").stdout.strip()
    if dirty:
        raise SystemExit(f"uncommitted changes under gangctl/: commit them first, a run names its commit\n{dirty}")
    for n in range(args.record_runs):
        say(f"run {n + 1} of {args.record_runs}")
        data = measure(args)
        path = next_run_path(RUNS_DIR, data["conditions"]["date"][:10])
        path.write_text(json.dumps(data, indent=2) + "\n")
        say(f"stored {path.relative_to(REPO)} (commit {data['conditions']['gangctl']})")
    return 0


def measure(args: argparse.Namespace) -> dict:
    """One run of the slices on a cluster of its own: the conditions and each slice's sim-check result."""
    slices = [(s, "quota" in Path(s).stem) for s in args.slices] if args.slices else list(SLICES)
    cond = conditions(args)
    say("conditions: " + json.dumps(cond))
    dumps = Path("/tmp") / f"{args.cluster_name}-dumps"
    dumps.mkdir(exist_ok=True)
    shape = parse_shape(args.topology) if args.topology else None
    options = UpOptions(gpu_nodes=shape.nodes if shape else args.gpu_nodes, gpus_per_node=8, topology=shape)
    with cluster_with_controller(args.cluster_name, options, say) as (_, cluster, _ctl):
        results = [run_slice(cluster.kubeconfig, s, q, args, dumps) for s, q in slices]
    say(f"per-job dumps in {dumps}")
    return {"conditions": cond, "results": results}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--jobs", type=int, default=300)
    ap.add_argument("--compression", type=float, default=60.0)
    ap.add_argument("--gpu-nodes", type=int, default=8)
    ap.add_argument("--slices", nargs="*", help="scenario files (default: the three replay-check slices)")
    ap.add_argument("--topology", metavar="BLOCKSxRACKSxHOSTS", help="label the GPU nodes in blocks and racks "
                    "(replaces --gpu-nodes): for a topology slice such as simulations/topology-racks.yaml")
    ap.add_argument("--json", help="write conditions and results here")
    ap.add_argument("--record-runs", type=int, metavar="N", help="run the slices N times back to back (a fresh "
                    "cluster each) and store each run in simulations/fidelity-run-<date>*.json")
    ap.add_argument("--report", nargs="+", metavar="FILE", help="print the table of earlier --json files and exit "
                                                                  "(several: runs of a slice pooled)")
    ap.add_argument("--remodel", action="store_true", help="with --report: recompute the model side with this "
                                                                "checkout's simulator")
    ap.add_argument("--held-out", action="store_true", help="with --report: score only the runs recorded at or "
                    "after the model's last commit (the protocol of docs/simulator.md)")
    ap.add_argument("--sweep", metavar="NAME=V1,V2", help="with --report: rescore the runs with a fitted constant "
                    f"set to each value ({', '.join(FITTED)}); sensitivity of the verdicts")
    ap.add_argument("--draws", type=int, help="with --remodel or --sweep: the model's draws per run (default: "
                    "sim-check's)")
    ap.add_argument("--write-fidelity", help="store the largest errors for `gangctl sim` (simulations/fidelity.json)")
    ap.add_argument("--record", action="store_true", help="with --report: write the pooled verdicts to "
                    "benchmarks/results/sim_fidelity.json")
    ap.add_argument("--cluster-name", default="gangctl-bench-fidelity")
    args = ap.parse_args()
    if args.record and not (args.report and (args.remodel or args.sweep)):
        ap.error("--record publishes a rescoring by this checkout's model: use it with --report ... --remodel "
                 "(or --sweep)")
    if args.record_runs:
        return record_runs(args)
    if args.report:
        stored = [json.loads(Path(f).read_text()) for f in args.report]
        if args.held_out:
            model = model_commit()
            stored = [d for d in stored if after_model(d["conditions"]["gangctl"], model)]
            say(f"{len(stored)} of {len(args.report)} runs recorded at or after the model's commit {model}")
            if not stored:
                print(f"No stored run was recorded at or after the model's last commit ({model}): the held-out "
                      "score awaits new runs (--record-runs N).")
                return 0
        data = {"conditions": stored[-1]["conditions"] | {"runs": [d["conditions"] for d in stored]},
                "results": [r | {"run": d["conditions"]["date"]} for d in stored for r in d["results"]]}
        data["conditions"]["argv"] = sys.argv[1:]   # the command behind these figures (each run keeps its own)
        if args.sweep:
            name, columns, rows = sweep(data["results"], args.sweep, args.draws)
            print(f"sensitivity to {name} ({FITTED[name]} in gangctl/validate/plan.py), the stored runs rescored:\n"
                  + markdown(columns, rows))
            if args.record:   # the slices with enough runs for a verdict
                rows = [r for r in rows if r[2] >= MIN_RUNS_FOR_VERDICT]
                slices = ", ".join(dict.fromkeys(r[1] for r in rows))
                path = published.record(
                    "sim_fidelity", columns, rows, f"the stored runs of {slices} rescored with {name} at each value"
                    f"{'' if args.draws is None else f', {args.draws} draws'} (slices with fewer than "
                    f"{MIN_RUNS_FOR_VERDICT} runs left out)", commit=model_commit(), part=f"Sensitivity to {name}")
                say(f"recorded {path}; run benchmarks/results_page.py to regenerate the page")
            return 0
        if args.remodel:
            remodel(data["results"], draws=args.draws)
            data["conditions"]["model_recomputed"] = model_commit()
    else:
        data = measure(args)
        if args.json:
            Path(args.json).write_text(json.dumps(data, indent=2))
    print(table(data["results"]))
    merged = pooled(data["results"])
    if any(m["runs"] > 1 for m in merged):
        print("\npooled over the runs of each slice:\n" + table(merged, pooled_runs=True))
    columns, rows = verdict_rows(merged)
    print("\nthe model's pooled error with its 95 % interval (bootstrap over the runs), and the verdict "
          "(within only when the whole interval is):\n" + markdown(columns, rows))
    for r in data["results"]:
        if r.get("by_shape"):
            print(f"{r['slice']}: mean queueing by gang shape, real / model: " + ", ".join(
                f"{g['pods']}x{g['gpus_per_pod']} ({g['jobs']}) {g['real_queueing_mean']:.1f} / "
                f"{g['model_queueing_mean']:.1f}" for g in r["by_shape"]))
        if r.get("oldest_first"):
            print(f"{r['slice']}: the longest-waiting gang of its shape started first, real / model: " + ", ".join(
                f"{g['pods']}x{g['gpus_per_pod']} {g['real'][0]}/{g['real'][1]} ({share(g['real'])}) / "
                f"{g['model'][0]}/{g['model'][1]} ({share(g['model'])})" for g in r["oldest_first"]))
    for line in arrival_order_lines(data["results"]) + ranks(data["results"]) + placement_lines(data["results"]):
        print(line)
    f = fidelity(data["results"], data["conditions"])
    print("largest error of the model: " + ", ".join(f"{k} {v:.1%}" for k, v in f["max_relative_error"].items()
                                                     if v is not None))
    if args.write_fidelity:
        Path(args.write_fidelity).write_text(json.dumps(f, indent=2) + "\n")
    if args.record:
        model = data["conditions"].get("model_recomputed", "unknown")
        runs = ", ".join(f"{m['slice']} {m['runs']}" for m in merged)
        path = published.record(
            "sim_fidelity", columns, rows, f"real runs {f['measured']} at {f['commit']} ({runs}), each scored by the "
            f"model at {model}{'' if args.draws is None else f' with {args.draws} draws'}; "
            f"bootstrap over the runs, {len(merged)} slices", commit=model,
            notes=["Within tolerance only when the whole 95 % interval is; \"not shown within\": the interval "
                   "crosses the tolerance, so the runs cannot tell. The model's own draw-to-draw spread is left out."])
        say(f"recorded {path}; run benchmarks/results_page.py to regenerate the page")
    return 0


if __name__ == "__main__":
    sys.exit(main())
