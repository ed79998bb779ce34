"""In-place gang restart with real torchrun on process nodes (issue 38 item 1): a runtime with
`gangctl.io/restart: InPlace`; examples/ddp with rank 1 exiting with code 3 once after step 60. Every
rank restarts in its own pod on its own node (RestartAllContainers), training resumes from the step-50
checkpoint, the budget shows one user restart, and no second Job is made."""
from __future__ import annotations

import copy
import re
import shutil
from pathlib import Path

import pytest
import yaml

from gangctl.api.resources import CLUSTER_TRAINING_RUNTIMES, TRAINING_RUNTIMES
from gangctl.config import REPO_ROOT
from gangctl.model.resolve import RESTART_ANNOTATION
from tests.integration.helpers import eventually, get_trainjob, is_running, is_true, jobs_in, pods_of, submit
from tests.integration.test_process_nodes import kubectl

pytestmark = [pytest.mark.integration, pytest.mark.asyncio(loop_scope="session")]

MANIFEST = REPO_ROOT / "examples" / "ddp" / "trainjob.yaml"
STEP = re.compile(r"\] step=(\d+) ")


def index(pod: dict) -> int:
    return int(pod["metadata"]["annotations"]["batch.kubernetes.io/job-completion-index"])


async def test_a_rank_that_fails_once_restarts_the_gang_in_place_and_resumes(kube, namespace, kubeconfig, controller,
                                                                              process_runtime):
    shipped = await kube.get(CLUSTER_TRAINING_RUNTIMES.path(name=process_runtime))
    rt = {"apiVersion": shipped["apiVersion"], "kind": "TrainingRuntime",
          "metadata": {"name": "in-place", "namespace": namespace, "annotations": {RESTART_ANNOTATION: "InPlace"}},
          "spec": copy.deepcopy(shipped["spec"])}
    rt["spec"]["template"]["spec"]["failurePolicy"] = {"maxRestarts": 2}
    await kube.create(TRAINING_RUNTIMES.path(namespace), rt)
    obj = yaml.safe_load(MANIFEST.read_text())
    obj["metadata"]["namespace"] = namespace
    obj["spec"]["runtimeRef"] = {"name": "in-place", "kind": "TrainingRuntime"}
    obj["spec"]["trainer"]["env"].append({"name": "FAIL_ONCE", "value": "1:60:3"})
    name = obj["metadata"]["name"]
    ckpt = Path("/tmp/gangctl-ddp") / namespace
    try:
        await submit(kube, obj)

        async def running() -> bool:
            return is_running(await get_trainjob(kube, namespace, name))
        await eventually(running, 90, "the gang running")
        before = {p["metadata"]["uid"]: p["spec"]["nodeName"] for p in await pods_of(kube, namespace, name)}
        jobs_before = {j["metadata"]["uid"] for j in await jobs_in(kube, namespace)}

        async def complete() -> bool:
            tj = await get_trainjob(kube, namespace, name)
            assert not is_true(tj, "Failed"), tj.get("status")
            return is_true(tj, "Complete")
        await eventually(complete, 240, "the TrainJob Complete after its in-place restart", interval=0.5)

        status = (await get_trainjob(kube, namespace, name))["status"]
        assert status["restarts"]["user"] == 1 and status["restarts"]["infrastructure"] == 0, status["restarts"]
        last = status["restarts"]["lastFailure"]
        assert (last["action"], last["reason"], last["attemptRestarts"]) == ("RestartInPlace", "RestartedInPlace", 1), last
        pods = sorted(await pods_of(kube, namespace, name), key=index)
        assert {p["metadata"]["uid"]: p["spec"]["nodeName"] for p in pods} == before, "same pods on the same nodes"
        assert {j["metadata"]["uid"] for j in await jobs_in(kube, namespace)} == jobs_before, "no second Job"
        restarted = [next(c for c in p["status"]["containerStatuses"])["restartCount"] for p in pods]
        assert restarted[1] >= 1, restarted
        for pod in pods:   # the current container is the run after the restart: it resumed at step 50
            out = kubectl(kubeconfig, "logs", "-n", namespace, pod["metadata"]["name"]).stdout
            assert "resumed from checkpoint" in out and "(step 50)" in out, out[-2000:]
            steps = [int(m.group(1)) for m in map(STEP.search, out.splitlines()) if m]
            assert steps and steps[0] == 51, steps[:5]
    finally:
        shutil.rmtree(ckpt, ignore_errors=True)
