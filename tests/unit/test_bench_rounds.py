"""Side-by-side benchmarks run in alternating rounds and publish medians with their range
(gangctl/harness/rounds.py and the tables of controller_peer.py, quota_backends.py and scale.py), checked on
figures those benchmarks recorded in earlier single runs."""
from __future__ import annotations

import importlib
import sys

import pytest

from benchmarks import controller_peer, quota_backends, scale
from gangctl.harness import results, rounds


def test_rounds_alternate_which_side_goes_first():
    assert rounds.order(["gangctl", "peer"], 3) == [(0, "gangctl"), (0, "peer"), (1, "peer"), (1, "gangctl"),
                                                    (2, "gangctl"), (2, "peer")]
    assert [s for _, s in rounds.order(["a", "b", "c"], 2)] == ["a", "b", "c", "c", "b", "a"]
    with pytest.raises(ValueError):
        rounds.order(["gangctl"], 0)
    assert rounds.check_rounds(2, publish=True) and rounds.check_rounds(3, publish=True) is None
    assert rounds.check_rounds(1, publish=False) is None, "a quick look need not publish"


def test_controller_peer_publishes_each_sides_median_and_range():
    # controller_peer.py's runs of 2026-11-25 (1368814), 2026-11-26 (bedceae, 3ff17f9, 75f58e0): seconds
    # to all 800 pods bound and apiserver requests; the ratio moved 2.23 -> 2.17 -> 1.64 -> 1.98.
    recorded = {"gangctl": [(16.21, 7254), (20.01, 7026), (22.07, 7687), (20.28, 7451)],
                "kubeflow-trainer": [(36.24, 12756), (43.39, 13192), (36.14, 12788), (40.13, 11897)]}
    runs = {side: [controller_peer.Result(side, "v", 200, 800, pods_bound_s=b, apiserver_requests=q) for b, q in rs]
            for side, rs in recorded.items()}
    columns, rows = controller_peer.median_rows(runs)
    assert columns == ["metric", "gangctl", "kubeflow-trainer", "gangctl / peer (medians)"]
    bound = next(r for r in rows if r[0].startswith("first create -> all pods bound"))
    assert bound[1] == {"median": 20.145, "min": 16.21, "max": 22.07, "n": 4, "samples": [16.21, 20.01, 22.07, 20.28]}
    assert bound[2]["median"] == 38.185 and (bound[2]["min"], bound[2]["max"]) == (36.14, 43.39)
    assert bound[3] == 0.53
    requests = next(r for r in rows if r[0].startswith("apiserver requests"))
    assert results.cell(requests[1]) == "7,352.5 (7,026–7,687, 4 runs)"
    created = next(r for r in rows if r[0].startswith("first create -> all pods created"))
    assert created[1:] == [None, None, None], "a figure no round measured is not invented"


def test_quota_backends_counts_every_rounds_invariant_and_takes_medians_of_timings():
    # quota_backends.py's coscheduling and KAI rows of 2026-11-25/26 and 2026-11-26 (two runs each).
    def run(backend, last, eff, p50, p95, over=0, complete=200):
        return {"backend": backend, "jobs": 200, "complete": complete, "seconds_to_last_finish": last,
                "quota_efficiency": eff, "wait_p50": p50, "wait_p95": p95, "samples_over_quota": over, "samples": 2800}
    runs = {"coscheduling": [run("coscheduling", 290.5, 0.258, 80.0, 220.0), run("coscheduling", 287.1, 0.261, 78.2, 218.3)],
            "kai": [run("kai", 273.4, 0.27, 100.0, 210.0, over=2, complete=199), run("kai", 288.5, 0.26, 113.2, 227.1)]}
    columns, rows = quota_backends.median_rows(runs)
    kai = dict(zip(columns, rows[1]))
    assert kai["complete"] == "199/200 200/200" and kai["samples over 64"] == "2 of 5,600", \
        "one round over the quota or short of a job shows, whatever the median"
    assert kai["last finished (s)"]["median"] == 280.95 and kai["last finished (s)"]["n"] == 2


def test_scale_takes_medians_over_rounds_with_the_floor_from_gangctls_cluster():
    # P1 floor / gangctl bound (s) of scale.py's runs at b0019af, 1b6c581, 67a1c6f; the peer's 37.51 once.
    def side(bound, writes=None, floor=None):
        d = {"p1": {"bound_s": bound, "window": {"audit": {"job_writes": writes}}}}
        if floor is not None:
            d["p1_floor"] = {"bound_s": floor}
        return d
    data = {"rounds": [{"gangctl": side(30.06, 35, 33.84), "peer": side(37.51, 9)},
                       {"gangctl": side(30.65, 17, 32.27)}, {"gangctl": side(33.43, 9, 34.25)}]}
    columns, rows = scale.median_rows(data["rounds"])
    p1 = dict(zip(columns, rows[0]))
    assert (p1["floor (no controller)"]["median"], p1["gangctl"]["median"], p1["peer"]["n"]) == (33.84, 30.65, 1)
    assert p1["gangctl / floor"] == 0.91 and p1["gangctl / peer"] == 0.82
    assert dict(zip(columns, rows[1]))["gangctl"]["samples"] == [35, 17, 9]
    assert "over 3 round(s)" in scale.medians_text(data)
    assert "over 1 round(s)" in scale.medians_text({"gangctl": side(30.0, 9, 33.0)}), "a file from before rounds"


@pytest.mark.parametrize("script", ["controller_peer", "pytorchjob_peer", "quota_backends", "scale"])
def test_the_peer_benchmarks_take_rounds_and_refuse_to_publish_fewer_than_three(script, monkeypatch, capsys):
    main = importlib.import_module(f"benchmarks.{script}").main
    monkeypatch.setattr(sys, "argv", [f"{script}.py", "--help"])
    with pytest.raises(SystemExit) as helped:
        main()
    out = capsys.readouterr().out
    assert helped.value.code == 0 and "--rounds" in out and "--record" in out
    monkeypatch.setattr(sys, "argv", [f"{script}.py", "--rounds", "2", "--record"])
    with pytest.raises(SystemExit) as refused:   # argparse's error, before any cluster starts
        main()
    assert refused.value.code == 2 and "--rounds 3 or more" in capsys.readouterr().err


def test_run_sides_runs_each_side_every_round_in_alternating_order_and_says_so():
    said, ran = [], []

    def run(side: str) -> dict:
        ran.append(side)
        return {"n": len(ran)}
    runs = rounds.run_sides(["a", "b"], 3, run, said.append)
    assert ran == ["a", "b", "b", "a", "a", "b"]
    assert runs == {"a": [{"n": 1}, {"n": 4}, {"n": 5}], "b": [{"n": 2}, {"n": 3}, {"n": 6}]}
    assert said[0] == "round 1 of 3: a" and said[-1] == "round 3 of 3: b"
