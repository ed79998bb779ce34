"""gangctl's own topology placement on the real cluster (issue 36): the shared cluster's coscheduling
backend has no placement of its own, so gangctl pins each gang with a required rack to a rack with
room, makes a gang wait naming the best rack when none has room, fails at once a gang no rack can
ever hold, and packs gangs that ask for nothing into the fullest rack that holds them. Eight KWOK GPU nodes get two test racks of four hosts (labels of this test's own, removed
after it), and the topology is stored where `gangctl policy apply` stores it."""
from __future__ import annotations

import json

import pytest
import pytest_asyncio

from gangctl.api.resources import CONFIGMAPS, NODES, PODS, PYTORCHJOBS, TRAINJOBS, object_path
from gangctl.cluster.local import KWOK_NODE_SELECTOR, KWOK_TOLERATION
from gangctl.model.topology import KUEUE_REQUIRED, Topology
from gangctl.plugins.quota_objects import POLICY_NAMESPACE, TOPOLOGY_CONFIGMAP, stored_topology
from gangctl.policy.placement import PLACEMENT_ANNOTATION, UNSATISFIABLE, WAITING
from gangctl.runtime.cluster_view import ClusterLister
from tests.integration.helpers import (condition, eventually, gang_state, gangctl_cli, get_trainjob, holds_no_node,
                                       is_running, pods_of, submit, trainjob)

pytestmark = [pytest.mark.integration, pytest.mark.asyncio(loop_scope="session")]

ZONE, RACK = "test.gangctl.io/zone", "test.gangctl.io/rack"
TOPOLOGY = Topology.model_validate({"name": "test-racks", "levels": [{"name": "zone", "nodeLabel": ZONE},
                                                                     {"name": "rack", "nodeLabel": RACK}]})
HOSTS_PER_RACK = 4


@pytest_asyncio.fixture(loop_scope="session")
async def racks(kube, controller):
    """Two racks (t0, t1) of four KWOK GPU nodes each in zone z0, and the topology stored for gangctl."""
    selector = ",".join(f"{k}={v}" for k, v in KWOK_NODE_SELECTOR.items())
    names = sorted(n["metadata"]["name"] for n in (await kube.get(NODES.path(), labelSelector=selector))["items"])
    chosen = {name: f"t{i // HOSTS_PER_RACK}" for i, name in enumerate(names[:2 * HOSTS_PER_RACK])}
    for name, rack in chosen.items():
        await kube.merge_patch(NODES.path(name=name), {"metadata": {"labels": {ZONE: "z0", RACK: rack}}})
    for obj in stored_topology(TOPOLOGY):
        await kube.apply(object_path(obj), obj, "gangctl-tests")
    yield chosen
    await kube.delete(CONFIGMAPS.path(POLICY_NAMESPACE, TOPOLOGY_CONFIGMAP))
    for name in chosen:
        await kube.merge_patch(NODES.path(name=name), {"metadata": {"labels": {ZONE: None, RACK: None}}})


def rack_job(name: str, namespace: str, nodes: int, level: str = RACK) -> dict:
    """A TrainJob whose pods must share one rack (Kueue's annotation, as Trainer + Kueue users write it)."""
    job = trainjob(name, namespace, nodes=nodes)
    job["spec"]["podTemplateOverrides"][0]["metadata"]["annotations"][KUEUE_REQUIRED] = level
    return job


async def racks_of(kube, namespace: str, name: str, racks: dict[str, str]) -> set[str]:
    pods = [p for p in await pods_of(kube, namespace, name) if not p["metadata"].get("deletionTimestamp")]
    return {racks.get(p["spec"].get("nodeName"), "elsewhere") for p in pods}


async def test_gangs_with_a_required_rack_fill_racks_wait_for_one_and_start_when_it_frees(kube, kubeconfig, namespace,
                                                                                            racks):
    for name in ("a", "b"):
        await submit(kube, rack_job(name, namespace, 3))

    async def both_running() -> bool:
        return all([is_running(await get_trainjob(kube, namespace, n)) for n in ("a", "b")])
    await eventually(both_running, 90, "the two rack gangs running")
    a_racks, b_racks = await racks_of(kube, namespace, "a", racks), await racks_of(kube, namespace, "b", racks)
    assert len(a_racks) == 1 and len(b_racks) == 1 and a_racks != b_racks, (a_racks, b_racks)
    assert a_racks | b_racks == {"t0", "t1"}
    pod = (await pods_of(kube, namespace, "a"))[0]
    assert pod["metadata"]["annotations"][PLACEMENT_ANNOTATION] == f"{RACK}={a_racks.pop()}"

    await submit(kube, rack_job("c", namespace, 3))   # each rack has one free host now

    async def waiting() -> bool:
        return gang_state(await get_trainjob(kube, namespace, "c")).get("reason") == WAITING
    await eventually(waiting, 60, "the third gang waiting for a rack")
    message = gang_state(await get_trainjob(kube, namespace, "c"))["message"]
    assert "no rack has room for the gang's floor (3 pods of" in message and "1 of 4 hosts free" in message, message
    assert await pods_of(kube, namespace, "c") == [], "a gang waiting for a rack creates no pod"
    shown = json.loads(gangctl_cli("explain", f"{namespace}/c", "-o", "json", kubeconfig=kubeconfig, timeout=60).stdout)
    assert shown["reason"] == WAITING and shown["next_domain"] == ""
    assert [(r["domain"], r["hosts"], r["hosts_with_room"], r["room"]) for r in shown["domains"]] == [
        ("t0", 4, 1, 1), ("t1", 4, 1, 1)], shown["domains"]

    freed = await racks_of(kube, namespace, "a", racks)
    await kube.delete(TRAINJOBS.path(namespace, "a"))
    await holds_no_node(kube, namespace, "a")

    async def c_running() -> bool:
        return is_running(await get_trainjob(kube, namespace, "c"))
    await eventually(c_running, 90, "the third gang running in the freed rack")
    assert await racks_of(kube, namespace, "c", racks) == freed

    # a PyTorchJob waiting for a rack is explained per rack too (each has one free host again)
    await kube.create(PYTORCHJOBS.path(namespace), rack_pytorchjob("pc", namespace))

    seen: dict = {}

    async def explained() -> bool:
        out = gangctl_cli("explain", f"pytorchjob/{namespace}/pc", "-o", "json", kubeconfig=kubeconfig, timeout=60)
        seen.update(json.loads(out.stdout))
        return seen["reason"] == WAITING
    await eventually(explained, 60, "the PyTorchJob explained as waiting for a rack", interval=1)
    shown = seen
    assert [(r["domain"], r["hosts"], r["hosts_with_room"]) for r in shown["domains"]] == [
        ("t0", 4, 1), ("t1", 4, 1)], shown["domains"]
    assert shown["level"] == "rack" and shown["next_domain"] == "", shown


async def test_gangs_that_ask_for_no_rack_are_packed_into_the_fullest_rack_that_holds_them(kube, namespace, racks):
    """A gang that asks for nothing is pinned (preferred node affinity) to the narrowest, fullest domain
    that holds it, as Kueue's TAS places a pod set without a topology request: the racks stay whole for
    the gangs that need one, where kube-scheduler alone would scatter it over any free nodes."""
    async def running(name: str) -> None:
        async def ready() -> bool:
            return is_running(await get_trainjob(kube, namespace, name))
        await eventually(ready, 90, f"{name} running")

    await submit(kube, rack_job("held", namespace, 3))
    await running("held")
    (fuller,) = await racks_of(kube, namespace, "held", racks)
    (emptier,) = {"t0", "t1"} - {fuller}
    await submit(kube, trainjob("one", namespace, nodes=1))
    await running("one")
    assert await racks_of(kube, namespace, "one", racks) == {fuller}, "the last free host of the fuller rack"
    await submit(kube, trainjob("two", namespace, nodes=2))
    await running("two")
    assert await racks_of(kube, namespace, "two", racks) == {emptier}
    marks = {p["metadata"]["annotations"].get(PLACEMENT_ANNOTATION) for p in await pods_of(kube, namespace, "two")}
    assert marks == {f"{RACK}={emptier}"}, marks


async def test_a_gang_no_rack_can_hold_fails_at_once_with_the_numbers(kube, namespace, racks):
    await submit(kube, rack_job("big", namespace, HOSTS_PER_RACK + 1))

    async def failed() -> bool:
        return (condition(await get_trainjob(kube, namespace, "big"), "Failed") or {}).get("status") == "True"
    await eventually(failed, 30, "the gang failed")
    cond = condition(await get_trainjob(kube, namespace, "big"), "Failed")
    assert cond["reason"] == UNSATISFIABLE
    assert "no rack can ever hold the gang's floor (5 pods of" in cond["message"], cond["message"]
    assert "4 hosts with room for 4 pods" in cond["message"], cond["message"]
    assert await pods_of(kube, namespace, "big") == []


async def test_a_level_the_cluster_topology_lacks_fails_naming_the_annotation(kube, namespace, racks):
    await submit(kube, rack_job("row", namespace, 2, level="example.com/row"))

    async def failed() -> bool:
        return (condition(await get_trainjob(kube, namespace, "row"), "Failed") or {}).get("status") == "True"
    await eventually(failed, 30, "the gang failed")
    cond = condition(await get_trainjob(kube, namespace, "row"), "Failed")
    assert cond["reason"] == "InvalidPlacement" and KUEUE_REQUIRED in cond["message"], cond


def rack_pytorchjob(name: str, namespace: str) -> dict:
    """A Master and two Workers whose pods must share one rack (the annotation on the Worker template)."""
    from tests.integration.quota_common import pytorchjob

    job = pytorchjob(name, namespace, masters=1, workers=2)
    del job["spec"]["runPolicy"]["schedulingPolicy"]["priorityClass"]   # the shared cluster's own classes vary
    job["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["metadata"]["annotations"][KUEUE_REQUIRED] = RACK
    return job


async def test_a_pytorchjob_with_a_required_rack_runs_its_master_and_workers_in_one_rack(kube, namespace, racks):
    from tests.integration.quota_common import get_pytorchjob, pj_pods, v1_condition

    await kube.create(PYTORCHJOBS.path(namespace), rack_pytorchjob("ranked", namespace))

    async def running() -> bool:
        obj = await get_pytorchjob(kube, namespace, "ranked")
        assert v1_condition(obj, "Failed").get("status") != "True", obj.get("status")
        return v1_condition(obj, "Running").get("status") == "True"
    await eventually(running, 90, "the PyTorchJob running")
    pods = await pj_pods(kube, namespace, "ranked")
    assert len(pods) == 3
    in_racks = {racks.get(p["spec"]["nodeName"], "elsewhere") for p in pods}
    assert len(in_racks) == 1 and in_racks <= {"t0", "t1"}, in_racks
    assert {p["metadata"]["annotations"][PLACEMENT_ANNOTATION] for p in pods} == {f"{RACK}={in_racks.pop()}"}


async def test_the_nodes_listed_for_placement_are_listed_again_once_capacity_was_freed(kube, namespace):
    """gangctl's placement reuses one listing of nodes and bound pods for a burst of gangs, but never
    past capacity it saw freed: a listing that still counts a deleted pod would send the next gang to
    another rack (or make a rack gang wait) while the freed rack is empty."""
    lister = ClusterLister(kube, max_age=600)
    selector = ",".join(f"{k}={v}" for k, v in KWOK_NODE_SELECTOR.items())
    node = (await kube.get(NODES.path(), labelSelector=selector))["items"][-1]["metadata"]["name"]
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "holder", "namespace": namespace},
           "spec": {"nodeName": node, "tolerations": [dict(KWOK_TOLERATION)],
                    "containers": [{"name": "c", "image": "none", "resources": {"requests": {"nvidia.com/gpu": "8"},
                                                                                "limits": {"nvidia.com/gpu": "8"}}}]}}
    await kube.create(PODS.path(namespace), pod)

    def holders(view) -> list[str]:
        return [p["spec"]["nodeName"] for p in view.pods if p["metadata"]["namespace"] == namespace]
    assert holders(await lister()) == [node]
    await kube.request("DELETE", PODS.path(namespace, "holder"), body={"gracePeriodSeconds": 0})

    async def gone() -> bool:
        return not (await kube.get(PODS.path(namespace)))["items"]
    await eventually(gone, 30, "the pod deleted")
    assert holders(await lister()) == [node], "within max_age, with nothing freed that it was told of, reused"
    lister.forget()   # what the controller does when it sees one of its pods deleted or a job finish
    assert holders(await lister()) == [], "listed again: the freed node counts as free"
