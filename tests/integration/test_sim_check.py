"""`gangctl sim-check`'s cluster side on the real control plane: TrainJobs submitted on schedule,
run by the real controller and scheduler on KWOK nodes, each finishing after its compressed duration."""
from __future__ import annotations

import time

import pytest

from gangctl.sim.replay import trainjob_submissions
from gangctl.sim.traces import TraceJob
from gangctl.validate import runner
from gangctl.validate.measure import outcome_of

pytestmark = [pytest.mark.integration, pytest.mark.asyncio(loop_scope="session")]

COMPRESSION = 60.0
RUN_SECONDS = 120.0   # 2 s on the cluster
GAP_SECONDS = 30.0    # 0.5 s between submissions on the cluster


def slice_of(count: int, run_id: str, namespace: str):
    jobs = [TraceJob(f"j{i}", i * GAP_SECONDS, RUN_SECONDS, 1, 8, cpu_per_node=8.0, memory_per_node=64.0, group="t")
            for i in range(count)]
    return trainjob_submissions(jobs, runtime="torch-kwok-gpu", namespace_of_team={"t": namespace},
                                compression=COMPRESSION, run_id=run_id)


async def test_replay_submits_on_schedule_and_every_job_finishes_after_its_run_time(kube, controller, namespace):
    run_id = f"it-{int(time.time())}"
    subs = slice_of(5, run_id, namespace)
    started = time.time()
    record = await runner.replay(kube, subs, run_id, timeout=90)

    keys = [f"{namespace}/{s.trainjob['metadata']['name']}" for s in subs]
    assert sorted(record.submitted) == sorted(keys)
    assert sorted(record.finished) == sorted(keys)
    for sub, key in zip(subs, keys):
        late = record.submitted[key] - started - sub.at_seconds
        assert -0.05 < late < 1.0, f"{key} submitted {late:.2f}s after its offset"
        outcome = outcome_of(sub.job_id, record.objects[key], record.submitted[key], record.finished[key])
        assert outcome.state == "done"
        assert outcome.bound is not None and outcome.bound >= outcome.submitted - 1.0
        run = outcome.finished - outcome.bound
        assert RUN_SECONDS / COMPRESSION - 0.5 < run < RUN_SECONDS / COMPRESSION + 10, f"{key} ran {run:.1f}s"
    await runner.delete_run(kube, record)


async def test_replay_says_when_no_controller_serves_the_trainjobs(kube, controller, namespace):
    run_id = f"it-unserved-{int(time.time())}"
    subs = slice_of(1, run_id, namespace)
    subs[0].trainjob["spec"]["managedBy"] = "example.com/another-controller"  # gangctl leaves these alone
    with pytest.raises(runner.ReplayError, match="is `gangctl controller` running"):
        await runner.replay(kube, subs, run_id, timeout=30, picked_up_within=3)
