"""In-place gang restart with real torchrun on process nodes (issue 38 item 1): a runtime that leaves
`gangctl.io/restart` unset and allows restarts, on process nodes, which declare
RestartAllContainersOnContainerExits as a 1.36 kubelet does, so in place is gangctl's default;
examples/ddp with rank 1 exiting with code 3 once after step 60. Every rank restarts in its own pod on
its own node (RestartAllContainers), training resumes from the step-50 checkpoint, the budget shows one
user restart, and no second Job is made. (`InPlace` asked for explicitly: test_stall.py.) The same ladder
on KWOK GPU nodes that declare the feature, with gangctl's own KWOK stage as their kubelet: charged once
per episode with the pods kept, then failed past the budget."""
from __future__ import annotations

import copy
import re
import shutil
from pathlib import Path

import pytest
import yaml

from gangctl.api.resources import CLUSTER_TRAINING_RUNTIMES, NODES, PODS, TRAINING_RUNTIMES
from gangctl.cluster import setup
from gangctl.cluster.local import KWOK_RUNTIME
from gangctl.config import REPO_ROOT
from gangctl.harness import chaos
from gangctl.plugins.workload import IN_PLACE_FEATURE, restarts_all_containers
from tests.integration.helpers import (condition, delete_namespace, eventually, get_trainjob, is_running, is_true,
                                       jobs_in, pods_of, submit, trainjob)
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


async def test_kwok_gang_on_nodes_that_declare_the_feature_restarts_in_place_until_its_budget_ends(kube, namespace,
                                                                                                     controller):
    """The same ladder on KWOK GPU nodes that declare RestartAllContainersOnContainerExits (gangctl's own
    KWOK stage plays the kubelet's RestartAllContainers): a runtime that leaves the mode unset, whose pods
    may land only on two such nodes, gets the rule; one episode is charged once with the pods kept; two
    more exhaust maxRestarts 2 and the TrainJob fails with its Job suspended. The two nodes are this
    test's own (a taint of their own keeps every other gang off them) and are deleted by uid after."""
    key = "gangctl.io/test-in-place"
    nodes = [setup.gpu_node(i, 8, prefix=f"{namespace}-node", declared_features=[IN_PLACE_FEATURE]) for i in range(2)]
    for node in nodes:
        node["metadata"]["labels"][key] = namespace
        node["spec"]["taints"].append({"key": key, "value": namespace, "effect": "NoSchedule"})
    made = [await kube.create(NODES.path(), node) for node in nodes]
    try:
        shipped = await kube.get(CLUSTER_TRAINING_RUNTIMES.path(name=KWOK_RUNTIME))
        spec = copy.deepcopy(shipped["spec"])
        spec["template"]["spec"]["failurePolicy"] = {"maxRestarts": 2}
        pod = spec["template"]["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
        pod["nodeSelector"] = {**pod["nodeSelector"], key: namespace}
        pod["tolerations"] = [*pod["tolerations"], {"key": key, "operator": "Exists", "effect": "NoSchedule"}]
        await kube.create(TRAINING_RUNTIMES.path(namespace), {
            "apiVersion": shipped["apiVersion"], "kind": "TrainingRuntime",
            "metadata": {"name": "kwok-in-place", "namespace": namespace}, "spec": spec})

        async def ready() -> bool:
            listed = [await kube.get(NODES.path(name=n["metadata"]["name"])) for n in made]
            return all(any(c["type"] == "Ready" and c["status"] == "True" for c in n["status"].get("conditions") or [])
                       and not any(t["key"].startswith("node.kubernetes.io/") for t in n["spec"].get("taints") or [])
                       for n in listed)
        await eventually(ready, 60, "the two KWOK nodes Ready, their not-ready taint gone")
        await submit(kube, trainjob("flaky", namespace, nodes=2, runtime="kwok-in-place", runtime_kind="TrainingRuntime"))

        async def running() -> bool:
            return is_running(await get_trainjob(kube, namespace, "flaky"))
        await eventually(running, 60, "the gang running")
        [job] = await jobs_in(kube, namespace)
        assert restarts_all_containers(job), "gangctl chose in place: every node the pods may use declares it"
        pods = sorted(await pods_of(kube, namespace, "flaky"), key=index)
        before = {p["metadata"]["uid"]: p["spec"]["nodeName"] for p in pods}

        async def restart_all(times: int) -> None:
            for p in pods:   # rank 1 fails with 3; rank 0's worker then loses its peer, as torchrun's does
                await kube.merge_patch(PODS.path(namespace, p["metadata"]["name"]), {"metadata": {
                    "annotations": chaos.restart_all(times, 3 if index(p) == 1 else 1)}})

        await restart_all(1)

        async def charged(user: int) -> bool:
            return ((await get_trainjob(kube, namespace, "flaky")).get("status") or {}).get("restarts", {}).get("user") == user
        await eventually(lambda: charged(1), 60, "one in-place restart charged")
        status = (await get_trainjob(kube, namespace, "flaky"))["status"]
        last = status["restarts"]["lastFailure"]
        assert (last["action"], last["attemptRestarts"], last["jobUID"]) == ("RestartInPlace", 1, job["metadata"]["uid"]), last
        assert not is_true(await get_trainjob(kube, namespace, "flaky"), "Failed")
        now = await pods_of(kube, namespace, "flaky")
        assert {p["metadata"]["uid"]: p["spec"]["nodeName"] for p in now} == before, "same pods on the same nodes"
        assert [j["metadata"]["uid"] for j in await jobs_in(kube, namespace)] == [job["metadata"]["uid"]], "no second Job"

        await restart_all(3)

        async def failed() -> bool:
            return is_true(await get_trainjob(kube, namespace, "flaky"), "Failed")
        await eventually(failed, 60, "the TrainJob failed past its budget")
        obj = await get_trainjob(kube, namespace, "flaky")
        assert condition(obj, "Failed")["reason"] == "MaxRestartsExceeded", condition(obj, "Failed")
        assert obj["status"]["restarts"]["user"] == 2, obj["status"]["restarts"]

        async def suspended() -> bool:
            return all((j.get("spec") or {}).get("suspend") for j in await jobs_in(kube, namespace))
        await eventually(suspended, 30, "its Job suspended (the pods stop)")
    finally:
        await delete_namespace(kube, namespace)
        for node in made:
            await kube.delete(NODES.path(name=node["metadata"]["name"]), uid=node["metadata"]["uid"])
