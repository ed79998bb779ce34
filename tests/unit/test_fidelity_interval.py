"""The simulator's fidelity is stated with its uncertainty: the pooled error of several real runs with a
95 % bootstrap interval over the runs, and "within tolerance" only when the whole interval is
(gangctl/validate/measure.py, benchmarks/sim_fidelity.py)."""
from __future__ import annotations

import pytest

from benchmarks import sim_fidelity
from gangctl.validate.measure import bootstrap_interval, interval_verdict, pooled_error

# replay-check's eleven stored runs (2026-11-26 07:41 to 2026-11-27 13:18 UTC), each beside the model at
# 931c65c with that run's latencies, as benchmarks/README.md published them on 2026-11-27.
P95_QUEUEING = ([245.02, 303.60, 195.19, 260.41, 257.86, 226.00, 242.74, 172.42, 233.38, 247.68, 307.49],
                [222.40, 228.55, 222.77, 229.48, 222.67, 221.90, 221.86, 228.48, 222.99, 230.54, 221.92])
MEAN_JCT = ([74.60, 80.86, 70.41, 75.20, 75.21, 72.01, 73.16, 68.43, 70.90, 72.86, 79.20],
            [73.20, 73.71, 73.20, 73.54, 73.20, 73.13, 73.21, 73.51, 73.25, 73.84, 73.12])


def test_a_p95_met_on_its_point_estimate_is_not_shown_within_once_the_runs_spread_is_counted():
    real, model = P95_QUEUEING
    assert pooled_error(real, model) == pytest.approx(-0.081, abs=0.001)   # the -8.1 % once called "met"
    lo, hi = bootstrap_interval(real, model)
    assert lo < -0.10 and hi > 0, (lo, hi)   # about -16 % to +2 %: from well outside to no bias at all
    assert interval_verdict((lo, hi), 0.10, len(real)) == "not shown within"
    assert bootstrap_interval(real, model) == (lo, hi), "seeded: the same interval every time"


def test_a_mean_whose_whole_interval_is_inside_is_within_tolerance():
    real, model = MEAN_JCT
    lo, hi = bootstrap_interval(real, model)
    assert -0.05 < lo < pooled_error(real, model) < hi < 0.05
    assert interval_verdict((lo, hi), 0.05, len(real)) == "within tolerance"


def test_verdicts_at_the_edges():
    assert interval_verdict((0.11, 0.2), 0.10, 11) == "outside tolerance"
    assert interval_verdict((-0.3, -0.12), 0.10, 11) == "outside tolerance"
    assert interval_verdict((-0.01, 0.01), 0.05, 4) == "too few runs", "four runs' bootstrap is too narrow to trust"
    assert bootstrap_interval([1.0], [1.1]) is None
    with pytest.raises(ValueError):
        bootstrap_interval([1.0, 2.0], [1.0])


def test_the_report_pools_each_slice_and_prints_the_interval_and_verdict():
    def run(real_p95, model_p95, real_mean=70.0, model_mean=70.0):
        metric = lambda mean, p95: {"mean": mean, "p95": p95}  # noqa: E731
        return {"slice": "replay-check", "quota": False, "jobs": 300, "compression": 60.0,
                "real": {"jct_seconds": metric(real_mean, 300.0), "queue_delay_seconds": metric(30.0, real_p95)},
                "model": {"jct_seconds": metric(model_mean, 300.0), "queue_delay_seconds": metric(30.0, model_p95)}}
    merged = sim_fidelity.pooled([run(r, m) for r, m in zip(*P95_QUEUEING)])
    assert merged[0]["verdict"]["queue_delay_seconds"]["p95"] == "not shown within"
    assert merged[0]["verdict"]["jct_seconds"]["mean"] == "within tolerance"
    columns, rows = sim_fidelity.verdict_rows(merged)
    assert columns[-1] == "queueing p95 (tolerance ±10%)"
    assert rows[0][0:2] == ["replay-check", 11] and rows[0][-1].startswith("-8.1% [-1") \
        and rows[0][-1].endswith("]: not shown within")


def test_new_runs_are_stored_under_the_next_free_name(tmp_path):
    assert sim_fidelity.next_run_path(tmp_path, "2026-11-28").name == "fidelity-run-2026-11-28.json"
    (tmp_path / "fidelity-run-2026-11-28.json").write_text("{}")
    (tmp_path / "fidelity-run-2026-11-28b.json").write_text("{}")
    assert sim_fidelity.next_run_path(tmp_path, "2026-11-28").name == "fidelity-run-2026-11-28c.json"


def test_held_out_runs_are_those_recorded_with_the_model_commit_in_their_history():
    # The six runs of 2026-11-27 ran at 063c8f2, before the Permit-hold model of 931c65c: not held out from it.
    assert not sim_fidelity.after_model("063c8f2", "931c65c")
    assert sim_fidelity.after_model("931c65c", "931c65c") and sim_fidelity.after_model("97b77fc", "931c65c")


def test_the_sweep_rescores_the_stored_runs_with_a_fitted_constant_changed():
    import json

    stored = json.loads((sim_fidelity.RUNS_DIR / "fidelity-run-2026-11-27c.json").read_text())["results"]
    name, columns, rows = sim_fidelity.sweep(stored, "permit_hold_race=0,1", draws=2)
    assert name == "permit_hold_race" and columns[:3] == ["permit_hold_race", "slice", "runs"]
    assert [r[:3] for r in rows] == [["0", "replay-check", 1], ["1", "replay-check", 1]]
    assert rows[0][3:] != rows[1][3:], "the constant moves the model"
    assert stored[0]["model"] == json.loads((sim_fidelity.RUNS_DIR / "fidelity-run-2026-11-27c.json").read_text())[
        "results"][0]["model"], "the stored runs are not changed"
    with pytest.raises(SystemExit, match="NAME one of permit_hold_race, attempt_seconds"):
        sim_fidelity.sweep(stored, "bind_seconds=1", draws=2)
