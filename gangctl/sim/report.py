"""A run's results for people: a terminal table, and an HTML page with PNG plots (matplotlib Agg).

matplotlib and numpy are imported only when plots are drawn (`-o json` and sweeps do not pay for
them). Figures are drawn on an Agg canvas without pyplot and with fixed margins (no tight_layout,
which draws every figure twice); the queueing-delay CDF is drawn from at most `_CDF_POINTS` points
(plots only: summary.json and the tables use every job).
"""
from __future__ import annotations

import html
import json
from pathlib import Path

from rich.table import Table

from gangctl.sim import fidelity
from gangctl.sim.engine import SimResult
from gangctl.sim.scenario import Scenario

_CDF_POINTS = 2000
# Margins (fractions of the 8 x 3.6 in figure) that leave room for the tick and axis labels.
_MARGINS = {"left": 0.085, "right": 0.985, "bottom": 0.14, "top": 0.9}


def duration(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    if seconds < 120:
        return f"{seconds:.0f}s"
    if seconds < 7200:
        return f"{seconds / 60:.1f}m"
    if seconds < 172800:
        return f"{seconds / 3600:.1f}h"
    return f"{seconds / 86400:.1f}d"


def summary_table(name: str, summary: dict) -> Table:
    table = Table(title=f"simulation {name}")
    table.add_column("metric")
    for column in ("mean", "p50", "p95", "p99"):
        table.add_column(column, justify="right")
    for label, key in (("job completion time", "jct_seconds"), ("queueing delay", "queue_delay_seconds")):
        s = summary[key]
        table.add_row(label, *(duration(s[c]) for c in ("mean", "p50", "p95", "p99")))
    jobs, f = summary["jobs"], summary["failures"]
    table.add_row("jobs done / failed / rejected", f"{jobs['done']} / {jobs['failed']} / {jobs['rejected']}", "", "", "")
    table.add_row("GPU utilization", f"{summary['gpu_utilization']:.1%}", "", "", "")
    table.add_row("fragmented GPUs (mean)", f"{summary['fragmented_gpus_mean']:.1f}", "", "", "")
    table.add_row("restarts user / infra, preemptions",
                  f"{f['user_restarts']} / {f['infra_restarts']}, {f['preemptions']}", "", "", "")
    table.add_row("node failures, goodput lost", f"{f['node_failures']}, {f['goodput_lost_gpu_hours']:.1f} GPU-h", "", "", "")
    for team, t in summary["teams"].items():
        table.add_row(f"team {team}: GPUs mean / peak / nominal",
                      f"{t['mean_gpus']:.1f} / {t['peak_gpus']} / {t['nominal_gpus']:g}", "", "",
                      duration(t["queue_delay_p95_seconds"]))
    table.add_row("simulated time", duration(summary["makespan_seconds"]), "", "", "")
    topology = summary.get("topology")
    if topology:
        table.add_row(f"topology ({' > '.join(topology['levels'])}): required violations, stranded GPUs (mean)",
                      f"{topology['required_violations']}, {topology['stranded_gpus_mean']:.1f}", "", "", "")
        for kind, row in topology["by_ask"].items():
            s = row["queue_delay_seconds"]
            spread = "-" if row["mean_domains"] is None else f"{row['mean_domains']:.2f}"
            table.add_row(f"ask {kind}: jobs, domains per gang; queueing delay", f"{row['jobs']}, {spread}",
                          duration(s["p50"]), duration(s["p95"]), duration(s["p99"]))
    return table


def preferred_spread(topology: dict) -> str:
    """Mean domains spanned per multi-pod gang that preferred a level (`-`: none started)."""
    rows = [row for kind, row in topology["by_ask"].items() if kind.startswith("preferred") and row["gang_starts"]]
    starts = sum(row["gang_starts"] for row in rows)
    return f"{sum(row['mean_domains'] * row['gang_starts'] for row in rows) / starts:.2f}" if starts else "-"


def write_report(scenario: Scenario, result: SimResult, directory: Path) -> Path:
    """Write index.html, summary.json and the plots into `directory`; return the HTML path."""
    name = scenario.name
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "summary.json").write_text(json.dumps(result.summary, indent=2))
    plots = {
        "utilization.png": ("GPU utilization over time", _plot_utilization),
        "queue.png": ("Queue length over time", _plot_queue),
        "teams.png": ("GPUs in use per team (dashed: nominal quota)", _plot_teams),
        "queue_delay_cdf.png": ("CDF of queueing delay", _plot_delay_cdf),
    }
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    for filename, (title, plot) in plots.items():
        fig = Figure(figsize=(8, 3.6))
        FigureCanvasAgg(fig)
        fig.subplots_adjust(**_MARGINS)
        ax = fig.add_subplot()
        plot(ax, result)
        ax.set_title(title)
        fig.savefig(directory / filename, dpi=90)
    rows = "".join(f"<tr><th>{html.escape(k)}</th><td>{html.escape(v)}</td></tr>" for k, v in _flat(result.summary))
    images = "".join(f"<h2>{html.escape(title)}</h2><img src='{f}' alt='{html.escape(title)}'>" for f, (title, _) in plots.items())
    page = (f"<!doctype html><html><head><meta charset='utf-8'><title>gangctl sim {html.escape(name)}</title>"
            "<style>body{font-family:sans-serif;max-width:900px;margin:auto}td,th{text-align:left;padding:2px 8px}"
            f"</style></head><body><h1>Simulation {html.escape(name)}</h1>"
            f"<p>{html.escape(fidelity.sentence(fidelity.load(), scenario))}</p><table>{rows}</table>{images}</body></html>")
    path = directory / "index.html"
    path.write_text(page)
    return path


def _flat(d: dict, prefix: str = ""):
    for key, value in d.items():
        if isinstance(value, dict):
            yield from _flat(value, f"{prefix}{key}.")
        else:
            yield f"{prefix}{key}", f"{value:.4g}" if isinstance(value, float) else str(value)


def _hours(result: SimResult):
    import numpy as np

    return np.asarray(result.series.t) / 3600


def _plot_utilization(ax, result: SimResult) -> None:
    import numpy as np

    s = result.series
    up = np.maximum(np.asarray(s.up_gpus, dtype=float), 1)
    ax.plot(_hours(result), np.asarray(s.busy_gpus) / up, label="busy / up GPUs")
    ax.plot(_hours(result), np.asarray(s.fragmented_gpus) / up, label="fragmented / up GPUs")
    ax.set_ylim(0, 1.05)
    ax.set_xlabel("hours")
    ax.legend(loc="lower right")


def _plot_queue(ax, result: SimResult) -> None:
    s = result.series
    ax.plot(_hours(result), s.pending, label="waiting for quota")
    ax.plot(_hours(result), s.waiting_for_nodes, label="admitted, waiting for nodes")
    ax.set_xlabel("hours")
    ax.set_ylabel("gangs")
    ax.legend(loc="upper right")


def _plot_teams(ax, result: SimResult) -> None:
    hours = _hours(result)
    for team, values in result.series.team_gpus.items():
        line, = ax.plot(hours, values, label=team)
        ax.axhline(result.summary["teams"][team]["nominal_gpus"], color=line.get_color(), linestyle="--", linewidth=0.8)
    ax.set_xlabel("hours")
    ax.set_ylabel("GPUs")
    ax.legend(loc="upper right")


def _plot_delay_cdf(ax, result: SimResult) -> None:
    import numpy as np

    delays = np.sort([o.queue_delay for o in result.outcomes if o.queue_delay is not None]) / 60
    if len(delays):
        fraction = np.arange(1, len(delays) + 1) / len(delays)
        if len(delays) > _CDF_POINTS:   # evenly spaced ranks, first and last kept
            keep = np.unique(np.linspace(0, len(delays) - 1, _CDF_POINTS).round().astype(int))
            delays, fraction = delays[keep], fraction[keep]
        ax.plot(delays, fraction)
        ax.set_xscale("symlog", linthresh=1)
    ax.set_xlabel("queueing delay (minutes)")
    ax.set_ylabel("fraction of jobs")
