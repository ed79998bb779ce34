"""Kueue on the real local cluster: the quota policy applied and read back; Jobs admitted by quota."""
from __future__ import annotations

import json
import subprocess

import pytest

from gangctl.api.resources import JOBS, PYTORCHJOBS, TRAINJOBS
from gangctl.kube.client import Kube
from gangctl.plugins.kueue import WORKLOADS, Kueue
from gangctl.commands.policy_apply import apply_policy
from gangctl.model.quota import QuotaPolicy
from tests.integration.helpers import (bound, eventually, gang_state, get_trainjob, pods_of, running, submit,
                                       trainjob)
from tests.integration.quota_common import (TEAMS, assert_same_jobs_within_policy, empty_teams, get_pytorchjob,
                                            pj_pods, preempt_low_with_high, pytorchjob, runtime_name, v1_condition)
from tests.integration.schedulers_common import (EXAMPLE_POLICY, cli, exposed_listeners, gang_objects, serve_backend,
                                                start, stop)

import yaml

pytestmark = pytest.mark.integration
CLUSTER = "gangctl-it-kueue"


@pytest.fixture(scope="module")
def kueue_cluster():
    settings, kubeconfig = start(CLUSTER, "kueue")
    yield settings, kubeconfig
    stop(settings)


@pytest.fixture
async def kube(kueue_cluster):
    k = await Kube.connect(kueue_cluster[1])
    yield k
    await k.close()


def gangctl(*args: str, cluster) -> subprocess.CompletedProcess:
    return cli(cluster, *args)


async def test_policy_applied_and_read_back(kueue_cluster, kube):
    dry = gangctl("policy", "apply", str(EXAMPLE_POLICY), "--dry-run", "-o", "json", cluster=kueue_cluster)
    assert dry.returncode == 0, dry.stderr
    assert {o["action"] for o in json.loads(dry.stdout)["objects"]} == {"create"}
    assert (await kube.get("/apis/kueue.x-k8s.io/v1beta1/clusterqueues"))["items"] == [], "dry run changed nothing"

    done = gangctl("policy", "apply", str(EXAMPLE_POLICY), cluster=kueue_cluster)
    assert done.returncode == 0, done.stderr
    cqs = {c["metadata"]["name"]: c for c in (await kube.get("/apis/kueue.x-k8s.io/v1beta1/clusterqueues"))["items"]}
    assert set(cqs) == {"ml-a", "ml-b", "prod", "eval"}
    gpu = cqs["ml-a"]["spec"]["resourceGroups"][0]["flavors"][0]["resources"][0]
    assert gpu == {"name": "nvidia.com/gpu", "nominalQuota": "64", "borrowingLimit": "32"}
    assert cqs["ml-b"]["spec"]["cohort"] == "research" and cqs["ml-b"]["spec"]["queueingStrategy"] == "BestEffortFIFO"
    lqs = (await kube.get("/apis/kueue.x-k8s.io/v1beta1/localqueues"))["items"]
    assert {(q["metadata"]["namespace"], q["spec"]["clusterQueue"]) for q in lqs} == {
        ("ml-a", "ml-a"), ("ml-a-dev", "ml-a"), ("ml-b", "ml-b"), ("prod", "prod"), ("eval", "eval")}
    cohorts = (await kube.get("/apis/kueue.x-k8s.io/v1alpha1/cohorts"))["items"]
    assert {c["metadata"]["name"] for c in cohorts} == {"research", "product"}
    wpcs = (await kube.get("/apis/kueue.x-k8s.io/v1beta1/workloadpriorityclasses"))["items"]
    assert {w["metadata"]["name"]: w["value"] for w in wpcs} == {"low": 10, "normal": 100, "high": 1000}

    async def active() -> bool:  # Kueue marks a ClusterQueue Active once its flavor and cohort resolve
        cq = await kube.get("/apis/kueue.x-k8s.io/v1beta1/clusterqueues/ml-b")
        return any(c["type"] == "Active" and c["status"] == "True" for c in cq.get("status", {}).get("conditions", []))
    await eventually(active, 30, "ClusterQueue ml-b Active")

    # Applying the same policy again changes nothing, through the Python API too.
    policy = QuotaPolicy.model_validate(yaml.safe_load(EXAMPLE_POLICY.read_text()))
    assert {c.action for c in await apply_policy(kube, policy, "kueue", dry_run=True)} == {"unchanged"}


def workload_of(workloads: list[dict], job: dict) -> dict | None:
    return next((w for w in workloads if any(o.get("uid") == job["metadata"]["uid"]
                                             for o in w["metadata"].get("ownerReferences", []))), None)


@pytest.fixture(scope="module")
async def kueue_controller(kueue_cluster, tmp_path_factory):
    """gangctl serving TrainJobs on the Kueue cluster, with the backend tests' policy applied."""
    async with serve_backend(kueue_cluster, "kueue", tmp_path_factory.mktemp("kueue-controller")) as ctl:
        yield ctl


async def test_trainjobs_wait_for_quota_with_the_reason_and_start_when_it_frees(kueue_controller, kube):
    ns = TEAMS["team-a"]  # 16 GPUs nominal + 8 borrowed from team-b = 24
    await submit(kube, trainjob("a-big", ns, nodes=2, runtime=runtime_name("batch"), runtime_kind="TrainingRuntime"))
    await submit(kube, trainjob("a-small", ns, nodes=1, runtime=runtime_name("batch"), runtime_kind="TrainingRuntime"))
    for name, nodes in (("a-big", 2), ("a-small", 1)):
        await eventually(lambda: running(kube, ns, name), 60, f"{name} admitted by Kueue and running")
        assert len(bound(await pods_of(kube, ns, name))) == nodes
    job = await kube.get(JOBS.path(ns, "a-big-node-0"))
    assert job["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "default"

    await submit(kube, trainjob("a-waits", ns, nodes=1, runtime=runtime_name("batch"), runtime_kind="TrainingRuntime"))

    async def waits_for_quota() -> bool:
        # Kueue first says "not evaluated yet", then why it does not admit: wait for the why.
        cond = gang_state(await get_trainjob(kube, ns, "a-waits"))
        message = cond.get("message", "")
        return (cond.get("reason") == "WaitingForQuota" and "Kueue" in message and "insufficient" in message
                and "nvidia.com/gpu" in message)
    await eventually(waits_for_quota, 90, "a-waits waiting for quota, in Kueue's words (insufficient GPUs)")
    assert bound(await pods_of(kube, ns, "a-waits")) == [], "a job beyond quota holds no node"

    await kube.delete(TRAINJOBS.path(ns, "a-big"))
    await eventually(lambda: running(kube, ns, "a-waits"), 90, "a-waits running once a-big's quota is free")
    workloads = (await kube.get(WORKLOADS.path(ns)))["items"]
    assert not [w for w in workloads if "a-big" in w["metadata"]["name"]], "a deleted TrainJob leaves no Workload"
    await kube.delete(TRAINJOBS.path(ns, "a-small"))
    await kube.delete(TRAINJOBS.path(ns, "a-waits"))


async def test_a_pytorchjob_with_a_queue_name_waits_in_kueues_words_and_runs_when_admitted(kueue_controller, kube):
    ns = TEAMS["team-a"]   # 24 GPUs at most
    await empty_teams(kube, ns)
    try:
        def queued(name: str, **kw) -> dict:
            obj = pytorchjob(name, ns, **kw)
            obj["metadata"]["labels"] = {"kueue.x-k8s.io/queue-name": "default"}
            return obj
        await kube.create(PYTORCHJOBS.path(ns), queued("pj-a", masters=0, workers=3))

        async def runs(name: str) -> bool:
            return v1_condition(await get_pytorchjob(kube, ns, name), "Running").get("status") == "True"
        await eventually(lambda: runs("pj-a"), 90, "a 24-GPU PyTorchJob admitted by Kueue and running")
        assert len(bound(await pj_pods(kube, ns, "pj-a"))) == 3
        await kube.create(PYTORCHJOBS.path(ns), queued("pj-b", masters=0, workers=1))

        async def waits_in_kueues_words() -> bool:
            held = v1_condition(await get_pytorchjob(kube, ns, "pj-b"), "Suspended")
            return (held.get("status") == "True" and held.get("reason") == "WaitingForQuota"
                    and "insufficient" in held.get("message", "") and "nvidia.com/gpu" in held.get("message", ""))
        await eventually(waits_in_kueues_words, 90, "pj-b Suspended, waiting for quota in Kueue's words")
        assert bound(await pj_pods(kube, ns, "pj-b")) == [], "a job beyond quota holds no node"
        await kube.delete(PYTORCHJOBS.path(ns, "pj-a"))
        await eventually(lambda: runs("pj-b"), 90, "pj-b running once Kueue admits it")
        assert v1_condition(await get_pytorchjob(kube, ns, "pj-b"), "Suspended")["status"] == "False"

        # Kueue admits each child Job alone: a Master and Workers would not be one gang, so it is refused
        await kube.create(PYTORCHJOBS.path(ns), queued("pj-split", workers=1))

        async def failed() -> dict:
            return v1_condition(await get_pytorchjob(kube, ns, "pj-split"), "Failed")
        await eventually(lambda: _true(failed()), 60, "a Master + Worker PyTorchJob under Kueue Failed")
        assert "kueue.x-k8s.io/queue-name" in (await failed())["message"]
    finally:   # the GPU nodes go back to the tests after this one, pass or fail
        await kube.request("DELETE", PYTORCHJOBS.path(ns), body={"propagationPolicy": "Background"})
        await empty_teams(kube, ns)


async def _true(condition) -> bool:
    return (await condition).get("status") == "True"


async def test_a_higher_priority_trainjob_preempts_within_the_team(kueue_controller, kube):
    # Kueue's Evicted condition is cleared once it requeues the workload: either reason shows.
    await preempt_low_with_high(kube, ("Evicted", "WaitingForQuota"))


async def test_the_same_jobs_never_exceed_the_policy(kueue_controller, kube):
    # Half the mix: Kueue admits one workload at a time until its pods are ready (blockAdmission),
    # so 24 jobs took three minutes of CI; the 200-job run is benchmarks/quota_backends.py.
    await assert_same_jobs_within_policy(kube, count=12)


async def test_jobs_without_a_queue_name_are_not_kueues(kueue_cluster, kube):
    _, plain = gang_objects(Kueue(), "plain", "ml-a", 1, {"kueue": {}})
    del plain["metadata"]["labels"]["kueue.x-k8s.io/queue-name"]
    plain["spec"]["suspend"] = False  # gangctl creates Kueue's Jobs suspended; this one is not Kueue's
    created = await kube.create(JOBS.path("ml-a"), plain)
    assert created["spec"].get("suspend") is False
    jobs_workloads = (await kube.get(WORKLOADS.path("ml-a")))["items"]
    assert workload_of(jobs_workloads, created) is None


def test_no_process_listens_beyond_loopback_or_on_gangctls_ports(kueue_cluster):
    assert exposed_listeners(kueue_cluster[0]) == {}


def test_status_and_down_leave_nothing_behind(kueue_cluster):
    status = gangctl("cluster", "status", "-o", "json", cluster=kueue_cluster)
    info = json.loads(status.stdout)
    assert info["scheduler"] == "kueue" and info["running"]
    assert any(c["name"] == "kueue" and c["running"] for c in info["components"])
    assert stop(kueue_cluster[0]) == [], "kueue still running after cluster down"
