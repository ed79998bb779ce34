"""Elastic TrainJobs under chaos on the session cluster (64 KWOK GPU nodes x 8 GPUs).

30 elastic TrainJobs (min 1-2, max 2-4 nodes, workers finish 15-30 s after they run) are submitted
at once; meanwhile random GPU nodes go NotReady for 10-20 s (KWOK's node-not-ready stage), and 4 of
the jobs have workers that exit non-zero (KWOK's pod-container-running-failed stage) against a
restart budget of 1. Checked as a user would: never two live pods for one (job, index) during the
whole run; every job ends Complete or Failed with a reason; no PodGroup and no running pod left for
a finished job; the restart budget is charged only for exit codes, never for node loss. The plans
are deterministic for SEED (gangctl.cluster.chaos); the larger run is benchmarks/elastic_chaos.py.
"""
from __future__ import annotations

import asyncio
import uuid

import aiohttp
import pytest

from gangctl.api.resources import CLUSTER_TRAINING_RUNTIMES
from gangctl.cluster import chaos
from gangctl.cluster.audit import PodAuditor, finished, settled_audit
from tests.integration.helpers import eventually, submit

pytestmark = [pytest.mark.integration, pytest.mark.asyncio(loop_scope="session")]

SEED = 20261124
JOBS, FAILING, MAX_RESTARTS = 30, 4, 1
OUTAGES = 8


async def test_elastic_jobs_under_node_loss_and_exit_codes(kube, controller, namespace):
    runtime = f"chaos-{uuid.uuid4().hex[:6]}"
    await kube.create(CLUSTER_TRAINING_RUNTIMES.path(), chaos.elastic_runtime(runtime, max_restarts=MAX_RESTARTS))
    jobs = chaos.plan_jobs(SEED, JOBS, min_nodes=(1, 2), max_nodes=(2, 4), run_for=(15, 30), failing=FAILING)
    nodes = await chaos.gpu_nodes(kube)
    outages = chaos.plan_outages(nodes, SEED, OUTAGES, window=45, down_for=(10, 20), max_down=3)
    auditor = PodAuditor()
    watch = asyncio.create_task(auditor.run(kube, namespace))
    driver = chaos.NodeChaos(kube)
    try:
        await asyncio.sleep(0.5)  # the auditor's first list
        for job in jobs:
            await submit(kube, chaos.trainjob(job, namespace, runtime))
        await driver.run(outages)  # ~60 s; every node is restored when it returns

        async def all_finished() -> bool:
            done, total = await finished(kube, namespace)
            return done == total == JOBS
        await eventually(all_finished, 150, f"all {JOBS} TrainJobs Complete or Failed", interval=1)
    finally:
        await driver.restore_all()
        watch.cancel()
        await kube.delete(CLUSTER_TRAINING_RUNTIMES.path(name=runtime))
    audit = await settled_audit(kube, namespace, grace=30)
    summary = (f"outcomes {audit.outcomes}, restarts {audit.restarts}, resizes {audit.resizes}, "
               f"disrupted pods {len(auditor.disrupted)}, exit-code failures {len(auditor.failed_exit)}, "
               f"chaos {driver.actions}")
    print(summary)

    assert auditor.events > 0 and auditor.max_live_pods > 0, "the auditor saw the run"
    assert not auditor.violations, f"two live pods for one (job, index): {auditor.violations[:5]}"
    assert len(driver.actions) == 2 * OUTAGES, "every planned outage was carried out and restored"
    assert auditor.disrupted, f"the outages hit no worker: {summary}"
    assert not audit.unfinished, f"not Complete/Failed with a reason: {audit.unfinished}"
    assert not audit.leaked_pod_groups, f"PodGroups left for finished jobs: {audit.leaked_pod_groups}"
    assert not audit.terminating_pods, f"pods stuck Terminating (every node is back): {audit.terminating_pods[:10]}"

    for job in jobs:
        got = audit.by_job[job.name]
        if job.exit_code is None:
            # Node loss (however many times) never costs the user a restart, nor the job its success.
            assert got["outcome"] == "Complete", f"{job.name}: {got}"
            assert got["restarts"]["user"] == 0, f"{job.name} charged for node loss: {got}"
        else:
            assert (got["outcome"], got["reason"]) == ("Failed", "MaxRestartsExceeded"), f"{job.name}: {got}"
            assert got["restarts"]["user"] == MAX_RESTARTS, f"{job.name}: {got}"

    async with aiohttp.ClientSession() as s, s.get(controller.url + "/metrics") as r:
        text = await r.text()
    assert 'gangctl_trainjob_restarts_total{cause="user"}' in text

    # A TrainJob gangctl failed (a worker's exit code, budget spent) must stop its child Job: an elastic
    # Job never fails on its own, and would go on recreating the failed workers.
    assert not audit.active_jobs, f"child Jobs of finished TrainJobs still active: {audit.active_jobs}"
    assert not audit.running_pods, f"pods still running for finished jobs: {audit.running_pods[:10]}"


async def test_lost_pod_reaper_lets_a_lost_index_be_replaced_while_its_node_is_down(kube, controller, namespace):
    """With a podFailurePolicy the Job controller replaces a pod only once it is terminal; a pod evicted
    from a NotReady KWOK node never gets there (nothing finishes it), so the index waits for the node.
    The reaper (gangctl.runtime.lost_pods, run here in the test process) marks it Failed and deletes it,
    and the index is replaced on another node while the lost node is still down."""
    from gangctl.api.resources import NODES, PODS
    from gangctl.runtime.lost_pods import LostPodReaper

    runtime = f"lost-{uuid.uuid4().hex[:6]}"
    rt = chaos.elastic_runtime(runtime, max_restarts=1)
    rt["spec"]["template"]["spec"]["replicatedJobs"][0]["template"]["spec"]["podFailurePolicy"] = {
        "rules": [{"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget"}]}]}
    await kube.create(CLUSTER_TRAINING_RUNTIMES.path(), rt)
    job = chaos.ChaosJob("lost", min_nodes=2, max_nodes=2, run_for=3600)
    driver = chaos.NodeChaos(kube)
    try:
        await submit(kube, chaos.trainjob(job, namespace, runtime))

        async def workers() -> list[dict]:
            return [p for p in (await kube.get(PODS.path(namespace), labelSelector="jobset.sigs.k8s.io/replicatedjob-name=node"))["items"]]

        def index(p: dict) -> int:
            return int(p["metadata"]["annotations"]["batch.kubernetes.io/job-completion-index"])

        async def running() -> bool:
            return len([p for p in await workers() if p["status"].get("phase") == "Running"
                        and not p["metadata"].get("deletionTimestamp")]) == 2
        await eventually(running, 60, "2 workers running")
        victim = next(p for p in await workers() if index(p) == 1)
        await driver.fail(victim["spec"]["nodeName"])

        async def evicted() -> bool:
            return any(p["metadata"]["uid"] == victim["metadata"]["uid"] and p["metadata"].get("deletionTimestamp")
                       for p in await workers())
        await eventually(evicted, 60, "the lost node's pod evicted")
        await asyncio.sleep(8)
        index1 = [p for p in await workers() if index(p) == 1]
        assert [p["metadata"]["uid"] for p in index1] == [victim["metadata"]["uid"]], \
            "without the reaper the evicted pod stays Terminating and index 1 is not replaced"
        assert index1[0]["status"]["phase"] == "Running"

        reaper = LostPodReaper(kube, lambda: pods, lambda: nodes, after_seconds=3)

        async def reaped() -> bool:
            nonlocal pods, nodes
            pods = (await kube.get(PODS.path(namespace)))["items"]
            nodes = (await kube.get(NODES.path()))["items"]
            return bool(await reaper.sweep())
        pods, nodes = [], []
        await eventually(reaped, 30, "the reaper to force-finish the lost pod", interval=1)
        assert [p.name for p in reaper.reaped] == [victim["metadata"]["name"]]

        async def replaced() -> bool:
            ps = [p for p in await workers() if index(p) == 1]
            return (len(ps) == 1 and ps[0]["metadata"]["uid"] != victim["metadata"]["uid"]
                    and ps[0]["status"].get("phase") == "Running" and ps[0]["spec"]["nodeName"] != victim["spec"]["nodeName"])
        await eventually(replaced, 60, "index 1 replaced on another node")
        assert victim["spec"]["nodeName"] in await chaos.not_ready_nodes(kube), "the lost node is still down"
        tj = (await kube.get(f"/apis/trainer.kubeflow.org/v1alpha1/namespaces/{namespace}/trainjobs/lost"))
        assert ((tj.get("status") or {}).get("restarts") or {}).get("user", 0) == 0, "a reaped pod is not the user's failure"
    finally:
        await driver.restore_all()
        await kube.delete(CLUSTER_TRAINING_RUNTIMES.path(name=runtime))
