"""gangctl's own quota admission on the coscheduling cluster, through the real controller.

Coscheduling has no quota system, so `gangctl policy apply --backend coscheduling` stores the policy
for gangctl, which holds each TrainJob of a team's namespace (no PodGroup, Job suspended) until the
policy's admission (the simulator's code) admits it. These are the same checks the Kueue and
Volcano modules make against their schedulers, with the same policy and the same jobs.
"""
from __future__ import annotations

import asyncio
import random

import pytest

from gangctl.api.resources import JOBS, TRAINING_RUNTIMES, TRAINJOBS
from gangctl.config import REPO_ROOT
from gangctl.kube.client import Kube
from gangctl.policy.status import phase
from gangctl.policy.quota_coscheduling import POLICY_CONFIGMAP, POLICY_NAMESPACE
from tests.integration.helpers import (bound, eventually, gang_state, get_trainjob, pods_of, reconciles, running,
                                       settled, submit, trainjob)
from tests.integration.quota_common import (TEAMS, UsageSampler, apply_policy_cli, assert_preempted_event,
                                            assert_same_jobs_within_policy, install_runtimes, preempt_low_with_high,
                                            runtime, runtime_name)

pytestmark = pytest.mark.integration
SOLO_POLICY = REPO_ROOT / "tests/integration/data/one-team-64.yaml"


@pytest.fixture(scope="module")
async def gated(kubeconfig, cluster_settings, controller, kube: Kube):
    apply_policy_cli(kubeconfig, "coscheduling", cluster_settings.cluster_name)
    await install_runtimes(kube, "coscheduling")
    yield
    # Turn the gate off again: the rest of the session's tests run ungated.
    await kube.delete(f"/api/v1/namespaces/{POLICY_NAMESPACE}/configmaps/{POLICY_CONFIGMAP}")


async def test_trainjobs_wait_for_quota_with_the_reason_and_start_when_it_frees(gated, kube):
    ns = TEAMS["team-a"]  # 16 GPUs nominal + 8 borrowed from team-b = 24
    rt = dict(runtime=runtime_name("batch"), runtime_kind="TrainingRuntime")
    await submit(kube, trainjob("a-big", ns, nodes=2, **rt))
    await submit(kube, trainjob("a-small", ns, nodes=1, **rt))
    for name, nodes in (("a-big", 2), ("a-small", 1)):
        await eventually(lambda: running(kube, ns, name), 60, f"{name} admitted by gangctl and running")
        assert len(bound(await pods_of(kube, ns, name))) == nodes
    tj = await get_trainjob(kube, ns, "a-big")
    assert tj["status"]["admission"]["team"] == "team-a"

    await submit(kube, trainjob("a-waits", ns, nodes=1, **rt))

    async def waits_for_quota() -> bool:
        state = gang_state(await get_trainjob(kube, ns, "a-waits"))
        return state.get("reason") == "WaitingForQuota" and "team team-a uses 24" in state.get("message", "")
    await eventually(waits_for_quota, 60, "a-waits waiting for quota, with the numbers")
    tj = await get_trainjob(kube, ns, "a-waits")
    assert "admission" not in tj["status"]
    assert bound(await pods_of(kube, ns, "a-waits")) == [], "a job beyond quota holds no node"
    try:
        await kube.get(f"/apis/scheduling.x-k8s.io/v1alpha1/namespaces/{ns}/podgroups/a-waits")
        raise AssertionError("a job waiting for quota has no PodGroup")
    except Exception as err:  # noqa: BLE001
        assert getattr(err, "not_found", False), err

    await kube.delete(TRAINJOBS.path(ns, "a-big"))
    await eventually(lambda: running(kube, ns, "a-waits"), 90, "a-waits running once a-big's quota is free")
    for name in ("a-small", "a-waits"):
        await kube.delete(TRAINJOBS.path(ns, name))


async def test_an_elastic_job_runs_at_most_the_nodes_it_was_admitted_with(gated, kube, controller):
    ns = TEAMS["team-a"]  # may hold 24 GPUs
    rt = runtime("coscheduling", ns, "batch")
    rt["metadata"]["name"] = "gang-elastic"
    rt["spec"]["mlPolicy"]["torch"]["elasticPolicy"] = {"minNodes": 1, "maxNodes": 4}
    await kube.apply(TRAINING_RUNTIMES.path(ns, "gang-elastic"), rt, "gangctl-tests")
    await submit(kube, trainjob("fill", ns, nodes=1, runtime=runtime_name("batch"), runtime_kind="TrainingRuntime"))
    await eventually(lambda: running(kube, ns, "fill"), 60, "an 8-GPU job of team-a running")
    await submit(kube, trainjob("el", ns, nodes=4, runtime="gang-elastic", runtime_kind="TrainingRuntime"))
    await eventually(lambda: running(kube, ns, "el"), 60, "the elastic job admitted and running")
    admission = (await get_trainjob(kube, ns, "el"))["status"]["admission"]
    assert admission["nodes"] == 2 and admission["requests"]["nvidia.com/gpu"] == "16", \
        "24 - 8 = 16 GPUs of room: its floor of 1 node and 1 more, charged for both"
    # The cluster has hundreds of GPUs free: unbounded, the job would probe its way up to 4 nodes.
    # gangctl probes (grows by one) in the pass that finds every worker healthy, and writes that
    # pass's status: wait for a status with both workers healthy at size 2 (the pass that would have
    # grown), then for the controller to have nothing left to do; sampled all along.
    peak: dict[str, int] = {"size": 0, "bound": 0}

    async def sample() -> dict:
        job = await kube.get(JOBS.path(ns, "el-node-0"))
        peak["size"] = max(peak["size"], job["spec"]["parallelism"])
        peak["bound"] = max(peak["bound"], len(bound(await pods_of(kube, ns, "el"))))
        assert peak["size"] <= 2 and peak["bound"] <= 2, f"an elastic job grew past what the quota admitted: {peak}"
        return (await get_trainjob(kube, ns, "el"))["status"].get("elastic") or {}

    async def decided_at_full_health() -> bool:
        el = await sample()
        return el.get("currentNodes") == 2 and el.get("size") == 2
    before = await reconciles(controller)
    await eventually(decided_at_full_health, 60, "a status of el written with both workers healthy at size 2")
    await settled(controller, before)
    await sample()
    assert (peak["size"], peak["bound"]) == (2, 2), "an elastic job never grows past what the quota admitted"
    assert (await get_trainjob(kube, ns, "el"))["status"]["elastic"]["currentNodes"] == 2

    await kube.delete(TRAINJOBS.path(ns, "fill"))   # 8 GPUs of team-a's 24 free: one more node of el's

    async def grown() -> bool:
        tj = await get_trainjob(kube, ns, "el")
        el = tj["status"].get("elastic") or {}
        assert (await kube.get(JOBS.path(ns, "el-node-0")))["spec"]["parallelism"] <= 3, "and not past it"
        # All 3 workers healthy at size 3: the pass that would probe for a 4th if the quota allowed it.
        return (tj["status"]["admission"].get("nodes") == 3
                and el.get("currentNodes") == 3 and el.get("size") == 3)
    before = await reconciles(controller)
    await eventually(grown, 60, "the elastic job admitted with a third node and running on it")
    assert (await get_trainjob(kube, ns, "el"))["status"]["admission"]["requests"]["nvidia.com/gpu"] == "24"
    await settled(controller, before)
    assert (await kube.get(JOBS.path(ns, "el-node-0")))["spec"]["parallelism"] == 3, "and not past it"
    assert len(bound(await pods_of(kube, ns, "el"))) == 3
    await kube.delete(TRAINJOBS.path(ns, "el"))
    await kube.delete(TRAINING_RUNTIMES.path(ns, "gang-elastic"))


async def test_a_higher_priority_trainjob_preempts_within_the_team(gated, kube):
    await preempt_low_with_high(kube, ("WaitingForQuota",))
    await assert_preempted_event(kube)


async def test_the_same_jobs_never_exceed_the_policy(gated, kube):
    await assert_same_jobs_within_policy(kube)


async def test_200_concurrent_trainjobs_never_exceed_a_64_gpu_quota(gated, kube, kubeconfig, cluster_settings):
    # The one-team policy replaces the two-team one (one policy per cluster, as with Kueue's objects).
    apply_policy_cli(kubeconfig, "coscheduling", cluster_settings.cluster_name, SOLO_POLICY)
    rng = random.Random(200)
    jobs = []
    for i in range(200):
        nodes = rng.choice((1, 1, 2, 4))
        gpus = rng.choice((1, 2, 4, 8))
        jobs.append((f"j{i:03d}", nodes, gpus, f"{rng.randint(2, 4)}s"))
    assert max(n * g for _, n, g, _ in jobs) == 32 and min(n * g for _, n, g, _ in jobs) == 1
    sampler = UsageSampler(kube, limits={"solo": 64}, namespaces={"solo": "solo"}, interval=0.1)
    stop = asyncio.Event()
    task = asyncio.create_task(sampler.run(stop))
    phases: dict[str, str] = {}
    try:
        for name, nodes, gpus, run_for in jobs:
            await submit(kube, trainjob(name, "solo", nodes=nodes, gpus=gpus, run_for=run_for))

        async def all_done() -> bool:
            listing = (await kube.get(TRAINJOBS.path("solo")))["items"]
            phases.update({tj["metadata"]["name"]: phase(tj.get("status")) for tj in listing})
            return len(phases) == 200 and all(p in ("Complete", "Failed") for p in phases.values())
        await eventually(all_done, 900, "all 200 TrainJobs finished", interval=2.0)
    finally:
        stop.set()
        await task
        await kube.request("DELETE", TRAINJOBS.path("solo"), body={"propagationPolicy": "Background"})
    assert sampler.samples > 100
    assert sampler.over == [], f"more than 64 GPUs admitted or held: {sampler.over[:5]}"
    assert all(p == "Complete" for p in phases.values()), {n: p for n, p in phases.items() if p != "Complete"}
    print(f"[quota] {sampler.samples} samples; peak admitted {sampler.peak_admitted['solo']:g} GPUs, "
          f"peak held {sampler.peak['solo']:g} GPUs of 64")
    assert sampler.peak_admitted["solo"] >= 48, "the quota was used, not just respected"
