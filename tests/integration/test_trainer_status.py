"""status.trainerStatus on the real cluster (Trainer KEP-2779): real torchrun pods on process nodes
report their progress to gangctl's HTTPS endpoint with their own pod-bound tokens, through the
cluster network to the controller on the host, and `kubectl get trainjob` shows it.

One TrainJob does everything a user's script would: the contract as the KEP's own snippet sends it
(urllib + the three variables), gangctl's helper, the refusals a misbehaving script meets (no token,
another TrainJob's URL, a malformed body, a burst past the rate limit), and reports that keep
arriving after the controller restarts (its CA and certificate live in a Secret, so the URL and CA the
pods were given stay valid).
"""
from __future__ import annotations

import asyncio
import json
import ssl
import subprocess
import time
import urllib.error
import urllib.request

import pytest

from gangctl.api.resources import CONFIGMAPS, SERVICES
from gangctl.kube import host_controller
from tests.integration.conftest import wait_ready
from tests.integration.helpers import eventually, get_trainjob, is_true, pods_of, submit

pytestmark = pytest.mark.integration

# Rank 0 probes the refusals (printing each answer), then reports once a second with gangctl's helper
# for HOLD seconds, then 100 %.
SCRIPT = r"""cat > /tmp/progress_$$.py <<'PY'
import json, os, ssl, sys, time, urllib.request, urllib.error
import torch.distributed as dist
from gangctl.trainer_progress import report

url, ca, token_file = (os.environ[k] for k in ("KUBEFLOW_TRAINER_STATUS_URL", "KUBEFLOW_TRAINER_STATUS_CA_CERT",
                                               "KUBEFLOW_TRAINER_STATUS_TOKEN"))
ctx = ssl.create_default_context(cafile=ca)

def post(target, body, token=True):
    headers = {"Content-Type": "application/json"}
    if token:
        headers["Authorization"] = "Bearer " + open(token_file).read()
    req = urllib.request.Request(target, data=body, headers=headers, method="POST")
    try:
        with urllib.request.urlopen(req, context=ctx, timeout=10) as r:
            return r.status, ""
    except urllib.error.HTTPError as e:
        return e.code, e.headers.get("Retry-After") or ""

dist.init_process_group("gloo")
rank = dist.get_rank()
if rank == 0:
    # the KEP's own snippet: urllib, the CA file, the token file
    first = json.dumps({"trainerStatus": {"progressPercentage": 5, "metrics": [{"name": "loss", "value": "2.5"}],
                                          "lastUpdatedTime": "2026-01-01T00:00:00Z"}}).encode()
    print("FIRST", post(url, first)[0], flush=True)
    print("NOTOKEN", post(url, first, token=False)[0], flush=True)
    print("OTHERJOB", post(url.replace("/trainjobs/" + os.environ["TJ"] + "/", "/trainjobs/someone-else/"), first)[0], flush=True)
    print("BADBODY", post(url, b'{"trainerStatus": {"progressPercentage": 101}}')[0], flush=True)
    burst = [post(url, first) for _ in range(12)]
    print("BURST", " ".join(f"{c}:{r}" for c, r in burst), flush=True)
    time.sleep(2)  # let the bucket refill a little
dist.barrier()
deadline = time.time() + float(os.environ["HOLD"])
step = 0
while time.time() < deadline:
    step += 1
    if rank == 0:
        code = report(progress=min(99, 10 + step), remaining_seconds=int(deadline - time.time()),
                      metrics={"loss": round(2.0 / step, 4), "step": step})
        print("REPORT", step, code, flush=True)
    time.sleep(1.0)
dist.barrier()
if rank == 0:
    print("FINAL", report(progress=100, remaining_seconds=0, metrics={"loss": 0.01, "step": step}), flush=True)
dist.destroy_process_group()
PY
exec torchrun /tmp/progress_$$.py"""


def trainjob(name: str, namespace: str, runtime: str, hold: int) -> dict:
    return {"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {"runtimeRef": {"name": runtime, "kind": "ClusterTrainingRuntime"},
                     "trainer": {"numNodes": 2, "command": ["bash", "-c", SCRIPT],
                                 "env": [{"name": "HOLD", "value": str(hold)}, {"name": "TJ", "value": name}],
                                 "resourcesPerNode": {"requests": {"cpu": "250m"}, "limits": {"cpu": "1"}}}}}


def kubectl(kubeconfig, *args: str) -> str:
    out = subprocess.run(["kubectl", *args], env={"KUBECONFIG": str(kubeconfig), "PATH": "/usr/bin:/bin:/usr/local/bin"},
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return out.stdout


async def test_trainer_pods_report_progress_and_only_for_their_own_trainjob(
        kube, kubeconfig, namespace, controller, process_runtime):
    name = "progress"
    await submit(kube, trainjob(name, namespace, process_runtime, hold=30))

    async def reported(at_least: int):
        async def check() -> bool:
            tj = await get_trainjob(kube, namespace, name)
            assert not is_true(tj, "Failed"), tj.get("status")
            return (((tj.get("status") or {}).get("trainerStatus") or {}).get("progressPercentage") or 0) >= at_least
        return check
    await eventually(await reported(11), 120, "the first periodic report in status.trainerStatus")

    pods = await pods_of(kube, namespace, name)
    rank0 = next(p for p in pods if p["metadata"]["annotations"]["batch.kubernetes.io/job-completion-index"] == "0")
    logs = kubectl(kubeconfig, "logs", "-n", namespace, rank0["metadata"]["name"])
    lines = {line.split()[0]: line.split()[1:] for line in logs.splitlines() if line.split()}
    assert lines["FIRST"] == ["200"], logs           # the KEP's snippet, as written
    assert lines["NOTOKEN"] == ["401"], logs
    assert lines["OTHERJOB"] == ["403"], logs        # its token names its pod, which is not someone-else's
    assert lines["BADBODY"] == ["400"], logs
    codes = [c.split(":") for c in lines["BURST"]]
    assert {"200", "429"} == {c for c, _ in codes}, logs   # burst 10, then 1 a second
    assert all(int(r) >= 1 for c, r in codes if c == "429"), "a 429 says when to retry"

    # What the pods were given: the URL of the Service standing for this controller, the CA in
    # <trainjob>-tls-config, a token for the trainer audience.
    env = {e["name"]: e.get("value") for e in rank0["spec"]["containers"][0]["env"]}
    assert env["KUBEFLOW_TRAINER_STATUS_URL"] == (
        f"{host_controller.url()}/apis/trainer.kubeflow.org/v1alpha1/namespaces/{namespace}/trainjobs/{name}/status")
    ca = (await kube.get(CONFIGMAPS.path(namespace, f"{name}-tls-config")))["data"]["ca.crt"]

    # A token the API server issued for its own audience is not a report token, even from the same pod.
    api_token = (await kube.create(f"/api/v1/namespaces/{namespace}/serviceaccounts/default/token", {
        "apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
        "spec": {"boundObjectRef": {"apiVersion": "v1", "kind": "Pod", "name": rank0["metadata"]["name"],
                                    "uid": rank0["metadata"]["uid"]}}}))["status"]["token"]
    svc = await kube.get(SERVICES.path(host_controller.NAMESPACE, host_controller.SERVICE))
    port = int(svc["metadata"]["annotations"][host_controller.HOST_PORT_ANNOTATION])
    code = await asyncio.to_thread(post_from_host, port, ca, env["KUBEFLOW_TRAINER_STATUS_URL"], api_token)
    assert code == 401

    # The controller restarts: reports made after it are taken with the URL and CA given before it.
    controller.stop()
    restarted = time.time()
    controller.start()
    await wait_ready(controller)

    async def reported_since_restart() -> bool:
        tj = await get_trainjob(kube, namespace, name)
        status = (tj.get("status") or {}).get("trainerStatus") or {}
        return status.get("lastUpdatedTime", "") > time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(restarted + 1))
    await eventually(reported_since_restart, 60, "a report accepted by the restarted controller")

    async def complete() -> bool:
        tj = await get_trainjob(kube, namespace, name)
        assert not is_true(tj, "Failed"), tj.get("status")
        return is_true(tj, "Complete")
    await eventually(complete, 120, "the TrainJob Complete")
    final = (await get_trainjob(kube, namespace, name))["status"]["trainerStatus"]
    # The reconciler's own status writes (Complete) never send back or drop the reported status.
    assert final["progressPercentage"] == 100 and final["estimatedRemainingSeconds"] == 0, final
    assert {m["name"]: m["value"] for m in final["metrics"]}["loss"] == "0.01", final
    header, row = kubectl(kubeconfig, "get", "trainjob", "-n", namespace, name).splitlines()[:2]
    assert row[header.index("PROGRESS %"):].split()[0] == "100", (header, row)


def post_from_host(port: int, ca_pem: str, url: str, token: str) -> int:
    """POST the way a pod would, from the host's loopback (the certificate names the Service, so the
    TLS check uses that name)."""
    context = ssl.create_default_context(cadata=ca_pem)
    context.check_hostname = False  # loopback: the chain is still verified against the CA
    path = "/" + url.split("/", 3)[3]
    body = json.dumps({"trainerStatus": {"progressPercentage": 1}}).encode()
    request = urllib.request.Request(f"https://127.0.0.1:{port}{path}", data=body, method="POST",
                                     headers={"Authorization": f"Bearer {token}"})
    try:
        with urllib.request.urlopen(request, context=context, timeout=10) as answer:  # noqa: S310 - loopback
            return answer.status
    except urllib.error.HTTPError as err:
        return err.code

