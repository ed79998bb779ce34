"""Synthetic workloads shaped like the published GPU traces, deterministic for a seed.

Shapes (approximate readings of the job-size and duration CDFs published with the traces, not fits):
most jobs use one GPU, with a tail of 8–128-GPU gangs; run times are log-normal (heavy-tailed) with
medians of minutes, and larger gangs run longer (duration × GPUs^0.2). `gangs` is no trace's: a
training cluster's mix where most jobs are multi-node gangs (the topology scenarios' workload). Arrivals are Poisson, with an
optional diurnal cycle (rate × (1 + 0.6·sin), peak mid-afternoon) made by thinning.
Gangs above one node become whole nodes: `gpus / gpus_per_node` pods of `gpus_per_node` GPUs.
"""
from __future__ import annotations

import math
import random
from dataclasses import dataclass
from enum import Enum

from gangctl.sim.traces import TraceJob


class Shape(str, Enum):
    PAI = "pai"
    PHILLY = "philly"
    HELIOS = "helios"
    GANGS = "gangs"


@dataclass(frozen=True)
class _ShapeParams:
    sizes: dict[int, float]      # total GPUs -> share of jobs
    median_seconds: float
    sigma: float                 # of ln(duration)


SHAPES = {
    Shape.PAI: _ShapeParams({1: 0.74, 2: 0.08, 4: 0.07, 8: 0.07, 16: 0.02, 32: 0.013, 64: 0.006, 128: 0.001},
                            median_seconds=1200, sigma=2.0),
    Shape.PHILLY: _ShapeParams({1: 0.78, 2: 0.08, 4: 0.07, 8: 0.05, 16: 0.015, 32: 0.005},
                               median_seconds=3600, sigma=1.9),
    Shape.HELIOS: _ShapeParams({1: 0.60, 2: 0.08, 4: 0.10, 8: 0.14, 16: 0.04, 32: 0.025, 64: 0.012, 128: 0.003},
                               median_seconds=600, sigma=2.2),
    Shape.GANGS: _ShapeParams({8: 0.3, 16: 0.3, 32: 0.25, 48: 0.1, 64: 0.05}, median_seconds=1800, sigma=1.0),
}
_MIN_SECONDS, _MAX_SECONDS = 10.0, 14 * 86400.0
_DIURNAL_AMPLITUDE = 0.6
_CPU_PER_GPU, _GIB_PER_GPU = 6.0, 48.0


def generate(jobs: int, arrivals_per_hour: float, *, seed: int, shape: Shape = Shape.PAI,
             groups: dict[str, float] | None = None, priority_classes: dict[str, float] | None = None,
             gpus_per_node: int = 8, diurnal: bool = False, max_seconds: float = _MAX_SECONDS) -> list[TraceJob]:
    """`jobs` jobs; `groups` and `priority_classes` map names to shares (e.g. teams {"ml-a": 2, ...})."""
    if jobs < 0 or arrivals_per_hour <= 0:
        raise ValueError("jobs must be >= 0 and arrivals_per_hour > 0")
    rng = random.Random(seed)
    params = SHAPES[shape]
    sizes, size_weights = list(params.sizes), list(params.sizes.values())
    group_names, group_weights = _choices(groups or {"": 1.0})
    class_names, class_weights = _choices(priority_classes or {})
    mu = math.log(params.median_seconds)
    rate = arrivals_per_hour / 3600.0
    peak = rate * (1 + _DIURNAL_AMPLITUDE) if diurnal else rate
    out: list[TraceJob] = []
    t = 0.0
    while len(out) < jobs:
        t += rng.expovariate(peak)
        if diurnal and rng.random() * peak > rate * (1 + _DIURNAL_AMPLITUDE * math.sin(2 * math.pi * (t / 86400 - 1 / 3))):
            continue
        gpus = rng.choices(sizes, size_weights)[0]
        pods, per_pod = (1, gpus) if gpus <= gpus_per_node else (gpus // gpus_per_node, gpus_per_node)
        duration = min(max_seconds, max(_MIN_SECONDS, rng.lognormvariate(mu, params.sigma) * gpus ** 0.2))
        out.append(TraceJob(
            id=f"job-{len(out):06d}", submit=round(t, 3), duration=round(duration, 1),
            num_nodes=pods, gpus_per_node=per_pod,
            cpu_per_node=per_pod * _CPU_PER_GPU, memory_per_node=per_pod * _GIB_PER_GPU,
            group=rng.choices(group_names, group_weights)[0],
            priority_class=rng.choices(class_names, class_weights)[0] if class_names else None))
    return out


def _choices(shares: dict[str, float]) -> tuple[list[str], list[float]]:
    if any(w < 0 for w in shares.values()):
        raise ValueError("shares must be non-negative")
    return list(shares), list(shares.values())
