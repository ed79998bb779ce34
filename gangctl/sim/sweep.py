"""What-if runs: one scenario over a range of cluster sizes, quota scales, elastic on/off or backends,
and the question form "smallest cluster such that <metric> <= <value>", answered with its curve.

Sweep syntax: `gpus=256..1024` (8 points) or `gpus=256..1024:128`, `racks=2..16[:STEP]` (the domains
of the scenario's narrowest topology level, whole ones), `quota=0.5,1,2` (factor on every team's
nominal quota and limits), `elastic=on,off`, `backend=kueue,volcano,coscheduling,native,kai`.
Targets: `<stat>_<queue_delay|jct><=|>=<value>[s|m|h|d]` with stat mean|p50|p95|p99, or
`utilization>=0.8`. Cluster sizes scale every node pool by the same factor (whole nodes, or whole
racks); a target asks for the smallest such size.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from gangctl.model.quota import QuotaPolicy, Resources
from gangctl.sim.engine import simulate
from gangctl.sim.scenario import Backend, Scenario
from gangctl.sim.traces import TraceJob

_DEFAULT_POINTS = 8
SIZES = ("gpus", "racks")   # the axes that size the cluster (a target's answer is one of them)
_UNITS = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}


class SweepError(ValueError):
    pass


@dataclass(frozen=True)
class Axis:
    key: str
    values: list[Any]


@dataclass(frozen=True)
class Point:
    value: Any           # for gpus: the cluster's actual GPU count
    summary: dict


def parse_axis(text: str) -> Axis:
    key, sep, spec = text.partition("=")
    key = key.strip()
    if not sep or not spec:
        raise SweepError(f"sweep {text!r}: expected KEY=VALUES, e.g. gpus=256..1024")
    if key in SIZES:
        m = re.fullmatch(r"(\d+)\.\.(\d+)(?::(\d+))?", spec)
        if not m or int(m[1]) < 1 or int(m[2]) < int(m[1]):
            raise SweepError(f"sweep {text!r}: expected {key}=LOW..HIGH[:STEP]")
        lo, hi = int(m[1]), int(m[2])
        step = int(m[3]) if m[3] else max(1, (hi - lo) // (_DEFAULT_POINTS - 1))
        values = list(range(lo, hi + 1, step))
        return Axis(key, values if values[-1] == hi else values + [hi])
    if key == "quota":
        try:
            return Axis(key, [float(v) for v in spec.split(",")])
        except ValueError:
            raise SweepError(f"sweep {text!r}: expected quota=FACTOR,FACTOR,...") from None
    if key == "elastic":
        flags = {"on": True, "off": False, "true": True, "false": False}
        if any(v not in flags for v in spec.split(",")):
            raise SweepError(f"sweep {text!r}: expected elastic=on,off")
        return Axis(key, [flags[v] for v in spec.split(",")])
    if key == "backend":
        try:
            return Axis(key, [Backend(v) for v in spec.split(",")])
        except ValueError:
            raise SweepError(f"sweep {text!r}: backends are {', '.join(b.value for b in Backend)}") from None
    raise SweepError(f"sweep {text!r}: can sweep gpus, racks, quota, elastic or backend")


@dataclass(frozen=True)
class Target:
    text: str
    path: tuple[str, ...]   # into the summary
    at_most: bool
    value: float

    def met(self, summary: dict) -> bool:
        v: Any = summary
        for key in self.path:
            v = v[key]
        return v is not None and (v <= self.value if self.at_most else v >= self.value)

    def measure(self, summary: dict) -> float | None:
        v: Any = summary
        for key in self.path:
            v = v[key]
        return v


def parse_target(text: str) -> Target:
    m = re.fullmatch(r"\s*(\w+)\s*(<=|>=)\s*([0-9.]+)\s*([smhd]?)\s*", text)
    if not m:
        raise SweepError(f"target {text!r}: expected e.g. 'p95_queue_delay<=1h' or 'utilization>=0.8'")
    name, op, number, unit = m.groups()
    if name == "utilization":
        return Target(text, ("gpu_utilization",), op == "<=", float(number))
    stat, _, metric = name.partition("_")
    metrics = {"queue_delay": "queue_delay_seconds", "jct": "jct_seconds"}
    if stat not in ("mean", "p50", "p95", "p99") or metric not in metrics:
        raise SweepError(f"target {text!r}: metric must be mean|p50|p95|p99 _queue_delay|_jct, or utilization")
    return Target(text, (metrics[metric], stat), op == "<=", float(number) * _UNITS[unit])


def with_value(scenario: Scenario, policy: QuotaPolicy, key: str, value: Any) -> tuple[Scenario, QuotaPolicy]:
    if key == "gpus":
        factor = value / scenario.cluster.total_gpus
        pools = [p.model_copy(update={"nodes": max(0, round(p.nodes * factor))}) for p in scenario.cluster.pools]
        if not any(p.nodes for p in pools):
            pools[0] = pools[0].model_copy(update={"nodes": 1})
        return scenario.model_copy(update={"cluster": scenario.cluster.model_copy(update={"pools": pools})}), policy
    if key == "racks":
        return _with_racks(scenario, value), policy
    if key == "quota":
        return scenario, _scaled_policy(policy, value)
    if key == "elastic":
        workload = scenario.workload
        elastic = workload.elastic.model_copy(update={"enabled": value})
        return scenario.model_copy(update={"workload": workload.model_copy(update={"elastic": elastic})}), policy
    return scenario.model_copy(update={"backend": value}), policy


def _with_racks(scenario: Scenario, racks: int) -> Scenario:
    """The scenario's pools with `racks` domains of its narrowest topology level in all, shared out as
    the pools share them now (whole racks, at least one)."""
    cluster = scenario.cluster
    if not cluster.topology:
        raise SweepError("a racks sweep needs the scenario's cluster.topology")
    size = cluster.topology[-1].nodes
    now = cluster.racks or 1
    counts = [round(-(-p.nodes // size) * racks / now) for p in cluster.pools]
    counts[counts.index(max(counts))] += racks - sum(counts)   # rounding: the largest pool takes the rest
    pools = [p.model_copy(update={"nodes": max(0, n) * size}) for p, n in zip(cluster.pools, counts)]
    return scenario.model_copy(update={"cluster": cluster.model_copy(update={"pools": pools})})


def _scaled_policy(policy: QuotaPolicy, factor: float) -> QuotaPolicy:
    def scale(r: Resources | None) -> Resources | None:
        if r is None:
            return None
        return Resources(**{k: None if v is None else v * factor for k, v in r.model_dump().items()})
    teams = [t.model_copy(update={"nominal": scale(t.nominal), "borrowing_limit": scale(t.borrowing_limit),
                                  "lending_limit": scale(t.lending_limit)}) for t in policy.teams]
    return policy.model_copy(update={"teams": teams})


Progress = Callable[[str], None]


def run_sweep(scenario: Scenario, policy: QuotaPolicy, jobs: list[TraceJob], axis: Axis,
              progress: Progress | None = None) -> list[Point]:
    return [_run_point(scenario, policy, jobs, axis.key, v, progress) for v in axis.values]


def _run_point(scenario: Scenario, policy: QuotaPolicy, jobs: list[TraceJob], key: str, value: Any,
               progress: Progress | None) -> Point:
    s, p = with_value(scenario, policy, key, value)
    if key == "gpus":
        value = s.cluster.total_gpus
    elif key == "racks":
        value = s.cluster.racks
    if progress:
        progress(f"{key}={getattr(value, 'value', value)}")
    return Point(value, simulate(s, p, jobs).summary)


def smallest_cluster(scenario: Scenario, policy: QuotaPolicy, jobs: list[TraceJob], axis: Axis, target: Target,
                     progress: Progress | None = None) -> tuple[int | None, list[Point]]:
    """Run the grid, then bisect between the last failing and the first passing size (to one node, or
    one rack)."""
    if axis.key not in SIZES:
        raise SweepError("a target needs a gpus or racks sweep, e.g. --sweep gpus=256..1024")
    points = run_sweep(scenario, policy, jobs, axis, progress)
    passing = [i for i, pt in enumerate(points) if target.met(pt.summary)]
    if not passing:
        return None, points
    first = passing[0]
    if first == 0:
        return points[0].value, points
    lo, hi = points[first - 1].value, points[first].value
    step = max(p.gpus_per_node for p in scenario.cluster.pools) if axis.key == "gpus" else 1
    answer = hi
    while hi - lo > step:
        pt = _run_point(scenario, policy, jobs, axis.key, (lo + hi) // 2, progress)
        if pt.value in (lo, hi):
            break
        points.append(pt)
        if target.met(pt.summary):
            hi = answer = pt.value
        else:
            lo = pt.value
    return answer, sorted(points, key=lambda p: p.value)


def plot_curve(points: list[Point], target: Target, answer: int | None, path: Path, unit: str = "GPUs") -> Path:
    pts = sorted(points, key=lambda p: p.value)
    xs = [p.value for p in pts]
    ys = [target.measure(p.summary) for p in pts]
    scale, unit = (3600, "hours") if target.path[0] != "gpu_utilization" else (1, "")
    # matplotlib only when a curve is drawn (Agg canvas, no pyplot).
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(8, 4))
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    ax.plot(xs, [None if y is None else y / scale for y in ys], marker="o", label=".".join(target.path))
    ax.axhline(target.value / scale, color="red", linestyle="--", label=f"target {target.text}")
    if answer is not None:
        ax.axvline(answer, color="green", linestyle=":", label=f"smallest: {answer} {unit}")
    shown = [y / scale for y in ys if y]
    if shown and max(shown) > 50 * min(shown):   # delays span decades: keep the target region readable
        ax.set_yscale("symlog", linthresh=max(target.value / scale / 2, 1e-3))
        ax.set_ylim(bottom=0)
    ax.set_xlabel(f"cluster {unit}")
    ax.set_ylabel(f"{'.'.join(target.path)} {unit}".strip())
    ax.legend()
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=90)
    return path
