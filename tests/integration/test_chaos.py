"""Elastic TrainJobs under chaos on the session cluster (64 KWOK GPU nodes x 8 GPUs).

30 elastic TrainJobs (min 1-2, max 2-4 nodes, workers finish 15-30 s after they run) are submitted
at once; meanwhile random GPU nodes go NotReady for 10-20 s (KWOK's node-not-ready stage), and 4 of
the jobs have workers that exit non-zero (KWOK's pod-container-running-failed stage) against a
restart budget of 1. Checked as a user would: never two live pods for one (job, index) during the
whole run; every job ends Complete or Failed with a reason; no PodGroup and no running pod left for
a finished job; the restart budget is charged only for exit codes, never for node loss. The plans
are deterministic for SEED (gangctl.harness.chaos); the larger run is benchmarks/elastic_chaos.py.
"""
from __future__ import annotations

import asyncio
import uuid

import pytest

from gangctl.api.resources import CLUSTER_TRAINING_RUNTIMES, PODS
from gangctl.harness import chaos
from gangctl.harness.audit import PodAuditor, finished, settled_audit
from gangctl.kube.client import ApiError
from tests.integration.helpers import eventually, scrape, submit

USER_RESTARTS = "gangctl_trainjob_restarts_total{cause=user}"

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
    user_restarts_before = (await scrape(controller.url))[USER_RESTARTS]
    auditor = PodAuditor()
    watch = asyncio.create_task(auditor.run(kube, namespace))
    driver = chaos.NodeChaos(kube)
    try:
        await auditor_listening(kube, namespace, auditor)
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

    # The series is pre-registered (always exported): its increase must be the restarts charged.
    charged = sum(audit.by_job[job.name]["restarts"]["user"] for job in jobs)
    assert charged == FAILING * MAX_RESTARTS
    assert (await scrape(controller.url))[USER_RESTARTS] - user_restarts_before == charged, \
        "gangctl_trainjob_restarts_total{cause=user} counts each restart charged to the user once"

    # A TrainJob gangctl failed (a worker's exit code, budget spent) must stop its child Job: an elastic
    # Job never fails on its own, and would go on recreating the failed workers.
    assert not audit.active_jobs, f"child Jobs of finished TrainJobs still active: {audit.active_jobs}"
    assert not audit.running_pods, f"pods still running for finished jobs: {audit.running_pods[:10]}"


async def auditor_listening(kube, namespace: str, auditor: PodAuditor) -> None:
    """Wait until the auditor's informer has listed (it then watches from that list, missing nothing):
    it hears about a probe pod no scheduler will take, which is then removed."""
    probe = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "auditor-probe"},
             "spec": {"schedulerName": "no-such-scheduler", "automountServiceAccountToken": False,
                      "containers": [{"name": "c", "image": "none"}]}}

    async def created() -> bool:  # the namespace's default ServiceAccount may not exist yet
        try:
            await kube.create(PODS.path(namespace), probe)
            return True
        except ApiError as err:
            if err.status == 403 and "serviceaccount" in err.message.lower():
                return False
            raise
    await eventually(created, 30, "the auditor's probe pod created")

    async def heard() -> bool:
        return auditor.events > 0
    await eventually(heard, 30, "the pod auditor to hear about its probe pod")
    await kube.request("DELETE", PODS.path(namespace, "auditor-probe"), body={"gracePeriodSeconds": 0})

    async def probe_gone() -> bool:
        try:
            await kube.get(PODS.path(namespace, "auditor-probe"))
            return False
        except ApiError as err:
            return err.not_found
    await eventually(probe_gone, 30, "the probe pod removed")
