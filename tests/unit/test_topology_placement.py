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
    assert choose(cluster({}), TOPOLOGY, REQUIRED_RACK, Floor(2, {GPU: 4})) == Placed(HOST, ("r0-h0",), ("r0-h0",), 0)


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


def test_a_preferred_gang_no_rack_holds_spans_the_fewest_racks_of_one_block():
    # Every rack has 3 free hosts, the floor is 4: two racks, both in block b0 (the first by name).
    free = busy("r0-h0", "r1-h0", "r2-h0", "r3-h0")
    placed = choose(cluster(free), TOPOLOGY, PlacementIntent(preferred=RACK), FLOOR)
    assert (placed.level, placed.domains, len(placed.nodes)) == (RACK, ("r0", "r1"), 8)
    assert placed.domain == "r0,r1" and placed.stranded_gpus == 16


def test_the_fewest_racks_take_the_roomiest_first_even_across_blocks():
    # b0's racks have 1 free host each, b1's r2 has 3 and r3 has 2: a floor of 5 takes r2 and r3,
    # not three racks; a floor of 6 needs r2, r3 and one of b0's: the whole cluster is the scope.
    free = busy("r0-h0", "r0-h1", "r0-h2", "r1-h0", "r1-h1", "r1-h2", "r2-h0", "r3-h0", "r3-h1")
    five = choose(cluster(free), TOPOLOGY, PlacementIntent(preferred=RACK), Floor(5, {GPU: 8}))
    assert five.domains == ("r2", "r3")
    six = choose(cluster(free), TOPOLOGY, PlacementIntent(preferred=RACK), Floor(6, {GPU: 8}))
    assert six.domains == ("r0", "r2", "r3")


def test_a_preferred_gang_goes_to_the_whole_cluster_only_when_its_racks_cannot_hold_it():
    # Two unlabelled nodes hold what the racks' one free host cannot.
    nodes = cluster(busy(*(f"r{r}-h{h}" for r in range(4) for h in range(1, 4))))
    nodes += [NodeRoom(f"loose-{i}", free={GPU: 8}, labels={}, allocatable={GPU: 8}) for i in range(2)]
    placed = choose(nodes, TOPOLOGY, PlacementIntent(preferred=RACK), Floor(6, {GPU: 8}))
    assert (placed.level, placed.domains, placed.domain, len(placed.nodes)) == (None, (), None, 18)


def test_preferred_waits_when_the_cluster_is_full():
    free = {f"r{r}-h{h}": 0 for r in range(4) for h in range(4)}
    assert isinstance(choose(cluster(free), TOPOLOGY, PlacementIntent(preferred=RACK), FLOOR), Waiting)


def test_a_level_outside_the_topology_is_a_caller_error():
    with pytest.raises(ValueError, match="not one of the topology's node labels"):
        choose(cluster({}), TOPOLOGY, PlacementIntent(required="rack"), FLOOR)
