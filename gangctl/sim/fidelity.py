"""How far the simulator agrees with the real control plane: the error bars every report states.

`benchmarks/sim_fidelity.py --write-fidelity simulations/fidelity.json` replays the shipped
replay-check slices through the real controller and scheduler (`gangctl sim-check`) and stores the
model's largest relative error over the slices per metric (against the mean of a slice's real runs
when it was run several times: one real run is itself one draw of the scheduler's races), and how far
one run varies by chance (the widest 5-95 % range of the model's tie-break draws, and the real runs'
own spread when there were several); `gangctl sim` prints them under its
results, so a what-if is read with the margin it deserves.

Only for the kind of scenario those slices are (`unvalidated`): the Coscheduling backend, no node or
exit failures, no elastic jobs, no PyTorchJobs, no zone topology. For any other the report says it
was not validated against a real cluster and prints no error bars: they were never measured there.
"""
from __future__ import annotations

import json
from pathlib import Path

from gangctl.config import REPO_ROOT
from gangctl.sim.scenario import Backend, Scenario

FILE = REPO_ROOT / "simulations" / "fidelity.json"
_LABELS = {"jct_seconds.mean": "mean JCT", "jct_seconds.p95": "p95 JCT",
           "queue_delay_seconds.mean": "mean queueing delay", "queue_delay_seconds.p95": "p95 queueing delay"}


def load(path: Path = FILE) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _means(spreads: dict | None) -> str:
    """The mean metrics of a stored spread, as "mean JCT ±x%, ..."."""
    return ", ".join(f"{_LABELS.get(k, k)} ±{v:.0%}" for k, v in (spreads or {}).items()
                     if v is not None and k.endswith(".mean"))


def unvalidated(scenario: Scenario) -> list[str]:
    """What in `scenario` no real replay validated ([] when it is of the validated kind)."""
    gaps = []
    if scenario.backend is not Backend.COSCHEDULING:
        gaps.append(f"the {scenario.backend.value} backend")
    if scenario.failures.node_mtbf_hours is not None or scenario.failures.exit_failure_rate > 0:
        gaps.append("node or exit failures")
    if scenario.workload.elastic.enabled:
        gaps.append("elastic jobs")
    if scenario.workload.pytorchjob_share:
        gaps.append("PyTorchJobs")
    if scenario.cluster.same_zone:
        gaps.append("zone topology (sameZone)")
    if scenario.cluster.topology:
        gaps.append("racks and blocks (cluster.topology)")
    return gaps


def sentence(fidelity: dict | None, scenario: Scenario | None = None) -> str:
    """The error bars to print under a report of `scenario`, or why there are none."""
    if scenario is not None and (gaps := unvalidated(scenario)):
        return (f"Not validated against a real cluster: {', '.join(gaps)}. The replays that give the simulator "
                "its error bars ran the Coscheduling backend without failures, elastic jobs, PyTorchJobs, zones or racks "
                "(benchmarks/README.md), so none are claimed here.")
    if not fidelity:
        return ("Not validated against a real control plane on this checkout (benchmarks/sim_fidelity.py "
                "measures it).")
    errors = ", ".join(f"{_LABELS.get(k, k)} ±{v:.0%}" for k, v in fidelity["max_relative_error"].items()
                       if v is not None)
    chance, real = (_means(fidelity.get(k)) for k in ("max_relative_chance_spread", "max_real_run_spread"))
    runs = sorted(set((fidelity.get("runs_per_slice") or {}).values()))
    pooled = "" if runs in ([], [1]) else \
        f", each against the mean of its {runs[0]}{f' to {runs[-1]}' if len(runs) > 1 else ''} real runs"
    interval = ", ".join(f"{_LABELS.get(k, k)} ±{v:.0%}" for k, v in
                         (fidelity.get("max_abs_error_interval95") or {}).items() if v is not None)
    return (f"Error bars against the real control plane: {errors} (the largest error over "
            f"{len(fidelity['slices'])} slices of {fidelity['jobs_per_slice']} jobs replayed by `gangctl sim-check`{pooled}, "
            f"measured {fidelity['measured']} at {fidelity['commit']}"
            + (f", model at {fidelity['model_commit']}" if fidelity.get("model_commit") else "")
            + "; benchmarks/README.md)."
            + (f" Counting the uncertainty of the real runs' mean (95 % bootstrap interval over the runs), up to "
               f"{interval}." if interval else "")
            + (f" One run of the same jobs also varies by chance, from the scheduler's random tie-breaks: {chance} "
               "(5-95 % of the model's draws)." if chance else "")
            + (f" Real runs of the same jobs differed by up to {real} (one standard deviation)." if real else ""))
