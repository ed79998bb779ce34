"""Volcano on the real local cluster: the quota policy as Queues, and gangs bound whole or not at all."""
from __future__ import annotations

import json
import subprocess

import pytest

from gangctl.api.resources import JOBS, PODS, PYTORCHJOBS, TRAINJOBS
from gangctl.kube.client import Kube
from gangctl.plugins.volcano import VOLCANO_POD_GROUPS, VOLCANO_QUEUES, Volcano
from tests.integration.helpers import (bound, eventually, gang_state, get_trainjob, pod_group, pods_of, running,
                                       submit, trainjob)
from tests.integration.quota_common import (POLICY_FILE, TEAMS, assert_preempted_event, assert_same_jobs_within_policy,
                                            empty_teams, get_pytorchjob, pj_pods, preempt_low_with_high, pytorchjob,
                                            runtime_name, v1_condition)
from tests.integration.schedulers_common import (cli, exposed_listeners, gang_objects, remove_builder_gangs,
                                                serve_backend, start, stop)

pytestmark = pytest.mark.integration
CLUSTER = "gangctl-it-volcano"
NS = "team-b"


@pytest.fixture(scope="module")
def volcano_cluster():
    settings, kubeconfig = start(CLUSTER, "volcano")
    yield settings, kubeconfig
    stop(settings)


@pytest.fixture
async def kube(volcano_cluster):
    k = await Kube.connect(volcano_cluster[1])
    yield k
    await k.close()


def gangctl(*args: str, cluster) -> subprocess.CompletedProcess:
    return cli(cluster, *args)


async def test_policy_applied_as_queues_and_read_back(volcano_cluster, kube):
    # The backend tests' policy (two teams in a cohort, 32 of the cluster's 40 GPUs): the example
    # policy is sized for 256 GPUs and its guarantees would leave these queues nothing.
    done = gangctl("policy", "apply", str(POLICY_FILE), "-o", "json", cluster=volcano_cluster)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["backend"] == "volcano", "the backend defaults to the cluster's scheduler"
    queues = {q["metadata"]["name"]: q["spec"] for q in (await kube.get(VOLCANO_QUEUES.path()))["items"]}
    assert {"default", "team-a", "team-b"} <= set(queues)
    assert queues["team-a"]["deserved"] == {"nvidia.com/gpu": "16"}
    assert queues["team-a"]["capability"]["nvidia.com/gpu"] == "24", "nominal 16 + borrowing limit 8"
    assert queues["team-b"]["guarantee"] == {"resource": {"nvidia.com/gpu": "8"}}, "16 nominal - 8 lent"
    again = gangctl("policy", "apply", str(POLICY_FILE), "--dry-run", "-o", "json", cluster=volcano_cluster)
    assert {o["action"] for o in json.loads(again.stdout)["objects"]} == {"unchanged"}


async def bound_pods(kube: Kube, name: str) -> int:
    pods = (await kube.get(PODS.path(NS), labelSelector=f"jobset.sigs.k8s.io/jobset-name={name}"))["items"]
    return len([p for p in pods if p["spec"].get("nodeName") and not p["metadata"].get("deletionTimestamp")])


async def create_gang(kube: Kube, name: str, nodes: int) -> None:
    group, job = gang_objects(Volcano(), name, NS, nodes, {"volcano": {"queue": "team-b"}})
    assert group is not None
    await kube.create(VOLCANO_POD_GROUPS.path(NS), group)
    await kube.create(JOBS.path(NS), job)


async def test_gangs_bind_whole_or_wait_whole(volcano_cluster, kube):
    # 40 GPUs in the cluster: a 4 x 8 gang binds; a 2 x 8 gang then finds 8 free and binds no pod.
    await create_gang(kube, "first", 4)

    async def first_bound() -> bool:
        return await bound_pods(kube, "first") == 4
    await eventually(first_bound, 60, "the 4-node gang bound whole")
    pg = await kube.get(VOLCANO_POD_GROUPS.path(NS, "first"))
    assert pg["spec"]["minTaskMember"] == {"node": 4} and pg["spec"]["queue"] == "team-b"

    await create_gang(kube, "second", 2)

    async def second_refused() -> bool:
        pg = await kube.get(VOLCANO_POD_GROUPS.path(NS, "second"))
        return any(c["type"] == "Unschedulable" for c in pg.get("status", {}).get("conditions", []))
    await eventually(second_refused, 60, "the 2-node gang reported Unschedulable")
    assert await bound_pods(kube, "second") == 0, "no pod of a gang that does not fit is bound"

    await kube.delete(JOBS.path(NS, "first-node-0"), propagation="Foreground")

    async def second_bound() -> bool:
        return await bound_pods(kube, "second") == 2
    await eventually(second_bound, 90, "the 2-node gang bound whole once the first gang's pods went away")


@pytest.fixture(scope="module")
async def volcano_controller(volcano_cluster, tmp_path_factory):
    """gangctl serving TrainJobs on the Volcano cluster, with the backend tests' policy applied."""
    async with serve_backend(volcano_cluster, "volcano", tmp_path_factory.mktemp("volcano-controller"),
                             remove_builder_gangs(VOLCANO_POD_GROUPS, NS, "first", "second")) as ctl:
        yield ctl


async def test_trainjobs_wait_for_their_queue_with_the_reason_and_start_when_it_frees(volcano_controller, kube):
    ns = TEAMS["team-a"]  # queue team-a: capability 24 GPUs
    await submit(kube, trainjob("a-big", ns, nodes=2, runtime=runtime_name("batch"), runtime_kind="TrainingRuntime"))
    await eventually(lambda: running(kube, ns, "a-big"), 90, "a-big admitted by its queue and running")
    pg = await kube.get(VOLCANO_POD_GROUPS.path(ns, "a-big"))
    assert pg["spec"]["queue"] == "team-a" and pg["spec"]["minMember"] == 2
    assert pg["spec"]["minResources"]["nvidia.com/gpu"] == "16"

    await submit(kube, trainjob("a-waits", ns, nodes=2, runtime=runtime_name("batch"), runtime_kind="TrainingRuntime"))

    async def waits_for_queue() -> bool:
        cond = gang_state(await get_trainjob(kube, ns, "a-waits"))
        return cond.get("reason") == "WaitingForQuota" and "queue team-a" in cond.get("message", "")
    await eventually(waits_for_queue, 60, "a-waits waiting for its Volcano queue, with the reason")
    assert bound(await pods_of(kube, ns, "a-waits")) == [], "a gang beyond its queue holds no node"

    await kube.delete(TRAINJOBS.path(ns, "a-big"))

    async def released() -> bool:
        return await pod_group(kube, ns, "a-big", VOLCANO_POD_GROUPS) is None
    await eventually(released, 30, "a-big's PodGroup deleted with it")
    await eventually(lambda: running(kube, ns, "a-waits"), 120, "a-waits running once the queue has room")
    assert len(bound(await pods_of(kube, ns, "a-waits"))) == 2
    await kube.delete(TRAINJOBS.path(ns, "a-waits"))


async def test_pytorchjobs_are_volcano_gangs_in_their_queue(volcano_controller, kube):
    ns = TEAMS["team-a"]   # queue team-a: capability 24 GPUs
    await empty_teams(kube, ns)

    def in_queue(name: str) -> dict:   # a Master and a Worker of 8 GPUs: 16 GPUs
        obj = pytorchjob(name, ns, workers=1)
        obj["spec"]["runPolicy"]["schedulingPolicy"]["queue"] = "team-a"
        return obj

    async def runs(name: str) -> bool:
        job = await get_pytorchjob(kube, ns, name)
        return v1_condition(job, "Running").get("status") == "True" and len(bound(await pj_pods(kube, ns, name))) == 2
    try:
        await kube.create(PYTORCHJOBS.path(ns), in_queue("pj-first"))
        await eventually(lambda: runs("pj-first"), 90, "a PyTorchJob admitted by its Volcano queue and running")
        pg = await kube.get(VOLCANO_POD_GROUPS.path(ns, "pj-first-pytorch"))
        assert pg["spec"]["queue"] == "team-a" and pg["spec"]["minMember"] == 2
        assert pg["spec"]["minResources"]["nvidia.com/gpu"] == "16"
        assert {p["spec"]["schedulerName"] for p in await pj_pods(kube, ns, "pj-first")} == {"volcano"}

        await kube.create(PYTORCHJOBS.path(ns), in_queue("pj-second"))   # 16 + 16 > 24: Volcano holds it

        async def held_whole() -> bool:
            pg = await pod_group(kube, ns, "pj-second-pytorch", VOLCANO_POD_GROUPS)   # None: not made yet
            return pg is not None and (pg.get("status") or {}).get("phase") in ("Pending", "Inqueue") and \
                len(await pj_pods(kube, ns, "pj-second")) == 2
        await eventually(held_whole, 60, "pj-second's gang made and held by Volcano")
        assert bound(await pj_pods(kube, ns, "pj-second")) == [], "a gang beyond its queue holds no node"
        await kube.delete(PYTORCHJOBS.path(ns, "pj-first"))

        async def released() -> bool:
            return await pod_group(kube, ns, "pj-first-pytorch", VOLCANO_POD_GROUPS) is None
        await eventually(released, 30, "pj-first's PodGroup deleted with it")
        await eventually(lambda: runs("pj-second"), 120, "pj-second running once the queue has room")
    finally:   # the GPU nodes go back to the tests after this one, pass or fail
        await kube.request("DELETE", PYTORCHJOBS.path(ns), body={"propagationPolicy": "Background"})
        await empty_teams(kube, ns)


async def test_a_higher_priority_trainjob_preempts_within_the_team(volcano_controller, kube):
    # Volcano keeps the urgent PodGroup Pending while team-a's queue is full, and its preempt action
    # only looks at Inqueue jobs: gangctl evicts the batch gang, which queues again behind it.
    low = await preempt_low_with_high(kube, ("WaitingForQuota",))
    assert "queue team-a" in gang_state(low).get("message", "")
    await assert_preempted_event(kube)


async def test_the_same_jobs_never_exceed_the_policy(volcano_controller, kube):
    await assert_same_jobs_within_policy(kube)


def test_no_process_listens_beyond_loopback_or_on_gangctls_ports(volcano_cluster):
    assert exposed_listeners(volcano_cluster[0]) == {}


def test_status_and_down_leave_nothing_behind(volcano_cluster):
    info = json.loads(gangctl("cluster", "status", "-o", "json", cluster=volcano_cluster).stdout)
    assert info["scheduler"] == "volcano" and info["running"]
    assert {c["name"] for c in info["components"]} >= {"vc-scheduler", "vc-controller-manager"}
    assert stop(volcano_cluster[0]) == [], "a Volcano process still runs after cluster down"
