"""`gangctl sim SCENARIO`: run a scenario, a sweep, or a "smallest cluster such that ..." question.

Mounted by gangctl/cli.py as the `sim` command; also runnable as `python -m gangctl.sim.cli`.
"""
from __future__ import annotations

import json
from enum import Enum
from pathlib import Path
from typing import Optional

import typer
from pydantic import ValidationError
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table


err = Console(stderr=True)
out = Console()


class SimOutput(str, Enum):
    text = "text"
    json = "json"


def sim_command(
    scenario: Path = typer.Argument(..., exists=True, dir_okay=False, help="a scenario YAML (simulations/*.yaml)"),
    output: SimOutput = typer.Option(SimOutput.text, "-o", "--output", help="json: print only the JSON summary"),
    report: Optional[Path] = typer.Option(None, help="report directory (default: sim-reports/<scenario name>)"),
    sweep: Optional[str] = typer.Option(None, help="gpus=256..1024[:step] | quota=0.5,1,2 | elastic=on,off | backend=kueue,volcano"),
    find: Optional[str] = typer.Option(None, help="with a gpus sweep: smallest cluster such that e.g. 'p95_queue_delay<=1h'"),
    seed: Optional[int] = typer.Option(None, help="override the scenario's seed"),
    max_jobs: Optional[int] = typer.Option(None, help="use only the first N jobs"),
) -> None:
    """Simulate a GPU cluster running the controller's own gang and quota policy on a trace."""
    # Imported here so that other gangctl commands do not pay for numpy and matplotlib.
    from gangctl.sim.engine import SimulationStuck
    from gangctl.sim.scenario import load_quota_policy, load_scenario, load_workload
    from gangctl.sim.sweep import SweepError, parse_axis, parse_target
    from gangctl.sim.traces import TraceError

    try:
        sc = load_scenario(scenario)
        if seed is not None:
            sc.seed = seed
        if max_jobs is not None:
            sc.workload.max_jobs = max_jobs
        policy = load_quota_policy(sc.quota_policy)
        trace = load_workload(sc, policy)
        axis = parse_axis(sweep) if sweep else None
        target = parse_target(find) if find else None
    except (OSError, ValidationError, TraceError, SweepError, ValueError) as exc:
        err.print(f"[bold red]error:[/] {exc}")
        raise typer.Exit(1)
    if trace.skipped and output is SimOutput.text:
        err.print("skipped rows: " + ", ".join(f"{n} {why}" for why, n in trace.skipped.items()))
    directory = report or Path("sim-reports") / sc.name
    quiet = output is SimOutput.json
    try:
        if axis is None:
            _single(sc, policy, trace.jobs, directory, quiet)
        elif target is None:
            _sweep(sc, policy, trace.jobs, axis, quiet)
        else:
            _question(sc, policy, trace.jobs, axis, target, directory, quiet)
    except (SimulationStuck, SweepError, ValueError) as exc:
        err.print(f"[bold red]error:[/] {exc}")
        raise typer.Exit(1)


def _bar(quiet: bool) -> Progress:
    return Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                    console=err, transient=True, disable=quiet)


def _single(sc, policy, jobs, directory: Path, quiet: bool) -> None:
    from gangctl.sim import fidelity
    from gangctl.sim.engine import simulate
    from gangctl.sim.report import summary_table, write_report

    with _bar(quiet) as bar:
        task = bar.add_task(f"simulating {sc.name}", total=len(jobs))
        result = simulate(sc, policy, jobs, progress=lambda done, total: bar.update(task, completed=done))
    if quiet:
        print(json.dumps(result.summary, indent=2))
        return
    out.print(summary_table(sc.name, result.summary))
    out.print(fidelity.sentence(fidelity.load(), sc))
    page = write_report(sc, result, directory)
    out.print(f"report: {page}")


def _sweep(sc, policy, jobs, axis, quiet: bool) -> None:
    from gangctl.sim.report import duration, preferred_spread
    from gangctl.sim.sweep import run_sweep

    with _bar(quiet) as bar:
        task = bar.add_task("sweep", total=len(axis.values))
        points = run_sweep(sc, policy, jobs, axis, lambda what: bar.update(task, advance=1, description=what))
    if quiet:
        print(json.dumps([{axis.key: getattr(p.value, "value", p.value), "summary": p.summary} for p in points], indent=2))
        return
    table = Table(title=f"{sc.name}: sweep over {axis.key}")
    topology = bool(sc.cluster.topology)
    columns = [axis.key, "p95 queueing delay", "mean queueing delay", "mean JCT", "GPU utilization"]
    for column in columns + (["required gangs over >1 domain", "domains per preferred gang", "stranded GPUs"]
                             if topology else []):
        table.add_column(column, justify="right")
    for p in points:
        s = p.summary
        row = [str(getattr(p.value, "value", p.value)), duration(s["queue_delay_seconds"]["p95"]),
               duration(s["queue_delay_seconds"]["mean"]), duration(s["jct_seconds"]["mean"]),
               f"{s['gpu_utilization']:.1%}"]
        if topology:
            t = s["topology"]
            row += [str(t["required_violations"]), preferred_spread(t), f"{t['stranded_gpus_mean']:.1f}"]
        table.add_row(*row)
    out.print(table)


def _question(sc, policy, jobs, axis, target, directory: Path, quiet: bool) -> None:
    from gangctl.sim.report import duration
    from gangctl.sim.sweep import plot_curve, smallest_cluster

    with _bar(quiet) as bar:
        task = bar.add_task("searching", total=None)
        answer, points = smallest_cluster(sc, policy, jobs, axis, target,
                                          lambda what: bar.update(task, advance=1, description=what))
    unit = "GPUs" if axis.key == "gpus" else axis.key
    curve = plot_curve(points, target, answer, directory / "smallest-cluster.png", unit)
    if quiet:
        print(json.dumps({"target": target.text, f"smallest_{axis.key}": answer,
                          "curve": [{axis.key: p.value, "value": target.measure(p.summary)} for p in points]}, indent=2))
        return
    for p in points:
        value = target.measure(p.summary)
        shown = f"{value:.1%}" if target.path == ("gpu_utilization",) else duration(value)
        out.print(f"  {p.value:>6} {unit}: {shown} {'[green]meets' if target.met(p.summary) else '[red]misses'}[/] {target.text}")
    if answer is None:
        out.print(f"[red]no cluster in {axis.values[0]}..{axis.values[-1]} {unit} meets {target.text}[/]")
    else:
        out.print(f"[bold]smallest cluster such that {target.text}: {answer} {unit}[/]")
    out.print(f"curve: {curve}")


def main() -> None:
    app = typer.Typer(add_completion=False)
    app.command()(sim_command)
    app()


if __name__ == "__main__":
    main()
