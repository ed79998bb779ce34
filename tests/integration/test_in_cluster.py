"""gangctl running inside the local cluster, as a user installs it:
`kubectl apply --server-side -k deploy/overlays/local`.

The Deployment's two pods run on process nodes under ServiceAccount gangctl-system/gangctl: their
processes are `gangctl controller --leader-elect ...` in the node agent's Python environment, with
no kubeconfig, so they authenticate in-cluster with the projected token (KUBERNETES_SERVICE_HOST
10.96.0.1, TLS verified). Exactly one holds the Lease and serves TrainJobs; deleting it (SIGTERM)
hands the Lease to the other within seconds, which serves the next TrainJob. A 403 in either pod's
log (read through pods/log, i.e. `kubectl logs`) fails the test: the least-privilege RBAC must cover
what the controller really does.

The session's own controller (admin kubeconfig) is stopped meanwhile, so exactly one controller
serves TrainJobs, and restarted after; the install is removed afterwards except the CRDs and what
was there before (gangctl.harness.incluster.uninstall).
"""
from __future__ import annotations

import asyncio
import re
import subprocess
import time
from pathlib import Path

import pytest

from gangctl.harness import incluster
from tests.integration.conftest import wait_ready
from tests.integration.helpers import eventually, get_trainjob, is_true, submit, trainjob

pytestmark = pytest.mark.integration

HANDOVER_WITHIN = 5.0  # seconds from the leader pod's deletion to the other holding the Lease (goal 3 s)
FORBIDDEN = re.compile(r"\b403\b|forbidden", re.I)
# ... except NamespaceLifecycle's 403 for a namespace being deleted, which is no missing permission
TERMINATING = "because it is being terminated"


class LogFollowers:
    """`kubectl logs -f` of every controller pod, from its start until the pod is gone (a deleted
    pod's log cannot be read afterwards)."""

    def __init__(self, kubeconfig: Path, folder: Path):
        self.kubeconfig, self.folder, self.procs = kubeconfig, folder, {}

    def follow(self, pod: str) -> None:
        if pod in self.procs:
            return
        out = (self.folder / f"{pod}.log").open("w")
        self.procs[pod] = subprocess.Popen(
            ["kubectl", "--kubeconfig", str(self.kubeconfig), "logs", "-f", "-n", incluster.NAMESPACE, pod],
            stdout=out, stderr=subprocess.STDOUT)

    def text(self, pod: str) -> str:
        return (self.folder / f"{pod}.log").read_text()

    def stop(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.terminate()
                proc.wait(10)


async def wait_complete(kube, namespace: str, name: str, timeout: float = 60) -> None:
    async def complete() -> bool:
        return is_true(await get_trainjob(kube, namespace, name), "Complete")
    await eventually(complete, timeout, f"TrainJob {namespace}/{name} Complete", interval=0.3)


async def test_deployment_on_process_nodes_serves_trainjobs_and_hands_over(
        kubeconfig: Path, kube, process_nodes, namespace, controller, tmp_path: Path):
    controller.stop()  # one controller only: the in-cluster one
    made: list[dict] = []
    logs = LogFollowers(kubeconfig, tmp_path)
    try:
        started = time.monotonic()
        made = await asyncio.to_thread(incluster.install, kubeconfig)
        assert {d["kind"] for d in made} >= {"Deployment", "ServiceAccount", "ClusterRoleBinding"}, made

        async def two_running() -> bool:
            pods = await incluster.controller_pods(kube)
            return len(pods) == 2 and all((p.get("status") or {}).get("phase") == "Running" for p in pods)
        await eventually(two_running, 60, "the Deployment's 2 pods Running", interval=0.3)
        pods = await incluster.controller_pods(kube)
        names = {p["metadata"]["name"] for p in pods}
        for pod in pods:
            logs.follow(pod["metadata"]["name"])
            assert pod["spec"]["nodeName"] in process_nodes, pod["spec"]["nodeName"]
            assert pod["spec"]["serviceAccountName"] == incluster.SERVICE_ACCOUNT
            found = []

            async def process_started(pod=pod) -> bool:  # Running means the shim runs; the Python process follows
                found[:] = [incluster.controller_process(pod)]
                return found[0] is not None
            await eventually(process_started, 30, f"`gangctl controller` under {pod['metadata']['name']}")
            _, argv, env = found[0]
            assert "--leader-elect" in argv and "--kubeconfig" not in argv, argv
            # in-cluster configuration: no kubeconfig of the agent's, the `kubernetes` Service's address
            assert "KUBECONFIG" not in env and env["KUBERNETES_SERVICE_HOST"] == "10.96.0.1", env

        async def one_leads() -> bool:
            return await incluster.lease_holder(kube) in names
        await eventually(one_leads, 30, "one of the 2 pods holding the Lease")
        leader = await incluster.lease_holder(kube)
        print(f"[in-cluster] installed, 2 pods Running, {leader} leads after {time.monotonic() - started:.1f}s")

        await submit(kube, trainjob("first", namespace, nodes=2, run_for="1s"))
        await wait_complete(kube, namespace, "first")
        # exactly one acquired: the standby's log says so only once it takes over
        acquired = [n for n in names if "acquired lease" in logs.text(n)]
        assert acquired == [leader], acquired

        # SIGTERM of the leader (the node agent's pod deletion): it releases the Lease, the other takes it
        [standby] = names - {leader}
        deleted = time.monotonic()
        await kube.delete(f"/api/v1/namespaces/{incluster.NAMESPACE}/pods/{leader}")

        async def handed_over() -> bool:
            return await incluster.lease_holder(kube) == standby
        await eventually(handed_over, 30, f"{standby} holding the Lease", interval=0.05)
        handover = time.monotonic() - deleted
        print(f"[in-cluster] SIGTERM of the leader: {standby} holds the Lease after {handover:.2f}s")
        assert handover <= HANDOVER_WITHIN, handover

        await submit(kube, trainjob("second", namespace, nodes=2, run_for="1s"))
        await wait_complete(kube, namespace, "second")

        async def leader_log_ended() -> bool:  # its log stream ends when the old pod is gone
            return logs.procs[leader].poll() is not None
        await eventually(leader_log_ended, 40, f"{leader} to exit")
        assert "releas" in logs.text(leader).lower(), logs.text(leader)[-2000:]
        for name in names:
            refused = [line for line in logs.text(name).splitlines()
                       if FORBIDDEN.search(line) and TERMINATING not in line]
            assert not refused, f"{name}: {refused[:3]}"
        # no pod of a deposed or stopped controller left behind: 2 replicas, one of them the standby
        pods = await incluster.controller_pods(kube)
        assert standby in {p["metadata"]["name"] for p in pods} and leader not in {p["metadata"]["name"] for p in pods}
    finally:
        logs.stop()
        try:
            await asyncio.to_thread(incluster.uninstall, kubeconfig, made)
        finally:
            controller.start()
            await wait_ready(controller)
