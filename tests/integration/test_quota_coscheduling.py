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

from gangctl.api.resources import JOBS, POD_GROUPS, PYTORCHJOBS, TRAINING_RUNTIMES, TRAINJOBS
from gangctl.config import REPO_ROOT
from gangctl.kube.client import ApiError, Kube
from gangctl.policy.status import phase
from gangctl.plugins.quota_objects import POLICY_CONFIGMAP, POLICY_NAMESPACE
from tests.integration.helpers import (KWOK_COMPLETE_DELAY, KWOK_COMPLETE_JITTER, bound, eventually, gang_state,
                                       gangctl_cli, get_trainjob, on_kwok_nodes, pods_of, reconciles,
                                       running, settled, submit, trainjob)
from tests.integration.quota_common import (GPU, TEAMS, UsageSampler, admission_of, apply_policy_cli,
                                            assert_preempted_event, assert_same_jobs_within_policy, empty_teams,
                                            get_pytorchjob, install_runtimes, pj_pods, preempt_low_with_high,
                                            pytorchjob, runtime, runtime_name, v1_condition)

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


# --- PyTorchJobs: the same gate, the same team quota ------------------------------------------------
async def pytorchjob_runs(kube: Kube, namespace: str, name: str) -> bool:
    return v1_condition(await get_pytorchjob(kube, namespace, name), "Running").get("status") == "True"


@pytest.fixture
async def team_a(gated, kube: Kube):
    """team-a's namespace, empty before the test and after it (pass or fail), so the GPU nodes its
    jobs held are free for the modules after this one."""
    async def empty() -> None:
        await kube.request("DELETE", PYTORCHJOBS.path(ns), body={"propagationPolicy": "Background"})
        await empty_teams(kube, ns)
    ns = TEAMS["team-a"]
    await empty()
    yield ns
    await empty()


async def test_pytorchjobs_and_trainjobs_share_the_teams_quota(team_a, kube, kubeconfig, cluster_settings):
    ns = team_a   # team-a may hold 24 GPUs
    rt = dict(runtime=runtime_name("batch"), runtime_kind="TrainingRuntime")
    await submit(kube, trainjob("tj-16", ns, nodes=2, **rt))
    await eventually(lambda: running(kube, ns, "tj-16"), 60, "a 16-GPU TrainJob of team-a running")
    await kube.create(PYTORCHJOBS.path(ns), pytorchjob("pj-8", ns))
    await eventually(lambda: pytorchjob_runs(kube, ns, "pj-8"), 60, "an 8-GPU PyTorchJob admitted and running")
    record = admission_of(await get_pytorchjob(kube, ns, "pj-8"))
    assert record and record["team"] == "team-a" and record["requests"][GPU] == "8", record

    await kube.create(PYTORCHJOBS.path(ns), pytorchjob("pj-waits", ns, workers=1))

    async def waits_for_quota() -> bool:
        held = v1_condition(await get_pytorchjob(kube, ns, "pj-waits"), "Suspended")
        return (held.get("status") == "True" and held.get("reason") == "WaitingForQuota"
                and "team team-a uses 24" in held.get("message", ""))
    await eventually(waits_for_quota, 60, "pj-waits Suspended with reason WaitingForQuota and the numbers")
    job = await get_pytorchjob(kube, ns, "pj-waits")
    assert admission_of(job) is None and "startTime" not in job["status"]
    assert bound(await pj_pods(kube, ns, "pj-waits")) == [], "a job beyond quota holds no node"
    with pytest.raises(ApiError) as gone:
        await kube.get(POD_GROUPS.path(ns, "pj-waits-pytorch"))
    assert gone.value.not_found, "a job waiting for quota has no PodGroup"
    said = gangctl_cli("explain", f"pytorchjob/{ns}/pj-waits", kubeconfig=kubeconfig,
                       cluster_name=cluster_settings.cluster_name)
    assert "WaitingForQuota" in said.stdout and "team team-a uses 24" in said.stdout, said.stdout + said.stderr

    await kube.delete(TRAINJOBS.path(ns, "tj-16"))   # the TrainJob's 16 GPUs go to the PyTorchJob
    await eventually(lambda: pytorchjob_runs(kube, ns, "pj-waits"), 90, "pj-waits running once tj-16 is gone")
    job = await get_pytorchjob(kube, ns, "pj-waits")
    assert admission_of(job)["requests"][GPU] == "16", "charged for its Master and its Worker"
    assert v1_condition(job, "Suspended")["status"] == "False"
    assert len(bound(await pj_pods(kube, ns, "pj-waits"))) == 2
    for name in ("pj-8", "pj-waits"):
        await kube.delete(PYTORCHJOBS.path(ns, name))


async def test_a_higher_priority_pytorchjob_preempts_and_an_elastic_one_runs_what_it_was_admitted_with(
        team_a, kube, controller):
    ns = team_a
    await kube.create(PYTORCHJOBS.path(ns), pytorchjob("low", ns, workers=2))            # 24 GPUs: all of it
    await eventually(lambda: pytorchjob_runs(kube, ns, "low"), 60, "the low-priority PyTorchJob on 24 GPUs")
    await kube.create(PYTORCHJOBS.path(ns), pytorchjob("high", ns, priority="urgent"))
    await eventually(lambda: pytorchjob_runs(kube, ns, "high"), 90, "the urgent PyTorchJob running after preempting")

    async def low_waits_again() -> bool:
        job = await get_pytorchjob(kube, ns, "low")
        held = v1_condition(job, "Suspended")
        return held.get("reason") == "WaitingForQuota" and v1_condition(job, "Running").get("status") == "False"
    await eventually(low_waits_again, 60, "the preempted PyTorchJob Suspended, waiting for quota again")
    low = await get_pytorchjob(kube, ns, "low")
    assert "requests 24 GPUs, team team-a uses 8" in v1_condition(low, "Suspended")["message"]
    assert v1_condition(low, "Failed") == {} and admission_of(low) is None
    await eventually(lambda: _bound_count(kube, ns, "low", 0), 60, "the preempted PyTorchJob holding no node")
    events = (await kube.get(f"/api/v1/namespaces/{ns}/events",
                             fieldSelector="involvedObject.name=low,involvedObject.kind=PyTorchJob,reason=Preempted"))
    assert events["items"] and "high" in events["items"][0]["message"], events["items"]
    await kube.delete(PYTORCHJOBS.path(ns, "low"))

    # 16 GPUs left: an elastic 1..4-worker job is admitted with 2 workers and runs 2, not 4
    await kube.create(PYTORCHJOBS.path(ns), pytorchjob("el", ns, masters=0, workers=4, elastic={
        "minReplicas": 1, "maxReplicas": 4, "rdzvBackend": "c10d", "rdzvHost": "etcd", "rdzvPort": 2379}))
    await eventually(lambda: pytorchjob_runs(kube, ns, "el"), 60, "the elastic PyTorchJob admitted and running")
    record = admission_of(await get_pytorchjob(kube, ns, "el"))
    assert record["nodes"] == 2 and record["requests"][GPU] == "16", record
    before = await reconciles(controller)
    await eventually(lambda: _bound_count(kube, ns, "el", 2), 60, "2 workers of el bound")
    await settled(controller, before)
    assert len(await pj_pods(kube, ns, "el")) == 2, "never past what was admitted"
    assert len(bound(await pj_pods(kube, ns, "el"))) == 2
    await kube.delete(PYTORCHJOBS.path(ns, "high"))   # 8 more GPUs: the gate grants el a third worker

    async def grown() -> bool:
        job = await get_pytorchjob(kube, ns, "el")
        return (admission_of(job) or {}).get("nodes") == 3 and len(await pj_pods(kube, ns, "el")) == 3
    await eventually(grown, 60, "el admitted with a third worker and running it")
    await kube.delete(PYTORCHJOBS.path(ns, "el"))


async def _bound_count(kube: Kube, namespace: str, name: str, want: int) -> bool:
    return len(bound(await pj_pods(kube, namespace, name))) == want


async def test_80_concurrent_trainjobs_never_exceed_a_64_gpu_quota(gated, kube, kubeconfig, cluster_settings):
    # Last in the module: the one-team policy replaces the two-team one (one policy per cluster, as
    # with Kueue's objects).
    apply_policy_cli(kubeconfig, "coscheduling", cluster_settings.cluster_name, SOLO_POLICY)
    # 80 jobs asking for 27 times the quota in GPU-seconds (CI-sized; the gate's cost per job is what
    # benchmarks/scale.py measures at 5,000 nodes).
    rng = random.Random(200)
    jobs = []
    for i in range(80):
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
            return len(phases) == len(jobs) and all(p in ("Complete", "Failed") for p in phases.values())
        await eventually(all_done, 900, f"all {len(jobs)} TrainJobs finished", interval=2.0)
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
