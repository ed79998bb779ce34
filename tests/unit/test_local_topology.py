"""`gangctl cluster up --topology BLOCKSxRACKSxHOSTS`: the GPU nodes' block and rack labels."""
from __future__ import annotations

from collections import Counter

import pytest

from gangctl.cluster.setup import BLOCK_LABEL, HOST_LABEL, RACK_LABEL, Shape, gpu_node, parse_shape


def test_the_shape_is_read_from_blocks_x_racks_x_hosts():
    assert parse_shape("2x4x8") == Shape(2, 4, 8) and parse_shape("2X4X8").nodes == 64
    for bad in ("2x4", "2x0x8", "axbxc", "", "1x2x3x4"):
        with pytest.raises(ValueError, match="BLOCKSxRACKSxHOSTS"):
            parse_shape(bad)


def test_hosts_fill_racks_and_racks_fill_blocks_with_racks_named_once_in_the_cluster():
    shape = Shape(2, 3, 4)
    nodes = [gpu_node(i, 8, shape=shape) for i in range(shape.nodes)]
    labels = [n["metadata"]["labels"] for n in nodes]
    assert Counter(x[BLOCK_LABEL] for x in labels) == {"block-0": 12, "block-1": 12}
    racks = Counter(x[RACK_LABEL] for x in labels)
    assert len(racks) == 6 and set(racks.values()) == {4}
    assert all(x[RACK_LABEL].startswith(x[BLOCK_LABEL] + "-") for x in labels), "a rack lies inside its block"
    assert [x[RACK_LABEL] for x in labels[:5]] == ["block-0-rack-0"] * 4 + ["block-0-rack-1"]
    assert len({x[HOST_LABEL] for x in labels}) == shape.nodes


def test_without_a_shape_nodes_carry_no_topology_labels():
    assert not {BLOCK_LABEL, RACK_LABEL} & set(gpu_node(0, 8)["metadata"]["labels"])
