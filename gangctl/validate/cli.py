"""`gangctl sim-check SCENARIO`: replay a scenario slice on the real local cluster, beside the simulator.

Needs a running cluster (`gangctl cluster up --gpu-nodes N`) and controller (`gangctl controller`).
Submits the first `--jobs` jobs of the scenario as TrainJobs (durations and gaps divided by
`--compression`, run on KWOK through their pod-complete delay), waits for all, and prints the real
mean/p50/p95 JCT and queueing delay beside two simulations of the same slice on the same nodes:
`ideal` (an instantaneous control plane) and `model` (the control plane's bind and finish latency,
measured in this run from jobs that never waited, gangctl's retry interval, and kube-scheduler's pace
and Permit race as measured in its logs: validate/plan.py). The model is the mean over 128 draws of
the scheduler's random tie-breaks and races (validate/expectation.py), shown with the
5-95 % range of the draws: how far one real run may fall from it by chance. The check passes
when the model's mean JCT and mean queueing delay are within `--tolerance` of the real ones. With
`--quota` both sides admit by the scenario's quota policy (stored for the controller's quota gate
during the run, the previous policy put back afterwards).
"""
from __future__ import annotations

import asyncio
import json
import os
import statistics
import time
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from gangctl.validate.measure import COMPARED, DEFAULT_TOLERANCE, compare, outcome_of, rank, summarize, verdict

err = Console(stderr=True)
out = Console()


def sim_check_command(
    scenario: Path = typer.Argument(..., exists=True, dir_okay=False, help="a scenario YAML (simulations/*.yaml)"),
    jobs: int = typer.Option(300, help="replay the first N jobs of the scenario"),
    compression: float = typer.Option(60.0, help="divide durations and arrival gaps by this"),
    kubeconfig: Optional[str] = typer.Option(None, envvar="KUBECONFIG", help="the cluster (gangctl cluster env)"),
    timeout: float = typer.Option(3600.0, help="give up after this many seconds"),
    retry_seconds: float = typer.Option(float(os.environ.get("GANGCTL_GANG_RETRY_SECONDS", 20)),
                                        help="the controller's GANGCTL_GANG_RETRY_SECONDS, for the model"),
    tolerance: float = typer.Option(DEFAULT_TOLERANCE, help="largest relative difference of the means that passes"),
    keep: bool = typer.Option(False, help="keep the TrainJobs afterwards (default: delete them)"),
    output: str = typer.Option("text", "-o", "--output", help="text or json"),
    dump: Optional[Path] = typer.Option(None, help="write one JSON line per job: real and simulated submit/start/end"),
    quota: bool = typer.Option(False, "--quota/--no-quota",
                               help="admit by the scenario's quota policy on both sides (stored for the controller's "
                                    "quota gate for the run, the previous policy put back after); default: no quota"),
    backend: str = typer.Option("coscheduling", help="the gang backend the replayed TrainJobs' runtime names, and the "
                                "simulation's (the cluster runs it: `gangctl cluster up --scheduler BACKEND`); a backend "
                                "with queues of its own (kueue, volcano, kai) needs --quota, which makes them"),
) -> None:
    """Replay a scenario slice on the local cluster through the real controller and scheduler; compare with the simulator."""
    from gangctl.plugins.base import gated_by_gangctl
    from gangctl.plugins.registry import BACKENDS
    from gangctl.sim.scenario import load_quota_policy, load_scenario, load_workload

    if backend not in BACKENDS:
        raise typer.BadParameter(f"{backend!r}: choose one of {', '.join(BACKENDS)}", param_hint="--backend")
    if not quota and not gated_by_gangctl(BACKENDS[backend]):
        raise typer.BadParameter(f"{backend} admits jobs only from its queues, which --quota makes from the "
                                 "scenario's policy: add --quota", param_hint="--backend")
    sc = load_scenario(scenario)
    policy = load_quota_policy(sc.quota_policy)
    trace = load_workload(sc, policy)
    try:
        policy_text = Path(sc.quota_policy).read_text() if quota else None
        result = asyncio.run(_run(sc, policy, trace.jobs, jobs, compression, kubeconfig, timeout, retry_seconds, keep,
                                  quiet=output == "json", policy_text=policy_text, backend=backend))
        per_job = result.pop("per_job")
        if dump is not None:
            dump.write_text("".join(json.dumps(row) + "\n" for row in per_job))
    except Exception as exc:  # noqa: BLE001 - one line for the user, whatever went wrong
        err.print(f"[bold red]error:[/] {type(exc).__name__}: {exc}")
        raise typer.Exit(1)
    rows = compare(result["real"], result["model"])
    passed = verdict(rows, tolerance)
    result["passed"] = passed
    if output == "json":
        print(json.dumps(result, indent=2))
    else:
        _print(result, rows, tolerance, passed)
    raise typer.Exit(0 if passed else 2)


async def _run(sc, policy, all_jobs, count, compression, kubeconfig, timeout, retry_seconds, keep, quiet,
               policy_text: str | None = None, backend: str = "coscheduling") -> dict:
    """`policy_text`: replay under that quota policy (the scenario's, as its file says it); `backend`:
    the gang backend of the replayed jobs and of the simulation."""
    from gangctl.kube.client import Kube
    from gangctl.plugins.base import admits_one_until_ready
    from gangctl.plugins.quota_objects import POLICY_CONFIGMAP, TOPOLOGY_CONFIGMAP
    from gangctl.plugins.registry import BACKENDS
    from gangctl.sim.engine import simulate
    from gangctl.sim.replay import RUNTIME, trainjob_submissions
    from gangctl.sim.scenario import Backend
    from gangctl.validate import runner
    from gangctl.validate.expectation import expected
    from gangctl.validate.plan import gpu_pools, local_control_plane, namespaces_of, plan, topology_levels

    kube = await Kube.connect(kubeconfig)
    try:
        await runner.check_runtime(kube, RUNTIME)
        runtime = await runner.backend_runtime(kube, RUNTIME, backend)
        nodes = await runner.gpu_nodes(kube)
        pools = gpu_pools(nodes)
        levels = topology_levels(nodes, [lv.name for lv in sc.cluster.topology]) if sc.cluster.topology else None
        p = plan(sc, policy, all_jobs, pools, count=count, compression=compression, quota=policy_text is not None,
                 levels=levels, backend=Backend(backend))
        ideal = simulate(p.scenario, p.policy, p.sim_jobs)
        run_id = f"{sc.name}-{int(time.time())}"
        ns_of = namespaces_of(p.policy)
        placer = replay_placer(p.scenario)
        subs = trainjob_submissions(p.jobs, runtime=runtime, namespace_of_team=ns_of, compression=compression,
                                    run_id=run_id, annotations=placer.annotations if placer else lambda _: {})
        t0 = subs[0].at_seconds
        subs = [s.__class__(s.at_seconds - t0, s.job_id, s.trainjob) for s in subs]
        if not quiet:
            err.print(f"cluster: {', '.join(f'{pl.nodes} × {pl.gpus_per_node} GPUs' for pl in pools)}; "
                      f"replaying {len(subs)} jobs ({p.left_out} left out: never fit), compression {compression:g}; "
                      f"the simulator expects about {ideal.summary['makespan_seconds']:.0f}s")
        await runner.ensure_namespaces(kube, set(ns_of.values()))
        before = await runner.install_policy(kube, p.policy, policy_text, backend) if policy_text is not None else None
        # The policy's own topology when it has one: `policy apply` named the backend's Topology objects
        # after it (KAI's PodGroups name theirs), and the levels are the same node labels.
        stored = (p.policy.topology or placer.topology) if placer else None
        topology_before = await runner.install_topology(kube, stored) if stored else None
        try:
            record = await _replay(kube, subs, run_id, timeout, quiet)
        finally:
            if policy_text is not None:
                await runner.restore(kube, POLICY_CONFIGMAP, before)
            if placer:
                await runner.restore(kube, TOPOLOGY_CONFIGMAP, topology_before)
        placed = await runner.placed_pods(kube, set(ns_of.values())) if placer else []
        serial = admits_one_until_ready(BACKENDS[backend])
        readied = await runner.admission_to_ready(kube, record) if serial else []
        if not keep:
            await runner.delete_run(kube, record)
    finally:
        await kube.close()

    by_key = {f"{s.trainjob['metadata']['namespace']}/{s.trainjob['metadata']['name']}": s.job_id for s in subs}
    outcomes = [outcome_of(by_key[k], record.objects[k], record.submitted[k], record.finished.get(k), record.bound.get(k))
                for k in by_key]
    real = summarize(outcomes)
    latency = measured_latency(outcomes, ideal.outcomes, {j.id: j.duration for j in p.sim_jobs}, serial=serial)
    if serial:   # the mean: the conditions' times are whole seconds, a median would snap to one
        latency["ready_seconds"] = round(statistics.fmean(readied), 3) if readied else 0.0
    cp = local_control_plane(latency["bind_seconds"], latency["finish_seconds"], retry_seconds,
                             latency.get("ready_seconds", 0.0))
    model = expected(p.scenario.model_copy(update={"control_plane": cp}), p.policy, p.sim_jobs)
    topology = ({"real_topology": _real_topology(placer, p.sim_jobs, subs, placed, nodes, outcomes,
                                                 p.scenario.sample_seconds),
                 "topology_levels": [lv.model_dump() for lv in levels]} if placer else {})
    return {"per_job": per_job_rows(p.sim_jobs, outcomes, ideal.outcomes, model.outcomes), **topology,
            "scenario": sc.name, "backend": backend, "jobs": len(subs), "compression": compression,
            "cluster": [{"nodes": pl.nodes, "gpus_per_node": pl.gpus_per_node} for pl in pools],
            "measured_latency": latency | {"retry_seconds": retry_seconds},
            "scheduler_modelled": {"attempt_seconds": cp.attempt_seconds, "permit_hold_race": cp.permit_hold_race},
            "real": real, "ideal": _pick(ideal.summary), **model.result_fields()}



def replay_placer(scenario):
    """The simulator's placer for the replayed scenario (None without a topology): it draws each job's
    intent, which the replay submits as annotations."""
    from gangctl.plugins.registry import BACKENDS
    from gangctl.sim.topology import Placer

    if not scenario.cluster.topology:
        return None
    return Placer(scenario.cluster.levels(), scenario.workload.placement, BACKENDS[scenario.backend.value])


def _real_topology(placer, sim_jobs, subs, pods, nodes, outcomes, sample_seconds: float) -> dict:
    from gangctl.validate.topology import (GangSpan, domains_by_trainjob, pods_by_trainjob, real_topology,
                                           stranded_gpus_mean)

    levels = placer.levels
    name_of = {s.job_id: s.trainjob["metadata"]["name"] for s in subs}
    asked = {j.id: placer.ask_of(j.id) for j in sim_jobs}
    label_of = {name_of[j]: levels[a.ask.level if a else len(levels) - 1].label for j, a in asked.items()}
    spans = domains_by_trainjob(pods, nodes, label_of)
    summary = real_topology({j: a.kind if a else "" for j, a in asked.items()}, {j.id: j.num_nodes for j in sim_jobs},
                            {j: spans[name_of[j]] for j in asked if name_of[j] in spans}, outcomes,
                            [lv.name for lv in levels])
    ran_on, outcome_of_job = pods_by_trainjob(pods), {o.job_id: o for o in outcomes}
    gangs = [GangSpan(tuple(ran_on.get(name_of[j.id], ())), j.gpus_per_node, o.submitted, o.bound, o.finished,
                      levels[a.ask.level].label if (a := asked[j.id]) and a.ask.required else None, j.num_nodes)
             for j in sim_jobs if (o := outcome_of_job.get(j.id)) is not None]
    return {**summary, "stranded_gpus_mean": stranded_gpus_mean(nodes, [lv.label for lv in levels], gangs,
                                                                sample_seconds)}


async def _replay(kube, subs, run_id, timeout, quiet):
    from gangctl.validate import runner

    with Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=err, transient=True, disable=quiet) as bar:
        task = bar.add_task("jobs finished", total=len(subs))
        return await runner.replay(kube, subs, run_id, timeout=timeout,
                                   progress=lambda done, total: bar.update(task, completed=done))

def measured_latency(real, ideal_outcomes, durations: dict[str, float], serial: bool = False) -> dict[str, float]:
    """The control plane's own latencies, from this run: bind = real queueing delay of jobs the
    ideal simulation started at once (nothing to wait for); finish = real run time beyond the job's
    duration (pod exit to TrainJob Complete). Medians. `serial`: the backend admits one gang at a time
    until its pods are ready (Kueue's blockAdmission), so a job with room still queues behind the
    admissions before it; only jobs that found every earlier job started (`alone`) measure bind."""
    immediate = {o.id for o in ideal_outcomes if o.queue_delay == 0}
    if serial:
        immediate &= alone(real)
    bind = [o.queue_delay for o in real if o.job_id in immediate and o.queue_delay is not None]
    finish = [o.finished - o.bound - durations[o.job_id] for o in real
              if o.state == "done" and o.finished is not None and o.bound is not None]
    return {"bind_seconds": round(max(0.0, statistics.median(bind)), 3) if bind else 0.0,
            "finish_seconds": round(max(0.0, statistics.median(finish)), 3) if finish else 0.0}


def alone(real) -> set[str]:
    """The jobs submitted when every job submitted before them had started (all pods bound)."""
    out: set[str] = set()
    started_by = float("-inf")   # when the last of the earlier jobs started (inf: one never did)
    for o in sorted(real, key=lambda o: (o.submitted, o.job_id)):
        if o.submitted >= started_by:
            out.add(o.job_id)
        started_by = max(started_by, o.bound if o.bound is not None else float("inf"))
    return out


def per_job_rows(sim_jobs, real, ideal_outcomes, model_outcomes) -> list[dict]:
    """Each job's submit, start (all pods bound) and end: real (seconds after the first submission)
    beside the ideal and the model simulation."""
    t0 = min((o.submitted for o in real), default=0.0)
    rel = lambda t: None if t is None else round(t - t0, 3)  # noqa: E731
    by_id = {o.job_id: o for o in real}
    ideal = {o.id: o for o in ideal_outcomes}
    model = {o.id: o for o in model_outcomes}
    rows = []
    for j in sim_jobs:
        r, i, m = by_id.get(j.id), ideal.get(j.id), model.get(j.id)
        rows.append({"job": j.id, "pods": j.num_nodes, "gpus_per_pod": j.gpus_per_node, "submit": round(j.submit, 3),
                     "duration": j.duration,
                     "real": r and {"submit": rel(r.submitted), "start": rel(r.bound), "end": rel(r.finished)},
                     "ideal": i and {"start": i.start, "end": i.end},
                     "model": m and {"start": m.start, "end": m.end}})
    return rows


def _pick(summary: dict) -> dict:
    return {k: summary[k] for k in ("jobs", *COMPARED)}


def _print(result: dict, rows, tolerance: float, passed: bool) -> None:
    table = Table(title=f"sim-check {result['scenario']}: {result['jobs']} jobs, compression {result['compression']:g}")
    draws = result.get("model_draws", 1)
    for col in ("metric", "real", "sim ideal", "sim model", f"model's {draws} draws 5-95 %", "draws below real",
                "model vs real"):
        table.add_column(col, justify="right")
    ideal = {r.metric: r.sim for r in compare(result["real"], result["ideal"])}
    for r, band, below in zip(rows, _band_cells(result), _rank_cells(result)):
        d = r.relative_difference
        shown = "-" if d is None else f"{d:+.1%}"
        if r.checked:
            shown = f"[{'green' if r.ok(tolerance) else 'red'}]{shown}[/]"
        table.add_row(r.metric, _num(r.real), _num(ideal[r.metric]), _num(r.sim), band, below, shown)
    out.print(table)
    lat = result["measured_latency"]
    ready = f", admission to pods ready {lat['ready_seconds']}s" if "ready_seconds" in lat else ""
    out.print(f"control plane measured: bind {lat['bind_seconds']}s, finish {lat['finish_seconds']}s{ready}; "
              f"retry every {lat['retry_seconds']}s")
    if sched := result.get("scheduler_modelled"):
        out.print(f"kube-scheduler modelled as measured in its logs: {sched['attempt_seconds'] * 1000:g} ms per pod "
                  f"attempt; a rejected gang's pod still holds a drained node at the next gang's attempt "
                  f"{sched['permit_hold_race']:.0%} of the time")
    out.print(f"sim model: the mean of {draws} draws of the scheduler's random tie-breaks and races; one real run may fall "
              "anywhere in the draws' 5-95 % range by chance (if the model is right, the share of draws below "
              "the real figure is anywhere from 0 to 100 % with equal odds: runs that keep landing high or low "
              "show a bias)")
    out.print(f"real jobs: {result['real']['jobs']}")
    if "real_topology" in result:
        _print_topology(result["real_topology"], result["model_topology"])
    verdict_text = "[green]PASS[/]" if passed else "[red]FAIL[/]"
    out.print(f"{verdict_text}: mean JCT and mean queueing delay of the model within {tolerance:.0%} of the real ones")


def _print_topology(real: dict, model: dict) -> None:
    """Per kind of ask: the gangs, the domains they spanned and their queueing delay, real beside the model."""
    table = Table(title=f"placement ({' > '.join(real['levels'])}): real beside the model's mean")
    for col in ("ask", "jobs", "multi-pod gangs", "domains per gang", "model", "p95 queueing", "model"):
        table.add_column(col, justify="right")
    for kind, row in real["by_ask"].items():
        m = model["by_ask"].get(kind) or {}
        table.add_row(kind, str(row["jobs"]), str(row["gang_starts"]), _num(row["mean_domains"]),
                      _num(m.get("mean_domains")), _num(row["queue_delay_seconds"]["p95"]),
                      _num((m.get("queue_delay_seconds") or {}).get("p95")))
    out.print(table)
    out.print(f"required gangs over more than one domain: real {real['required_violations']}, "
              f"model {model['required_violations']} (over all draws); stranded GPUs (mean over the run): "
              f"real {_num(real.get('stranded_gpus_mean'))}, model {_num(model.get('stranded_gpus_mean'))}")


def _band_cells(result: dict) -> list[str]:
    """The model's 5-95 % range per metric, in `compare`'s row order."""
    band = result.get("model_band") or {}

    def cell(key: str, stat: str) -> str:
        low_high = (band.get(key) or {}).get(stat) or []
        return f"{low_high[0]:.2f}-{low_high[1]:.2f}" if len(low_high) == 2 else "-"
    return _per_row(cell)


def _rank_cells(result: dict) -> list[str]:
    """The share of the model's draws below the real figure per metric (`rank`), in `compare`'s row order."""
    values = result.get("model_draw_values") or {}

    def cell(key: str, stat: str) -> str:
        draws, real = (values.get(key) or {}).get(stat), (result["real"].get(key) or {}).get(stat)
        return f"{rank(real, draws):.0%}" if draws and real is not None else "-"
    return _per_row(cell)


def _per_row(cell) -> list[str]:
    return [cell(key, stat) for key in COMPARED for stat in ("mean", "p50", "p95")]


def _num(v) -> str:
    return "-" if v is None else f"{v:.2f}"
