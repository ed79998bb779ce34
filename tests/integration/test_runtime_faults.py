"""The runtime under bad input and faults, on the real cluster: a child the API refuses fails only its
TrainJob, a change the running child cannot take is reported where users look, and a finished child
deleted while gangctl is down is recorded, never rerun."""
from __future__ import annotations

import asyncio
import signal
import time
import urllib.error
import urllib.request

import pytest

from gangctl.api.resources import JOBS, TRAINJOBS
from gangctl.kube.client import ApiError
from gangctl.model.names import RESULT_FINALIZER
from tests.integration.conftest import APISERVER_RESTARTS, wait_ready
from tests.integration.helpers import (condition, eventually, gang_state, get_trainjob, is_running, is_true, jobs_in,
                                       restart_apiserver, submit, trainjob)

pytestmark = [pytest.mark.integration, pytest.mark.asyncio(loop_scope="session")]


async def test_numnodes_past_an_indexed_jobs_limit_is_refused_naming_the_field(kube, namespace):
    with pytest.raises(ApiError) as refused:
        await submit(kube, trainjob("huge", namespace, nodes=2147483648))
    assert refused.value.status == 422
    assert "spec.trainer.numNodes" in refused.value.message


async def test_a_child_the_api_refuses_fails_only_its_trainjob(kube, controller, namespace):
    bad = trainjob("bad-env", namespace, nodes=1, run_for="2s")
    # Valid to the TrainJob API; the Job API refuses an env name with '=' and a request over its limit.
    bad["spec"]["trainer"]["env"] = [{"name": "LR=0.1", "value": "x"}]
    bad["spec"]["trainer"]["resourcesPerNode"] = {"requests": {"cpu": "4"}, "limits": {"cpu": "2"}}
    await submit(kube, bad)
    await submit(kube, trainjob("fine", namespace, nodes=1, run_for="2s"))

    async def bad_failed() -> bool:
        return is_true(await get_trainjob(kube, namespace, "bad-env"), "Failed")
    await eventually(bad_failed, 30, "the TrainJob whose child Job the API refuses to be Failed")
    failed = condition(await get_trainjob(kube, namespace, "bad-env"), "Failed")
    assert failed["reason"] == "JobRejected"
    assert "env[0].name" in failed["message"] and "LR=0.1" in failed["message"], failed["message"]
    assert "resources.requests" in failed["message"], failed["message"]

    async def fine_complete() -> bool:
        return is_true(await get_trainjob(kube, namespace, "fine"), "Complete")
    await eventually(fine_complete, 60, "the other TrainJob served and Complete")


async def test_an_edit_the_running_child_cannot_take_is_reported_then_cleared(kube, controller, namespace):
    await submit(kube, trainjob("edited", namespace, nodes=2))

    async def running() -> bool:
        return is_running(await get_trainjob(kube, namespace, "edited"))
    await eventually(running, 60, "TrainJob Running")
    path = TRAINJOBS.path(namespace, "edited")
    # A new env var changes the pod template, which a Job keeps immutable once created.
    await kube.merge_patch(path, {"spec": {"trainer": {"env": [{"name": "LR", "value": "0.1"}]}}})

    async def reported() -> bool:
        return gang_state(await get_trainjob(kube, namespace, "edited")).get("reason") == "Invalid"
    await eventually(reported, 30, "status.gang.reason Invalid on the TrainJob")
    obj = await get_trainjob(kube, namespace, "edited")
    stuck = gang_state(obj)
    assert "immutable" in stuck["message"] and "suspend the TrainJob" in stuck["message"], stuck["message"]
    assert is_running(obj), "the running attempt is left alone (state Running, no condition)"

    await kube.merge_patch(path, {"spec": {"trainer": {"env": None}}})

    async def cleared() -> bool:
        return gang_state(await get_trainjob(kube, namespace, "edited")).get("reason") == "GangScheduled"
    await eventually(cleared, 30, "the refusal gone from status.gang once the edit is undone")


async def test_a_finished_child_deleted_while_gangctl_is_down_is_recorded_not_rerun(kube, controller, namespace):
    await submit(kube, trainjob("ttl", namespace, nodes=2, run_for="4s"))

    async def running() -> bool:
        return is_running(await get_trainjob(kube, namespace, "ttl"))
    await eventually(running, 60, "TrainJob Running")
    [job] = await jobs_in(kube, namespace)
    assert RESULT_FINALIZER in job["metadata"]["finalizers"]
    controller.stop(signal.SIGKILL)
    try:
        async def child_complete() -> bool:
            conds = (await kube.get(JOBS.path(namespace, "ttl-node-0"))).get("status", {}).get("conditions") or []
            return any(c["type"] == "Complete" and c["status"] == "True" for c in conds)
        await eventually(child_complete, 60, "the child Job Complete while gangctl is down")
        # What a runtime's ttlSecondsAfterFinished (or a person) does before gangctl saw the result.
        await kube.delete(JOBS.path(namespace, "ttl-node-0"), propagation="Background")

        async def held() -> bool:
            return bool((await kube.get(JOBS.path(namespace, "ttl-node-0")))["metadata"].get("deletionTimestamp"))
        await eventually(held, 15, "the deleted Job held by gangctl's result finalizer")
    finally:
        controller.start()
        await wait_ready(controller)

    async def complete() -> bool:
        return is_true(await get_trainjob(kube, namespace, "ttl"), "Complete")
    await eventually(complete, 30, "the TrainJob Complete from the held Job's result")

    async def released() -> bool:
        return not await jobs_in(kube, namespace)
    await eventually(released, 30, "the Job let go once its result is recorded")
    obj = await get_trainjob(kube, namespace, "ttl")
    assert obj["status"]["jobsStatus"][0]["succeeded"] == 2
    assert not (obj["status"].get("restarts") or {}).get("user"), "a finished attempt is not a failure"
    # Complete is final: the reconciler creates nothing for it again (test_lifecycle checks that
    # deleting a finished job's children brings nothing back).
    assert not await jobs_in(kube, namespace)


# --- throttled by the apiserver's own API Priority and Fairness ----------------------------------------
FLOW = "gangctl-test-throttle"


def _metric_sum(text: str, name: str, *labels: str) -> float:
    """The sum of a Prometheus metric's samples whose line carries every one of `labels`."""
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name) and (line[len(name)] in "{ ") and all(lab in line for lab in labels):
            total += float(line.rsplit(" ", 1)[1])
    return total


async def test_throttled_by_priority_and_fairness_it_backs_off_and_converges(kube, kubeconfig, controller,
                                                                           namespace, tmp_path):
    from gangctl.kube.client import Kube
    from gangctl.processes import ControllerProcess
    from tests.integration.helpers import service_account, token_for, user_kubeconfig

    bindings = [await service_account(kube, namespace, sa, "cluster-admin") for sa in ("throttled", "noisy")]
    # Three seats (one share of the server's 600), and a request that finds them taken is refused at
    # once (429). gangctl's user and a noisy neighbour share them, each under its own FlowSchema.
    await kube.create("/apis/flowcontrol.apiserver.k8s.io/v1/prioritylevelconfigurations", {
        "apiVersion": "flowcontrol.apiserver.k8s.io/v1", "kind": "PriorityLevelConfiguration",
        "metadata": {"name": FLOW},
        "spec": {"type": "Limited", "limited": {"nominalConcurrencyShares": 1, "lendablePercent": 0,
                                                "limitResponse": {"type": "Reject"}}}})
    for sa in ("throttled", "noisy"):
        await kube.create("/apis/flowcontrol.apiserver.k8s.io/v1/flowschemas", {
            "apiVersion": "flowcontrol.apiserver.k8s.io/v1", "kind": "FlowSchema", "metadata": {"name": f"{FLOW}-{sa}"},
            "spec": {"priorityLevelConfiguration": {"name": FLOW}, "matchingPrecedence": 90,
                     "rules": [{"subjects": [{"kind": "ServiceAccount",
                                              "serviceAccount": {"namespace": namespace, "name": sa}}],
                                "resourceRules": [{"verbs": ["*"], "apiGroups": ["*"], "resources": ["*"],
                                                   "clusterScope": True, "namespaces": ["*"]}],
                                "nonResourceRules": [{"verbs": ["*"], "nonResourceURLs": ["*"]}]}]}})
    config = user_kubeconfig(kubeconfig, tmp_path / "throttled.yaml",
                             {"token": await token_for(kube, namespace, "throttled")})
    noisy_token = await token_for(kube, namespace, "noisy")
    noisy = await Kube.connect(user_kubeconfig(kubeconfig, tmp_path / "noisy.yaml", {"token": noisy_token}))
    throttled = ControllerProcess(config, tmp_path / "throttled.log")
    jobs = [f"t{i}" for i in range(12)]
    done = asyncio.Event()

    async def neighbour() -> None:
        """Sixteen clients that do not back off, each asking again the moment it is answered (429 or
        not), until the TrainJobs are done (at most 180 s): the three seats are nearly always taken."""
        url = f"{noisy.host}/api/v1/namespaces/{namespace}/pods"
        headers = {"Authorization": f"Bearer {noisy_token}"}
        deadline = time.monotonic() + 180

        async def client() -> None:
            while not done.is_set() and time.monotonic() < deadline:
                async with noisy.session.get(url, headers=headers) as resp:
                    await resp.read()
        await asyncio.gather(*(client() for _ in range(16)), return_exceptions=True)

    controller.stop()  # only the throttled controller serves these TrainJobs
    load = asyncio.create_task(neighbour())
    try:
        before = await kube.text("/metrics")
        throttled.start()
        await asyncio.to_thread(throttled.wait_ready, 90)
        started = time.monotonic()
        await asyncio.gather(*(submit(kube, trainjob(name, namespace, nodes=2, gpus=1, run_for="1s"))
                               for name in jobs))

        async def all_complete() -> bool:
            listing = await kube.get(TRAINJOBS.path(namespace))
            return sum(is_true(tj, "Complete") for tj in listing["items"]) == len(jobs)
        await eventually(all_complete, 180, "every TrainJob Complete under throttling", interval=1)
        elapsed = time.monotonic() - started
        after = await kube.text("/metrics")
        scraped, ours = await asyncio.to_thread(_http, throttled.url + "/metrics")
        assert scraped == 200, ours
    finally:
        done.set()
        await load
        await noisy.close()
        throttled.stop()
        controller.start()
        await wait_ready(controller)
        for sa in ("throttled", "noisy"):
            await kube.delete(f"/apis/flowcontrol.apiserver.k8s.io/v1/flowschemas/{FLOW}-{sa}")
        await kube.delete(f"/apis/flowcontrol.apiserver.k8s.io/v1/prioritylevelconfigurations/{FLOW}")
        for binding in bindings:
            await kube.delete(f"/apis/rbac.authorization.k8s.io/v1/clusterrolebindings/{binding}")
    label = f'flow_schema="{FLOW}-throttled"'
    rejected = (_metric_sum(after, "apiserver_flowcontrol_rejected_requests_total", label)
                - _metric_sum(before, "apiserver_flowcontrol_rejected_requests_total", label))
    dispatched = (_metric_sum(after, "apiserver_flowcontrol_dispatched_requests_total", label)
                  - _metric_sum(before, "apiserver_flowcontrol_dispatched_requests_total", label))
    assert rejected > 0, "the apiserver refused some of gangctl's requests (429)"
    assert _metric_sum(ours, "gangctl_api_throttled_total") > 0, "gangctl saw the 429s and waited them out"
    rate = (rejected + dispatched) / elapsed
    print(f"[throttle] {len(jobs)} TrainJobs Complete in {elapsed:.1f}s; gangctl's requests dispatched "
          f"{dispatched:.0f}, rejected {rejected:.0f} ({rate:.1f}/s)")
    assert rate < 40, f"no hot loop: {rate:.1f} requests/s from a controller answered 429"


def _http(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as resp:  # noqa: S310 - loopback
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode()
    except OSError as err:  # not listening yet
        return 0, str(err)


async def test_readyz_names_the_cache_it_cannot_fill_until_access_is_granted(kube, kubeconfig, namespace, tmp_path):
    from gangctl.processes import ControllerProcess
    from tests.integration.helpers import service_account, token_for, user_kubeconfig

    # The built-in `view` role reads pods and Jobs but not TrainJobs (a CRD nobody aggregated into it).
    view = await service_account(kube, namespace, "reader", "view")
    config = user_kubeconfig(kubeconfig, tmp_path / "reader.yaml", {"token": await token_for(kube, namespace, "reader")})
    ctl = ControllerProcess(config, tmp_path / "reader.log")
    ctl.start()
    granted = f"{view}-admin"
    try:
        async def refused() -> bool:
            status, body = await asyncio.to_thread(_http, ctl.url + "/readyz")
            return status == 503 and "trainjobs: not listed yet" in body and "Forbidden" in body
        await eventually(refused, 30, "/readyz 503 naming the TrainJob cache and the 403")
        await kube.create("/apis/rbac.authorization.k8s.io/v1/clusterrolebindings", {
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding", "metadata": {"name": granted},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "cluster-admin"},
            "subjects": [{"kind": "ServiceAccount", "name": "reader", "namespace": namespace}]})

        async def ready() -> bool:
            return (await asyncio.to_thread(_http, ctl.url + "/readyz"))[0] == 200
        waited = await eventually(ready, 60, "/readyz 200 once the ServiceAccount may list TrainJobs")
        print(f"[readyz] ready {waited:.1f}s after the grant (watch backoff capped at 5 s)")
    finally:
        ctl.stop()
        for binding in (view, granted):
            await kube.delete(f"/apis/rbac.authorization.k8s.io/v1/clusterrolebindings/{binding}")


class RunAudit:
    """What a user checks after a faulty run, watched for its whole length: never two live pods for one
    (TrainJob, index), and exactly one child Job (by uid) per TrainJob — no attempt reran."""

    def __init__(self, kube, namespace: str):
        from gangctl.api.resources import JOBS as JOB_RESOURCE
        from gangctl.harness.audit import PodAuditor
        from gangctl.kube.informer import Informer
        from gangctl.model.names import TRAINJOB_NAME

        self.pods = PodAuditor()
        self.job_uids: dict[str, set[str]] = {}

        def on_job(_: str, job: dict) -> None:
            owner = (job["metadata"].get("labels") or {}).get(TRAINJOB_NAME)
            if owner:
                self.job_uids.setdefault(owner, set()).add(job["metadata"]["uid"])
        jobs = Informer(kube, JOB_RESOURCE, namespace=namespace, handlers=[on_job])
        self._tasks = [asyncio.create_task(self.pods.run(kube, namespace)), asyncio.create_task(jobs.run())]

    def stop(self) -> None:
        for task in self._tasks:
            task.cancel()

    def check(self, names: list[str], *, pods: bool = True) -> None:
        if pods:
            assert not self.pods.violations, f"two live pods for one index: {self.pods.violations[:3]}"
        doubles = {name: uids for name, uids in self.job_uids.items() if len(uids) != 1}
        assert not doubles, f"exactly one child Job per TrainJob: {doubles}"
        assert set(self.job_uids) == set(names)


async def test_five_apiserver_restarts_mid_run_lose_and_duplicate_nothing(kube, controller, cluster_settings,
                                                                         namespace):
    from gangctl.cluster.lifecycle import local_cluster

    cluster = local_cluster(cluster_settings)
    names = [f"r{i}" for i in range(15)]
    audit = RunAudit(kube, namespace)
    await asyncio.gather(*(submit(kube, trainjob(n, namespace, nodes=2, gpus=1, run_for="8s")) for n in names))
    resumed = []
    for restart in range(5):
        # SIGTERM (graceful, up to 10 s to drain) and SIGKILL (a crash) in turn: the real kube-apiserver.
        sig = signal.SIGTERM if restart % 2 == 0 else signal.SIGKILL
        APISERVER_RESTARTS.append(await restart_apiserver(kube, cluster, sig))  # RBAC refills: 403s excused meanwhile
        back = time.monotonic()
        probe = f"after-{restart}"

        async def submitted() -> bool:  # the test's own pooled connections may have died with the server
            try:
                await submit(kube, trainjob(probe, namespace, nodes=1, gpus=1, run_for="1s"))
            except ApiError as err:
                return err.conflict
            except Exception:  # noqa: BLE001 - a stale keep-alive connection
                return False
            return True
        await eventually(submitted, 10, f"{probe} submitted", interval=0.1)

        async def served() -> bool:
            return bool(await _child_jobs(kube, namespace, probe))
        await eventually(served, 30, f"gangctl serving again after restart {restart + 1}", interval=0.1)
        resumed.append(time.monotonic() - back)
        assert controller.alive(), "the controller process survives an apiserver restart"
        names.append(probe)
    print(f"[apiserver restarts] TrainJob served {', '.join(f'{s:.1f}' for s in resumed)} s after /readyz")
    assert max(resumed) <= 10, f"resumed within 10 s of the apiserver's /readyz: {resumed}"

    async def all_complete() -> bool:
        listing = await kube.get(TRAINJOBS.path(namespace))
        return sum(is_true(tj, "Complete") for tj in listing["items"]) == len(names)
    try:
        await eventually(all_complete, 120, "every TrainJob Complete", interval=1)
    finally:
        audit.stop()
    for tj in (await kube.get(TRAINJOBS.path(namespace)))["items"]:
        status = tj["status"]
        assert not (status.get("restarts") or {}).get("user"), f"{tj['metadata']['name']}: nothing charged"
        nodes = tj["spec"]["trainer"]["numNodes"]
        assert status["jobsStatus"][0]["succeeded"] == nodes, f"{tj['metadata']['name']}: every index once"
    # Pods are the Job controller's: after an apiserver restart it has been seen to run a second pod
    # for an index for a few seconds (its expectations lost with the watch); gangctl's part is the Job.
    audit.check(names, pods=False)
    print(f"[apiserver restarts] two live pods for one index (kube-controller-manager's Job controller): "
          f"{len(audit.pods.violations)} events")


async def _child_jobs(kube, namespace: str, name: str) -> list[dict]:
    return (await kube.get(JOBS.path(namespace), labelSelector=f"jobset.sigs.k8s.io/jobset-name={name}"))["items"]


async def test_controller_sigkilled_every_few_seconds_while_gangs_queue(kube, controller, namespace):
    import random

    from gangctl.harness.audit import settled_audit

    # 40 gangs of 2 x 8 GPUs want 640 GPUs of the cluster's 512: they queue behind each other.
    names = [f"q{i}" for i in range(40)]
    run = RunAudit(kube, namespace)
    rng = random.Random(12)
    try:
        await asyncio.gather(*(submit(kube, trainjob(n, namespace, nodes=2, run_for="4s")) for n in names))
        kills, chaos_until = 0, time.monotonic() + 40
        while time.monotonic() < chaos_until:
            await asyncio.sleep(rng.uniform(2, 5))  # the chaos schedule, not a wait for a result
            controller.stop(signal.SIGKILL)
            controller.start()
            kills += 1
        await wait_ready(controller)

        async def all_finished() -> bool:
            items = (await kube.get(TRAINJOBS.path(namespace)))["items"]
            return sum(is_true(tj, "Complete") or is_true(tj, "Failed") for tj in items) == len(names)
        await eventually(all_finished, 180, "every queued TrainJob finished", interval=1)
        audit = await settled_audit(kube, namespace)
    finally:
        run.stop()
    print(f"[controller kills] {kills} SIGKILLs; {run.pods.events} pod events; outcomes {audit.outcomes}")
    assert kills >= 8
    assert audit.outcomes == {"Complete/JobsCompleted": len(names)}, audit.outcomes
    assert audit.ok, audit
    assert audit.restarts == {"user": 0, "infrastructure": 0, "ignored": 0}, "no restart charged"
    run.check(names)


async def test_the_lost_pod_reaper_lets_a_lost_index_be_replaced_while_its_node_is_down(
        kube, controller, reaper_kubeconfig, namespace, tmp_path):
    """A pod evicted from a lost node never becomes terminal (nothing finishes it), and with a
    podFailurePolicy the Job controller replaces an index only once its pod is terminal: without help
    the index waits for the node. The controller started with GANGCTL_LOST_POD_SECONDS marks such a pod
    Failed (a disruption) and deletes it, as PodGC does for an out-of-service node."""
    import uuid

    from gangctl.api.resources import CLUSTER_TRAINING_RUNTIMES, PODS
    from gangctl.harness import chaos
    from gangctl.processes import ControllerProcess
    from tests.integration.test_policies import finish_terminating_pods

    runtime = f"lost-{uuid.uuid4().hex[:6]}"
    rt = chaos.elastic_runtime(runtime, max_restarts=1)
    rt["spec"]["template"]["spec"]["replicatedJobs"][0]["template"]["spec"]["podFailurePolicy"] = {
        "rules": [{"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget"}]}]}
    await kube.create(CLUSTER_TRAINING_RUNTIMES.path(), rt)
    driver = chaos.NodeChaos(kube)
    reaping = ControllerProcess(reaper_kubeconfig, tmp_path / "reaper.log", env={"GANGCTL_LOST_POD_SECONDS": "3"})
    controller.stop()  # one controller at a time: this one reaps, under deploy/overlays/lost-pod-reaper's RBAC
    try:
        reaping.start()
        await asyncio.to_thread(reaping.wait_ready)
        await submit(kube, chaos.trainjob(chaos.ChaosJob("lost", min_nodes=2, max_nodes=2, run_for=3600),
                                          namespace, runtime))

        async def workers() -> list[dict]:
            return (await kube.get(PODS.path(namespace), labelSelector="jobset.sigs.k8s.io/replicatedjob-name=node"))["items"]

        def index(p: dict) -> int:
            return int(p["metadata"]["annotations"]["batch.kubernetes.io/job-completion-index"])

        async def running() -> bool:
            return len([p for p in await workers() if p["status"].get("phase") == "Running"
                        and not p["metadata"].get("deletionTimestamp")]) == 2
        await eventually(running, 60, "2 workers running")
        victim = next(p for p in await workers() if index(p) == 1)
        await driver.fail(victim["spec"]["nodeName"])

        async def replaced() -> bool:
            ps = [p for p in await workers() if index(p) == 1]
            return (len(ps) == 1 and ps[0]["metadata"]["uid"] != victim["metadata"]["uid"]
                    and ps[0]["status"].get("phase") == "Running"
                    and ps[0]["spec"]["nodeName"] != victim["spec"]["nodeName"])
        await eventually(replaced, 90, "index 1 replaced on another node")
        assert victim["spec"]["nodeName"] in await chaos.not_ready_nodes(kube), "the lost node is still down"
        log = reaping.log_path.read_text()
        assert f"force-deleted pod {namespace}/{victim['metadata']['name']}" in log, "the reaper finished it"
        assert "is forbidden: User" not in log, "deploy/overlays/lost-pod-reaper grants what the reaper calls"
        tj = await get_trainjob(kube, namespace, "lost")
        assert not ((tj.get("status") or {}).get("restarts") or {}).get("user"), "a reaped pod is not the user's failure"
    finally:
        await driver.restore_all()
        reaping.stop()
        controller.start()
        await wait_ready(controller)
        await finish_terminating_pods(kube, namespace)
        await kube.delete(CLUSTER_TRAINING_RUNTIMES.path(name=runtime))
