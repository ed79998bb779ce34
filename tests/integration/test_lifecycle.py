"""TrainJob lifecycle on the real cluster: completion, suspend/resume, restarts, deletion of children."""
from __future__ import annotations

import signal

import pytest

from gangctl.api.resources import JOBS, TRAINJOBS
from tests.integration.conftest import wait_ready
from tests.integration.helpers import (bound, eventually, get_trainjob, is_running, is_true, jobs_in, pod_group, pods_of,
                                       reconciles, settled, submit, trainjob)

pytestmark = [pytest.mark.integration, pytest.mark.asyncio(loop_scope="session")]


async def test_completed_job_releases_its_gang_and_is_never_recreated(kube, controller, namespace):
    await submit(kube, trainjob("short", namespace, nodes=3, run_for="2s"))

    async def complete() -> bool:
        return is_true(await get_trainjob(kube, namespace, "short"), "Complete")
    await eventually(complete, 60, "TrainJob Complete")

    async def group_gone() -> bool:
        return await pod_group(kube, namespace, "short") is None
    await eventually(group_gone, 15, "the PodGroup released after completion")
    status = (await get_trainjob(kube, namespace, "short"))["status"]
    assert status["jobsStatus"][0]["succeeded"] == 3

    # A TTL controller or a user deletes the finished children: nothing comes back.
    before = await reconciles(controller)
    await kube.delete(JOBS.path(namespace, "short-node-0"), propagation="Background")

    async def job_gone() -> bool:
        return not await jobs_in(kube, namespace)
    await eventually(job_gone, 15, "the child Job deleted")
    # The deletion requeues the TrainJob: wait until the controller has reconciled it and has nothing
    # left to do, then nothing may have been recreated.
    await settled(controller, before)
    assert not await jobs_in(kube, namespace), "a finished TrainJob's children are never recreated"
    again = await get_trainjob(kube, namespace, "short")
    assert is_true(again, "Complete")
    assert again["status"]["conditions"] == status["conditions"]


async def test_suspend_then_resume(kube, controller, namespace):
    await submit(kube, trainjob("paused", namespace, nodes=2, suspend=True))

    async def suspended() -> bool:
        return is_true(await get_trainjob(kube, namespace, "paused"), "Suspended")
    await eventually(suspended, 30, "TrainJob Suspended")
    jobs = await jobs_in(kube, namespace)
    assert [j["spec"]["suspend"] for j in jobs] == [True]
    assert await pods_of(kube, namespace, "paused") == []
    assert await pod_group(kube, namespace, "paused") is None, "a suspended job holds no gang"

    await kube.merge_patch(TRAINJOBS.path(namespace, "paused"), {"spec": {"suspend": False}})

    async def running() -> bool:
        tj = await get_trainjob(kube, namespace, "paused")
        return is_running(tj) and not is_true(tj, "Suspended")
    await eventually(running, 60, "TrainJob Running after resume")
    resumed = (await get_trainjob(kube, namespace, "paused"))["status"]
    assert "conditions" not in resumed, "no Suspended=False left behind: the SDK reads the job as Running"
    assert resumed["gang"]["resumedAt"], "the resume time (activeDeadlineSeconds' start) is kept"
    assert len(bound(await pods_of(kube, namespace, "paused"))) == 2
    assert await pod_group(kube, namespace, "paused") is not None


async def test_active_deadline_fails_the_job_and_releases_its_gang(kube, controller, namespace):
    tj = trainjob("bounded", namespace, nodes=2)  # its pods would run for an hour
    tj["spec"]["activeDeadlineSeconds"] = 8
    await submit(kube, tj)
    await eventually(lambda: _running(kube, namespace, "bounded"), 60, "TrainJob Running")

    async def failed() -> bool:
        return is_true(await get_trainjob(kube, namespace, "bounded"), "Failed")
    waited = await eventually(failed, 60, "TrainJob Failed past its deadline")
    done = await get_trainjob(kube, namespace, "bounded")
    cond = next(c for c in done["status"]["conditions"] if c["type"] == "Failed")
    assert cond["reason"] == "DeadlineExceeded" and "activeDeadlineSeconds (8s)" in cond["message"]
    print(f"[deadline] Failed {waited:.1f}s after Running (deadline 8 s from creation)")

    async def released() -> bool:
        live = [p for p in await pods_of(kube, namespace, "bounded")
                if p["status"].get("phase") not in ("Succeeded", "Failed")]
        return await pod_group(kube, namespace, "bounded") is None and not live
    await eventually(released, 60, "the gang released and its pods stopped")
    assert [j["spec"]["suspend"] for j in await jobs_in(kube, namespace)] == [True]


async def _running(kube, namespace: str, name: str) -> bool:
    return is_running(await get_trainjob(kube, namespace, name))


async def test_controller_restart_creates_no_duplicates(kube, controller, namespace):
    await submit(kube, trainjob("steady", namespace, nodes=4))

    async def running() -> bool:
        return is_running(await get_trainjob(kube, namespace, "steady"))
    await eventually(running, 60, "TrainJob Running")
    before_pods = sorted(p["metadata"]["uid"] for p in await pods_of(kube, namespace, "steady"))
    before_jobs = [j["metadata"]["uid"] for j in await jobs_in(kube, namespace)]
    before_status = (await get_trainjob(kube, namespace, "steady"))["status"]

    controller.stop(signal.SIGKILL)
    controller.start()
    await wait_ready(controller)
    # Ready means every TrainJob of the first list is queued: wait until the new process has reconciled
    # at least that many and its queue is empty (one of them is "steady").
    trainjobs = len((await kube.get(TRAINJOBS.path()))["items"])
    await settled(controller, 0, at_least=trainjobs)

    assert sorted(p["metadata"]["uid"] for p in await pods_of(kube, namespace, "steady")) == before_pods
    assert [j["metadata"]["uid"] for j in await jobs_in(kube, namespace)] == before_jobs
    after_status = (await get_trainjob(kube, namespace, "steady"))["status"]
    assert after_status["gang"] == before_status["gang"], "gang state and timing survive a restart"
    assert "conditions" not in before_status and "conditions" not in after_status, "running: none, as under Trainer"


def test_no_process_of_the_cluster_listens_beyond_loopback_or_on_gangctls_ports(cluster_settings, kubeconfig):
    from tests.integration.schedulers_common import exposed_listeners
    assert exposed_listeners(cluster_settings) == {}
