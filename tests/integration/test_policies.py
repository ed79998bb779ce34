"""Failure and success policies on the real cluster (KWOK GPU nodes, the real Job controller).

A KWOK pod labelled pod-container-running-failed.stage.kwok.x-k8s.io=true fails 1-2 s after it runs,
with the exit code in the annotation pod-container-running-failed.stage.kwok.x-k8s.io/exit-code.
KWOK has no kubelet to finish an evicted pod, so the disruption test plays that part: it evicts a
pod through the Eviction API (the API server adds DisruptionTarget) and then reports the pod Failed,
as a kubelet does once the container has stopped.
"""
from __future__ import annotations

import asyncio
import copy
import signal
import uuid
from datetime import datetime, timedelta

import pytest

from gangctl.api.resources import CLUSTER_TRAINING_RUNTIMES, JOBS, PODS, TRAINJOBS
from gangctl.kube.events import CORE_EVENTS
from gangctl.kube.client import ApiError
from tests.integration.conftest import wait_ready
from tests.integration.helpers import (KWOK_COMPLETE_DELAY, KWOK_COMPLETE_JITTER, condition, eventually, get_trainjob, is_true, jobs_in,
                                       on_kwok_nodes, pods_of, report_failed, settled, submit, trainjob)

pytestmark = [pytest.mark.integration, pytest.mark.asyncio(loop_scope="session")]

FAIL_LABEL = "pod-container-running-failed.stage.kwok.x-k8s.io"
FAIL_EXIT_CODE = "pod-container-running-failed.stage.kwok.x-k8s.io/exit-code"


def runtime(name: str, *, failure_policy: dict | None = None, pod_failure_policy: dict | None = None,
            success_policy: dict | None = None, backoff_limit: int = 0) -> dict:
    job_spec: dict = {"backoffLimit": backoff_limit, "template": {"spec": on_kwok_nodes({
        "restartPolicy": "Never", "containers": [{"name": "node", "image": "pytorch", "command": ["torchrun", "t.py"]}]})}}
    if pod_failure_policy:
        job_spec["podFailurePolicy"] = pod_failure_policy
    if success_policy:
        job_spec["successPolicy"] = success_policy
    spec: dict = {"replicatedJobs": [{"name": "node", "replicas": 1, "template": {
        "metadata": {"labels": {"trainer.kubeflow.org/trainjob-ancestor-step": "trainer"}}, "spec": job_spec}}]}
    if failure_policy:
        spec["failurePolicy"] = failure_policy
    return {"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "ClusterTrainingRuntime",
            "metadata": {"name": name, "labels": {"trainer.kubeflow.org/framework": "torch"}},
            "spec": {"mlPolicy": {"numNodes": 1, "torch": {"numProcPerNode": "auto"}},
                     "podGroupPolicy": {"coscheduling": {"scheduleTimeoutSeconds": 60}},
                     "template": {"spec": spec}}}


@pytest.fixture
async def make_runtime(kube, namespace):
    made = []

    async def make(**kw) -> str:
        name = f"pol-{uuid.uuid4().hex[:6]}"
        await kube.create(CLUSTER_TRAINING_RUNTIMES.path(), runtime(name, **kw))
        made.append(name)
        return name
    yield make
    for name in made:
        await kube.delete(CLUSTER_TRAINING_RUNTIMES.path(name=name))
    await finish_terminating_pods(kube, namespace)


async def finish_terminating_pods(kube, namespace: str) -> None:
    """Play kubelet for deleted pods: KWOK never finishes a terminating pod that still has the Job's
    tracking finalizer (kept while a Job with a podFailurePolicy waits for it to be Failed), and a
    stuck pod would hold its GPUs and its namespace for the rest of the session."""
    for tj in (await kube.get(f"/apis/trainer.kubeflow.org/v1alpha1/namespaces/{namespace}/trainjobs"))["items"]:
        await kube.delete(f"/apis/trainer.kubeflow.org/v1alpha1/namespaces/{namespace}/trainjobs/"
                          f"{tj['metadata']['name']}", propagation="Background")
    # The test is over: its pods go now, not after KWOK's 30 s termination grace (kubelet's SIGKILL).
    await kube.request("DELETE", PODS.path(namespace), body={"gracePeriodSeconds": 0})

    async def none_left() -> bool:
        pods = (await kube.get(PODS.path(namespace)))["items"]
        for pod in pods:
            if pod["metadata"].get("deletionTimestamp") and pod["status"].get("phase") not in ("Failed", "Succeeded"):
                try:
                    await report_failed(kube, namespace, pod["metadata"]["name"], exit_code=137)
                except ApiError as err:  # gone since the list: what this waits for
                    if not err.not_found:
                        raise
        return not pods
    await eventually(none_left, 60, "the test's pods to be gone", interval=1)


def failing(obj: dict, exit_code: int, *, delay: str = "3600s") -> dict:
    """Every pod of the TrainJob fails with `exit_code` shortly after it starts."""
    obj = copy.deepcopy(obj)
    obj["spec"]["podTemplateOverrides"] = [{"targetJobs": [{"name": "node"}], "metadata": {
        "labels": {FAIL_LABEL: "true"},
        "annotations": {FAIL_EXIT_CODE: str(exit_code), KWOK_COMPLETE_DELAY: delay, KWOK_COMPLETE_JITTER: delay}}}]
    return obj


def runs_for(obj: dict, seconds: int) -> dict:
    obj = copy.deepcopy(obj)
    obj["spec"]["podTemplateOverrides"] = [{"targetJobs": [{"name": "node"}], "metadata": {"annotations": {
        KWOK_COMPLETE_DELAY: f"{seconds}s", KWOK_COMPLETE_JITTER: f"{seconds + 1}s"}}}]
    return obj


async def wait_condition(kube, namespace: str, name: str, ctype: str, timeout: float) -> dict:
    async def done() -> bool:
        return is_true(await get_trainjob(kube, namespace, name), ctype)
    await eventually(done, timeout, f"TrainJob {name} {ctype}")
    return await get_trainjob(kube, namespace, name)


async def test_fatal_exit_code_fails_at_once_without_restarts(kube, controller, namespace, make_runtime):
    rt = await make_runtime(
        pod_failure_policy={"rules": [{"action": "FailJob", "onExitCodes": {"operator": "In", "values": [42]}}]},
        failure_policy={"maxRestarts": 3, "rules": [
            {"name": "fatal-exit", "action": "FailJobSet", "onJobFailureReasons": ["PodFailurePolicy"]}]})
    await submit(kube, failing(trainjob("fatal", namespace, nodes=2, runtime=rt, run_for=None), 42))
    tj = await wait_condition(kube, namespace, "fatal", "Failed", 60)
    failed = condition(tj, "Failed")
    assert failed["reason"] == "FailurePolicyRule", failed
    assert "fatal-exit" in failed["message"] and "exited with code 42" in failed["message"], failed
    restarts = tj["status"]["restarts"]
    assert restarts["user"] == 0 and restarts["infrastructure"] == 0
    assert restarts["lastFailure"]["exitCode"] == 42 and restarts["lastFailure"]["reason"] == "PodFailurePolicy"
    job = (await jobs_in(kube, namespace))[0]
    assert job["spec"]["podFailurePolicy"]["rules"][0]["action"] == "FailJob", "passed through to the child Job"


async def test_budget_exhausted_names_the_last_failure_and_stays_sticky(kube, controller, namespace, make_runtime):
    rt = await make_runtime(failure_policy={"maxRestarts": 2})
    await submit(kube, failing(trainjob("flaky", namespace, nodes=2, runtime=rt, run_for=None), 3))

    async def restarted_once() -> bool:
        tj = await get_trainjob(kube, namespace, "flaky")
        return ((tj.get("status") or {}).get("restarts") or {}).get("user", 0) >= 1
    await eventually(restarted_once, 60, "the first restart charged to the user")

    # The controller dies mid-way: the count lives in the TrainJob's status, not in the process.
    controller.stop(signal.SIGKILL)
    await asyncio.sleep(2)
    controller.start()
    await wait_ready(controller)

    tj = await wait_condition(kube, namespace, "flaky", "Failed", 120)
    failed = condition(tj, "Failed")
    assert failed["reason"] == "MaxRestartsExceeded", failed
    assert "2/2" in failed["message"] and "exited with code 3" in failed["message"], failed
    assert "flaky-node-0-" in failed["message"], "the message names the pod"
    restarts = tj["status"]["restarts"]
    assert restarts["user"] == 2 and restarts["infrastructure"] == 0, restarts
    assert tj["status"]["restartCount"] == 2
    # The second attempt also failed soon after it started: the third was made 10 s later, not at once
    # (crash-loop pacing), and the Event said so.
    events = (await kube.get(CORE_EVENTS.path(namespace), fieldSelector="involvedObject.name=flaky"))["items"]
    paced = [e for e in events if e["reason"] == "Restarting" and "next attempt in 10s" in e["message"]]
    assert len(paced) == 1, [e["message"] for e in events]
    said = datetime.fromisoformat((paced[0].get("eventTime") or paced[0]["lastTimestamp"]).replace("Z", "+00:00"))
    third_failed = datetime.fromisoformat(restarts["lastFailure"]["time"].replace("Z", "+00:00"))
    assert third_failed - said >= timedelta(seconds=10), (said, third_failed)

    # Deleting the children of the failed TrainJob neither recreates them nor resets the budget.
    for job in await jobs_in(kube, namespace):
        await kube.delete(JOBS.path(namespace, job["metadata"]["name"]), propagation="Background")

    async def gone() -> bool:
        return not await jobs_in(kube, namespace)
    await eventually(gone, 30, "the child Job deleted")
    controller.stop(signal.SIGKILL)
    controller.start()
    await wait_ready(controller)
    # Ready means every TrainJob of the first list is queued: once the new process has reconciled at
    # least that many and its queue is empty, it has decided about "flaky" without its children.
    await settled(controller, 0, at_least=len((await kube.get(TRAINJOBS.path()))["items"]))
    assert not await jobs_in(kube, namespace), "children of a failed TrainJob are never recreated"
    again = await get_trainjob(kube, namespace, "flaky")
    assert again["status"]["restarts"] == tj["status"]["restarts"]
    assert condition(again, "Failed") == failed


async def test_restart_recreates_the_job_then_succeeds_on_the_success_rule(kube, controller, namespace, make_runtime):
    # batch/v1 successPolicy: the Job (and so the TrainJob) succeeds as soon as any one index has
    # succeeded; pods run 10-60 s (KWOK picks in between), so the first to finish decides.
    rt = await make_runtime(failure_policy={"maxRestarts": 1},
                            success_policy={"rules": [{"succeededIndexes": "0-2", "succeededCount": 1}]})
    obj = trainjob("leader", namespace, nodes=3, runtime=rt, run_for=None)
    obj["spec"]["podTemplateOverrides"] = [{"targetJobs": [{"name": "node"}], "metadata": {"annotations": {
        KWOK_COMPLETE_DELAY: "10s", KWOK_COMPLETE_JITTER: "60s"}}}]
    await submit(kube, obj)

    async def index_1_running() -> bool:
        return any(p["metadata"]["annotations"]["batch.kubernetes.io/job-completion-index"] == "1"
                   and (p.get("status") or {}).get("phase") == "Running"
                   for p in await pods_of(kube, namespace, "leader"))
    await eventually(index_1_running, 60, "index 1 Running")
    first_uid = (await jobs_in(kube, namespace))[0]["metadata"]["uid"]
    pod = next(p for p in await pods_of(kube, namespace, "leader")
               if p["metadata"]["annotations"]["batch.kubernetes.io/job-completion-index"] == "1")
    await report_failed(kube, namespace, pod["metadata"]["name"], exit_code=1)  # the first attempt fails

    tj = await wait_condition(kube, namespace, "leader", "Complete", 120)
    assert tj["status"]["restarts"]["user"] == 1
    assert tj["status"]["restarts"]["lastFailure"]["exitCode"] == 1
    assert tj["status"]["restarts"]["lastFailure"]["pod"] == pod["metadata"]["name"]
    jobs = await jobs_in(kube, namespace)
    assert len(jobs) == 1 and jobs[0]["metadata"]["uid"] != first_uid, "the failed Job was recreated"
    reasons = {c["type"]: c.get("reason") for c in jobs[0]["status"]["conditions"] if c["status"] == "True"}
    assert reasons.get("SuccessCriteriaMet") == "SuccessPolicy", jobs[0]["status"]


async def test_disruption_is_ignored_and_never_charged(kube, controller, namespace, make_runtime):
    # The workers run until the test is done with them, as real workers of a gang wait for a peer that
    # is being replaced. (With pods that finish on a timer, the sibling could finish before the
    # replacement reached the scheduler, and Coscheduling never admits a lone replacement: its Permit
    # counts only running pods of the group, so it waits for a gang of 2 that can no longer form.)
    rt = await make_runtime(
        failure_policy={"maxRestarts": 0},
        pod_failure_policy={"rules": [{"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget"}]},
                                      {"action": "FailJob", "onExitCodes": {"operator": "In", "values": [42]}}]})
    await submit(kube, runs_for(trainjob("evicted", namespace, nodes=2, runtime=rt, run_for=None), 3600))

    async def running() -> list[str]:
        pods = await pods_of(kube, namespace, "evicted")
        return sorted(p["metadata"]["name"] for p in pods if (p.get("status") or {}).get("phase") == "Running"
                      and not p["metadata"].get("deletionTimestamp"))

    async def both_running() -> bool:
        return len(await running()) == 2
    await eventually(both_running, 60, "2 pods Running")
    first = await running()
    victim = first[0]
    (before,) = await jobs_in(kube, namespace)
    await evict_and_finish(kube, namespace, victim)

    async def replaced() -> bool:
        now = await running()
        return len(now) == 2 and victim not in now and first[1] in now
    await eventually(replaced, 60, "the evicted pod replaced beside its running sibling")
    (job,) = await jobs_in(kube, namespace)
    assert job["status"].get("failed", 0) == 0, "an Ignore'd disruption is not a failure for the Job"
    assert job["metadata"]["uid"] == before["metadata"]["uid"], "the gang went on in the same Job: no restart"
    tj = await get_trainjob(kube, namespace, "evicted")
    assert not is_true(tj, "Failed")
    assert (tj["status"].get("restarts") or {}).get("user", 0) == 0
    assert (tj["status"].get("restarts") or {}).get("infrastructure", 0) == 0, "nothing was restarted"


async def test_disruption_that_fails_the_job_restarts_it_uncharged(kube, controller, namespace, make_runtime):
    # No Ignore rule: the disrupted pod fails the Job (backoffLimit 0); gangctl sees DisruptionTarget
    # on the first failed pod and restarts the gang without charging the user's budget (maxRestarts 0).
    rt = await make_runtime(failure_policy={"maxRestarts": 0})
    await submit(kube, runs_for(trainjob("lost", namespace, nodes=2, runtime=rt, run_for=None), 8))

    async def running() -> bool:
        pods = await pods_of(kube, namespace, "lost")
        return len([p for p in pods if (p.get("status") or {}).get("phase") == "Running"]) == 2
    await eventually(running, 60, "2 pods Running")
    victim = (await pods_of(kube, namespace, "lost"))[0]["metadata"]["name"]
    await evict_and_finish(kube, namespace, victim)

    tj = await wait_condition(kube, namespace, "lost", "Complete", 90)
    restarts = tj["status"]["restarts"]
    assert restarts["infrastructure"] == 1 and restarts["user"] == 0, restarts
    assert restarts["lastFailure"]["kind"] == "infrastructure" and restarts["lastFailure"]["pod"] == victim


async def evict_and_finish(kube, namespace: str, pod: str) -> None:
    """Evict the pod, then report it Failed until it is gone (KWOK may rewrite a status once)."""
    await evict(kube, namespace, pod)

    async def gone() -> bool:
        try:
            current = await kube.get(PODS.path(namespace, pod))
        except ApiError as err:
            if err.not_found:
                return True
            raise
        if current["status"].get("phase") != "Failed":
            await report_failed(kube, namespace, pod, exit_code=137)
        return False
    await eventually(gone, 60, f"evicted pod {pod} to be gone", interval=1)


async def evict(kube, namespace: str, pod: str) -> None:
    await kube.create(PODS.path(namespace, pod, "eviction"), {
        "apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": pod, "namespace": namespace}})


async def test_a_concurrent_status_writer_never_makes_the_budget_count_twice_or_roll_back(kube, controller, namespace,
                                                                                      make_runtime):
    from tests.integration.helpers import scrape

    rt = await make_runtime(failure_policy={"maxRestarts": 2})
    await submit(kube, failing(trainjob("raced", namespace, nodes=2, runtime=rt, run_for=None), 3))
    path = TRAINJOBS.path(namespace, "raced")
    conflicts = lambda m: sum(v for k, v in m.items()  # noqa: E731
                              if k.startswith("gangctl_reconcile_errors_total") and "reason=Conflict" in k)
    before = conflicts(await scrape(controller.url))
    seen: list[int] = []

    async def writer() -> None:
        """Another client changing the TrainJob every 20 ms: every write of gangctl's races it."""
        n = 0
        while True:
            n += 1
            tj = await kube.merge_patch(path, {"metadata": {"annotations": {"example.com/touched": str(n)}}})
            seen.append(int(((tj.get("status") or {}).get("restarts") or {}).get("user") or 0))
            await asyncio.sleep(0.02)
    racing = asyncio.create_task(writer())
    try:
        tj = await wait_condition(kube, namespace, "raced", "Failed", 120)
    finally:
        racing.cancel()
    failed = condition(tj, "Failed")
    assert failed["reason"] == "MaxRestartsExceeded", failed
    assert tj["status"]["restarts"]["user"] == 2, "each failed attempt charged once"
    assert seen == sorted(seen), f"the charged restarts never went down under the race: {seen}"
    assert conflicts(await scrape(controller.url)) > before, "gangctl's writes were refused as stale and redone"
