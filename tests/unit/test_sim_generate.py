"""The workload generator reproduces the shapes it claims, deterministically for a seed."""
from __future__ import annotations

import math
import statistics

import pytest

from gangctl.sim.generate import SHAPES, Shape, generate


@pytest.mark.parametrize("shape", list(Shape))
def test_job_sizes_and_durations_follow_the_shape(shape):
    n = 20_000
    jobs = generate(n, 60, seed=11, shape=shape, gpus_per_node=8)
    params = SHAPES[shape]
    # Job-size distribution: the share of each total GPU count within 1.5 points of the published one.
    for gpus, share in params.sizes.items():
        seen = sum(1 for j in jobs if j.gpus == gpus) / n
        assert seen == pytest.approx(share, abs=0.015), f"{gpus}-GPU jobs: {seen:.3f} vs {share}"
    # Durations are log-normal around the shape's median, stretched by GPUs^0.2 for bigger gangs
    # (the smallest jobs: 1 GPU, or one 8-GPU node in the gangs shape); mean/median = exp(sigma^2 / 2).
    smallest = min(params.sizes)
    durations = [j.duration for j in jobs if j.gpus == smallest]
    assert statistics.median(durations) == pytest.approx(params.median_seconds * smallest ** 0.2, rel=0.1)
    assert statistics.mean(durations) / statistics.median(durations) == pytest.approx(
        math.exp(params.sigma ** 2 / 2), rel=0.3), "log-normal tail"
    # Gangs above one node are whole nodes.
    assert all(j.num_nodes == 1 or j.gpus_per_node == 8 for j in jobs)


def test_arrivals_are_poisson_at_the_rate():
    jobs = generate(10_000, 120, seed=3)
    gaps = [b.submit - a.submit for a, b in zip(jobs, jobs[1:])]
    assert statistics.mean(gaps) == pytest.approx(30, rel=0.05)        # 120 per hour
    assert statistics.stdev(gaps) == pytest.approx(30, rel=0.1)         # exponential: stdev = mean


def test_diurnal_arrivals_peak_in_the_afternoon():
    jobs = generate(20_000, 60, seed=3, diurnal=True)
    by_hour = [0] * 24
    for j in jobs:
        by_hour[int(j.submit // 3600) % 24] += 1
    assert max(range(24), key=by_hour.__getitem__) in range(12, 18)
    assert max(by_hour) > 2 * min(by_hour)


def test_teams_and_priority_classes_by_share():
    jobs = generate(8_000, 60, seed=1, groups={"a": 3, "b": 1}, priority_classes={"high": 1, "low": 1})
    assert sum(j.group == "a" for j in jobs) / len(jobs) == pytest.approx(0.75, abs=0.02)
    assert sum(j.priority_class == "high" for j in jobs) / len(jobs) == pytest.approx(0.5, abs=0.02)


def test_same_seed_same_jobs_other_seed_other_jobs():
    assert generate(500, 30, seed=4) == generate(500, 30, seed=4)
    assert generate(500, 30, seed=4) != generate(500, 30, seed=5)
