"""In-place gang restart with real torchrun on process nodes (issue 38 item 1): a runtime that leaves
`gangctl.io/restart` unset and allows restarts, on process nodes, which declare
RestartAllContainersOnContainerExits as a 1.36 kubelet does, so in place is gangctl's default;
examples/ddp with rank 1 exiting with code 3 once after step 60. Every rank restarts in its own pod on
its own node (RestartAllContainers), training resumes from the step-50 checkpoint, the budget shows one
user restart, and no second Job is made. (`InPlace` asked for explicitly: test_stall.py.)"""
from __future__ import annotations

import copy
import re
import shutil
from pathlib import Path

import pytest
import yaml

from gangctl.api.resources import CLUSTER_TRAINING_RUNTIMES, TRAINING_RUNTIMES
from gangctl.config import REPO_ROOT
from tests.integration.helpers import eventually, get_trainjob, is_running, is_true, jobs_in, pods_of, submit
from tests.integration.test_process_nodes import kubectl

pytestmark = [pytest.mark.integration, pytest.mark.asyncio(loop_scope="session")]

MANIFEST = REPO_ROOT / "examples" / "ddp" / "trainjob.yaml"
STEP = re.compile(r"\] step=(\d+) ")


async def ddp_job(kube, namespace: str, process_runtime: str, runtime: str, annotations: dict[str, str],
                  env: dict[str, str]) -> dict:
    """examples/ddp (3 process nodes) on a TrainingRuntime `runtime`: the shipped process-node runtime
    with `annotations` and failurePolicy.maxRestarts 2; the trainer gets `env` besides its own."""
    shipped = await kube.get(CLUSTER_TRAINING_RUNTIMES.path(name=process_runtime))
    rt = {"apiVersion": shipped["apiVersion"], "kind": "TrainingRuntime",
          "metadata": {"name": runtime, "namespace": namespace, "annotations": annotations},
          "spec": copy.deepcopy(shipped["spec"])}
    rt["spec"]["template"]["spec"]["failurePolicy"] = {"maxRestarts": 2}
    await kube.create(TRAINING_RUNTIMES.path(namespace), rt)
    obj = yaml.safe_load(MANIFEST.read_text())
    obj["metadata"]["namespace"] = namespace
    obj["spec"]["runtimeRef"] = {"name": runtime, "kind": "TrainingRuntime"}
    obj["spec"]["trainer"]["env"] += [{"name": k, "value": v} for k, v in env.items()]
    return obj


async def completes(kube, namespace: str, name: str, timeout: float, what: str) -> dict:
    """Wait until the TrainJob is Complete, never Failed on the way; its status then."""
    async def complete() -> bool:
        tj = await get_trainjob(kube, namespace, name)
        assert not is_true(tj, "Failed"), tj.get("status")
        return is_true(tj, "Complete")
    await eventually(complete, timeout, f"the TrainJob Complete {what}", interval=0.5)
    return (await get_trainjob(kube, namespace, name))["status"]


def resumed_at_step_51(kubeconfig: Path, namespace: str, pods: list[dict]) -> None:
    """Every pod's current container resumed from the step-50 checkpoint: its first step is 51."""
    assert pods
    for pod in pods:
        out = kubectl(kubeconfig, "logs", "-n", namespace, pod["metadata"]["name"]).stdout
        assert "resumed from checkpoint" in out and "(step 50)" in out, out[-2000:]
        steps = [int(m.group(1)) for m in map(STEP.search, out.splitlines()) if m]
        assert steps and steps[0] == 51, steps[:5]


def index(pod: dict) -> int:
    return int(pod["metadata"]["annotations"]["batch.kubernetes.io/job-completion-index"])


async def test_a_rank_that_fails_once_restarts_the_gang_in_place_and_resumes(kube, namespace, kubeconfig, controller,
                                                                              process_runtime):
    obj = await ddp_job(kube, namespace, process_runtime, "in-place", {}, {"FAIL_ONCE": "1:60:3"})
    name = obj["metadata"]["name"]
    ckpt = Path("/tmp/gangctl-ddp") / namespace
    try:
        await submit(kube, obj)

        async def running() -> bool:
            return is_running(await get_trainjob(kube, namespace, name))
        await eventually(running, 90, "the gang running")
        before = {p["metadata"]["uid"]: p["spec"]["nodeName"] for p in await pods_of(kube, namespace, name)}
        jobs_before = {j["metadata"]["uid"] for j in await jobs_in(kube, namespace)}

        status = await completes(kube, namespace, name, 240, "after its in-place restart")
        assert status["restarts"]["user"] == 1 and status["restarts"]["infrastructure"] == 0, status["restarts"]
        last = status["restarts"]["lastFailure"]
        assert (last["action"], last["reason"], last["attemptRestarts"]) == ("RestartInPlace", "RestartedInPlace", 1), last
        pods = sorted(await pods_of(kube, namespace, name), key=index)
        assert {p["metadata"]["uid"]: p["spec"]["nodeName"] for p in pods} == before, "same pods on the same nodes"
        assert {j["metadata"]["uid"] for j in await jobs_in(kube, namespace)} == jobs_before, "no second Job"
        restarted = [next(c for c in p["status"]["containerStatuses"])["restartCount"] for p in pods]
        assert restarted[1] >= 1, restarted
        resumed_at_step_51(kubeconfig, namespace, pods)   # the current containers: the run after the restart
    finally:
        shutil.rmtree(ckpt, ignore_errors=True)
