"""What-if sweeps and the "smallest cluster such that ..." question."""
from __future__ import annotations

from dataclasses import replace

import pytest

from gangctl.model.quota import QuotaPolicy
from gangctl.sim.engine import simulate
from gangctl.sim.generate import generate
from gangctl.sim.scenario import Backend, Scenario
from gangctl.sim.sweep import SweepError, parse_axis, parse_target, plot_curve, run_sweep, smallest_cluster, with_value

POLICY = QuotaPolicy.model_validate({"teams": [{"name": "t", "nominal": {"gpu": 100_000}}]})
# Whole-node jobs only: with one gang size, greedy placement is monotone in cluster size. (With mixed
# sizes it need not be: on a smaller cluster a big gang may starve while small ones flow past it.)
JOBS = [replace(j, num_nodes=1, gpus_per_node=8) for j in generate(400, 4, seed=9, groups={"t": 1})]
TARGET = parse_target("p95_queue_delay<=30m")


def scenario(nodes: int = 16) -> Scenario:
    return Scenario.model_validate({
        "name": "s", "backend": "coscheduling", "quotaPolicy": "unused.yaml",
        "cluster": {"pools": [{"name": "p", "nodes": nodes, "gpusPerNode": 8}]},
        "workload": {"generate": {"jobs": 1, "arrivalsPerHour": 1}}, "sampleSeconds": 3600})


def p95_delay(nodes: int) -> float:
    return simulate(scenario(nodes), POLICY, JOBS).summary["queue_delay_seconds"]["p95"]


def test_parse_axis_and_target():
    assert parse_axis("gpus=256..1024").values == [256, 365, 474, 583, 692, 801, 910, 1019, 1024]
    assert parse_axis("gpus=64..256:64").values == [64, 128, 192, 256]
    assert parse_axis("quota=0.5,1,2").values == [0.5, 1.0, 2.0]
    assert parse_axis("elastic=on,off").values == [True, False]
    assert parse_axis("backend=kueue,volcano").values == [Backend.KUEUE, Backend.VOLCANO]
    t = parse_target("p95_queue_delay<=1h")
    assert (t.path, t.at_most, t.value) == (("queue_delay_seconds", "p95"), True, 3600)
    assert parse_target("utilization>=0.8").path == ("gpu_utilization",)
    for bad in ("gpus=1024..256", "nodes=3", "backend=slurm", "gpus"):
        with pytest.raises(SweepError):
            parse_axis(bad)
    with pytest.raises(SweepError):
        parse_target("p42_jct<=1h")


def test_gpu_sweep_scales_whole_nodes_and_more_gpus_never_queue_longer():
    points = run_sweep(scenario(), POLICY, JOBS, parse_axis("gpus=64..256:32"))
    assert [p.value for p in points] == [64, 96, 128, 160, 192, 224, 256]   # the cluster actually simulated
    delays = [p.summary["queue_delay_seconds"]["p95"] for p in points]
    assert delays == sorted(delays, reverse=True), delays                    # monotone on this scenario
    assert delays[0] > delays[-1]


def test_find_returns_the_smallest_cluster_meeting_the_target():
    answer, points = smallest_cluster(scenario(), POLICY, JOBS, parse_axis("gpus=32..256:56"), TARGET)
    assert answer is not None
    assert TARGET.met(next(p.summary for p in points if p.value == answer))
    # One node fewer misses the target (checked independently of the search).
    assert p95_delay(answer // 8) <= TARGET.value
    assert p95_delay(answer // 8 - 1) > TARGET.value
    # The curve returned is sorted and passes the target exactly from the answer on.
    values = [p.value for p in points]
    assert values == sorted(values)
    assert [TARGET.met(p.summary) for p in points] == [v >= answer for v in values]


def test_find_says_none_when_no_size_in_range_meets_the_target():
    answer, points = smallest_cluster(scenario(), POLICY, JOBS, parse_axis("gpus=8..16:8"), parse_target("p95_queue_delay<=1s"))
    assert answer is None and len(points) == 2


def test_curve_plot_is_written(tmp_path):
    answer, points = smallest_cluster(scenario(), POLICY, JOBS, parse_axis("gpus=64..256:64"), TARGET)
    png = plot_curve(points, TARGET, answer, tmp_path / "curve.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 5000


def test_other_axes_change_what_they_name():
    sc = scenario()
    s, p = with_value(sc, POLICY, "quota", 0.5)
    assert p.teams[0].nominal.gpu == 50_000 and s is sc
    s, _ = with_value(sc, POLICY, "elastic", True)
    assert s.workload.elastic.enabled and not sc.workload.elastic.enabled
    s, _ = with_value(sc, POLICY, "backend", Backend.VOLCANO)
    assert s.backend is Backend.VOLCANO and sc.backend is Backend.COSCHEDULING
