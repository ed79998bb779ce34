"""Transport faults for real: two leader-elected controllers reach the API server through a loopback
proxy (gangctl.harness.netfaults) that, in bursts, resets every connection and cuts responses
mid-body, while they run 20 TrainJobs. What a user checks afterwards:

- no controller process exited, except by losing the Lease (then it is started again, as its
  Deployment would);
- never two leaders writing: in the apiserver's audit log, every write of a replica's controller
  client lies inside that replica's tenure (from its Lease write that took over to the next
  replica's), and every write completed before another replica's takeover was received;
- all 20 TrainJobs Complete, each with exactly one child Job, created exactly once.
"""
from __future__ import annotations

import asyncio
import json
import re
import time
import uuid
from datetime import datetime
from pathlib import Path
from urllib.parse import urlsplit

import pytest
import yaml

from gangctl.cluster.local import LocalCluster
from gangctl.harness.netfaults import FaultyProxy
from gangctl.kube.client import ApiError
from gangctl.model.names import TRAINJOB_NAME
from gangctl.processes import ControllerProcess
from tests.integration.conftest import wait_ready
from tests.integration.helpers import eventually, get_trainjob, is_true, jobs_in, submit, trainjob

pytestmark = [pytest.mark.integration, pytest.mark.asyncio(loop_scope="session")]

LEASE_NS = "gangctl-system"  # where deploy/'s RBAC lets the controller's ServiceAccount hold a Lease
JOBS = 20
AGENT = re.compile(r"\((?P<identity>[^;()]+); (?P<role>[^()]+)\)")


def through(kubeconfig: Path, port: int, path: Path) -> tuple[Path, tuple[str, int]]:
    """A copy of `kubeconfig` whose server is 127.0.0.1:`port` (the proxy); and the real server's address."""
    doc = yaml.safe_load(kubeconfig.read_text())
    cluster = doc["clusters"][0]["cluster"]
    real = urlsplit(cluster["server"])
    cluster["server"] = f"https://127.0.0.1:{port}"
    path.write_text(yaml.safe_dump(doc))
    return path, (real.hostname, real.port)


def when(stamp: str) -> float:
    return datetime.fromisoformat(stamp).timestamp()


REVIEWS = {"selfsubjectaccessreviews", "subjectaccessreviews", "tokenreviews"}


def audit_writes(log: Path, replicas: tuple[str, ...]) -> list[dict]:
    """The audit log's writes by our replicas' clients: {identity, role, verb, resource, ns, name, code, t0, t1}."""
    out = []
    for line in log.read_text().splitlines():
        event = json.loads(line)
        agent = AGENT.search(event.get("userAgent") or "")
        if event.get("stage") != "ResponseComplete" or agent is None \
                or not agent["identity"].startswith(tuple(f"{r}_" for r in replicas)):
            continue
        ref = event.get("objectRef") or {}
        out.append({"identity": agent["identity"], "role": agent["role"], "verb": event["verb"],
                    "resource": ref.get("resource"), "sub": ref.get("subresource"), "ns": ref.get("namespace"),
                    "name": ref.get("name"), "code": (event.get("responseStatus") or {}).get("code"),
                    "t0": when(event["requestReceivedTimestamp"]), "t1": when(event["stageTimestamp"])})
    return out


def tenures(lease_writes: list[dict]) -> list[tuple[str, float, float]]:
    """(identity, start, end) of each leader: from its first successful Lease write after another's
    (its takeover answered) until the next replica's takeover was received."""
    out: list[tuple[str, float, float]] = []
    for w in sorted(lease_writes, key=lambda w: w["t1"]):
        if out and out[-1][0] == w["identity"]:
            continue
        if out:
            out[-1] = (out[-1][0], out[-1][1], w["t0"])
        out.append((w["identity"], w["t1"], float("inf")))
    return out


async def test_transport_faults_are_retried_and_never_two_leaders_write(kube, controller, controller_kubeconfig,
                                                                        cluster_settings, namespace, tmp_path):
    lease = f"gangctl-faults-{uuid.uuid4().hex[:6]}"
    audit_log = LocalCluster(cluster_settings, Path("/nonexistent")).audit_log_path
    controller.stop()  # the session's controller (no election) would be a third writer
    proxy = FaultyProxy(("127.0.0.1", 0), seed=34)
    port = await proxy.start()
    config, proxy.upstream = through(controller_kubeconfig, port, tmp_path / "proxied.kubeconfig")
    replicas = {pod: ControllerProcess(config, tmp_path / f"{pod}.log", env={"POD_NAME": pod},
                                       args=("--leader-elect", "--leader-elect-namespace", LEASE_NS,
                                             "--leader-elect-lease-name", lease))
                for pod in ("faults-a", "faults-b")}
    exits: list[tuple[str, int, bool]] = []   # (replica, exit code, its log says it lost the Lease)
    bursts = asyncio.create_task(proxy.bursts(every=(2.0, 5.0), lasting=(0.3, 1.5)))

    marks = {pod: 0 for pod in replicas}  # where each replica's log of its current run starts

    async def supervise() -> None:
        """Start a replica that exited again, as its Deployment would; record why it exited."""
        while True:
            for pod, ctl in replicas.items():
                if ctl.proc is not None and not ctl.alive():
                    text = ctl.log_path.read_text()
                    exits.append((pod, ctl.proc.returncode, "lost lease" in text[marks[pod]:]))
                    marks[pod] = len(text)
                    ctl.start()
            await asyncio.sleep(0.2)
    supervisor = None
    started = time.monotonic()
    try:
        for ctl in replicas.values():
            ctl.start()
        supervisor = asyncio.create_task(supervise())
        await asyncio.gather(*(asyncio.to_thread(ctl.wait_ready, 90) for ctl in replicas.values()))
        for i in range(JOBS):
            await submit(kube, trainjob(f"tf-{i:02d}", namespace, nodes=1, run_for="2s"))

        async def all_complete() -> bool:
            # and faulted for long enough: on a quiet machine the jobs can finish in two bursts, and the
            # replicas must go on renewing the Lease and serving through a third.
            done = all([is_true(await get_trainjob(kube, namespace, f"tf-{i:02d}"), "Complete") for i in range(JOBS)])
            return done and proxy.bursts_done >= 3
        await eventually(all_complete, 150, f"all {JOBS} TrainJobs Complete through the faulty proxy, 3 bursts",
                         interval=1.0)
        bursts.cancel()
        supervisor.cancel()
        codes = {pod: await asyncio.to_thread(ctl.stop) for pod, ctl in replicas.items()}
    finally:
        bursts.cancel()
        if supervisor is not None:
            supervisor.cancel()
        for ctl in replicas.values():
            ctl.stop()
        await proxy.close()
        controller.start()
        await wait_ready(controller)
        try:
            await kube.delete(f"/apis/coordination.k8s.io/v1/namespaces/{LEASE_NS}/leases/{lease}")
        except ApiError:
            pass
    took = time.monotonic() - started
    print(f"\n[transport faults] {took:.0f}s: {proxy.bursts_done} bursts, {proxy.resets} connections reset, "
          f"{proxy.cuts} responses cut mid-body, of {proxy.connections}; exits {exits}")
    assert proxy.bursts_done >= 3 and proxy.resets and proxy.cuts, "the proxy did fault the connections"

    # No process exited, except by losing the Lease (the elector's own "lost lease" line, exit 1).
    assert all(code == 1 and lost for _, code, lost in exits), exits
    unclean = {pod: replicas[pod].log_path.read_text()[-6000:] for pod, code in codes.items() if code != 0}
    assert not unclean, f"both replicas stop cleanly on SIGTERM: {codes}; the log's end of each that did not: {unclean}"

    # Never two leaders writing, by the apiserver's own account.
    writes = audit_writes(audit_log, tuple(replicas))
    lease_writes = [w for w in writes if w["resource"] == "leases" and w["name"] == lease and w["code"] in (200, 201)]
    leaders = tenures(lease_writes)
    assert leaders, "the audit log shows the Lease taken"
    # Reviews (SelfSubjectAccessReviews at start, which every replica sends) change no object: not writes.
    fenced = [w for w in writes if w["role"] == "controller" and w["resource"] not in REVIEWS]
    assert len(fenced) > JOBS, f"the audit log shows the controllers' writes: {len(fenced)}"
    outside = [w for w in fenced if not any(who == w["identity"] and start <= w["t0"] and w["t1"] < end
                                             for who, start, end in leaders)]
    assert not outside, f"writes outside their replica's tenure {leaders}: {outside[:3]}"

    # Each TrainJob has exactly one child Job, created exactly once (a server-side apply that creates
    # answers 201).
    created = sorted(w["name"] for w in fenced if w["resource"] == "jobs" and w["verb"] in ("create", "patch")
                     and not w["sub"] and w["ns"] == namespace and w["code"] == 201)
    assert created == sorted(f"tf-{i:02d}-node-0" for i in range(JOBS)), created
    children: dict[str, int] = {}
    for job in await jobs_in(kube, namespace):
        owner = job["metadata"]["labels"][TRAINJOB_NAME]
        children[owner] = children.get(owner, 0) + 1
    assert children == {f"tf-{i:02d}": 1 for i in range(JOBS)}, children
