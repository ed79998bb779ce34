"""Process nodes on the real cluster: pods run as real processes, logs through the apiserver, real
torchrun gangs with their own addresses and names, and node loss seen by the real node lifecycle
controller. The agents are added to the session cluster by the `process_nodes` fixture (conftest.py).
"""
from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import time
import uuid
from pathlib import Path

import pytest

from gangctl.api.resources import NODES, PODS
from gangctl.cluster.lifecycle import start_process_nodes
from gangctl.config import ClusterSettings
from gangctl.kube.client import ApiError, Kube
from gangctl.nodeagent import launch
from tests.integration.conftest import PROCESS_NODE_FIRST_INDEX, PROCESS_NODES, process_node_test_state
from tests.integration.helpers import eventually, get_trainjob, is_true, pods_of, submit

pytestmark = pytest.mark.integration

NODES_COUNT = PROCESS_NODES
FIRST_INDEX = PROCESS_NODE_FIRST_INDEX
# kube-controller-manager: --node-monitor-grace-period=16s, --node-monitor-period=2s; gang pods
# tolerate not-ready/unreachable for 5 s (gangctl.plugins.workload.NODE_LOSS_TOLERATION_SECONDS).
NOT_READY_WITHIN = 25
EVICTED_WITHIN = 35


def _state(settings: ClusterSettings) -> Path:
    return process_node_test_state(settings)


def kubectl(kubeconfig: Path, *args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run(["kubectl", *args], env=dict(os.environ, KUBECONFIG=str(kubeconfig)),
                          capture_output=True, text=True, timeout=timeout)


def process_pod(name: str, script: str, node: str | None = None, grace: int = 5) -> dict:
    spec: dict = {
        "restartPolicy": "Never",
        "terminationGracePeriodSeconds": grace,
        "nodeSelector": {"gangctl.io/process-node": "true", **({"kubernetes.io/hostname": node} if node else {})},
        "tolerations": [{"key": "gangctl.io/process-node", "operator": "Exists", "effect": "NoSchedule"}],
        "containers": [{"name": "main", "image": "busybox", "command": ["bash", "-c", script],
                        "env": [{"name": "MY_POD", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
                                {"name": "MY_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}],
                        "resources": {"requests": {"cpu": "100m"}}}],
    }
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec}


async def wait_phase(kube: Kube, ns: str, name: str, phases: set[str], timeout: float = 60) -> dict:
    seen: dict = {}

    async def check() -> bool:
        seen["pod"] = await kube.get(PODS.path(ns, name))
        return seen["pod"]["status"].get("phase") in phases
    await eventually(check, timeout, f"pod {name} in {phases}")
    return seen["pod"]


async def test_pod_runs_reports_truthful_status_and_serves_logs(kube, namespace, kubeconfig, process_nodes):
    await kube.create(PODS.path(namespace), process_pod(
        "fails", "echo hello from $MY_POD at $MY_IP on $(hostname); for i in 1 2 3; do echo line $i; sleep 1; done; "
                 "echo oops >&2; exit 3"))
    await kube.create(PODS.path(namespace), process_pod("works", "echo done"))
    pod = await wait_phase(kube, namespace, "fails", {"Running"})
    assert pod["spec"]["nodeName"] in process_nodes
    assert pod["status"]["podIP"].startswith("10.244.")
    follow = kubectl(kubeconfig, "logs", "-f", "-n", namespace, "fails", timeout=60)  # ends when the process does
    assert follow.returncode == 0, follow.stderr
    assert follow.stdout.splitlines() == [f"hello from fails at {pod['status']['podIP']} on fails",
                                          "line 1", "line 2", "line 3", "oops"]
    pod = await wait_phase(kube, namespace, "fails", {"Failed"})
    term = pod["status"]["containerStatuses"][0]["state"]["terminated"]
    assert term["exitCode"] == 3 and term["reason"] == "Error" and term["startedAt"] <= term["finishedAt"]
    ok = await wait_phase(kube, namespace, "works", {"Succeeded"})
    assert ok["status"]["containerStatuses"][0]["state"]["terminated"]["exitCode"] == 0
    tail = kubectl(kubeconfig, "logs", "-n", namespace, "fails", "--tail=1", "--timestamps")
    assert tail.returncode == 0 and tail.stdout.rstrip().endswith(" oops") and tail.stdout.startswith("20")
    events = (await kube.get(f"/api/v1/namespaces/{namespace}/events",
                             fieldSelector="involvedObject.name=works"))["items"]
    assert any(e["reason"] == "ProcessNode" and "not pulled" in e["message"] for e in events)


async def test_deleting_a_pod_stops_its_processes_and_removes_it(kube, namespace, process_nodes):
    marker = f"marker-{uuid.uuid4().hex[:8]}"
    await kube.create(PODS.path(namespace), process_pod("sleeper", f"trap 'echo bye; exit 0' TERM; sleep 300 # {marker} &"
                                                                    " wait", grace=3))
    await wait_phase(kube, namespace, "sleeper", {"Running"})
    await eventually(lambda: _async(bool(_pgrep(marker))), 10, "the pod's process")
    await kube.delete(PODS.path(namespace, "sleeper"))

    async def gone() -> bool:
        try:
            await kube.get(PODS.path(namespace, "sleeper"))
            return False
        except ApiError as err:
            return err.not_found
    await eventually(gone, 20, "the pod object to be removed by its node agent")
    assert not _pgrep(marker)


async def _async(value):
    return value


def _pgrep(pattern: str) -> list[str]:
    return subprocess.run(["pgrep", "-f", pattern], capture_output=True, text=True).stdout.split()


TORCH_SCRIPT = """cat > /tmp/allreduce_$$.py <<'PY'
import os, time, torch, torch.distributed as dist
dist.init_process_group("gloo")
t = torch.tensor([float(dist.get_rank() + 1)])
dist.all_reduce(t)
print(f"WORLD_SIZE={os.environ['WORLD_SIZE']} RANK={os.environ['RANK']} LOCAL_RANK={os.environ['LOCAL_RANK']} "
      f"MASTER={os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']} sum={t.item():.0f}", flush=True)
time.sleep(float(os.environ.get("HOLD", "0")))
dist.barrier()
dist.destroy_process_group()
PY
exec torchrun /tmp/allreduce_$$.py"""


def torch_trainjob(name: str, ns: str, runtime: str, nodes: int, node: str | None = None, hold: int = 0) -> dict:
    spec: dict = {"runtimeRef": {"name": runtime, "kind": "ClusterTrainingRuntime"},
                  "trainer": {"numNodes": nodes, "command": ["bash", "-c", TORCH_SCRIPT],
                              "env": [{"name": "HOLD", "value": str(hold)}],
                              "resourcesPerNode": {"requests": {"cpu": "250m"}, "limits": {"cpu": "1"}}}}
    if node:
        spec["podTemplateOverrides"] = [{"targetJobs": [{"name": "node"}],
                                         "spec": {"nodeSelector": {"kubernetes.io/hostname": node}}}]
    return {"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob",
            "metadata": {"name": name, "namespace": ns}, "spec": spec}


async def test_two_torchrun_gangs_on_one_node_share_the_master_port(kube, namespace, kubeconfig, controller,
                                                                   process_runtime, process_nodes):
    node = process_nodes[0]
    started = time.monotonic()
    for name in ("alpha", "beta"):
        await submit(kube, torch_trainjob(name, namespace, process_runtime, nodes=2, node=node, hold=4))

    async def both_complete() -> bool:
        jobs = [await get_trainjob(kube, namespace, n) for n in ("alpha", "beta")]
        for tj in jobs:
            assert not is_true(tj, "Failed"), tj["status"]
        return all(is_true(tj, "Complete") for tj in jobs)
    took = await eventually(both_complete, 150, "both TrainJobs Complete")
    print(f"[process-nodes] two 2-node torchrun gangs on one node completed in {time.monotonic() - started:.1f}s "
          f"({took:.1f}s)")
    spans = {}
    for name in ("alpha", "beta"):
        pods = await pods_of(kube, namespace, name)
        assert len(pods) == 2 and {p["spec"]["nodeName"] for p in pods} == {node}
        ips = {p["status"]["podIP"] for p in pods}
        assert len(ips) == 2
        for p in pods:
            logs = kubectl(kubeconfig, "logs", "-n", namespace, p["metadata"]["name"]).stdout
            rank = p["metadata"]["annotations"]["batch.kubernetes.io/job-completion-index"]
            assert f"WORLD_SIZE=2 RANK={rank} LOCAL_RANK=0 MASTER={name}-node-0-0.{name}:29500 sum=3" in logs, logs
            term = p["status"]["containerStatuses"][0]["state"]["terminated"]
            spans.setdefault(name, []).append((term["startedAt"], term["finishedAt"]))
    # The gangs ran at the same time (each holds its port 29500 for at least 4 s).
    a_start, a_end = min(s for s, _ in spans["alpha"]), max(e for _, e in spans["alpha"])
    b_start, b_end = min(s for s, _ in spans["beta"]), max(e for _, e in spans["beta"])
    assert a_start < b_end and b_start < a_end, spans


async def test_killing_an_agent_is_a_node_loss(kube, namespace, kubeconfig, controller, process_runtime,
                                               cluster_settings, process_nodes):
    state = _state(cluster_settings)
    [doomed] = await asyncio.to_thread(start_process_nodes, cluster_settings, kubeconfig, 1, lambda m: None,
                                       state=state, prefix="doomed", first_index=FIRST_INDEX + NODES_COUNT)
    try:
        await submit(kube, torch_trainjob("lost", namespace, process_runtime, nodes=1, node=doomed, hold=600))

        async def running() -> bool:
            pods = await pods_of(kube, namespace, "lost")
            return bool(pods) and pods[0]["status"].get("phase") == "Running"
        await eventually(running, 60, "the pod on the doomed node to run")
        [pod] = await pods_of(kube, namespace, "lost")
        tolerations = {t["key"]: t.get("tolerationSeconds") for t in pod["spec"]["tolerations"]}
        assert tolerations["node.kubernetes.io/unreachable"] == 5
        shim = int(pod["status"]["containerStatuses"][0]["containerID"].split("://")[1])
        assert _alive(shim)

        os.kill(launch.agent_pid(state, doomed), signal.SIGKILL)
        killed = time.monotonic()
        # PDEATHSIG kills them within milliseconds (benchmarks/leader_failover.py measures it); the bound
        # only has to outlast a loaded machine (5 s once timed out in a cold CI run at load ~4).
        await eventually(lambda: _async(not _alive(shim)), 15, "the pod's processes to die with the agent")
        assert not _pgrep(f"torchrun /tmp/allreduce") or all(
            str(shim) not in p for p in _pgrep("torchrun /tmp/allreduce"))

        async def not_ready() -> bool:
            node = await kube.get(NODES.path(name=doomed))
            ready = next(c for c in node["status"]["conditions"] if c["type"] == "Ready")
            return ready["status"] != "True"
        await eventually(not_ready, NOT_READY_WITHIN + 5, "the Node to be NotReady")
        detected = time.monotonic() - killed

        async def evicted() -> bool:
            p = await kube.get(PODS.path(namespace, pod["metadata"]["name"]))
            return bool(p["metadata"].get("deletionTimestamp"))
        await eventually(evicted, EVICTED_WITHIN + 5, "the pod to be evicted")
        evicted_after = time.monotonic() - killed
        print(f"[process-nodes] node loss: NotReady after {detected:.1f}s, pod evicted after {evicted_after:.1f}s")
        assert detected <= NOT_READY_WITHIN and evicted_after <= EVICTED_WITHIN
        p = await kube.get(PODS.path(namespace, pod["metadata"]["name"]))
        assert any(c["type"] == "DisruptionTarget" and c["status"] == "True" for c in p["status"].get("conditions", []))
    finally:
        pid = launch.agent_pid(state, doomed)
        if pid and _alive(pid):
            os.kill(pid, signal.SIGKILL)
        (state / "pids" / f"{doomed}.pid").unlink(missing_ok=True)
        await kube.delete(NODES.path(name=doomed))


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


async def test_a_failing_exec_liveness_probe_restarts_the_container_and_downward_api_files_follow(
        kube, namespace, kubeconfig, process_nodes):
    """An exec liveness probe, as a process node's kubelet runs it, in the container (its mounts and
    env): it compares a downward API file of an annotation with the env the container started with.
    The annotation changes, the file follows, the probe fails, the kubelet stops the container
    (Unhealthy, Killing) and its RestartAllContainers rule restarts it in the same pod, on the same
    node, where its env now shows the new value (gangctl's in-place stall restart works so)."""
    annotation, folder = "example.com/attempt", "/var/run/secrets/example.com/attempt"
    field = {"fieldPath": f"metadata.annotations['{annotation}']"}
    pod = process_pod("probed", 'echo "started with attempt $SEEN"; exec sleep 600', grace=2)
    pod["metadata"]["annotations"] = {annotation: "0"}
    main = pod["spec"]["containers"][0]
    main["env"].append({"name": "SEEN", "valueFrom": {"fieldRef": field}})
    main["restartPolicy"] = "Never"
    main["restartPolicyRules"] = [{"action": "RestartAllContainers", "exitCodes": {"operator": "NotIn", "values": [0]}}]
    main["volumeMounts"] = [{"name": "attempt", "mountPath": folder, "readOnly": True}]
    main["livenessProbe"] = {"exec": {"command": ["sh", "-c", f'read -r now < {folder}/attempt; [ "$now" = "$SEEN" ]']},
                             "periodSeconds": 1, "timeoutSeconds": 10, "failureThreshold": 1}
    pod["spec"]["volumes"] = [{"name": "attempt", "projected": {"sources": [{"downwardAPI": {"items": [
        {"path": "attempt", "fieldRef": field}]}}]}}]
    await kube.create(PODS.path(namespace), pod)
    first = await wait_phase(kube, namespace, "probed", {"Running"})

    async def started(attempt: str) -> bool:
        out = kubectl(kubeconfig, "logs", "-n", namespace, "probed").stdout
        return f"started with attempt {attempt}" in out
    await eventually(lambda: started("0"), 30, "the container started with attempt 0")
    await kube.merge_patch(PODS.path(namespace, "probed"), {"metadata": {"annotations": {annotation: "1"}}})

    async def restarted() -> bool:
        pod = await kube.get(PODS.path(namespace, "probed"))
        return any(c.get("restartCount") == 1 and "running" in c.get("state", {})
                   for c in pod["status"].get("containerStatuses") or [])
    await eventually(restarted, 30, "the container restarted by its liveness probe")
    await eventually(lambda: started("1"), 30, "the restarted container's env showing attempt 1")
    now = await kube.get(PODS.path(namespace, "probed"))
    assert (now["metadata"]["uid"], now["spec"]["nodeName"], now["status"]["podIP"]) == (
        first["metadata"]["uid"], first["spec"]["nodeName"], first["status"]["podIP"]), "same pod, node and IP"
    last = now["status"]["containerStatuses"][0]["lastState"]["terminated"]
    assert last["exitCode"] != 0, last
    events = (await kube.get(f"/api/v1/namespaces/{namespace}/events"))["items"]
    said = {e["reason"]: e["message"] for e in events if e["involvedObject"].get("name") == "probed"}
    assert said.get("Unhealthy", "").startswith("Liveness probe failed"), said
    assert "failed liveness probe, will be restarted" in said.get("Killing", ""), said


async def test_a_restart_all_containers_rule_restarts_every_container_in_place(kube, namespace, process_nodes):
    """Kubernetes 1.36's RestartAllContainers rule, as a process node's kubelet carries it out: the
    container that exits 42 restarts with its sidecar, same pod, node and IP; the second run ends it."""
    marker = f"/tmp/gangctl-restart-all-{uuid.uuid4().hex}"
    pod = process_pod("inplace", f"sleep 1; if [ -e {marker} ]; then exit 0; fi; touch {marker}; exit 42")
    main = pod["spec"]["containers"][0]
    main["restartPolicy"] = "Never"
    main["restartPolicyRules"] = [{"action": "RestartAllContainers", "exitCodes": {"operator": "In", "values": [42]}}]
    side = {k: v for k, v in main.items() if k not in ("restartPolicy", "restartPolicyRules")}
    pod["spec"]["containers"].append({**side, "name": "side", "command": ["bash", "-c", "sleep 3"]})
    try:
        await kube.create(PODS.path(namespace), pod)
        first = await wait_phase(kube, namespace, "inplace", {"Running"})
        done = await wait_phase(kube, namespace, "inplace", {"Succeeded", "Failed"}, timeout=60)
        assert done["status"]["phase"] == "Succeeded", done["status"]
        assert done["metadata"]["uid"] == first["metadata"]["uid"]
        assert (done["spec"]["nodeName"], done["status"]["podIP"]) == (first["spec"]["nodeName"], first["status"]["podIP"])
        statuses = {c["name"]: c for c in done["status"]["containerStatuses"]}
        assert statuses["main"]["restartCount"] == 1 and statuses["side"]["restartCount"] == 1, statuses
        assert statuses["main"]["lastState"]["terminated"]["exitCode"] == 42
        assert statuses["side"]["lastState"]["terminated"]["reason"] == "RestartingAllContainers"
        restarting = next(c for c in done["status"]["conditions"] if c["type"] == "AllContainersRestarting")
        assert restarting["status"] == "False"
        node = await kube.get(NODES.path(name=done["spec"]["nodeName"]))
        assert "RestartAllContainersOnContainerExits" in node["status"].get("declaredFeatures", [])
    finally:
        Path(marker).unlink(missing_ok=True)
