"""Hang detection on the real cluster (issue 38 item 2): a runtime with a stall timeout restarts a
running TrainJob whose progress reports stop, charged as infrastructure, and fails it with reason
Stalled once failurePolicy.maxRestarts stall restarts are used; a job that never reported is left
alone. KWOK plays the pods; the test writes status.trainerStatus itself, as the progress endpoint
does for a reporting pod."""
from __future__ import annotations

import copy
from datetime import datetime, timezone

import pytest
import yaml

from gangctl.api.resources import TRAINING_RUNTIMES, TRAINJOBS
from gangctl.config import REPO_ROOT
from gangctl.model.progress import STALL_TIMEOUT_ANNOTATION
from tests.integration.helpers import eventually, get_trainjob, is_running, is_true, submit, trainjob

pytestmark = [pytest.mark.integration, pytest.mark.asyncio(loop_scope="session")]

RUNTIME = yaml.safe_load((REPO_ROOT / "deploy/runtimes/torch-kwok-gpu.yaml").read_text())
TIMEOUT = 6


def stalling_runtime(namespace: str) -> dict:
    rt = copy.deepcopy(RUNTIME)
    rt["kind"] = "TrainingRuntime"
    rt["metadata"] = {"name": "stalls", "namespace": namespace,
                      "annotations": {STALL_TIMEOUT_ANNOTATION: f"{TIMEOUT}s"}}
    rt["spec"]["template"]["spec"]["failurePolicy"] = {"maxRestarts": 1}
    return rt


async def report(kube, namespace: str, name: str) -> None:
    now = datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    await kube.merge_patch(TRAINJOBS.path(namespace, name, "status"),
                           {"status": {"trainerStatus": {"progressPercentage": 10, "lastUpdatedTime": now}}})


async def test_a_job_whose_reports_stop_is_restarted_then_failed_and_a_silent_one_is_left_alone(kube, namespace,
                                                                                              controller):
    await kube.create(TRAINING_RUNTIMES.path(namespace), stalling_runtime(namespace))
    for name in ("hangs", "silent"):
        await submit(kube, trainjob(name, namespace, nodes=2, runtime="stalls", runtime_kind="TrainingRuntime"))

    async def both_running() -> bool:
        return all([is_running(await get_trainjob(kube, namespace, n)) for n in ("hangs", "silent")])
    await eventually(both_running, 90, "both jobs running")
    await report(kube, namespace, "hangs")

    async def restarted() -> bool:
        return ((await get_trainjob(kube, namespace, "hangs")).get("status") or {}).get("restarts", {}).get("stalled") == 1
    await eventually(restarted, TIMEOUT + 30, "the silent job restarted as a stall")
    restarts = (await get_trainjob(kube, namespace, "hangs"))["status"]["restarts"]
    assert (restarts["user"], restarts["infrastructure"]) == (0, 1), restarts
    assert (restarts["lastFailure"]["kind"], restarts["lastFailure"]["reason"]) == ("infrastructure", "Stalled")

    async def failed() -> bool:
        return is_true(await get_trainjob(kube, namespace, "hangs"), "Failed")
    await eventually(failed, 90 + TIMEOUT, "the job failed on its second stall (maxRestarts 1)")
    cond = next(c for c in (await get_trainjob(kube, namespace, "hangs"))["status"]["conditions"] if c["type"] == "Failed")
    assert cond["reason"] == "Stalled" and "1/1 stall restarts used" in cond["message"], cond

    silent = await get_trainjob(kube, namespace, "silent")
    assert is_running(silent) and not (silent["status"].get("restarts") or {}).get("infrastructure"), silent["status"]
