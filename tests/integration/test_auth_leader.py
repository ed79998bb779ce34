"""The controller as a platform admin runs it: ServiceAccount credentials (token-only and exec-plugin
kubeconfigs), leader election between two replicas (handover on SIGTERM, failover on SIGKILL), and
/metrics behind TokenReview + SubjectAccessReview. Every assertion is on the API server's objects."""
from __future__ import annotations

import asyncio
import signal
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import yaml

from gangctl.kube.auth import load_configuration
from gangctl.kube.client import ApiError, Kube
from gangctl.kube.leader import LeaderElector
from gangctl.policy.leader import LeaseTimings
from gangctl.processes import ControllerProcess
from tests.integration.conftest import wait_ready
from tests.integration.helpers import (eventually, get_trainjob, is_true, service_account, submit, token_for, trainjob,
                                       user_kubeconfig)

pytestmark = [pytest.mark.integration, pytest.mark.asyncio(loop_scope="session")]

PLUGIN = Path(__file__).parent / "data" / "exec_credential_plugin.py"
LEASE = "gangctl-test-leader"


async def delete_quietly(kube: Kube, path: str) -> None:
    try:
        await kube.delete(path)
    except ApiError:
        pass


async def whoami(kube: Kube) -> str:
    review = await kube.create("/apis/authentication.k8s.io/v1/selfsubjectreviews", {
        "apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"})
    return review["status"]["userInfo"]["username"]


async def completes(kube: Kube, namespace: str, name: str, timeout: float = 60) -> None:
    await submit(kube, trainjob(name, namespace, nodes=2, run_for="1s"))

    async def complete() -> bool:
        return is_true(await get_trainjob(kube, namespace, name), "Complete")
    await eventually(complete, timeout, f"TrainJob {name} Complete")


async def started(ctl: ControllerProcess) -> ControllerProcess:
    ctl.start()
    await wait_ready(ctl)
    return ctl


# --- (a) a kubeconfig holding only a ServiceAccount token ------------------------------------------------
async def test_token_only_kubeconfig_runs_the_controller(kube, kubeconfig, namespace, tmp_path):
    binding = await service_account(kube, namespace, "gangctl", "cluster-admin")
    try:
        token = await token_for(kube, namespace, "gangctl")
        config = user_kubeconfig(kubeconfig, tmp_path / "token.kubeconfig", {"token": token})
        as_sa = await Kube.connect(config)
        try:
            assert await whoami(as_sa) == f"system:serviceaccount:{namespace}:gangctl"
        finally:
            await as_sa.close()
        ctl = await started(ControllerProcess(config, tmp_path / "controller.log"))
        try:
            await completes(kube, namespace, "by-token")
        finally:
            assert ctl.stop() == 0
    finally:
        await delete_quietly(kube, f"/apis/rbac.authorization.k8s.io/v1/clusterrolebindings/{binding}")


async def test_token_file_is_re_read_when_rotated_and_tls_server_name_is_honoured(kube, kubeconfig, namespace,
                                                                                   tmp_path):
    for name in ("first", "second"):
        await service_account(kube, namespace, name, None)
    token_file = tmp_path / "token"
    token_file.write_text(await token_for(kube, namespace, "first") + "\n")
    config = user_kubeconfig(kubeconfig, tmp_path / "file.kubeconfig", {"tokenFile": str(token_file)})
    client = await Kube.connect(config)
    try:
        assert await whoami(client) == f"system:serviceaccount:{namespace}:first"
        rotated = tmp_path / "token.new"
        rotated.write_text(await token_for(kube, namespace, "second"))
        rotated.replace(token_file)  # atomically, as kubelet rotates a projected token

        async def second() -> bool:
            return await whoami(client) == f"system:serviceaccount:{namespace}:second"
        await eventually(second, 5, "the rotated token in use")
    finally:
        await client.close()

    # tls-server-name: the name verified in the server's certificate, whatever the URL says.
    token = await token_for(kube, namespace, "first")
    for server_name, ok in (("kubernetes.default.svc", True), ("not-in-the-certificate.example", False)):
        config = user_kubeconfig(kubeconfig, tmp_path / "sni.kubeconfig", {"token": token})
        doc = yaml.safe_load(config.read_text())
        doc["clusters"][0]["cluster"]["tls-server-name"] = server_name
        config.write_text(yaml.safe_dump(doc))
        client = await Kube.connect(config)
        try:
            if ok:
                assert await whoami(client) == f"system:serviceaccount:{namespace}:first"
            else:
                with pytest.raises(OSError, match="certificate"):
                    await whoami(client)
        finally:
            await client.close()


async def test_in_cluster_configuration_and_service_account_token_rotation(kube, kubeconfig, namespace, tmp_path):
    """What a pod sees (KUBERNETES_SERVICE_HOST/PORT, token and ca.crt in the service-account folder),
    here in a folder of the test's own."""
    for name in ("first", "second"):
        await service_account(kube, namespace, name, None)
    cluster = yaml.safe_load(kubeconfig.read_text())["clusters"][0]["cluster"]
    host, port = cluster["server"].removeprefix("https://").rsplit(":", 1)
    folder = tmp_path / "serviceaccount"
    folder.mkdir()
    (folder / "ca.crt").write_text(Path(cluster["certificate-authority"]).read_text())
    (folder / "token").write_text(await token_for(kube, namespace, "first"))
    env = {"KUBERNETES_SERVICE_HOST": host, "KUBERNETES_SERVICE_PORT": port}
    client = Kube(await load_configuration(None, environ=env, serviceaccount_dir=folder))
    try:
        assert await whoami(client) == f"system:serviceaccount:{namespace}:first"
        (folder / "token.new").write_text(await token_for(kube, namespace, "second"))
        (folder / "token.new").replace(folder / "token")

        async def rotated() -> bool:
            return await whoami(client) == f"system:serviceaccount:{namespace}:second"
        await eventually(rotated, 5, "the rotated service-account token in use")
    finally:
        await client.close()


# --- (b) an exec credential plugin -------------------------------------------------------------------------
async def test_exec_plugin_kubeconfig_runs_the_controller_and_refreshes_before_expiry(kube, kubeconfig, namespace,
                                                                                       tmp_path):
    binding = await service_account(kube, namespace, "gangctl", "cluster-admin")
    calls = tmp_path / "plugin-calls.log"
    refresh_after = 3  # seconds until the reported credential is due for a refresh
    config = user_kubeconfig(kubeconfig, tmp_path / "exec.kubeconfig", {"exec": {
        "apiVersion": "client.authentication.k8s.io/v1", "command": sys.executable, "interactiveMode": "Never",
        "args": [str(PLUGIN), str(kubeconfig), namespace, "gangctl", str(refresh_after), str(calls)]}})

    def plugin_calls() -> list[tuple[float, float]]:
        text = calls.read_text() if calls.exists() else ""
        return [(float(a), float(b)) for a, b in (line.split() for line in text.splitlines())]
    try:
        ctl = await started(ControllerProcess(config, tmp_path / "controller.log"))
        try:
            first_at, first_expiry = plugin_calls()[0]
            due = first_expiry - 300  # kubernetes_asyncio refreshes 5 minutes before the reported expiry

            async def credential_due() -> bool:
                return time.time() >= due
            await eventually(credential_due, refresh_after + 1, "the first credential due for refresh")
            await completes(kube, namespace, "by-exec")  # the requests this takes run the plugin again

            refreshed = [at for at, _ in plugin_calls() if due <= at < first_expiry]
            assert refreshed, f"the plugin ran again before the credential expired: {plugin_calls()}"
        finally:
            assert ctl.stop() == 0
    finally:
        await delete_quietly(kube, f"/apis/rbac.authorization.k8s.io/v1/clusterrolebindings/{binding}")


# --- (c) leader election -----------------------------------------------------------------------------------
async def lease_holder(kube: Kube, namespace: str) -> str:
    try:
        lease = await kube.get(f"/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases/{LEASE}")
    except ApiError as err:
        if err.not_found:
            return ""
        raise
    return lease["spec"].get("holderIdentity") or ""


async def lease(kube: Kube, namespace: str) -> dict:
    return await kube.get(f"/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases/{LEASE}")


async def wait_holder(kube: Kube, namespace: str, pod: str, timeout: float) -> float:
    async def held() -> bool:
        return (await lease_holder(kube, namespace)).startswith(pod + "_")
    return await eventually(held, timeout, f"{pod} holding the lease", interval=0.1)


def replica(kubeconfig: Path, tmp_path: Path, pod: str, namespace: str) -> ControllerProcess:
    return ControllerProcess(kubeconfig, tmp_path / f"{pod}.log", env={"POD_NAME": pod},
                             args=("--leader-elect", "--leader-elect-namespace", namespace,
                                   "--leader-elect-lease-name", LEASE))


async def test_leader_election_handover_on_sigterm_and_failover_on_sigkill(kube, kubeconfig, namespace, tmp_path):
    replicas = {pod: replica(kubeconfig, tmp_path, pod, namespace) for pod in ("ctl-a", "ctl-b")}
    try:
        await asyncio.gather(*(started(r) for r in replicas.values()))  # both ready: the standby's caches too

        async def someone() -> bool:
            return bool(await lease_holder(kube, namespace))
        await eventually(someone, 10, "a leader")
        holder = await lease_holder(kube, namespace)
        leader = holder.rsplit("_", 1)[0]
        standby = next(p for p in replicas if p != leader)
        assert leader in replicas and replicas[standby].alive()
        assert (await lease(kube, namespace))["spec"]["leaseDurationSeconds"] == 15

        # SIGTERM: the leader drains, releases the lease and exits 0; the standby takes over at once.
        sent = time.monotonic()
        replicas[leader].proc.send_signal(signal.SIGTERM)
        await wait_holder(kube, namespace, standby, 10)
        handover = time.monotonic() - sent
        assert await asyncio.to_thread(replicas[leader].proc.wait, 15) == 0
        replicas[leader].proc = None
        await completes(kube, namespace, "after-handover")
        transitions = (await lease(kube, namespace))["spec"]["leaseTransitions"]

        # SIGKILL: nothing is released; the restarted replica takes over once the lease expires.
        await started(replicas[leader])
        sent = time.monotonic()
        replicas[standby].stop(signal.SIGKILL)
        await wait_holder(kube, namespace, leader, 30)
        failover = time.monotonic() - sent
        assert (await lease(kube, namespace))["spec"]["leaseTransitions"] == transitions + 1
        print(f"\n[leader election] handover after SIGTERM {handover:.1f}s, failover after SIGKILL {failover:.1f}s")
        assert handover < 3.5, "SIGTERM: drained, released, taken over by the watching standby"
        assert failover < 18, "SIGKILL: taken over when the 15 s lease runs out"
    finally:
        for r in replicas.values():
            r.stop()


async def test_a_deposed_leader_stops_writing_at_its_renew_deadline_and_exits_1(kube, kubeconfig, namespace,
                                                                                tmp_path):
    timings = LeaseTimings(lease_duration=3, renew_deadline=2, retry_period=0.5)
    lease_path = f"/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases/{LEASE}"

    async def steal() -> None:
        """Another replica's write, as after a network partition: the Lease is no longer ours. The leader
        renews every half second, so a write between our read and its renewal conflicts; like any writer,
        the thief reads again and retries."""
        for _ in range(20):
            current = await kube.get(lease_path)
            current["spec"].update(holderIdentity="thief_0", leaseDurationSeconds=60)
            try:
                await kube.request("PUT", lease_path, body=current)
                return
            except ApiError as err:
                if not err.conflict:
                    raise
        raise AssertionError("the Lease kept changing under 20 attempts to take it")

    # In process: the elector's fence closes the guarded client's writes at the renew deadline.
    guarded, own = await Kube.connect(kubeconfig), await Kube.connect(kubeconfig)
    elector = LeaderElector(own, namespace, LEASE, "inproc_1", timings)
    guarded.write_fence = elector.fence_left
    task = asyncio.create_task(elector.run())
    try:
        await asyncio.wait_for(elector.acquired(), 5)
        await guarded.create(f"/api/v1/namespaces/{namespace}/configmaps",
                             {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "while-leading"}})
        await steal()
        await asyncio.wait_for(elector.lost.wait(), timings.renew_deadline + 2)
        assert not elector.still_leading()
        with pytest.raises(ApiError, match="NotLeader"):
            await guarded.create(f"/api/v1/namespaces/{namespace}/configmaps",
                                 {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "deposed"}})
        assert not await elector.release(), "a lease that is not ours is left alone"
        assert await lease_holder(kube, namespace) == "thief_0"
    finally:
        task.cancel()
        await guarded.close()
        await own.close()
    await kube.delete(lease_path)

    # The controller process: a lost lease ends it with exit code 1 (its Deployment restarts it).
    ctl = replica(kubeconfig, tmp_path, "ctl-deposed", namespace)
    ctl.env.update(GANGCTL_LEASE_DURATION_SECONDS="3", GANGCTL_RENEW_DEADLINE_SECONDS="2",
                   GANGCTL_RETRY_PERIOD_SECONDS="0.5")
    await started(ctl)
    try:
        await wait_holder(kube, namespace, "ctl-deposed", 10)
        await steal()
        assert await asyncio.to_thread(ctl.proc.wait, 15) == 1
        assert "leadership lost" in ctl.log_path.read_text()
    finally:
        ctl.stop()


# --- (d) /metrics behind TokenReview + SubjectAccessReview -------------------------------------------------
def http_status(url: str, token: str | None = None) -> int:
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"} if token else {})
    try:
        with urllib.request.urlopen(request, timeout=10) as resp:  # noqa: S310 - loopback
            return resp.status
    except urllib.error.HTTPError as err:
        return err.code


async def test_metrics_need_a_token_allowed_to_get_metrics(kube, kubeconfig, namespace, tmp_path):
    role = f"{namespace}-metrics-reader"
    await kube.create("/apis/rbac.authorization.k8s.io/v1/clusterroles", {
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole", "metadata": {"name": role},
        "rules": [{"nonResourceURLs": ["/metrics"], "verbs": ["get"]}]})
    bindings = [await service_account(kube, namespace, "scraper", role),
                await service_account(kube, namespace, "nobody", None)]
    ctl = await started(ControllerProcess(kubeconfig, tmp_path / "controller.log", args=("--metrics-auth",)))
    try:
        scraper, nobody = await token_for(kube, namespace, "scraper"), await token_for(kube, namespace, "nobody")
        statuses = await asyncio.gather(*(asyncio.to_thread(http_status, ctl.url + "/metrics", token)
                                          for token in (None, "not-a-token", nobody, scraper)))
        assert statuses == [401, 401, 403, 200]
        for path in ("/healthz", "/readyz"):
            assert await asyncio.to_thread(http_status, ctl.url + path) == 200, path
    finally:
        ctl.stop()
        for binding in bindings:
            await delete_quietly(kube, f"/apis/rbac.authorization.k8s.io/v1/clusterrolebindings/{binding}")
        await delete_quietly(kube, f"/apis/rbac.authorization.k8s.io/v1/clusterroles/{role}")

