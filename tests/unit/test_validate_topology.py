"""A topology replay's pure parts: the levels the real nodes carry, the intents the replay submits,
the domains each gang's pods ran in, and the summaries set beside the simulator's."""
from __future__ import annotations

import pytest

from gangctl.cluster.setup import Shape, gpu_node
from gangctl.model.names import TRAINJOB_NAME
from gangctl.model.topology import KUEUE_PREFERRED, KUEUE_REQUIRED, read_intent
from gangctl.plugins.registry import BACKENDS
from gangctl.sim.replay import trainjob_manifest
from gangctl.sim.scenario import Scenario
from gangctl.sim.topology import Placer
from gangctl.sim.traces import TraceJob
from gangctl.validate.measure import RealOutcome
from gangctl.validate.plan import topology_levels
from gangctl.validate.topology import (GangSpan, domains_by_trainjob, mean_topology, pods_by_trainjob, real_topology,
                                      stranded_gpus_mean)

SHAPE = Shape(2, 2, 4)


def ready(node: dict) -> dict:
    node["status"]["conditions"] = [{"type": "Ready", "status": "True"}]
    return node


NODES = [ready(gpu_node(i, 8, shape=SHAPE)) for i in range(SHAPE.nodes)]


def test_the_levels_are_read_from_the_nodes_labels():
    levels = topology_levels(NODES, ["block", "rack"])
    assert [(lv.name, lv.nodes) for lv in levels] == [("block", 8), ("rack", 4)]


def test_unlabelled_or_unequal_racks_are_refused_with_what_to_do():
    with pytest.raises(ValueError, match="has no label topology.gangctl.io/rack: replay a topology scenario on "
                                         "nodes labelled by `gangctl cluster up --topology"):
        topology_levels([ready(gpu_node(0, 8))], ["rack"])
    with pytest.raises(ValueError, match="the racks differ in size"):
        topology_levels(NODES[:-1], ["rack"])


def test_the_replay_asks_the_controller_for_the_intent_the_simulator_drew():
    sc = Scenario.model_validate({
        "name": "t", "quotaPolicy": "x.yaml", "backend": "coscheduling",
        "cluster": {"pools": [{"name": "p", "nodes": 16}], "topology": [{"name": "block", "nodes": 8},
                                                                        {"name": "rack", "nodes": 4}]},
        "workload": {"generate": {"jobs": 1, "arrivalsPerHour": 1},
                     "placement": [{"level": "rack", "mode": "required", "share": 0.5},
                                   {"level": "block", "mode": "preferred", "share": 0.5}]}})
    placer = Placer(sc.cluster.levels(), sc.workload.placement, BACKENDS["coscheduling"])
    seen = set()
    for i in range(40):
        job = TraceJob(f"job-{i}", 0, 60, 2, 8, group="t")
        annotations = placer.annotations(job.id)
        manifest = trainjob_manifest(job, runtime="r", namespace="ns", annotations=annotations)
        pod_annotations = manifest["spec"]["podTemplateOverrides"][0]["metadata"]["annotations"]
        intent = read_intent(pod_annotations)     # what the controller reads from the pod template
        asked = placer.ask_of(job.id)
        if asked.ask.required:
            assert annotations == {KUEUE_REQUIRED: "topology.gangctl.io/rack"} and intent.required == annotations[KUEUE_REQUIRED]
        else:
            assert annotations == {KUEUE_PREFERRED: "topology.gangctl.io/block"} and intent.preferred == annotations[KUEUE_PREFERRED]
        seen.add(asked.kind)
    assert seen == {"required rack", "preferred block"}


def pod(trainjob: str, node: str | None) -> dict:
    return {"metadata": {"labels": {TRAINJOB_NAME: trainjob}}, "spec": {"nodeName": node} if node else {}}


def test_each_gang_counts_the_domains_its_bound_pods_ran_in():
    rack, block = "topology.gangctl.io/rack", "topology.gangctl.io/block"
    pods = [pod("a", "gpu-node-000"), pod("a", "gpu-node-004"), pod("b", "gpu-node-000"), pod("b", "gpu-node-004"),
            pod("c", "gpu-node-001"), pod("c", None), pod("other", "gpu-node-009")]
    assert domains_by_trainjob(pods, NODES, {"a": rack, "b": block, "c": rack}) == {"a": 2, "b": 1, "c": 1}


def test_the_real_summary_groups_by_ask_and_counts_violations():
    outcomes = [RealOutcome("j1", 0, 2, 10, "done"), RealOutcome("j2", 0, 4, 10, "done"), RealOutcome("j3", 0, 0, 10, "done")]
    real = real_topology({"j1": "required rack", "j2": "required rack", "j3": ""}, {"j1": 2, "j2": 3, "j3": 1},
                         {"j1": 1, "j2": 2, "j3": 1}, outcomes, ["block", "rack"])
    assert real["required_violations"] == 1
    assert real["by_ask"]["required rack"]["mean_domains"] == 1.5 and real["by_ask"]["required rack"]["gang_starts"] == 2
    assert real["by_ask"]["required rack"]["queue_delay_seconds"]["mean"] == 3
    assert real["by_ask"]["none"] == {"jobs": 1, "gang_starts": 0, "mean_domains": None,
                                      "queue_delay_seconds": {"mean": 0, "p50": 0, "p95": 0}}


def test_the_models_draws_are_averaged():
    def draw(spread: float, p95: float, violations: int) -> dict:
        delay = {"mean": 1.0, "p50": 1.0, "p95": p95, "p99": p95}
        return {"levels": ["rack"], "required_violations": violations, "stranded_gpus_mean": 4.0,
                "by_ask": {"none": {"jobs": 3, "gang_starts": 2, "mean_domains": spread, "queue_delay_seconds": delay}}}
    mean = mean_topology([draw(1.0, 10, 0), draw(2.0, 20, 1)])
    assert mean["by_ask"]["none"]["mean_domains"] == 1.5 and mean["by_ask"]["none"]["queue_delay_seconds"]["p95"] == 15
    assert mean["required_violations"] == 1 and mean["stranded_gpus_mean"] == 4.0


# --- stranded GPUs, real side: SHAPE is 2 blocks x 2 racks x 4 hosts of 8 GPUs; racks r0..r3 hold
# gpu-node-000..003, 004..007, 008..011, 012..015 (block b0: r0, r1).
LEVELS = ["topology.gangctl.io/block", "topology.gangctl.io/rack"]


def rack_nodes(rack: int, count: int) -> tuple[str, ...]:
    return tuple(f"gpu-node-{rack * 4 + i:03d}" for i in range(count))


def test_nothing_is_stranded_while_no_gang_waits_for_a_required_rack():
    busy = GangSpan(rack_nodes(0, 3), 8, 0, 0, 10)
    preferred_waiting = GangSpan(rack_nodes(1, 4), 8, 0, 5, 10)    # waits 5 s, requires nothing
    assert stranded_gpus_mean(NODES, LEVELS, [busy, preferred_waiting], 1.0) == 0


def test_free_gpus_in_racks_that_cannot_hold_the_waiting_rack_gang_are_stranded():
    """Each rack has 3 hosts busy (8 free GPUs in each of the 4 racks) while a gang of 2 hosts that
    requires a rack waits from 0 to 10 s: all 32 free GPUs are stranded, then it is bound (nothing)."""
    busy = [GangSpan(rack_nodes(r, 3), 8, 0, 0, 20) for r in range(4)]
    waiting = GangSpan(rack_nodes(0, 1) + rack_nodes(1, 1), 8, 0, 10, 20, required=LEVELS[1], pods=2)
    # sampled at 0, 5, 10, 15: stranded 32, 32, then the gang is bound (0, 0)
    assert stranded_gpus_mean(NODES, LEVELS, [*busy, waiting], 5.0) == 16.0


def test_a_rack_that_holds_the_waiting_gang_strands_nothing_and_a_block_counts_its_racks_together():
    """Rack r3 is free: it holds the waiting rack gang, so only r0-r2's free GPUs are stranded (24).
    A gang that requires a block of 2 hosts is held by either block (two racks with a free host each)."""
    busy = [GangSpan(rack_nodes(r, 3), 8, 0, 0, 10) for r in range(3)]
    rack_gang = GangSpan(rack_nodes(3, 4), 8, 0, None, None, required=LEVELS[1], pods=4)
    assert stranded_gpus_mean(NODES, LEVELS, [*busy, rack_gang], 5.0) == 24.0
    block_gang = GangSpan((), 8, 0, None, None, required=LEVELS[0], pods=2)
    assert stranded_gpus_mean(NODES, LEVELS, [*busy, block_gang], 5.0) == 0.0


def test_each_trainjobs_pods_nodes_are_read_failed_pods_left_out():
    failed = pod("a", "gpu-node-007") | {"status": {"phase": "Failed"}}
    assert pods_by_trainjob([pod("a", "gpu-node-000"), pod("a", "gpu-node-001"), pod("b", None), failed]) == {
        "a": ["gpu-node-000", "gpu-node-001"]}


def test_the_real_side_counts_stranded_gpus_as_the_simulator_does():
    """Random occupancies of SHAPE and random waiting gangs: the real side's count at one instant
    equals the simulator's own (`Cluster.stranded_gpus`) on the same state."""
    import random

    from gangctl.sim.model import Cluster, Level, NodePool

    rng = random.Random(36)
    for _ in range(200):
        sim = Cluster([NodePool("p", SHAPE.nodes, 8)], levels=[Level("block", 8), Level("rack", 4)])
        busy = {i: rng.choice((0, 0, 2, 4, 8)) for i in range(SHAPE.nodes)}
        gangs = [GangSpan((f"gpu-node-{i:03d}",), gpus, 0, 0, 10) for i, gpus in busy.items() if gpus]
        for i, gpus in busy.items():
            if gpus:
                sim.reserve([(i, 1)], gpus)
        waiting: dict[tuple, int] = {}
        for _ in range(rng.randint(0, 3)):
            level, gpp, pods = rng.randint(0, 1), rng.choice((2, 4, 8)), rng.randint(1, 6)
            gangs.append(GangSpan((), gpp, 0, None, None, required=LEVELS[level], pods=pods))
            key = (sim.domain_of[0].gpu_type, level, gpp)
            waiting[key] = min(pods, waiting.get(key, pods))
        assert stranded_gpus_mean(NODES, LEVELS, gangs, 100.0) == sim.stranded_gpus(waiting), (busy, waiting)


def test_a_pod_gives_its_node_up_when_a_later_pod_is_bound_into_its_room():
    """Gang a (rack r0's 4 hosts) is seen finished at 10 s, but gang b was bound onto two of its hosts
    at 6 s: a's pods there had exited. While a rack gang of 3 waits, r0's free GPUs are never counted
    below none (at 8 s, a and b would both hold the two hosts), and 2 hosts are free from 10 s."""
    a = GangSpan(rack_nodes(0, 4), 8, 0, 0, 10)
    b = GangSpan(rack_nodes(0, 2), 8, 5, 6, 30)
    others = [GangSpan(rack_nodes(r, 4), 8, 0, 0, 30) for r in (1, 2, 3)]
    waiting = GangSpan((), 8, 0, None, None, required=LEVELS[1], pods=3)
    # samples 0, 4, 8 ... 28: r0 free 0, 0, 0, then 16 five times (3 pods never fit)
    assert stranded_gpus_mean(NODES, LEVELS, [a, b, *others, waiting], 4.0) == 80 / 8
