"""gangctl's own placement choice: the narrowest domain that holds the floor now, a wait naming the
best domain and its numbers, or TopologyUnsatisfiable when no domain ever could (issue 36 item 4)."""
from __future__ import annotations

import pytest

from gangctl.model.topology import PlacementIntent, Topology
from gangctl.model.room import NodeRoom, pods_fitting
from gangctl.policy.placement import GPU, UNSATISFIABLE, WAITING, Floor, Placed, Unsatisfiable, Waiting, choose

BLOCK, RACK, HOST = "topology.gangctl.io/block", "topology.gangctl.io/rack", "kubernetes.io/hostname"
TOPOLOGY = Topology.model_validate({"levels": [{"name": "block", "nodeLabel": BLOCK},
                                               {"name": "rack", "nodeLabel": RACK},
                                               {"name": "host", "nodeLabel": HOST}]})
REQUIRED_RACK = PlacementIntent(required=RACK)


def cluster(free: dict[str, int], racks: int = 4, hosts: int = 4, gpus: int = 8) -> list[NodeRoom]:
    """`racks` racks (two per block) of `hosts` hosts; `free`: free GPUs by node name (default all)."""
    nodes = []
    for r in range(racks):
        for h in range(hosts):
            name = f"r{r}-h{h}"
            nodes.append(NodeRoom(name, free={GPU: free.get(name, gpus)},
                                  labels={BLOCK: f"b{r // 2}", RACK: f"r{r}", HOST: name}, allocatable={GPU: gpus}))
    return nodes


def busy(*names: str) -> dict[str, int]:
    return {n: 0 for n in names}


FLOOR = Floor(4, {GPU: 8})


def test_pods_fitting():
    assert pods_fitting({GPU: 8, "cpu": 10}, {GPU: 2, "cpu": 4}) == 2
    assert pods_fitting({}, {GPU: 1}) == 0


def test_a_single_host_is_narrowest_when_it_holds_the_floor():
    assert choose(cluster({}), TOPOLOGY, REQUIRED_RACK, Floor(2, {GPU: 4})) == Placed(HOST, "r0-h0", ("r0-h0",), 0)


def test_the_rack_that_strands_fewest_gpus():
    # Racks of 5 hosts: r0, r3 all free (8 GPUs stranded after 4 pods), r1 one host busy (0 stranded),
    # r2 one host half busy (4 stranded).
    nodes = cluster(busy("r1-h0") | {"r2-h0": 4}, hosts=5)
    placed = choose(nodes, TOPOLOGY, REQUIRED_RACK, FLOOR)
    assert isinstance(placed, Placed) and (placed.level, placed.domain, placed.stranded_gpus) == (RACK, "r1", 0)


def test_ties_go_to_the_first_rack_by_name():
    placed = choose(cluster({}), TOPOLOGY, REQUIRED_RACK, FLOOR)
    assert (placed.domain, placed.nodes) == ("r0", ("r0-h0", "r0-h1", "r0-h2", "r0-h3"))


def test_waiting_names_the_best_rack_and_its_numbers():
    free = busy("r0-h0", "r0-h1", "r1-h0", "r1-h1", "r2-h0", "r3-h0", "r3-h1")
    result = choose(cluster(free), TOPOLOGY, REQUIRED_RACK, FLOOR)
    assert isinstance(result, Waiting) and result.reason == WAITING
    assert "best rack r2: 3 of 4 hosts free, room for 3 of 4 pods (24 GPUs free)" in result.message


def test_a_floor_no_rack_can_ever_hold_is_unsatisfiable():
    result = choose(cluster({}), TOPOLOGY, REQUIRED_RACK, Floor(5, {GPU: 8}))
    assert isinstance(result, Unsatisfiable) and result.reason == UNSATISFIABLE
    assert ("no rack can ever hold the gang's floor (5 pods of 8 nvidia.com/gpu): the largest, rack r0, has 4 hosts "
            "with room for 4 pods (32 GPUs allocatable)") in result.message


def test_a_required_block_takes_two_racks():
    placed = choose(cluster({}), TOPOLOGY, PlacementIntent(required=BLOCK), Floor(6, {GPU: 8}))
    assert (placed.level, placed.domain, len(placed.nodes)) == (BLOCK, "b0", 8)


def test_preferred_falls_back_to_the_whole_cluster():
    free = busy("r0-h0", "r1-h0", "r2-h0", "r3-h0")
    placed = choose(cluster(free), TOPOLOGY, PlacementIntent(preferred=RACK), FLOOR)
    assert (placed.level, placed.domain, len(placed.nodes)) == (None, None, 16)


def test_preferred_waits_when_the_cluster_is_full():
    free = {f"r{r}-h{h}": 0 for r in range(4) for h in range(4)}
    assert isinstance(choose(cluster(free), TOPOLOGY, PlacementIntent(preferred=RACK), FLOOR), Waiting)


def test_a_level_outside_the_topology_is_a_caller_error():
    with pytest.raises(ValueError, match="not one of the topology's node labels"):
        choose(cluster({}), TOPOLOGY, PlacementIntent(required="rack"), FLOOR)
