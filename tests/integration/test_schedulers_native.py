"""Kubernetes' own gang scheduling (KEP-4671, scheduling.k8s.io/v1alpha2) on the real local cluster.

The module brings up its own cluster with `--scheduler native`: its apiserver serves the PodGroup API
with the GenericWorkload and GangScheduling gates, and upstream kube-scheduler 1.36 (built from the
control plane's pinned module, cached) runs with GangScheduling as `native-gang-scheduler`. Native
gangs have no quota system of their own, so gangctl's quota gate admits them, as for coscheduling:
the same checks as the other backends, with the same policy and the same jobs.
"""
from __future__ import annotations

import json

import pytest

from gangctl.api.resources import JOBS, NAMESPACES, NATIVE_POD_GROUPS, PODS, TRAINJOBS
from gangctl.cluster.native import NATIVE_SCHEDULER
from gangctl.kube.client import Kube
from gangctl.plugins.native import Native
from tests.integration.helpers import (bound, eventually, gang_state, get_trainjob, pods_of, running, submit,
                                       trainjob)
from tests.integration.quota_common import (TEAMS, assert_preempted_event, assert_same_jobs_within_policy,
                                            preempt_low_with_high, runtime_name)
from tests.integration.schedulers_common import (cli, exposed_listeners, gang_objects, remove_builder_gangs,
                                                serve_backend, start, stop)

pytestmark = pytest.mark.integration
CLUSTER = "gangctl-it-native"
NS = "team-b"
POLICY = {"native": {"schedulerName": NATIVE_SCHEDULER}}


@pytest.fixture(scope="module")
def native_cluster():
    settings, kubeconfig = start(CLUSTER, "native")
    yield settings, kubeconfig
    stop(settings)


@pytest.fixture
async def kube(native_cluster):
    k = await Kube.connect(native_cluster[1])
    await k.apply(NAMESPACES.path(name=NS), {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}},
                  "gangctl-tests")
    yield k
    await k.close()


async def create_gang(kube: Kube, name: str, nodes: int) -> None:
    group, job = gang_objects(Native(), name, NS, nodes, POLICY)
    assert group is not None
    await kube.create(NATIVE_POD_GROUPS.path(NS), group)
    await kube.create(JOBS.path(NS), job)


async def bound_pods(kube: Kube, name: str) -> list[dict]:
    pods = (await kube.get(PODS.path(NS), labelSelector=f"jobset.sigs.k8s.io/jobset-name={name}"))["items"]
    return [p for p in pods if p["spec"].get("nodeName") and not p["metadata"].get("deletionTimestamp")]


def scheduled(pg: dict) -> dict:
    return next((c for c in (pg.get("status") or {}).get("conditions") or [] if c["type"] == "PodGroupScheduled"), {})


async def test_gangs_bind_whole_or_wait_whole(native_cluster, kube):
    # 40 GPUs in the cluster: a 4 x 8 gang binds; a 2 x 8 gang then finds 8 free and binds no pod.
    await create_gang(kube, "first", 4)

    async def first_bound() -> bool:
        return len(await bound_pods(kube, "first")) == 4
    await eventually(first_bound, 60, "the 4-node gang bound whole")
    pods = await bound_pods(kube, "first")
    assert {p["spec"]["schedulingGroup"]["podGroupName"] for p in pods} == {"first"}
    assert {p["spec"]["schedulerName"] for p in pods} == {NATIVE_SCHEDULER}
    pg = await kube.get(NATIVE_POD_GROUPS.path(NS, "first"))
    assert pg["spec"]["schedulingPolicy"] == {"gang": {"minCount": 4}}
    assert scheduled(pg).get("status") == "True", pg.get("status")

    await create_gang(kube, "second", 2)

    async def second_refused() -> bool:
        cond = scheduled(await kube.get(NATIVE_POD_GROUPS.path(NS, "second")))
        return cond.get("status") == "False" and cond.get("reason") == "Unschedulable"
    await eventually(second_refused, 60, "the 2-node gang's PodGroup reported Unschedulable by kube-scheduler")
    assert await bound_pods(kube, "second") == [], "no pod of a gang that does not fit is bound"

    await kube.delete(JOBS.path(NS, "first-node-0"), propagation="Foreground")

    async def second_bound() -> bool:
        return len(await bound_pods(kube, "second")) == 2
    await eventually(second_bound, 90, "the 2-node gang bound whole once the first gang's pods went away")


@pytest.fixture(scope="module")
async def native_controller(native_cluster, tmp_path_factory):
    """gangctl serving TrainJobs on the native cluster, with the backend tests' policy applied."""
    async with serve_backend(native_cluster, "native", tmp_path_factory.mktemp("native-controller"),
                             remove_builder_gangs(NATIVE_POD_GROUPS, NS, "first", "second")) as ctl:
        yield ctl


async def gone(kube: Kube, path: str) -> bool:
    return not await kube.exists(path)


async def test_trainjobs_wait_for_quota_with_the_reason_and_start_when_it_frees(native_controller, kube):
    ns = TEAMS["team-a"]  # 16 GPUs nominal + 8 borrowed from team-b = 24
    rt = dict(runtime=runtime_name("batch"), runtime_kind="TrainingRuntime")
    await submit(kube, trainjob("a-big", ns, nodes=2, **rt))
    await eventually(lambda: running(kube, ns, "a-big"), 90, "a-big admitted by gangctl and bound by kube-scheduler")
    pg = await kube.get(NATIVE_POD_GROUPS.path(ns, "a-big"))
    assert pg["spec"]["schedulingPolicy"] == {"gang": {"minCount": 2}}
    assert pg["metadata"]["ownerReferences"][0]["kind"] == "TrainJob"
    pods = bound(await pods_of(kube, ns, "a-big"))
    assert len(pods) == 2 and {p["spec"]["schedulingGroup"]["podGroupName"] for p in pods} == {"a-big"}

    await submit(kube, trainjob("a-waits", ns, nodes=2, **rt))

    async def waits_for_quota() -> bool:
        state = gang_state(await get_trainjob(kube, ns, "a-waits"))
        return state.get("reason") == "WaitingForQuota" and "team team-a uses 16" in state.get("message", "")
    await eventually(waits_for_quota, 60, "a-waits waiting for quota, with the numbers")
    assert bound(await pods_of(kube, ns, "a-waits")) == [], "a job beyond quota holds no node"
    assert await gone(kube, NATIVE_POD_GROUPS.path(ns, "a-waits")), "a job waiting for quota has no PodGroup"

    await kube.delete(TRAINJOBS.path(ns, "a-big"))
    # The PodGroup's protection finalizer holds it until no running pod names it: once the Job is gone
    # (nothing recreates them), its pods go at once (kubelet's SIGKILL), not after KWOK's 30 s grace.
    await eventually(lambda: gone(kube, JOBS.path(ns, "a-big-node-0")), 30, "a-big's Job deleted with it")
    await kube.request("DELETE", PODS.path(ns), body={"gracePeriodSeconds": 0},
                       params={"labelSelector": "jobset.sigs.k8s.io/jobset-name=a-big"})
    await eventually(lambda: gone(kube, NATIVE_POD_GROUPS.path(ns, "a-big")), 30, "a-big's PodGroup deleted with it")
    await eventually(lambda: running(kube, ns, "a-waits"), 90, "a-waits running once a-big's quota is free")
    await kube.delete(TRAINJOBS.path(ns, "a-waits"))


async def test_a_higher_priority_trainjob_preempts_within_the_team(native_controller, kube):
    low = await preempt_low_with_high(kube, ("WaitingForQuota",))
    assert "team team-a" in gang_state(low).get("message", "")
    await assert_preempted_event(kube)


async def test_the_same_jobs_never_exceed_the_policy(native_controller, kube):
    await assert_same_jobs_within_policy(kube)

    async def no_podgroups() -> bool:
        left = [pg for ns in TEAMS.values() for pg in (await kube.get(NATIVE_POD_GROUPS.path(ns)))["items"]]
        return not left
    await eventually(no_podgroups, 30, "every finished job's PodGroup deleted")


def test_no_process_listens_beyond_loopback_or_on_gangctls_ports(native_cluster):
    assert exposed_listeners(native_cluster[0]) == {}


def test_status_and_down_leave_nothing_behind(native_cluster):
    info = json.loads(cli(native_cluster, "cluster", "status", "-o", "json").stdout)
    assert info["scheduler"] == "native" and info["running"]
    assert {c["name"] for c in info["components"]} >= {"kube-scheduler-native"}
    assert stop(native_cluster[0]) == [], "the native kube-scheduler still runs after cluster down"
