"""`gangctl sim`: the HTML report with its plots, the JSON output, sweeps and errors, via the real CLI."""
from __future__ import annotations

import json
import re
from pathlib import Path

from typer.testing import CliRunner

from gangctl.cli import app

ROOT = Path(__file__).resolve().parents[2]
SCENARIOS = ROOT / "simulations"
runner = CliRunner()
PNG = b"\x89PNG\r\n\x1a\n"


def sim(*args: str):
    return runner.invoke(app, ["sim", *args])


def test_shipped_scenario_prints_the_summary_and_writes_the_report(tmp_path):
    result = sim(str(SCENARIOS / "pai-small.yaml"), "--report", str(tmp_path))
    assert result.exit_code == 0, result.output
    for label in ("job completion time", "queueing delay", "GPU utilization", "fragmented GPUs",
                  "restarts user / infra", "goodput lost", "team ml-a"):
        assert label in result.output
    page = (tmp_path / "index.html").read_text()
    images = re.findall(r"<img src='([^']+)'", page)
    assert set(images) == {"utilization.png", "queue.png", "teams.png", "queue_delay_cdf.png"}
    for name in images:
        data = (tmp_path / name).read_bytes()
        assert data.startswith(PNG) and len(data) > 5000, name
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["jobs"]["total"] > 0


def test_json_output_is_only_json_with_the_metrics():
    result = sim(str(SCENARIOS / "helios-elastic.yaml"), "-o", "json", "--max-jobs", "80")
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    assert set(summary) >= {"jobs", "jct_seconds", "queue_delay_seconds", "gpu_utilization",
                            "fragmented_gpus_mean", "teams", "failures", "makespan_seconds"}
    for key in ("jct_seconds", "queue_delay_seconds"):
        assert set(summary[key]) == {"mean", "p50", "p95", "p99"}
        s = summary[key]
        assert s["p50"] <= s["p95"] <= s["p99"]
    assert set(summary["failures"]) == {"node_failures", "user_restarts", "infra_restarts", "preemptions",
                                        "goodput_lost_gpu_hours"}
    assert set(summary["teams"]) == {"ml-a", "ml-b", "prod", "eval"}
    assert summary["jobs"]["total"] == 80
    assert 0 < summary["gpu_utilization"] <= 1


def test_sweep_and_find_as_json(tmp_path):
    result = sim(str(SCENARIOS / "pai-generated.yaml"), "-o", "json", "--max-jobs", "300",
                 "--sweep", "gpus=8..256:48", "--find", "p95_queue_delay<=10m", "--report", str(tmp_path))
    assert result.exit_code == 0, result.output
    answer = json.loads(result.stdout)
    curve = {p["gpus"]: p["value"] for p in answer["curve"]}
    assert list(curve) == sorted(curve)
    smallest = answer["smallest_gpus"]
    assert smallest in curve and curve[smallest] <= 600
    assert all(value > 600 for gpus, value in curve.items() if gpus < smallest)
    assert smallest - 8 in curve, "the search narrows down to one node"
    assert (tmp_path / "smallest-cluster.png").read_bytes().startswith(PNG)


def test_bad_trace_row_is_a_clear_error_and_can_be_skipped(tmp_path):
    (tmp_path / "jobs.csv").write_text("job_id,submit_time,duration,num_nodes,gpus_per_node\na,0,10,1,8\nb,x,10,1,8\n")
    policy = (ROOT / "policies/example-teams.yaml").resolve()
    scenario = tmp_path / "s.yaml"
    text = (f"name: s\ncluster: {{pools: [{{name: p, nodes: 2}}]}}\nquotaPolicy: {policy}\n"
            "workload: {trace: {format: csv, path: jobs.csv, skipBadRows: SKIP}}\n")
    scenario.write_text(text.replace("SKIP", "false"))
    result = sim(str(scenario), "--report", str(tmp_path / "r"))
    assert result.exit_code == 1
    assert "jobs.csv:3: submit_time is not a number" in " ".join(result.output.split())
    scenario.write_text(text.replace("SKIP", "true"))
    result = sim(str(scenario), "--report", str(tmp_path / "r"))
    assert result.exit_code == 0, result.output
    assert "1 bad row" in result.output


def test_the_report_states_how_far_the_simulator_was_validated(tmp_path):
    from gangctl.sim import fidelity

    measured = {"measured": "2026-11-26 04:20 UTC", "commit": "abc1234", "jobs_per_slice": 300,
                "slices": ["replay-check", "replay-check-philly", "replay-check-quota"],
                "max_relative_error": {"jct_seconds.mean": 0.043, "jct_seconds.p95": 0.09,
                                       "queue_delay_seconds.mean": 0.216, "queue_delay_seconds.p95": None}}
    assert "by chance" not in fidelity.sentence(measured), "a file without the spread claims none"
    measured["max_relative_chance_spread"] = {"jct_seconds.mean": 0.061, "queue_delay_seconds.mean": 0.25,
                                              "queue_delay_seconds.p95": 0.5}
    text = fidelity.sentence(measured)
    assert "by chance, from the scheduler's random tie-breaks: mean JCT ±6%, mean queueing delay ±25%" in text
    assert "mean JCT ±4%" in text and "p95 JCT ±9%" in text and "mean queueing delay ±22%" in text
    assert "p95 queueing delay" not in text, "a metric not measured is not claimed"
    assert "3 slices of 300 jobs replayed by `gangctl sim-check`, measured" in text
    assert "2026-11-26 04:20 UTC at abc1234" in text
    measured["runs_per_slice"] = {"replay-check": 4, "replay-check-philly": 2, "replay-check-quota": 3}
    assert "3 slices of 300 jobs replayed by `gangctl sim-check`, each against the mean of its 2 to 4 real runs, " \
        in fidelity.sentence(measured)
    assert "Real runs" not in fidelity.sentence(measured), "no spread of real runs stored, none claimed"
    measured["max_real_run_spread"] = {"jct_seconds.mean": 0.057, "queue_delay_seconds.mean": 0.138,
                                       "queue_delay_seconds.p95": 0.27}
    assert fidelity.sentence(measured).endswith(
        "Real runs of the same jobs differed by up to mean JCT ±6%, mean queueing delay ±14% (one standard deviation).")
    measured["runs_per_slice"] = {"replay-check": 1, "replay-check-philly": 1, "replay-check-quota": 1}
    assert "against the mean" not in fidelity.sentence(measured), "one run per slice is not called a mean"
    path = tmp_path / "fidelity.json"
    path.write_text(__import__("json").dumps(measured))
    assert fidelity.load(path) == measured
    assert fidelity.load(tmp_path / "absent.json") is None
    assert fidelity.sentence(None).startswith("Not validated")
    measured["max_abs_error_interval95"] = {"jct_seconds.mean": 0.037, "queue_delay_seconds.p95": 0.228}
    measured["model_commit"] = "def5678"
    assert "measured 2026-11-26 04:20 UTC at abc1234, model at def5678;" in fidelity.sentence(measured)
    assert ("Counting the uncertainty of the real runs' mean (95 % bootstrap interval over the runs), up to "
            "mean JCT ±4%, p95 queueing delay ±23%.") in fidelity.sentence(measured)


def test_error_bars_are_printed_only_for_the_kind_of_scenario_that_was_validated(tmp_path):
    from gangctl.sim import fidelity
    from gangctl.sim.scenario import Backend, load_scenario

    validated = load_scenario(SCENARIOS / "replay-check.yaml")   # coscheduling, no failures, not elastic, no zones
    assert fidelity.unvalidated(validated) == []
    assert fidelity.sentence(fidelity.load(), validated).startswith("Error bars against the real control plane")
    failures = validated.failures.model_copy(update={"exit_failure_rate": 0.03})
    elastic = validated.workload.model_copy(update={"elastic": validated.workload.elastic.model_copy(update={"enabled": True})})
    pytorchjobs = validated.workload.model_copy(update={"pytorchjob_share": 0.5})
    for change, gap in (({"backend": Backend.KAI}, "the kai backend"), ({"failures": failures}, "node or exit failures"),
                        ({"workload": elastic}, "elastic jobs"),
                        ({"workload": pytorchjobs}, "PyTorchJobs"),
                        ({"cluster": validated.cluster.model_copy(update={"same_zone": True})}, "zone topology")):
        other = validated.model_copy(update=change)
        assert fidelity.unvalidated(other) == [gap] or fidelity.unvalidated(other)[0].startswith(gap)
        text = fidelity.sentence(fidelity.load(), other)
        assert text.startswith("Not validated against a real cluster: " + gap) and "±" not in text
    # The report says so under the results, in the terminal and on the HTML page: pai-small runs Kueue with failures.
    result = sim(str(SCENARIOS / "pai-small.yaml"), "--report", str(tmp_path / "r"))
    shown = " ".join(result.output.split())
    assert "Not validated against a real cluster: the kueue backend, node or exit failures." in shown
    assert "Error bars" not in shown
    assert "Not validated against a real cluster" in (tmp_path / "r" / "index.html").read_text()
