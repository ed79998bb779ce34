"""The CI-sized fidelity check (issue 17): `gangctl sim-check` as a user runs it, on a cluster of its
own (4 KWOK nodes x 8 GPUs) with `gangctl controller`, replaying simulations/replay-check-ci.yaml:
24 whole-node gangs that queue behind each other for about a minute. Every pod takes a whole node,
so the replay is not one draw of the scheduler's random tie-breaks (the model's draws all agree):
the simulator must reproduce the real controller and scheduler's queueing, gang by gang, within
sim-check's tolerance. The three 300-job slices are the benchmark's (benchmarks/sim_fidelity.py)."""
from __future__ import annotations

import json

import pytest

from gangctl.cluster.lifecycle import UpOptions, down, up
from gangctl.config import REPO_ROOT, ClusterSettings
from gangctl.processes import ControllerProcess
from tests.integration.helpers import gangctl_cli

pytestmark = pytest.mark.integration
CLUSTER = "gangctl-it-simcheck"


@pytest.fixture(scope="module")
def replay_cluster(tmp_path_factory):
    settings = ClusterSettings(cluster_name=CLUSTER)
    down(settings, lambda m: None)  # left by an interrupted run
    cluster = up(settings, UpOptions(gpu_nodes=4, gpus_per_node=8), lambda m: print(f"[{CLUSTER}] {m}"))
    ctl = ControllerProcess(cluster.kubeconfig, tmp_path_factory.mktemp("simcheck") / "controller.log")
    ctl.start()
    try:
        ctl.wait_ready()
        yield cluster.kubeconfig
    finally:
        ctl.stop()
        print(f"[controller] log: {ctl.log_path}")
        down(settings, lambda m: print(f"[{CLUSTER}] {m}"))


def test_the_model_matches_the_real_stack_on_whole_node_gangs(replay_cluster, tmp_path):
    dump = tmp_path / "per-job.jsonl"
    run = gangctl_cli("sim-check", str(REPO_ROOT / "simulations" / "replay-check-ci.yaml"), "--jobs", "24",
                      "-o", "json", "--dump", str(dump), kubeconfig=replay_cluster, timeout=400)
    assert run.returncode in (0, 2), run.stderr
    result = json.loads(run.stdout)
    assert result["real"]["jobs"] == {"done": 24, "failed": 0, "unfinished": 0, "total": 24}
    rows = [json.loads(line) for line in dump.read_text().splitlines()]
    assert len(rows) == 24 and {(r["pods"], r["gpus_per_pod"]) for r in rows} == {(1, 8), (2, 8), (3, 8)}
    # Jobs really queued (not a slice where any model agrees): the gangs waited seconds on average.
    assert result["real"]["queue_delay_seconds"]["mean"] > 5, result["real"]
    band = result["model_band"]["queue_delay_seconds"]["mean"]
    assert band[0] == band[1], "whole-node gangs: every draw of the ties gives the same replay"
    worst = {m: (result["model"][k]["mean"] - result["real"][k]["mean"]) / result["real"][k]["mean"]
             for m, k in (("JCT", "jct_seconds"), ("queueing delay", "queue_delay_seconds"))}
    assert result["passed"], f"model vs real, relative: {worst}; per job in {dump}"
