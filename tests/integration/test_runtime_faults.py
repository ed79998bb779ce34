"""The runtime under bad input and faults, on the real cluster: a child the API refuses fails only its
TrainJob, a change the running child cannot take is reported where users look, and a finished child
deleted while gangctl is down is recorded, never rerun."""
from __future__ import annotations

import asyncio
import signal
import time
import urllib.request

import pytest

from gangctl.api.resources import JOBS, TRAINJOBS
from gangctl.kube.client import ApiError
from gangctl.plugins.names import RESULT_FINALIZER
from tests.integration.conftest import wait_ready
from tests.integration.helpers import condition, eventually, get_trainjob, is_true, jobs_in, submit, trainjob

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
        return is_true(await get_trainjob(kube, namespace, "edited"), "Running")
    await eventually(running, 60, "TrainJob Running")
    path = TRAINJOBS.path(namespace, "edited")
    # A new env var changes the pod template, which a Job keeps immutable once created.
    await kube.merge_patch(path, {"spec": {"trainer": {"env": [{"name": "LR", "value": "0.1"}]}}})

    async def reported() -> bool:
        cond = condition(await get_trainjob(kube, namespace, "edited"), "Synced")
        return bool(cond and cond["status"] == "False")
    await eventually(reported, 30, "Synced=False on the TrainJob")
    obj = await get_trainjob(kube, namespace, "edited")
    synced = condition(obj, "Synced")
    assert synced["reason"] == "Invalid"
    assert "immutable" in synced["message"] and "suspend the TrainJob" in synced["message"], synced["message"]
    assert is_true(obj, "Running"), "the running attempt is left alone"

    await kube.merge_patch(path, {"spec": {"trainer": {"env": None}}})

    async def cleared() -> bool:
        return condition(await get_trainjob(kube, namespace, "edited"), "Synced") is None
    await eventually(cleared, 30, "the Synced condition gone once the edit is undone")


async def test_a_finished_child_deleted_while_gangctl_is_down_is_recorded_not_rerun(kube, controller, namespace):
    await submit(kube, trainjob("ttl", namespace, nodes=2, run_for="4s"))

    async def running() -> bool:
        return is_true(await get_trainjob(kube, namespace, "ttl"), "Running")
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
    from tests.integration.test_auth_leader import service_account, token_for, user_kubeconfig

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
    noisy = await Kube.connect(user_kubeconfig(kubeconfig, tmp_path / "noisy.yaml",
                                               {"token": await token_for(kube, namespace, "noisy")}))
    throttled = ControllerProcess(config, tmp_path / "throttled.log")
    jobs = [f"t{i}" for i in range(12)]
    done = asyncio.Event()

    async def neighbour() -> None:
        """Sixteen requests at a time into the same three seats, until the TrainJobs are done (≤ 180 s)."""
        deadline = time.monotonic() + 180
        while not done.is_set() and time.monotonic() < deadline:
            await asyncio.gather(*(noisy.get(f"/api/v1/namespaces/{namespace}/pods") for _ in range(16)),
                                 return_exceptions=True)

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
        ours = await asyncio.to_thread(_read, throttled.url + "/metrics")
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


def _read(url: str) -> str:
    with urllib.request.urlopen(url, timeout=5) as resp:  # noqa: S310 - loopback
        return resp.read().decode()
