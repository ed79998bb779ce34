"""The simulator against the real control plane, CI-sized (issue 17): `gangctl sim-check` replays
simulations/replay-check-ci-quota.yaml (24 whole-node gangs of two teams held to 16 GPUs each by
the quota gate) through the real controller and scheduler on the session cluster, and its model
must agree with what happened within the check's own tolerance: means within 5 %, p95s within 10 %.
The full 300-job slices are benchmarks (benchmarks/sim_fidelity.py)."""
from __future__ import annotations

import json

import pytest

from gangctl.config import REPO_ROOT
from gangctl.validate.measure import compare
from tests.integration.helpers import gangctl_cli

pytestmark = pytest.mark.integration

SCENARIO = REPO_ROOT / "simulations/replay-check-ci-quota.yaml"
P95_TOLERANCE = 0.10


def test_sim_check_agrees_with_the_real_cluster_on_a_quota_bound_slice(kubeconfig, controller):
    run = gangctl_cli("sim-check", str(SCENARIO), "--quota", "--jobs", "24", "--compression", "120", "--timeout", "300", "-o", "json",
                      kubeconfig=kubeconfig, timeout=420)
    assert run.returncode in (0, 2), f"sim-check could not run: {run.stderr[-2000:]}"
    result = json.loads(run.stdout)
    assert result["real"]["jobs"]["done"] == 24, result["real"]["jobs"]
    rows = {r.metric: (r.real, r.sim, r.relative_difference) for r in compare(result["real"], result["model"])}
    print("sim-check (real, model, error):", {m: (a, b, f"{d:+.1%}") for m, (a, b, d) in rows.items()})
    assert result["passed"] and run.returncode == 0, f"the model's means are off by more than 5 %: {rows}"
    off = {m: r for m, r in rows.items() if m.startswith("p95") and abs(r[2]) > P95_TOLERANCE}
    assert not off, f"the model's p95s are off by more than 10 % (real, model, error): {off}"
