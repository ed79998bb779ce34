"""Each backend's translation of a placement intent and of the policy's topology (issue 36 item 3)."""
from __future__ import annotations

from pathlib import Path

import yaml

from gangctl.commands.policy_apply import objects_for
from gangctl.model.quota import QuotaPolicy
from gangctl.model.topology import (KUEUE_PREFERRED, KUEUE_REQUIRED, KUEUE_SLICE_REQUIRED, KUEUE_SLICE_SIZE,
                                    PlacementIntent, read_intent)
from gangctl.plugins import base
from gangctl.plugins.registry import BACKENDS

ROOT = Path(__file__).parents[2]
POLICY = QuotaPolicy.model_validate(yaml.safe_load((ROOT / "policies/example-topology.yaml").read_text()))
TOPOLOGY = POLICY.topology
BLOCK, RACK, HOST = (lv.node_label for lv in TOPOLOGY.levels)
REQUIRED_RACK = PlacementIntent(required=RACK)
PREFERRED_RACK = PlacementIntent(preferred=RACK)


def node(name: str, block: str, rack: str) -> dict:
    return {"metadata": {"name": name, "labels": {BLOCK: block, RACK: rack, HOST: name}}}


NODES = [node("n1", "b1", "r1"), node("n2", "b1", "r1"), node("n3", "b1", "r2"), node("n4", "b2", "r3"),
         {"metadata": {"name": "cpu-0", "labels": {}}}]


def kinds(objs: list[dict]) -> list[str]:
    return [o["kind"] for o in objs]


# --- Kueue: annotations passed through, Topology + the flavor's topologyName

def test_kueue_passes_the_annotations_through():
    kueue = BACKENDS["kueue"]
    assert base.placement_annotations(kueue, REQUIRED_RACK) == {KUEUE_REQUIRED: RACK}
    assert base.placement_annotations(kueue, PREFERRED_RACK) == {KUEUE_PREFERRED: RACK}
    sliced = read_intent({KUEUE_REQUIRED: BLOCK, KUEUE_SLICE_REQUIRED: RACK, KUEUE_SLICE_SIZE: "2"}).on(TOPOLOGY)
    assert base.placement_annotations(kueue, sliced) == {KUEUE_REQUIRED: BLOCK, KUEUE_SLICE_REQUIRED: RACK,
                                                         KUEUE_SLICE_SIZE: "2"}
    assert base.placement_spec(kueue, REQUIRED_RACK, TOPOLOGY) == {}


def test_kueue_policy_objects_carry_the_topology():
    objs = objects_for(POLICY, "kueue")
    topology = objs[0]
    assert (topology["apiVersion"], topology["kind"], topology["metadata"]["name"]) == (
        "kueue.x-k8s.io/v1beta2", "Topology", "datacenter")
    assert topology["spec"]["levels"] == [{"nodeLabel": BLOCK}, {"nodeLabel": RACK}, {"nodeLabel": HOST}]
    flavor = next(o for o in objs if o["kind"] == "ResourceFlavor")
    assert flavor["spec"] == {"nodeLabels": dict(TOPOLOGY.node_labels), "topologyName": "datacenter"}
    assert base.unexpressed(BACKENDS["kueue"], POLICY) == []


def test_kueue_without_node_labels_says_so_and_keeps_a_plain_flavor():
    policy = POLICY.model_copy(update={"topology": TOPOLOGY.model_copy(update={"node_labels": {}})})
    flavor = next(o for o in objects_for(policy, "kueue") if o["kind"] == "ResourceFlavor")
    assert flavor["spec"] == {}
    assert "topology.nodeLabels" in base.unexpressed(BACKENDS["kueue"], policy)[0]


# --- Volcano: networkTopology, HyperNodes

def test_volcano_network_topology():
    volcano = BACKENDS["volcano"]
    assert base.placement_spec(volcano, REQUIRED_RACK, TOPOLOGY) == {
        "networkTopology": {"mode": "hard", "highestTierAllowed": 1}}
    assert base.placement_spec(volcano, PlacementIntent(required=BLOCK), TOPOLOGY) == {
        "networkTopology": {"mode": "hard", "highestTierAllowed": 2}}
    assert base.placement_spec(volcano, PREFERRED_RACK, TOPOLOGY) == {"networkTopology": {"mode": "soft"}}


def test_volcano_tier_round_trips_through_the_intent():
    intent = read_intent({}, {"mode": "hard", "highestTierAllowed": 2}).on(TOPOLOGY)
    assert base.placement_spec(BACKENDS["volcano"], intent, TOPOLOGY)["networkTopology"]["highestTierAllowed"] == 2


def test_volcano_hypernodes_from_the_nodes():
    objs = objects_for(POLICY, "volcano", "text\n", NODES)
    hyper = [o for o in objs if o["kind"] == "HyperNode"]
    assert kinds(objs)[:len(hyper)] == ["HyperNode"] * len(hyper)  # before the queues
    by_name = {o["metadata"]["name"]: o["spec"] for o in hyper}
    assert list(by_name) == ["datacenter-rack-r1", "datacenter-rack-r2", "datacenter-rack-r3",
                             "datacenter-block-b1", "datacenter-block-b2"]
    assert by_name["datacenter-rack-r1"] == {"tier": 1, "members": [
        {"type": "Node", "selector": {"exactMatch": {"name": "n1"}}},
        {"type": "Node", "selector": {"exactMatch": {"name": "n2"}}}]}
    assert by_name["datacenter-block-b1"] == {"tier": 2, "members": [
        {"type": "HyperNode", "selector": {"exactMatch": {"name": "datacenter-rack-r1"}}},
        {"type": "HyperNode", "selector": {"exactMatch": {"name": "datacenter-rack-r2"}}}]}
    assert all(o["apiVersion"] == "topology.volcano.sh/v1alpha1" for o in hyper)


# --- KAI: topologyConstraint, Topology

def test_kai_topology_constraint():
    kai = BACKENDS["kai"]
    both = PlacementIntent(required=BLOCK, preferred=RACK)
    assert base.placement_spec(kai, both, TOPOLOGY) == {"topologyConstraint": {
        "topology": "datacenter", "requiredTopologyLevel": BLOCK, "preferredTopologyLevel": RACK}}


def test_kai_policy_objects_carry_the_topology():
    topology = objects_for(POLICY, "kai")[0]
    assert (topology["apiVersion"], topology["kind"]) == ("kai.scheduler/v1alpha1", "Topology")
    assert [lv["nodeLabel"] for lv in topology["spec"]["levels"]] == [BLOCK, RACK, HOST]


# --- native and coscheduling

def test_native_required_key_only():
    native = BACKENDS["native"]
    assert base.placement_spec(native, REQUIRED_RACK, TOPOLOGY) == {
        "schedulingConstraints": {"topology": [{"key": RACK}]}}
    assert base.placement_spec(native, PREFERRED_RACK, TOPOLOGY) == {}


def test_coscheduling_has_no_topology_fields():
    cos = BACKENDS["coscheduling"]
    assert base.placement_spec(cos, REQUIRED_RACK, TOPOLOGY) == {}
    assert base.placement_annotations(cos, REQUIRED_RACK) == {}


def test_no_topology_objects_for_native_and_coscheduling():
    for backend in ("native", "coscheduling"):
        assert base.topology_objects(BACKENDS[backend], TOPOLOGY, NODES) == []
        assert not {"Topology", "HyperNode"} & set(kinds(objects_for(POLICY, backend, "text\n", NODES)))


def test_a_policy_without_topology_makes_the_same_objects_as_before():
    plain = POLICY.model_copy(update={"topology": None})
    for backend in BACKENDS:
        assert not {"Topology", "HyperNode"} & set(kinds(objects_for(plain, backend, "text\n", NODES)))


class NodesOnlyKube:
    """An API server with nodes and nothing else yet: records the paths read and the objects applied."""

    def __init__(self, nodes: list[dict]):
        self.nodes, self.read, self.applied = nodes, [], []

    async def get(self, path: str) -> dict:
        from gangctl.kube.client import ApiError

        self.read.append(path)
        if path == "/api/v1/nodes":
            return {"items": self.nodes}
        raise ApiError(404, "NotFound", f"{path} not found")

    async def apply(self, path: str, body: dict, field_manager: str) -> dict:
        self.applied.append(body)
        return body


def test_apply_lists_nodes_only_for_a_policy_with_a_topology():
    import asyncio

    from gangctl.commands.policy_apply import apply_policy

    kube = NodesOnlyKube(NODES)
    changes = asyncio.run(apply_policy(kube, POLICY, "volcano", dry_run=False, text="text\n"))
    assert "/api/v1/nodes" in kube.read
    assert [c.name for c in changes if c.kind == "HyperNode"][:1] == ["datacenter-rack-r1"]
    assert all(c.action == "created" for c in changes)
    plain = NodesOnlyKube(NODES)
    asyncio.run(apply_policy(plain, POLICY.model_copy(update={"topology": None}), "volcano", dry_run=False,
                             text="text\n"))
    assert "/api/v1/nodes" not in plain.read


def test_every_backend_stores_the_topology_where_the_controller_reads_it_once():
    from gangctl.plugins.quota_objects import TOPOLOGY_CONFIGMAP, topology_of

    for backend in BACKENDS:
        objs = objects_for(POLICY, backend, "text\n", NODES)
        stored = [o for o in objs if o["kind"] == "ConfigMap" and o["metadata"]["name"] == TOPOLOGY_CONFIGMAP]
        assert len(stored) == 1 and topology_of(stored[0]) == TOPOLOGY, backend
        names = [(o["kind"], o["metadata"].get("namespace"), o["metadata"]["name"]) for o in objs]
        assert len(names) == len(set(names)), f"{backend}: an object twice in {names}"
    plain = POLICY.model_copy(update={"topology": None})
    assert not [o for o in objects_for(plain, "kueue") if o["metadata"]["name"] == TOPOLOGY_CONFIGMAP]
