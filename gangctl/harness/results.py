"""Benchmark results as data, and the results page generated from them.

Each benchmark's current figures live in `benchmarks/results/<benchmark>.json`: a table (its columns
and rows; gangctl's figures beside the peer's from the same run), the date, the commit measured, the
command, the CPU model and the load. `benchmarks/README.md` is generated from those files
(`benchmarks/results_page.py`): per benchmark what it measures, its table and its command. Older
figures live in git history, not on the page.

The generator knows which source paths each benchmark measures (`BENCHMARKS`); a result whose paths
differ in this work tree from its commit (`git diff <commit> -- paths`, new files included) is marked stale on
the page. The mark names no later commit, so a change and the page it makes stale are committed together
(run the script before committing), and the page changes only when a figure goes stale. A cell is a number, a string, or a summary of repeated runs (`rounds.summary`: median and
range), printed as "median (min–max, n runs)".
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
RESULTS = REPO / "benchmarks" / "results"
PAGE = REPO / "benchmarks" / "README.md"
UNKNOWN = "unknown"
FIELDS = ("benchmark", "date", "commit", "command", "cpu", "load", "runs", "columns", "rows")


@dataclass(frozen=True)
class Benchmark:
    script: str
    title: str
    measures: str
    paths: tuple[str, ...]   # the code whose change makes its figures stale


# The simulator's model as sim-check and `sim_fidelity.py --remodel` run it (not its report or CLI).
_MODEL = tuple(f"gangctl/sim/{m}.py" for m in ("engine", "controller", "model", "scenario", "generate", "replay", "clock",
                                                "units", "traces")) + ("gangctl/validate/plan.py",
                                                                       "gangctl/validate/expectation.py", "gangctl/policy")
_CONTROLLER = ("gangctl/runtime", "gangctl/kube", "gangctl/plugins", "gangctl/policy", "gangctl/api")
BENCHMARKS: dict[str, Benchmark] = {b.script.removesuffix(".py"): b for b in (
    Benchmark("sim_speed.py", "Simulator speed",
              "Simulated jobs per CPU second on one core: PAI-shaped generated traces (20 arrivals/hour) on "
              "256 GPUs shared by the four teams of `policies/example-teams.yaml`, Kueue backend semantics, node "
              "and exit failures on; every event runs the controller's quota admission (`decide`), then "
              "all-or-nothing placement. Only the simulation is timed. Goal (issue 14): ≥ 10,000 jobs/s at 20,000 "
              "jobs.", ("gangctl/sim", "gangctl/policy")),
    Benchmark("sim_fidelity.py", "Simulator fidelity against the real control plane",
              "The three 300-job replay-check slices run on a real local cluster (8 KWOK nodes × 8 GPUs, "
              "`gangctl controller`, kube-scheduler with Coscheduling) by `gangctl sim-check`, each slice's "
              "stored runs pooled and scored by the model: the pooled error of the runs' mean against the "
              "model, with a 95 % interval from a seeded bootstrap over the runs. Verdict against issue 17's "
              "tolerance (means 5 %, p95s 10 %): within it only when the whole interval is. Protocol and "
              "model: [docs/simulator.md](../docs/simulator.md).",
              _MODEL),
    Benchmark("coscheduling_churn.py", "Coscheduling's churn on a gang that fits in sum",
              "A P × 8 gang whose GPUs are free in sum but not node by node, on P + 2 KWOK nodes: its Permit "
              "turns while it churns, the pods kube-scheduler discards as already in flight, and whether it "
              "binds once the nodes are freed (exit 3 if it never does).",
              ("integrations/coscheduling", "gangctl/plugins/coscheduling.py")),
    Benchmark("controller_peer.py", "gangctl against Kubeflow Trainer, side by side",
              "The same 200 TrainJobs × 4 pods (1 GPU each; every gang fits at once) submitted in a burst to "
              "gangctl and to Kubeflow Trainer v2.3.0 + JobSet v0.12.0, each on a fresh local cluster of its "
              "own (same pinned control plane, Coscheduling, 100 KWOK nodes × 8 GPUs): time to every pod "
              "bound, per-TrainJob latency, controller CPU and memory, apiserver requests and CPU.",
              _CONTROLLER),
    Benchmark("pytorchjob_peer.py", "gangctl against Training Operator v1 on PyTorchJobs",
              "The method of `controller_peer.py` for the v1 API: 200 PyTorchJobs (a Master and three Workers, "
              "1 GPU each) on gangctl and on Kubeflow Training Operator v1.9.4 with its defaults, each on a "
              "fresh local cluster of 100 KWOK nodes × 8 GPUs.", _CONTROLLER),
    Benchmark("elastic_recovery.py", "Elastic recovery on real node loss",
              "An elastic TrainJob (min 2, max 4 process nodes, `examples/elastic/train.py`): each round "
              "SIGKILLs the agent of the node hosting the lowest running index and reads the pods' logs: detect, rendezvous, "
              "workers restarted, total (kill → first step with 3 workers), regrow (new node → 4 workers); "
              "`default_estimate` is the same round with torchrun's default keep-alive and last call.",
              (*_CONTROLLER, "gangctl/nodeagent", "gangctl/trainer_progress.py", "examples/elastic")),
    Benchmark("in_place_recovery.py", "In-place gang restart against recreating the gang",
              "The real 3-node DDP job (`examples/ddp`, process nodes) whose rank 1 exits with code 3 once "
              "after step 60, under two runtimes that differ only in `gangctl.io/restart` (InPlace, Recreate), "
              "interleaved: seconds from the failure to the first step every rank completes after it (both "
              "resume from the step-50 checkpoint). Goal (issue 38): in place ≤ 5 s.",
              (*_CONTROLLER, "gangctl/nodeagent", "examples/ddp")),
    Benchmark("elastic_chaos.py", "Elastic TrainJobs under chaos",
              "200 elastic TrainJobs on 500 KWOK GPU nodes while a seeded plan makes 60 nodes NotReady "
              "for 20-60 s each and 20 jobs' workers exit non-zero; a pod watch checks that no (job, "
              "index) ever has two live pods, and at the end that every job finished with a reason and "
              "nothing leaked. Exit 1 when an invariant breaks.", _CONTROLLER),
    Benchmark("quota_backends.py", "One quota policy on five backends",
              "One team, 64 GPUs of quota on 128, the same 200 seeded TrainJobs (pods finish 2-4 s after "
              "they run) on each backend, each on a cluster of its own: whether any sample of the GPUs held "
              "exceeds the quota, time to the last finish, efficiency (GPU-seconds of work over 64 GPUs × "
              "that time) and the wait to the gang bound. Under coscheduling and native the admission is "
              "gangctl's quota gate; under Kueue, Volcano and KAI it is theirs.",
              (*_CONTROLLER, "gangctl/cluster/native.py", "integrations/kueue", "integrations/volcano",
               "integrations/kai")),
    Benchmark("topology_backends.py", "Topology-aware gangs on every backend",
              "The first gangs of simulations/topology-racks.yaml (8-64 GPUs; 40 % require a rack, 20 % prefer "
              "one) replayed with `gangctl sim-check --backend B --quota` on 2 blocks x 2 racks x 8 hosts of 8 "
              "KWOK GPUs, each backend on a cluster of its own: required gangs over more than one rack (goal 0), "
              "racks per preferred gang and p95 wait (goal: gangctl's own placement on coscheduling no worse "
              "than Kueue's TAS), the last finish, and the simulator's model of the same replay beside.",
              (*_CONTROLLER, *_MODEL, "gangctl/validate", "gangctl/sim/topology.py", "gangctl/cluster/native.py",
               "integrations/kueue", "integrations/kai", "simulations/topology-racks.yaml",
               "policies/topology-racks.yaml")),
    Benchmark("leader_failover.py", "Leader failover of gangctl running in the cluster",
              "Two replicas deployed on process nodes (`deploy/overlays/local`, lease 15 s, renew deadline "
              "10 s): (a) SIGKILL of the leader's node agent, (b) deletion of the leader pod (graceful "
              "handover), (c) SIGSTOP of the leader; the time until the other holds the Lease, and, from "
              "the apiserver's audit log, every write a deposed leader made after its deadline.",
              ("gangctl/runtime/leader.py", "gangctl/kube", "gangctl/nodeagent", "deploy")),
    Benchmark("leader_handover.py", "Leader handover and failover of two local replicas",
              "Two `gangctl controller --leader-elect` processes on this machine: SIGTERM (graceful) and "
              "SIGKILL of the leader, the seconds until the Lease names the other. Goals (issue 11): "
              "handover ≤ 3 s, failover ≤ 17 s p95.", ("gangctl/runtime/leader.py", "gangctl/kube")),
    Benchmark("scale.py", "Scale beside Kubeflow Trainer: one big gang, many small ones, a cold start",
              "5,000 KWOK nodes × 8 GPUs per side. P1: one TrainJob of 1,024 pods × 8 GPUs (time to all "
              "bound, against a floor with no controller); P2: 2,000 TrainJobs × 8 pods, 16 creates in "
              "flight (TrainJobs/s to the 2,000th child Job; requests per TrainJob); P3: the controller "
              "restarted with 60,000 pods cached (process start → ready, RSS); P4: the 1,024-pod gang "
              "recovering from one failed pod, in place and recreated. Goals: issues 12 and 38.",
              _CONTROLLER),
)}


def load(directory: Path = RESULTS) -> list[dict]:
    """Every results file, in the order of `BENCHMARKS`; a file of an unknown benchmark or missing a
    field is an error naming the file."""
    order, keyed = list(BENCHMARKS), []
    for path in directory.glob("*.json"):
        data = json.loads(path.read_text())
        missing = [f for f in FIELDS if f not in data]
        if missing or data.get("benchmark") not in BENCHMARKS:
            raise ValueError(f"{path}: " + (f"missing {', '.join(missing)}" if missing
                                            else f"benchmark {data.get('benchmark')!r} is not in BENCHMARKS"))
        # the benchmark's main file first, then its other parts by file name
        keyed.append(((order.index(data["benchmark"]), path.stem != data["benchmark"], path.stem), data))
    return [data for _, data in sorted(keyed, key=lambda k: k[0])]


def changed_since(commit: str, paths: tuple[str, ...], repo: Path = REPO) -> bool | None:
    """Whether `paths` in this work tree differ from `commit` (a new untracked file counts), or None when
    `commit` is unknown or not in this clone's history (staleness cannot be told)."""
    if commit == UNKNOWN:
        return None
    diff = subprocess.run(["git", "-C", str(repo), "diff", "--quiet", commit, "--", *paths],
                          capture_output=True, text=True)
    if diff.returncode not in (0, 1):
        return None
    new = subprocess.run(["git", "-C", str(repo), "ls-files", "--others", "--exclude-standard", "--", *paths],
                         capture_output=True, text=True)
    return diff.returncode == 1 or bool(new.stdout.strip())


def cell(value) -> str:
    if isinstance(value, dict) and "median" in value:   # rounds.summary
        return f"{cell(value['median'])} ({cell(value['min'])}–{cell(value['max'])}, {value['n']} runs)"
    if isinstance(value, bool) or value is None:
        return "—" if value is None else str(value).lower()
    if isinstance(value, (int, float)):
        return f"{value:,}"   # as recorded, with thousands separators
    return str(value)


def print_table(columns: list[str], rows: list[list]) -> None:
    """A benchmark's table on stdout, its cells as the page prints them."""
    for row in [columns, *rows]:
        print(" | ".join(cell(c) for c in row))


def _part(result: dict, paths: tuple[str, ...], changed: bool | None) -> list[str]:
    """One results file: its table, when, where and how it was measured, staleness and notes."""
    lines = [f"### {result['part']}"] if result.get("part") else []
    lines.append("| " + " | ".join(result["columns"]) + " |")
    lines.append("|" + "---|" * len(result["columns"]))
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in result["rows"]]
    lines.append("")
    peer = f"; peer: {result['peer']}" if result.get("peer") else ""
    uncommitted = " with uncommitted changes to the measured code" if result.get("uncommitted") else ""
    commands = [" ".join(c.split()) for c in result["command"].splitlines() if c.strip()]
    lines.append(f"Measured {result['date']} at `{result['commit']}`{uncommitted} on {result['cpu']} "
                 f"({result['load']}); {result['runs']}{peer}. Command{'s' if len(commands) > 1 else ''}: "
                 + "; ".join(f"`{c}`" for c in commands))
    # The mark ends the paragraph that says when it was measured (one line of the page, not two).
    if changed is None:
        lines[-1] += " **Stale or not: unknown** (the commit measured is not in this clone's history)."
    elif changed:
        lines[-1] += (f" **Stale:** the measured code ({', '.join(f'`{p}`' for p in paths)}) changed after it "
                      f"(`git log {result['commit']}.. -- <those paths>`); re-run before quoting.")
    lines += [*result.get("notes", []), ""]
    return lines


HEADER = """# Benchmarks

Generated by `benchmarks/results_page.py` from `benchmarks/results/*.json` (do not edit by hand: edit the
results file, or record a new one with the benchmark's `--record`, then run the script). One section per
benchmark: what it measures, its current figures (gangctl beside the peer's from the same run where there
is a peer), when, where and at which commit they were measured, and the command. A figure whose measured
code differs from its commit is marked **Stale** by the script (`git diff <commit> -- <paths>`), so run it
before committing a change to measured code.
Earlier figures, and the lab notes that explain them, are in git history
(`git log -p -- benchmarks/README.md benchmarks/results`).
Side-by-side runs record each side's median and range over rounds in alternating order (`--rounds`);
a figure from a single run says so.
"""


def page(results: list[dict], repo: Path = REPO) -> str:
    lines, seen = [HEADER], set()
    for r in results:
        b = BENCHMARKS[r["benchmark"]]
        if r["benchmark"] not in seen:
            seen.add(r["benchmark"])
            lines += [f"## {b.title} (`{b.script}`)", "", b.measures, ""]
        lines += _part(r, b.paths, changed_since(r["commit"], b.paths, repo))
    return "\n".join(lines).rstrip() + "\n"


def machine() -> tuple[str, str]:
    """The CPU model with its core count, and the load average now."""
    try:
        cpu = next(line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                   if line.startswith("model name"))
    except (OSError, StopIteration):
        cpu = UNKNOWN
    one, five, _ = os.getloadavg()
    return f"{cpu}, {os.cpu_count()} cores", f"load average {one:.2f} (5 min {five:.2f}) at the end"


def record(benchmark: str, columns: list[str], rows: list[list], runs: str, *, peer: str | None = None,
           part: str | None = None, notes: list[str] | None = None, commit: str | None = None,
           directory: Path = RESULTS, repo: Path = REPO) -> Path:
    """Write this run as the benchmark's current result (`benchmarks/results/<benchmark>.json`), with
    the date, the commit measured (HEAD unless `commit` names another, e.g. the model a rescoring ran;
    `uncommitted` if the measured paths differ from HEAD), the command, the CPU and the load. Then
    `benchmarks/results_page.py` regenerates the page."""
    if benchmark not in BENCHMARKS:
        raise ValueError(f"{benchmark!r} is not in BENCHMARKS")
    head = commit or subprocess.run(["git", "-C", str(repo), "rev-parse", "--short", "HEAD"], capture_output=True,
                                    text=True).stdout.strip() or UNKNOWN
    dirty = subprocess.run(["git", "-C", str(repo), "status", "--porcelain", "--", *BENCHMARKS[benchmark].paths],
                           capture_output=True, text=True).stdout.strip()
    cpu, load = machine()
    data = {"benchmark": benchmark, "date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
            "commit": head, "uncommitted": bool(dirty),
            "command": ".venv/bin/python " + " ".join([f"benchmarks/{BENCHMARKS[benchmark].script}", *sys.argv[1:]]),
            "cpu": cpu, "load": load, "runs": runs, "peer": peer, "columns": columns, "rows": rows,
            "notes": notes or [], **({"part": part} if part else {})}
    slug = re.sub(r"[^a-z0-9]+", "-", part.lower()).strip("-") if part else ""
    path = directory / f"{benchmark}{'-' + slug if slug else ''}.json"
    path.write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n")
    return path


def report_sides(benchmark: str, args, runs: dict[str, list[dict]], title: str, rows_of, method: str,
                 say) -> list[dict]:
    """The end of a side-by-side benchmark (`gangctl.harness.rounds`): every run to `--json`, the
    medians `rows_of(runs)` gives printed under `title` and, with `--record`, recorded with `method`
    (how the rounds ran); returns every run of every side, for the benchmark's own exit rule."""
    if args.json:
        args.json.write_text(json.dumps(runs, indent=2))
    print(title)
    columns, rows = rows_of(runs)
    print_table(columns, rows)
    if args.record:
        path = record(benchmark, columns, rows, method)
        say(f"recorded {path}; run benchmarks/results_page.py to regenerate the page")
    return [r for rs in runs.values() for r in rs]
