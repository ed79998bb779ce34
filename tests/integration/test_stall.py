"""Hang detection on the real cluster (issue 38 item 2): a runtime with a stall timeout restarts a
running TrainJob whose progress reports stop, charged as infrastructure, and fails it with reason
Stalled once failurePolicy.maxRestarts stall restarts are used; a job that never reported is left
alone. The last test does the same for a PyTorchJob (annotation on the job, reports sent to the
endpoint with its KWOK master pod's own token). In the first test KWOK plays the pods and the test writes status.trainerStatus itself, as the
progress endpoint does for a reporting pod; in the second, real torchrun on process nodes hangs in
an all-reduce and reports through the endpoint."""
from __future__ import annotations

import copy
import json
import shutil
from datetime import datetime, timezone
from pathlib import Path

import aiohttp
import pytest
import yaml

from gangctl.api.resources import CONFIGMAPS, PODS, PYTORCHJOBS, TRAINING_RUNTIMES, TRAINJOBS
from gangctl.config import REPO_ROOT
from gangctl.model import progress
from gangctl.model.progress import STALL_TIMEOUT_ANNOTATION
from gangctl.model.resolve import RESTART_ANNOTATION
from gangctl.policy.decide_pytorchjob import RESTARTS_ANNOTATION
from gangctl.policy.pytorchjob import JOB_NAME as PYTORCHJOB_NAME
from gangctl.processes import free_port
from tests.integration.conftest import wait_ready
from tests.integration.helpers import (KWOK_COMPLETE_DELAY, KWOK_COMPLETE_JITTER, condition, eventually, gangctl_cli,
                                       get_trainjob, is_running, is_true, jobs_in, on_kwok_nodes, pods_of, submit,
                                       trainjob)
from tests.integration.test_abusive_callers import alone, ca_of, pod_token, post, progress_controller, verified  # noqa: F401
from tests.integration.test_in_place import completes, ddp_job, resumed_at_step_51

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


HANG_TIMEOUT = 30   # beyond a restarted attempt's start (three ranks importing torch on 2 cores)


async def hung_ddp_job(kube, namespace: str, process_runtime: str, runtime: str,
                       annotations: dict[str, str]) -> tuple[str, float]:
    """examples/ddp submitted on a runtime with the stall timeout (and `annotations`), rank 1 told to
    hang once after step 60; waits until it has: (the TrainJob's name, when rank 1 hung)."""
    obj = await ddp_job(kube, namespace, process_runtime, runtime,
                        {STALL_TIMEOUT_ANNOTATION: f"{HANG_TIMEOUT}s", **annotations}, {"HANG_ONCE": "1:60"})
    name = obj["metadata"]["name"]
    await submit(kube, obj)
    marker = Path("/tmp/gangctl-ddp") / namespace / name / "hung-once-rank1"

    async def hung() -> bool:
        return marker.exists()
    await eventually(hung, 150, "rank 1 hung after step 60", interval=0.5)
    return name, marker.stat().st_mtime


async def test_a_rank_hung_in_an_all_reduce_is_detected_restarted_and_the_run_resumes(kube, namespace, kubeconfig,
                                                                                        controller, process_runtime):
    """examples/ddp, 3 nodes, real torchrun: rank 1 stops after step 60 (once), so ranks 0 and 2 block
    in the next all-reduce and rank 0's progress reports stop. gangctl restarts the gang within the
    stall timeout (reason Stalled, charged as infrastructure); the new attempt resumes from the step-50
    checkpoint and completes."""
    ckpt = Path("/tmp/gangctl-ddp") / namespace
    try:
        # process nodes restart in place by default (test_in_place.py): this runtime asks to recreate
        name, hung_at = await hung_ddp_job(kube, namespace, process_runtime, "hangs", {RESTART_ANNOTATION: "Recreate"})
        first = {p["metadata"]["uid"] for p in await pods_of(kube, namespace, name)}

        status = await completes(kube, namespace, name, 300, "after its stall restart")
        restarts = status["restarts"]
        assert (restarts["user"], restarts["infrastructure"], restarts.get("stalled")) == (0, 1, 1), restarts
        last = restarts["lastFailure"]
        assert (last["kind"], last["reason"]) == ("infrastructure", "Stalled"), last
        judged = datetime.fromisoformat(last["time"].replace("Z", "+00:00")).timestamp()
        # the last report came at most ~2 s before the hang (rank 0 reports every 2 s); timestamps are to the second
        assert HANG_TIMEOUT - 3 <= judged - hung_at <= HANG_TIMEOUT + 15, judged - hung_at
        pods = await pods_of(kube, namespace, name)
        assert pods and not first & {p["metadata"]["uid"] for p in pods}, "the gang was made anew"
        resumed_at_step_51(kubeconfig, namespace, pods)
    finally:
        shutil.rmtree(ckpt, ignore_errors=True)


async def test_a_hung_gang_that_restarts_in_place_keeps_its_pods_and_resumes(kube, namespace, kubeconfig, controller,
                                                                            process_runtime):
    """The same hang on a runtime that restarts in place: gangctl raises the pods' restart attempt, each
    trainer's liveness probe sees it and the kubelet restarts every container of every pod where it is
    (RestartAllContainers). Same pods on the same nodes, no second Job, charged once as a stall (not
    the user's), and the run resumes from the step-50 checkpoint and completes."""
    ckpt = Path("/tmp/gangctl-ddp") / namespace
    try:
        name, _ = await hung_ddp_job(kube, namespace, process_runtime, "hangs-in-place", {RESTART_ANNOTATION: "InPlace"})
        before = {p["metadata"]["uid"]: p["spec"]["nodeName"] for p in await pods_of(kube, namespace, name)}
        jobs_before = {j["metadata"]["uid"] for j in await jobs_in(kube, namespace)}

        status = await completes(kube, namespace, name, 300, "after its in-place stall restart")
        restarts = status["restarts"]
        assert (restarts["user"], restarts["infrastructure"], restarts.get("stalled")) == (0, 1, 1), restarts
        last = restarts["lastFailure"]
        assert (last["reason"], last["action"], last["restartAttempt"]) == ("Stalled", "RestartInPlace", 1), last
        pods = await pods_of(kube, namespace, name)
        assert {p["metadata"]["uid"]: p["spec"]["nodeName"] for p in pods} == before, "same pods on the same nodes"
        assert {j["metadata"]["uid"] for j in await jobs_in(kube, namespace)} == jobs_before, "no second Job"
        assert all(next(iter(p["status"]["containerStatuses"]))["restartCount"] == 1 for p in pods), [
            p["status"]["containerStatuses"] for p in pods]
        resumed_at_step_51(kubeconfig, namespace, pods)
    finally:
        shutil.rmtree(ckpt, ignore_errors=True)


def kwok_pytorchjob(name: str, namespace: str) -> dict:
    """A Master and a Worker of 1 GPU each on KWOK's GPU nodes (Running for an hour), with the stall
    timeout and a budget of one restart."""
    template = {"metadata": {"annotations": {KWOK_COMPLETE_DELAY: "3600s", KWOK_COMPLETE_JITTER: "3600s"}},
                "spec": on_kwok_nodes({"containers": [{"name": "pytorch", "image": "pytorch/pytorch:2.7.1",
                                                       "command": ["torchrun", "t.py"],
                                                       "resources": {"limits": {"nvidia.com/gpu": "1"}}}],
                                       # a trainer that exits on SIGTERM: KWOK removes a deleted pod at a
                                       # random moment within its grace (30 s by default), and the gang
                                       # is made again under the same names only once the old pods are gone
                                       "terminationGracePeriodSeconds": 2})}
    return {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob",
            "metadata": {"name": name, "namespace": namespace, "annotations": {STALL_TIMEOUT_ANNOTATION: f"{TIMEOUT}s"}},
            "spec": {"runPolicy": {"backoffLimit": 1}, "pytorchReplicaSpecs": {
                "Master": {"replicas": 1, "restartPolicy": "OnFailure", "template": copy.deepcopy(template)},
                "Worker": {"replicas": 1, "restartPolicy": "OnFailure", "template": copy.deepcopy(template)}}}}


async def test_a_pytorchjob_reports_through_the_endpoint_and_is_restarted_then_failed_when_its_reports_stop(
        kube, kubeconfig, namespace, tmp_path, alone):
    """gangctl's extension for PyTorchJobs: its pods get the progress variables (the URL ends in
    pytorchjobs/<name>/status), a report sent with the master pod's own token is kept on the
    PyTorchJob and `gangctl explain` says how long ago it came; once reports stop for the stall
    timeout the gang is made anew (charged as infrastructure), and the second stall fails the job."""
    port = free_port()
    ctl = progress_controller(kubeconfig, tmp_path / "controller.log", namespace, port)
    try:
        ctl.start()
        await wait_ready(ctl)
        await kube.create(PYTORCHJOBS.path(namespace), kwok_pytorchjob("hangs", namespace))
        url = progress.status_url(f"https://127.0.0.1:{port}", namespace, "hangs", "PyTorchJob")
        ca = await ca_of(kube, namespace)

        async def master() -> dict | None:
            listing = await kube.get(PODS.path(namespace), labelSelector=f"{PYTORCHJOB_NAME}=hangs")
            return next((p for p in listing["items"] if p["metadata"]["name"] == "hangs-master-0" and p["status"].get("phase") == "Running"
                         and not p["metadata"].get("deletionTimestamp")), None)

        async def report_once(pod: dict) -> None:
            env = {e["name"]: e.get("value") for e in pod["spec"]["containers"][0]["env"]}
            assert env["KUBEFLOW_TRAINER_STATUS_URL"] == url, env
            async with aiohttp.ClientSession(connector=verified(ca)) as session:
                code, text = await post(session, url, await pod_token(kube, pod))
                assert code == 200 and '"progressPercentage": 42' in text, (code, text)
                trainjob_url = progress.status_url(f"https://127.0.0.1:{port}", namespace, "hangs")
                code, text = await post(session, trainjob_url, await pod_token(kube, pod))
                assert code == 403 and "not made for TrainJob" in text, (code, text)

        async def running_master() -> bool:
            return await master() is not None
        await eventually(running_master, 60, "the PyTorchJob's master Running")
        cm = await kube.get(CONFIGMAPS.path(namespace, progress.config_map_name("hangs", "PyTorchJob")))
        assert cm["data"]["ca.crt"] == ca, "the pods verify the endpoint with the CA it serves"
        first = await master()
        await report_once(first)
        job = await kube.get(PYTORCHJOBS.path(namespace, "hangs"))
        assert json.loads(job["metadata"]["annotations"][progress.REPORT_ANNOTATION])["progressPercentage"] == 42
        said = gangctl_cli("explain", f"pytorchjob/{namespace}/hangs", kubeconfig=kubeconfig, timeout=60)
        assert "last progress report" in said.stdout and f"stalled after {TIMEOUT}s" in said.stdout, said.stdout

        async def remade() -> bool:
            pod = await master()
            return pod is not None and pod["metadata"]["uid"] != first["metadata"]["uid"]
        # KWOK deletes each old pod within its 2 s grace, and a pod made again may wait for gangctl's
        # 20 s gang retry before Coscheduling binds the pair
        await eventually(remade, TIMEOUT + 120, "the stalled gang made anew")
        job = await kube.get(PYTORCHJOBS.path(namespace, "hangs"))
        restarts = json.loads(job["metadata"]["annotations"][RESTARTS_ANNOTATION])
        assert (restarts["user"], restarts["infrastructure"], restarts.get("stalled")) == (0, 1, 1), restarts
        assert restarts["lastFailure"]["reason"] == "Stalled", restarts

        await report_once(await master())   # the new attempt reports once, then falls silent too

        async def failed() -> bool:
            return is_true(await kube.get(PYTORCHJOBS.path(namespace, "hangs")), "Failed")
        await eventually(failed, TIMEOUT + 60, "the PyTorchJob failed on its second stall (backoffLimit 1)")
        cond = condition(await kube.get(PYTORCHJOBS.path(namespace, "hangs")), "Failed")
        assert "Stalled" in cond["message"] and "stall" in cond["message"], cond
    finally:
        ctl.stop()
