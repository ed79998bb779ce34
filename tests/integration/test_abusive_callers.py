"""The controller's endpoints under callers that are not what they claim (docs/install.md "Abusive
callers"): a flood of invented tokens against /metrics and the progress endpoint, a pod made by hand
with a TrainJob's labels, bodies no trainer sends, and a serving Secret that cannot serve. Each runs
its own `gangctl controller` (leader-elected, --metrics-auth, its progress endpoint on a loopback port
of its own, its certificate in a Secret of the test's namespace) against the session cluster, with
real pod-bound tokens for KWOK pods of a real TrainJob."""
from __future__ import annotations

import asyncio
import base64
import json
import ssl
import time
from collections import Counter
from pathlib import Path

import aiohttp
import pytest
import pytest_asyncio

from gangctl.api.resources import PODS, SECRETS
from gangctl.kube import serving_cert
from gangctl.kube.client import ApiError, Kube
from gangctl.model import progress
from gangctl.policy.review_gate import Limits
from gangctl.processes import ControllerProcess, free_port
from tests.integration.conftest import wait_ready
from tests.integration.helpers import (eventually, get_trainjob, is_true, pods_of, service_account, submit, token_for,
                                       trainjob)

pytestmark = [pytest.mark.integration, pytest.mark.asyncio(loop_scope="session")]


@pytest_asyncio.fixture
async def alone(controller):
    """The session's controller stopped while the test's own runs: two controllers configured with
    different progress endpoints would write different Job templates for the same TrainJob. Started
    again before the namespace goes (it lets go of the jobs' result finalizers)."""
    controller.stop()
    yield
    controller.start()
    await wait_ready(controller)

LEASE = "gangctl-abuse"
SECRET = "progress-tls"
FLOOD_SOURCES = ["127.0.0.2", "127.0.0.3", "127.0.0.4", "127.0.0.5"]  # loopback addresses, not the pods'


def progress_controller(kubeconfig: Path, log: Path, namespace: str, port: int, *args: str,
                        env: dict[str, str] | None = None) -> ControllerProcess:
    return ControllerProcess(kubeconfig, log, env={
        "POD_NAME": "edge", "GANGCTL_TRAINER_STATUS_URL": f"https://127.0.0.1:{port}",
        "GANGCTL_TRAINER_STATUS_BIND_ADDRESS": f"127.0.0.1:{port}",
        "GANGCTL_TRAINER_STATUS_SECRET": f"{namespace}/{SECRET}", **(env or {})}, args=args)


def status_url(port: int, namespace: str, name: str) -> str:
    return progress.status_url(f"https://127.0.0.1:{port}", namespace, name)


async def ca_of(kube: Kube, namespace: str) -> str:
    secret = await kube.get(SECRETS.path(namespace, SECRET))
    return base64.b64decode(secret["data"]["ca.crt"]).decode()


async def pod_token(kube: Kube, pod: dict) -> str:
    """A token bound to `pod` for the trainer audience: what the kubelet projects into a trainer pod."""
    meta = pod["metadata"]
    review = await kube.create(
        f"/api/v1/namespaces/{meta['namespace']}/serviceaccounts/{pod['spec'].get('serviceAccountName') or 'default'}"
        "/token", {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
                   "spec": {"audiences": [progress.AUDIENCE], "expirationSeconds": 600,
                            "boundObjectRef": {"apiVersion": "v1", "kind": "Pod", "name": meta["name"],
                                               "uid": meta["uid"]}}})
    return review["status"]["token"]


async def running_pod(kube: Kube, namespace: str, name: str) -> dict:
    """The first Running pod of KWOK TrainJob `name` (submitted here)."""
    await submit(kube, trainjob(name, namespace, nodes=1, gpus=1))
    found: list[dict] = []

    async def running() -> bool:
        found[:] = [p for p in await pods_of(kube, namespace, name) if p["status"].get("phase") == "Running"]
        return bool(found)
    await eventually(running, 60, f"a Running pod of TrainJob {name}")
    return found[0]


REPORT = {"trainerStatus": {"progressPercentage": 42, "metrics": [{"name": "loss", "value": "0.5"}]}}


async def post(session: aiohttp.ClientSession, url: str, token: str, body: bytes | None = None) -> tuple[int, str]:
    data = json.dumps(REPORT).encode() if body is None else body
    async with session.post(url, data=data, headers={"Authorization": f"Bearer {token}"}) as resp:
        return resp.status, await resp.text()


def verified(ca_pem: str) -> aiohttp.TCPConnector:
    return aiohttp.TCPConnector(ssl=ssl.create_default_context(cadata=ca_pem))


async def apiserver_tokenreviews(kube: Kube) -> float:
    """TokenReviews the API server has answered (apiserver_request_total), from its own /metrics."""
    text = await kube.text("/metrics")
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith("apiserver_request_total{") and 'resource="tokenreviews"' in line)


async def lease(kube: Kube, namespace: str) -> dict:
    return (await kube.get(f"/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases/{LEASE}"))["spec"]


async def metrics_reader(kube: Kube, namespace: str) -> tuple[str, list[str]]:
    """A ServiceAccount allowed GET /metrics (as Prometheus is): its token, and the cluster objects to delete."""
    role = f"{namespace}-metrics-reader"
    await kube.create("/apis/rbac.authorization.k8s.io/v1/clusterroles", {
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole", "metadata": {"name": role},
        "rules": [{"nonResourceURLs": ["/metrics"], "verbs": ["get"]}]})
    binding = await service_account(kube, namespace, "scraper", role)
    return await token_for(kube, namespace, "scraper"), [
        f"/apis/rbac.authorization.k8s.io/v1/clusterrolebindings/{binding}",
        f"/apis/rbac.authorization.k8s.io/v1/clusterroles/{role}"]


async def delete_quietly(kube: Kube, paths: list[str]) -> None:
    for path in paths:
        try:
            await kube.delete(path)
        except ApiError:
            pass


async def flood(url: str, source: str, count: int, codes: Counter, concurrency: int = 16) -> None:
    """`count` requests from `source` to `url`, each with a token never issued (POST for the progress
    endpoint, GET for /metrics); their answers counted in `codes`."""
    connector = aiohttp.TCPConnector(local_addr=(source, 0), ssl=False, limit=concurrency)
    https = url.startswith("https://")
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=30)) as session:
        async def one(i: int) -> None:
            headers = {"Authorization": f"Bearer invented-{source}-{i}-{time.monotonic_ns()}"}
            call = session.post(url, data=b"{}", headers=headers) if https else session.get(url, headers=headers)
            async with call as resp:
                codes[resp.status] += 1
        await asyncio.gather(*(one(i) for i in range(count)))


async def test_a_flood_of_invented_tokens_costs_neither_the_lease_nor_a_real_report(kube, kubeconfig, namespace,
                                                                                   tmp_path, alone):
    port = free_port()
    ctl = progress_controller(kubeconfig, tmp_path / "controller.log", namespace, port, "--metrics-auth",
                              "--leader-elect", "--leader-elect-namespace", namespace,
                              "--leader-elect-lease-name", LEASE)
    scraper, cleanup = await metrics_reader(kube, namespace)
    try:
        ctl.start()
        await wait_ready(ctl)

        async def leading() -> bool:
            try:
                return (await lease(kube, namespace)).get("holderIdentity", "").startswith("edge_")
            except ApiError:
                return False
        await eventually(leading, 20, "the controller holding the Lease")
        pod = await running_pod(kube, namespace, "reporter")
        report_url = status_url(port, namespace, "reporter")
        ca = await ca_of(kube, namespace)
        before_lease, before_reviews = await lease(kube, namespace), await apiserver_tokenreviews(kube)

        per_endpoint = 4000
        codes = {"metrics": Counter(), "progress": Counter()}
        real: list[tuple[str, int, str]] = []
        done = asyncio.Event()

        async def trainer_and_scraper() -> None:
            """Meanwhile, from 127.0.0.1 (where the local cluster's pods come from, through netd's relay):
            a report with a new pod token (the first time that token is seen) and a scrape, every second."""
            async with aiohttp.ClientSession(connector=verified(ca)) as reports, aiohttp.ClientSession() as scrapes:
                while not done.is_set():
                    real.append(("report", *await post(reports, report_url, await pod_token(kube, pod))))
                    async with scrapes.get(ctl.url + "/metrics", headers={"Authorization": f"Bearer {scraper}"}) as r:
                        real.append(("scrape", r.status, ""))
                    await asyncio.sleep(1.0)

        async def attack() -> None:
            share = per_endpoint // len(FLOOD_SOURCES)
            try:
                await asyncio.gather(*(flood(url, source, share, codes[which]) for source in FLOOD_SOURCES
                                       for which, url in (("metrics", ctl.url + "/metrics"), ("progress", report_url))))
            finally:
                done.set()
        started = time.monotonic()
        await asyncio.gather(attack(), trainer_and_scraper())
        took = time.monotonic() - started
        print(f"\n[abuse] {2 * per_endpoint} requests from {len(FLOOD_SOURCES)} sources in {took:.1f}s: "
              f"/metrics {dict(codes['metrics'])}, progress {dict(codes['progress'])}; real {Counter(real)}")

        # Every real report and scrape went through, though the flood's were refused (401, or 429 early).
        assert real and all(code == 200 for _, code, _ in real), real
        for which, answered in codes.items():
            assert sum(answered.values()) == per_endpoint and set(answered) <= {401, 429}, (which, answered)
            assert answered[429] > answered[401], (which, answered)
        # Reviews stayed under the per-source caps (one token bucket per flooding source), whatever the flood.
        reviews = await apiserver_tokenreviews(kube) - before_reviews
        limits = Limits()
        cap = len(FLOOD_SOURCES) * (limits.source_burst + limits.source_rate * took) + len(real)
        assert reviews <= cap, f"{reviews:g} TokenReviews for a {took:.1f}s flood (cap {cap:g})"
        exported = (await scrape_with(ctl.url, scraper))
        assert exported['gangctl_access_reviews_refused_total{limit="source"}'] >= per_endpoint, exported
        # The leader kept its Lease all along: still the holder, no transition, renewed within the deadline.
        after = await lease(kube, namespace)
        assert ctl.alive() and after["holderIdentity"] == before_lease["holderIdentity"]
        assert after.get("leaseTransitions") == before_lease.get("leaseTransitions")
        tj = await get_trainjob(kube, namespace, "reporter")
        assert tj["status"]["trainerStatus"]["progressPercentage"] == 42
    finally:
        ctl.stop()
        await delete_quietly(kube, cleanup)


async def scrape_with(url: str, token: str) -> dict[str, float]:
    async with aiohttp.ClientSession() as session:
        async with session.get(url + "/metrics", headers={"Authorization": f"Bearer {token}"}) as resp:
            text = await resp.text()
    return {line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
            if line and not line.startswith("#")}


async def test_only_a_live_pod_of_the_trainjob_may_report_and_bad_bodies_are_refused(kube, kubeconfig, namespace,
                                                                                    tmp_path, alone):
    port = free_port()
    ctl = progress_controller(kubeconfig, tmp_path / "controller.log", namespace, port)
    try:
        ctl.start()
        await wait_ready(ctl)
        pod = await running_pod(kube, namespace, "victim")
        url = status_url(port, namespace, "victim")
        ca = await ca_of(kube, namespace)
        # A pod made by hand with the TrainJob's labels (anyone allowed to create pods can): no owner.
        forged = await kube.create(PODS.path(namespace), {
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "forged", "labels": dict(pod["metadata"]["labels"])},
            "spec": {"containers": [{"name": "c", "image": "busybox"}], "nodeName": pod["spec"]["nodeName"],
                     "tolerations": pod["spec"].get("tolerations") or []}})

        async with aiohttp.ClientSession(connector=verified(ca)) as session:
            code, text = await post(session, url, await pod_token(kube, forged))
            assert code == 403 and "was not made for TrainJob" in text, (code, text)
            real = await pod_token(kube, pod)
            assert (await post(session, url, real))[0] == 200
            # Bodies no trainer sends: 400/413 with a message, never a 500.
            for body, want, says in ((b" " * (256 * 1024 + 1), 413, "over 256 KiB"),
                                     (b"[" * 50_000, 400, "nested too deeply"),
                                     (b'{"trainerStatus": {"progressPercentage": ' + b"9" * 5000 + b"}}", 400, "JSON"),
                                     (b"\xff\xfe", 400, "JSON")):
                code, text = await post(session, url, real, body)
                assert code == want and says in text, (body[:20], code, text)
            # The TrainJob's pod, once finished, may report no more.
            await kube.merge_patch(PODS.path(namespace, pod["metadata"]["name"], "status"),
                                   {"status": {"phase": "Succeeded"}})

            async def refused() -> bool:
                code, text = await post(session, url, real)
                return code == 403 and "has finished (Succeeded)" in text
            await eventually(refused, 10, "a report from the finished pod refused")
    finally:
        ctl.stop()


async def test_a_malformed_serving_secret_turns_the_endpoint_off_not_the_controller(kube, kubeconfig, namespace,
                                                                                    tmp_path, alone):
    await kube.create(SECRETS.path(namespace), {
        "apiVersion": "v1", "kind": "Secret", "metadata": {"name": SECRET},
        "data": {"ca.crt": base64.b64encode(b"not a certificate").decode(), "tls.crt": "", "tls.key": ""}})
    port = free_port()
    ctl = progress_controller(kubeconfig, tmp_path / "controller.log", namespace, port,
                              env={"GANGCTL_TRAINER_STATUS_CHECK_SECONDS": "1"})
    try:
        ctl.start()

        async def readyz() -> tuple[int, str]:
            async with aiohttp.ClientSession() as session, session.get(ctl.url + "/readyz") as resp:
                return resp.status, await resp.text()

        async def names_the_problem() -> bool:
            try:
                code, text = await readyz()
            except aiohttp.ClientError:
                return False
            # ready all the same (an optional feature never holds a rollout), the problem named
            return code == 200 and f"secret {namespace}/{SECRET}: data.ca.crt is not a PEM certificate" in text
        await eventually(names_the_problem, 30, "/readyz naming the malformed Secret")
        assert ctl.alive()
        # TrainJobs are served all the same.
        await submit(kube, trainjob("served", namespace, nodes=1, gpus=1, run_for="1s"))

        seen: list[dict] = [{}]

        async def complete() -> bool:
            seen[0] = await get_trainjob(kube, namespace, "served")
            return is_true(seen[0], "Complete")
        try:
            await eventually(complete, 60, "the TrainJob Complete without the progress endpoint")
        except AssertionError as err:
            pods = [(p["metadata"]["name"], p["status"].get("phase")) for p in await pods_of(kube, namespace, "served")]
            raise AssertionError(f"{err}: status {seen[0].get('status')}, pods {pods}") from None
        assert "not a PEM certificate" in ctl.log_path.read_text()

        # Deleted, the Secret is made anew: the endpoint comes on without a restart, and /readyz is clear.
        await kube.delete(SECRETS.path(namespace, SECRET))

        async def ready() -> bool:
            return await readyz() == (200, "ok")
        await eventually(ready, 30, "/readyz clear once the Secret is made anew")
        ca = await ca_of(kube, namespace)
        async with aiohttp.ClientSession(connector=verified(ca)) as session:
            code, _ = await post(session, status_url(port, namespace, "served"), "invented")
            assert code == 401, "served, with the new certificate"
    finally:
        ctl.stop()


async def test_a_certificate_re_issued_before_expiry_is_served_without_a_restart(kube, kubeconfig, namespace,
                                                                                 tmp_path):
    port = free_port()
    ctl = progress_controller(kubeconfig, tmp_path / "controller.log", namespace, port,
                              env={"GANGCTL_TRAINER_STATUS_CHECK_SECONDS": "1"})
    try:
        ctl.start()
        await wait_ready(ctl)
        secret = await kube.get(SECRETS.path(namespace, SECRET))
        data = {k: base64.b64decode(v).decode() for k, v in secret["data"].items()}
        served_first = await asyncio.to_thread(served_certificate, port, data["ca.crt"])
        # The certificate is due: 20 days left (an admin's copy, or a year gone by).
        from datetime import datetime, timedelta, timezone
        due = datetime.now(timezone.utc) - timedelta(days=serving_cert.SERVING_DAYS - 20)
        data["tls.crt"], data["tls.key"] = serving_cert.new_serving_cert(data["ca.crt"], data["ca.key"],
                                                                         ["127.0.0.1"], due)
        secret["data"] = {k: base64.b64encode(v.encode()).decode() for k, v in data.items()}
        await kube.request("PUT", SECRETS.path(namespace, SECRET), body=secret)

        async def re_issued() -> bool:
            current = await kube.get(SECRETS.path(namespace, SECRET))
            cert = base64.b64decode(current["data"]["tls.crt"]).decode()
            return cert != data["tls.crt"] and serving_cert.serves(cert, ["127.0.0.1"], datetime.now(timezone.utc))
        await eventually(re_issued, 20, "the controller re-issuing the certificate (same CA)")
        current = base64.b64decode((await kube.get(SECRETS.path(namespace, SECRET)))["data"]["tls.crt"]).decode()

        async def serving_it() -> bool:
            return await asyncio.to_thread(served_certificate, port, data["ca.crt"]) == der(current)
        await eventually(serving_it, 10, "the re-issued certificate served by the same process")
        assert served_first != der(current) and ctl.alive()
    finally:
        ctl.stop()


def der(pem: str) -> bytes:
    return ssl.PEM_cert_to_DER_cert(pem)


def served_certificate(port: int, ca_pem: str) -> bytes:
    """The certificate the endpoint shows a client that trusts only `ca_pem` (DER)."""
    import socket

    context = ssl.create_default_context(cadata=ca_pem)
    with socket.create_connection(("127.0.0.1", port), timeout=5) as raw:
        with context.wrap_socket(raw, server_hostname="127.0.0.1") as tls:
            return tls.getpeercert(binary_form=True)
