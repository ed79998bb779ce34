"""NVIDIA KAI Scheduler on the real local cluster: the quota policy as a Queue tree, gangs bound whole
or not at all, TrainJobs waiting with KAI's reason, priority preemption within a team."""
from __future__ import annotations

import json
import subprocess

import pytest

from gangctl.api.resources import JOBS, PODS, PYTORCHJOBS, TRAINJOBS
from gangctl.kube.client import Kube
from gangctl.plugins.kai import KAI_POD_GROUPS, KAI_QUEUES, Kai
from tests.integration.helpers import (bound, eventually, gang_state, get_trainjob, pod_group, pods_of, running,
                                       submit, trainjob)
from tests.integration.quota_common import (POLICY_FILE, TEAMS, assert_same_jobs_within_policy, empty_teams,
                                            get_pytorchjob, pj_pods, preempt_low_with_high, pytorchjob, runtime_name,
                                            v1_condition)
from tests.integration.schedulers_common import (cli, exposed_listeners, gang_objects, remove_builder_gangs,
                                                serve_backend, start, stop)

pytestmark = pytest.mark.integration
CLUSTER = "gangctl-it-kai"
NS = "team-b"


@pytest.fixture(scope="module")
def kai_cluster():
    settings, kubeconfig = start(CLUSTER, "kai")
    yield settings, kubeconfig
    stop(settings)


@pytest.fixture
async def kube(kai_cluster):
    k = await Kube.connect(kai_cluster[1])
    yield k
    await k.close()


def gangctl(*args: str, cluster) -> subprocess.CompletedProcess:
    return cli(cluster, *args)


async def test_policy_applied_as_a_queue_tree_and_read_back(kai_cluster, kube):
    done = gangctl("policy", "apply", str(POLICY_FILE), "-o", "json", cluster=kai_cluster)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["backend"] == "kai", "the backend defaults to the cluster's scheduler"
    assert "team team-b: lendingLimit is not enforced by KAI" in " ".join(done.stderr.split()), done.stderr
    queues = {q["metadata"]["name"]: q["spec"] for q in (await kube.get(KAI_QUEUES.path()))["items"]}
    assert {"default-queue", "cohort-shared", "team-a", "team-b"} <= set(queues)
    assert queues["cohort-shared"]["resources"]["gpu"]["limit"] == 32, "the cohort holds its teams' 16 + 16"
    assert queues["team-a"]["parentQueue"] == "cohort-shared"
    assert queues["team-a"]["resources"]["gpu"] == {"quota": 16, "limit": 24, "overQuotaWeight": 1}
    again = gangctl("policy", "apply", str(POLICY_FILE), "--dry-run", "-o", "json", cluster=kai_cluster)
    assert {o["action"] for o in json.loads(again.stdout)["objects"]} == {"unchanged"}


async def bound_pods(kube: Kube, name: str) -> int:
    pods = (await kube.get(PODS.path(NS), labelSelector=f"jobset.sigs.k8s.io/jobset-name={name}"))["items"]
    return len([p for p in pods if p["spec"].get("nodeName") and not p["metadata"].get("deletionTimestamp")])


async def create_gang(kube: Kube, name: str, nodes: int) -> None:
    group, job = gang_objects(Kai(), name, NS, nodes, {"kai": {"queue": "default-queue"}})
    assert group is not None
    await kube.create(KAI_POD_GROUPS.path(NS), group)
    await kube.create(JOBS.path(NS), job)


async def test_gangs_bind_whole_or_wait_whole(kai_cluster, kube):
    # 40 GPUs in the cluster, an unlimited queue: a 4 x 8 gang binds; a 2 x 8 gang then finds 8 free
    # and binds no pod, with KAI's reason on its PodGroup.
    await create_gang(kube, "first", 4)

    async def first_bound() -> bool:
        return await bound_pods(kube, "first") == 4
    await eventually(first_bound, 60, "the 4-node gang bound whole")
    await create_gang(kube, "second", 2)

    async def second_refused() -> bool:
        pg = await kube.get(KAI_POD_GROUPS.path(NS, "second"))
        return bool((pg.get("status") or {}).get("schedulingConditions"))
    await eventually(second_refused, 60, "the 2-node gang reported unschedulable by KAI")
    pg = await kube.get(KAI_POD_GROUPS.path(NS, "second"))
    assert "2 are required for gang scheduling" in pg["status"]["schedulingConditions"][-1]["message"]
    assert await bound_pods(kube, "second") == 0, "no pod of a gang that does not fit is bound"

    await kube.delete(JOBS.path(NS, "first-node-0"), propagation="Foreground")

    async def second_bound() -> bool:
        return await bound_pods(kube, "second") == 2
    await eventually(second_bound, 90, "the 2-node gang bound whole once the first gang's pods went away")


@pytest.fixture(scope="module")
async def kai_controller(kai_cluster, tmp_path_factory):
    """gangctl serving TrainJobs on the KAI cluster, with the backend tests' policy applied."""
    async with serve_backend(kai_cluster, "kai", tmp_path_factory.mktemp("kai-controller"),
                             remove_builder_gangs(KAI_POD_GROUPS, NS, "first", "second")) as ctl:
        yield ctl


async def test_trainjobs_wait_for_their_queue_with_the_reason_and_start_when_it_frees(kai_cluster, kai_controller,
                                                                                      kube):
    ns = TEAMS["team-a"]  # queue team-a: quota 16, limit 24 GPUs
    await submit(kube, trainjob("a-big", ns, nodes=2, runtime=runtime_name("batch"), runtime_kind="TrainingRuntime"))
    await eventually(lambda: running(kube, ns, "a-big"), 90, "a-big allocated by KAI and running")
    pg = await kube.get(KAI_POD_GROUPS.path(ns, "a-big"))
    assert pg["spec"]["queue"] == "team-a" and pg["spec"]["minMember"] == 2
    assert pg["spec"]["priorityClassName"] == "batch"
    assert {p["spec"]["schedulerName"] for p in await pods_of(kube, ns, "a-big")} == {"kai-scheduler"}

    await submit(kube, trainjob("a-waits", ns, nodes=2, runtime=runtime_name("batch"), runtime_kind="TrainingRuntime"))

    async def waits_for_queue() -> bool:   # 16 + 16 > the limit of 24: KAI says OverLimit
        cond = gang_state(await get_trainjob(kube, ns, "a-waits"))
        return cond.get("reason") == "WaitingForQuota" and "KAI queue team-a" in cond.get("message", "")
    await eventually(waits_for_queue, 60, "a-waits waiting for its KAI queue, with the reason")
    assert bound(await pods_of(kube, ns, "a-waits")) == [], "a gang beyond its queue holds no node"
    explained = gangctl("explain", f"trainjob/{ns}/a-waits", cluster=kai_cluster)
    assert "KAI queue team-a" in " ".join(explained.stdout.split()), explained.stdout + explained.stderr

    await kube.delete(TRAINJOBS.path(ns, "a-big"))

    async def released() -> bool:
        return await pod_group(kube, ns, "a-big", KAI_POD_GROUPS) is None
    await eventually(released, 30, "a-big's PodGroup deleted with it")
    await eventually(lambda: running(kube, ns, "a-waits"), 120, "a-waits running once the queue has room")
    assert len(bound(await pods_of(kube, ns, "a-waits"))) == 2
    await kube.delete(TRAINJOBS.path(ns, "a-waits"))


async def test_pytorchjobs_are_kai_gangs_in_their_queue(kai_controller, kube):
    ns = TEAMS["team-a"]   # queue team-a: limit 24 GPUs
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
        await eventually(lambda: runs("pj-first"), 90, "a PyTorchJob allocated by KAI in its queue and running")
        pg = await kube.get(KAI_POD_GROUPS.path(ns, "pj-first-pytorch"))
        assert pg["spec"]["queue"] == "team-a" and pg["spec"]["minMember"] == 2
        assert {p["spec"]["schedulerName"] for p in await pj_pods(kube, ns, "pj-first")} == {"kai-scheduler"}

        await kube.create(PYTORCHJOBS.path(ns), in_queue("pj-second"))   # 16 + 16 > 24: KAI holds it

        async def held_whole() -> bool:
            pg = await pod_group(kube, ns, "pj-second-pytorch", KAI_POD_GROUPS)   # None: not made yet
            return pg is not None and bool((pg.get("status") or {}).get("schedulingConditions"))
        await eventually(held_whole, 60, "pj-second's gang made and refused by KAI")
        assert bound(await pj_pods(kube, ns, "pj-second")) == [], "a gang beyond its queue holds no node"
        await kube.delete(PYTORCHJOBS.path(ns, "pj-first"))
        await eventually(lambda: runs("pj-second"), 120, "pj-second running once the queue has room")
    finally:   # the GPU nodes go back to the tests after this one, pass or fail
        await kube.request("DELETE", PYTORCHJOBS.path(ns), body={"propagationPolicy": "Background"})
        await empty_teams(kube, ns)


async def test_a_higher_priority_trainjob_preempts_within_the_team(kai_controller, kube):
    # KAI's preempt action evicts the batch gang (DisruptionTarget: PreemptionByScheduler, so it is
    # not charged) and the batch job waits for its queue again: 16 urgent + 24 batch > team-a's limit.
    low = await preempt_low_with_high(kube, ("WaitingForQuota",))
    assert "KAI queue team-a" in gang_state(low).get("message", "")


async def test_the_same_jobs_never_exceed_the_policy(kai_controller, kube):
    await assert_same_jobs_within_policy(kube)


def test_no_process_listens_beyond_loopback_or_on_gangctls_ports(kai_cluster):
    """The podgroupcontroller ignores its --metrics-bind-address (controller-runtime's default :8080,
    moved to loopback by integrations/kai/build.json). KAI's scheduler binds its plugin server on every
    interface in code (`":%d"`, no flag): the one exception, on a free port."""
    exposed = exposed_listeners(kai_cluster[0])
    assert list(exposed) in ([], ["kai-scheduler"]), exposed
    assert all(not a.startswith(("127.", "[::1]:")) for a in exposed.get("kai-scheduler", [])), exposed
    assert len(exposed.get("kai-scheduler", [])) <= 1, exposed


def test_status_and_down_leave_nothing_behind(kai_cluster):
    info = json.loads(gangctl("cluster", "status", "-o", "json", cluster=kai_cluster).stdout)
    assert info["scheduler"] == "kai" and info["running"]
    assert {c["name"] for c in info["components"]} >= {"kai-scheduler", "kai-binder", "kai-podgroupcontroller",
                                                       "kai-queuecontroller"}
    assert all(c["running"] for c in info["components"])
    assert stop(kai_cluster[0]) == [], "a KAI process still runs after cluster down"
