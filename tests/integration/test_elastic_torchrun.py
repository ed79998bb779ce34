"""Elastic training with real torchrun on process nodes: lose the node of rank 0 mid-training, go on
from the last DCP checkpoint with the survivors, grow back to 4 when a node is added, complete.

Nodes: 5 started here (4 workers + the rendezvous store, which never shares a node with a worker;
the session's process nodes are cordoned meanwhile); the one hosting the completion-index-0 pod is
SIGKILLed; a sixth is started once the survivors train again. The script is examples/elastic/train.py shipped
in the command (process nodes pull no image); its checkpoints go to a directory on this machine.
"""
from __future__ import annotations

import asyncio
import os
import re
import shutil
import signal
import time
from pathlib import Path

import pytest

from gangctl.api.resources import NODES, PODS, TRAINJOBS
from gangctl.cluster.lifecycle import start_process_nodes
from gangctl.config import REPO_ROOT
from gangctl.nodeagent import launch
from tests.integration.conftest import PROCESS_NODE_FIRST_INDEX, PROCESS_NODES, process_node_test_state
from tests.integration.helpers import eventually, get_trainjob, is_true, pods_of, submit
from tests.integration.test_process_nodes import _alive, kubectl

pytestmark = pytest.mark.integration

SCRIPT = REPO_ROOT / "examples" / "elastic" / "train.py"
# Indexes after the session's nodes and test_process_nodes.py's "doomed" one.
FIRST_INDEX = PROCESS_NODE_FIRST_INDEX + PROCESS_NODES + 1
STEP = re.compile(r"^step=(\d+) loss=(\S+) world=(\d+) restart=(\d+) t=([0-9.]+)$", re.M)
RESUMED = re.compile(r"^resumed from \S+/step-(\d+) at step=(\d+) world=(\d+)$", re.M)
STEPS, CKPT_EVERY, STEP_SECONDS, LR = 400, 10, 0.1, 0.01


def elastic_trainjob(name: str, ns: str, runtime: str, ckpt: Path) -> dict:
    program = SCRIPT.read_text()
    command = (f"set -e\nprogram=`mktemp /tmp/gangctl-elastic-train-XXXXXX.py`\ntrap 'rm -f \"$program\"' EXIT\n"
               f"cat > \"$program\" <<'PY'\n{program}PY\n"
               f"torchrun \"$program\" --steps {STEPS} --ckpt-every {CKPT_EVERY} --step-seconds {STEP_SECONDS} --lr {LR} "
               f"--ckpt-dir {ckpt}")
    return {"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob",
            "metadata": {"name": name, "namespace": ns},
            "spec": {"runtimeRef": {"name": runtime, "kind": "ClusterTrainingRuntime"},
                     "trainer": {"numNodes": 4, "elasticPolicy": {"minNodes": 2, "maxNodes": 4},
                                 "command": ["bash", "-c", command],
                                 # LOGLEVEL=INFO: torchrun's agents log each rendezvous round they join.
                                 "env": [{"name": "OMP_NUM_THREADS", "value": "1"}, {"name": "LOGLEVEL", "value": "INFO"}],
                                 "numProcPerNode": 1,
                                 # One worker per node (2 CPUs): a lost node's replacement waits for a new node.
                                 "resourcesPerNode": {"requests": {"cpu": "1500m"}, "limits": {"cpu": "1500m"}}}}}


def _index(pod: dict) -> int:
    return int(pod["metadata"]["annotations"]["batch.kubernetes.io/job-completion-index"])


def _steps(text: str) -> list[tuple[int, float, int, int, float]]:
    """(step, loss, world, restart, time) of every step line, ordered by time (rank 0 prints them)."""
    return sorted(((int(s), float(loss), int(w), int(r), float(t)) for s, loss, w, r, t in STEP.findall(text)),
                  key=lambda x: x[4])


async def test_elastic_torchrun_survives_losing_rank0_node_and_grows_back(kube, namespace, kubeconfig, controller,
                                                                         process_runtime, cluster_settings,
                                                                         process_nodes):
    state = process_node_test_state(cluster_settings)
    ckpt = Path("/tmp/gangctl-elastic") / namespace / "el"
    started: list[str] = []
    texts: dict[str, str] = {}  # pod name -> its last log (a lost node's pod logs are gone with it)

    async def logs() -> str:
        pods = await pods_of(kube, namespace, "el")
        for p in pods:
            r = await asyncio.to_thread(kubectl, kubeconfig, "logs", "-n", namespace, p["metadata"]["name"], timeout=30)
            if r.returncode == 0 and len(r.stdout) >= len(texts.get(p["metadata"]["name"], "")):
                texts[p["metadata"]["name"]] = r.stdout
        return "\n".join(texts.values())

    try:
        # The job runs on nodes of its own, so killing one never takes a node from the other tests.
        for name in process_nodes:
            await kube.merge_patch(NODES.path(name=name), {"spec": {"unschedulable": True}})
        started += await asyncio.to_thread(start_process_nodes, cluster_settings, kubeconfig, 5, lambda m: None,
                                           state=state, prefix="elastic", first_index=FIRST_INDEX)
        await submit(kube, elastic_trainjob("el", namespace, process_runtime, ckpt))

        async def live() -> list[dict]:
            return [p for p in await pods_of(kube, namespace, "el")
                    if not p["metadata"].get("deletionTimestamp") and p["status"].get("phase") == "Running"]

        async def trained(world: int, beyond: int = 0, since: float = 0.0) -> bool:
            tj = await get_trainjob(kube, namespace, "el")
            assert not is_true(tj, "Failed") and not is_true(tj, "Complete"), tj.get("status")
            return any(w == world and s >= beyond and t > since for s, _, w, _, t in _steps(await logs()))
        await eventually(lambda: trained(4, 2 * CKPT_EVERY + 3), 150, "4 workers past their second checkpoint",
                         interval=1)
        pods = await live()
        assert len(pods) == 4 and len({p["spec"]["nodeName"] for p in pods}) == 4, [p["metadata"]["name"] for p in pods]
        store = (await kube.get(PODS.path(namespace, "el-rdzv")))["spec"]["nodeName"]
        assert store not in {p["spec"]["nodeName"] for p in pods}
        assert {store, *(p["spec"]["nodeName"] for p in pods)} <= set(started)
        [rank0] = [p for p in pods if _index(p) == 0]
        victim = rank0["spec"]["nodeName"]

        before = _steps(await logs())
        os.kill(launch.agent_pid(state, victim), signal.SIGKILL)
        killed = time.time()
        last_ckpt = int((ckpt / "latest").read_text().strip().split("-")[1])

        await eventually(lambda: trained(3, since=killed), 90, "training on with the 3 survivors", interval=1)
        first3 = next(x for x in _steps(await logs()) if x[2] == 3 and x[4] > killed)
        recovered = first3[4] - killed

        async def not_ready() -> bool:
            node = await kube.get(NODES.path(name=victim))
            return any(c["type"] == "Ready" and c["status"] != "True" for c in node["status"]["conditions"])
        await eventually(not_ready, 40, "the killed node NotReady", interval=1)
        detected = time.time() - killed
        # Index 0's replacement (once its pod is evicted) waits for a node: one worker per node, and the
        # store's node takes none.
        assert len([p for p in await live() if p["spec"]["nodeName"] != victim]) == 3

        grow_at = time.time()
        started += await asyncio.to_thread(start_process_nodes, cluster_settings, kubeconfig, 1, lambda m: None,
                                           state=state, prefix="elastic", first_index=FIRST_INDEX + 5)
        await eventually(lambda: trained(4, since=first3[4]), 120, "grown back to 4 workers", interval=1)
        regrown = next(x for x in _steps(await logs()) if x[2] == 4 and x[4] > first3[4])[4] - grow_at
        tj = await get_trainjob(kube, namespace, "el")
        elastic = dict(tj["status"].get("elastic", {}))

        async def complete() -> bool:
            tj = await get_trainjob(kube, namespace, "el")
            assert not is_true(tj, "Failed"), tj.get("status")
            return is_true(tj, "Complete")
        await eventually(complete, 120, "TrainJob Complete", interval=1)
        text = await logs()
        steps = _steps(text)
        worlds = [w for _, _, w, _, _ in steps]
        # World 4, then 3 (rank 0's node lost), then 4 again until the last step.
        changes = [w for i, w in enumerate(worlds) if i == 0 or w != worlds[i - 1]]
        assert changes == [4, 3, 4], changes
        assert steps[-1][0] == STEPS
        resumed = [(int(c), int(s), int(w)) for c, s, w in RESUMED.findall(text)]
        assert (last_ckpt, last_ckpt, 3) in resumed, (resumed, last_ckpt)
        assert first3[0] == last_ckpt + 1, (first3, last_ckpt)
        # The loss keeps falling across both membership changes (a fresh start would be back at step 1's).
        loss = {s: l for s, l, _, _, _ in steps}
        first4 = next(x for x in steps if x[2] == 4 and x[4] > first3[4])
        at_ckpt = loss[max(s for s in loss if s <= last_ckpt)]  # the lost pod's last lines may not have been read
        assert first3[1] < 0.7 * loss[1] and first3[1] < 1.5 * at_ckpt, (loss[1], at_ckpt, first3)
        assert first4[1] < first3[1] and steps[-1][1] < first4[1], (first3, first4, steps[-1])
        assert elastic.get("currentNodes") == 4 and elastic.get("size") == 4, elastic
        print(f"[elastic-torchrun] rank-0 node killed at step {before[-1][0]} (checkpoint {last_ckpt}); first step with "
              f"3 workers {recovered:.1f}s later (step {first3[0]}); Node NotReady after {detected:.1f}s; new node -> "
              f"world 4 in {regrown:.1f}s (step {first4[0]}); loss {loss[1]:.3e} -> {at_ckpt:.3e} (ckpt) | "
              f"{first3[1]:.3e} (resumed, 3) | {first4[1]:.3e} (4 again) -> {steps[-1][1]:.3e} at step {steps[-1][0]}; "
              f"status.elastic {elastic}")
    except BaseException:
        for name, out in texts.items():
            print(f"== {name}\n" + "\n".join(line[:220] for line in out.splitlines()
                                                if "step=" not in line and "[rank" not in line))
        raise
    finally:
        try:
            await _cleanup(kube, namespace, state, started)
        finally:
            for name in process_nodes:
                await kube.merge_patch(NODES.path(name=name), {"spec": {"unschedulable": None}})
            shutil.rmtree(ckpt.parent, ignore_errors=True)


async def _cleanup(kube, namespace: str, state: Path, started: list[str]) -> None:
    """Delete the job while our agents still run (they stop its pods), force-delete the pods of the killed
    node (no kubelet will ever finish them), then stop our agents and remove their Nodes."""
    await kube.delete(TRAINJOBS.path(namespace, "el"))

    async def gone() -> bool:
        pods = await pods_of(kube, namespace, "el")
        for p in pods:
            pid = launch.agent_pid(state, p["spec"].get("nodeName", ""))
            if p["spec"].get("nodeName") in started and not (pid and _alive(pid)):
                await kube.request("DELETE", PODS.path(namespace, p["metadata"]["name"]),
                                   body={"gracePeriodSeconds": 0})
        return not pods
    try:
        await eventually(gone, 60, "the job's pods to be gone", interval=1)
    finally:
        for name in started:
            pid = launch.agent_pid(state, name)
            if pid and _alive(pid):
                os.kill(pid, signal.SIGKILL)
            (state / "pids" / f"{name}.pid").unlink(missing_ok=True)
            await kube.delete(NODES.path(name=name))
