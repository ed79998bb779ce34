"""The cluster topology of the quota policy file, its check against nodes, and one job's placement
intent read from Kueue's, KAI's and Volcano's vocabularies."""
from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from pydantic import ValidationError
from typer.testing import CliRunner

from gangctl.cli import app
from gangctl.model.quota import QuotaPolicy
from gangctl.model.topology import (KAI_PREFERRED, KAI_REQUIRED, KUEUE_PREFERRED, KUEUE_REQUIRED,
                                    KUEUE_SLICE_REQUIRED, KUEUE_SLICE_SIZE, PlacementIntent, Topology,
                                    TopologyError, check_nodes, read_intent)
from gangctl.policy.quota_check import check_policy

ROOT = Path(__file__).parents[2]
EXAMPLE = ROOT / "policies/example-topology.yaml"
BLOCK, RACK, HOST = "topology.gangctl.io/block", "topology.gangctl.io/rack", "kubernetes.io/hostname"
TOPOLOGY = Topology.model_validate({"levels": [{"name": "block", "nodeLabel": BLOCK},
                                               {"name": "rack", "nodeLabel": RACK},
                                               {"name": "host", "nodeLabel": HOST}]})


def node(name: str, block: str | None, rack: str | None) -> dict:
    labels = {HOST: name}
    labels.update({BLOCK: block} if block else {})
    labels.update({RACK: rack} if rack else {})
    return {"metadata": {"name": name, "labels": labels}}


def test_the_example_policy_has_a_topology():
    policy, problems = check_policy(EXAMPLE.read_text())
    assert problems == []
    assert [lv.name for lv in policy.topology.levels] == ["block", "rack", "host"]


def test_a_policy_without_topology_still_validates():
    policy, problems = check_policy((ROOT / "policies/example-teams.yaml").read_text())
    assert problems == [] and policy.topology is None


@pytest.mark.parametrize("levels, message", [
    ([], "at least 1"),
    ([{"name": "rack", "nodeLabel": "a"}, {"name": "rack", "nodeLabel": "b"}], "name 'rack' appears twice"),
    ([{"name": "a", "nodeLabel": RACK}, {"name": "b", "nodeLabel": RACK}], f"nodeLabel '{RACK}' appears twice"),
])
def test_bad_topologies_are_refused(levels, message):
    with pytest.raises(ValidationError, match=message):
        QuotaPolicy.model_validate({"teams": [{"name": "a", "nominal": {}}], "topology": {"levels": levels}})


def test_topology_errors_name_the_field_and_line():
    text = "teams:\n  - name: a\n    nominal: {}\ntopology:\n  levels:\n    - name: rack\n      label: x\n"
    _, problems = check_policy(text)
    assert any(p.path.startswith("topology.levels[0]") and p.line >= 6 for p in problems), problems


def test_labelled_nested_nodes_pass():
    nodes = [node("n1", "b1", "r1"), node("n2", "b1", "r1"), node("n3", "b1", "r2"), node("n4", "b2", "r3")]
    assert check_nodes(TOPOLOGY, nodes) == []


def test_a_node_without_a_level_label_is_named():
    problems = check_nodes(TOPOLOGY, [node("n1", "b1", "r1"), node("gpu-7", "b1", None)])
    assert problems == [f"node gpu-7: no label {RACK} (topology levels block, rack, host)"]


def test_a_rack_in_two_blocks_is_named_with_both_nodes():
    problems = check_nodes(TOPOLOGY, [node("n1", "b1", "r1"), node("n2", "b2", "r1")])
    assert len(problems) == 1
    assert f"node n2: {RACK}=r1 is in {BLOCK}=b2, but node n1 puts it in {BLOCK}=b1" in problems[0]


def test_policy_validate_checks_nodes(tmp_path):
    nodes = tmp_path / "nodes.yaml"
    nodes.write_text(yaml.safe_dump({"kind": "NodeList", "items": [node("n1", "b1", "r1"), node("n2", "b1", None)]}))
    result = CliRunner().invoke(app, ["policy", "validate", str(EXAMPLE), "--nodes", str(nodes)])
    assert result.exit_code == 1
    assert f"node n2: no label {RACK}" in result.output
    good = tmp_path / "good.yaml"
    good.write_text(yaml.safe_dump({"kind": "NodeList", "items": [node("n1", "b1", "r1")]}))
    result = CliRunner().invoke(app, ["policy", "validate", str(EXAMPLE), "--nodes", str(good)])
    assert result.exit_code == 0, result.output
    assert "topology: block > rack > host" in result.output


def test_policy_validate_json_names_the_levels():
    import json

    result = CliRunner().invoke(app, ["policy", "validate", str(EXAMPLE), "-o", "json"])
    assert result.exit_code == 0 and json.loads(result.stdout)["topology"] == ["block", "rack", "host"]


def test_policy_validate_without_topology_ignores_nodes(tmp_path):
    nodes = tmp_path / "nodes.yaml"
    nodes.write_text(yaml.safe_dump({"items": [{"metadata": {"name": "bare"}}]}))
    result = CliRunner().invoke(app, ["policy", "validate", str(ROOT / "policies/example-teams.yaml"),
                                      "--nodes", str(nodes)])
    assert result.exit_code == 0, result.output


# --- placement intent ---

def test_no_vocabulary_no_intent():
    assert read_intent({"other": "x"}, None) is None


def test_kueue_required_and_slice():
    intent = read_intent({KUEUE_REQUIRED: BLOCK, KUEUE_SLICE_REQUIRED: RACK, KUEUE_SLICE_SIZE: "4"})
    assert (intent.required, intent.preferred, intent.slice_level, intent.slice_size) == (BLOCK, None, RACK, 4)
    assert intent.on(TOPOLOGY).required == BLOCK


def test_kueue_required_and_preferred_together_are_refused():
    with pytest.raises(TopologyError, match=f"{KUEUE_REQUIRED} and {KUEUE_PREFERRED}"):
        read_intent({KUEUE_REQUIRED: RACK, KUEUE_PREFERRED: RACK})


@pytest.mark.parametrize("annotations, message", [
    ({KUEUE_SLICE_REQUIRED: RACK}, f"{KUEUE_SLICE_REQUIRED} needs {KUEUE_SLICE_SIZE}"),
    ({KUEUE_SLICE_SIZE: "2"}, f"{KUEUE_SLICE_SIZE} needs {KUEUE_SLICE_REQUIRED}"),
    ({KUEUE_SLICE_REQUIRED: RACK, KUEUE_SLICE_SIZE: "zero"}, "'zero' is not a positive number"),
])
def test_bad_kueue_slices(annotations, message):
    with pytest.raises(TopologyError, match=message):
        read_intent(annotations)


def test_kai_required_and_preferred():
    intent = read_intent({KAI_REQUIRED: "block", KAI_PREFERRED: "rack"}).on(TOPOLOGY)
    assert (intent.required, intent.preferred) == (BLOCK, RACK)


def test_kai_preferred_wider_than_required_is_refused():
    with pytest.raises(TopologyError, match=f"annotation {KAI_PREFERRED}: {BLOCK} is wider than "
                                            f"annotation {KAI_REQUIRED}: {RACK}"):
        read_intent({KAI_REQUIRED: RACK, KAI_PREFERRED: BLOCK}).on(TOPOLOGY)


def test_kueue_and_kai_agreeing_are_one_intent():
    intent = read_intent({KUEUE_REQUIRED: RACK, KAI_REQUIRED: RACK})
    assert intent.required == RACK and intent.field_of("required") == f"annotation {KUEUE_REQUIRED}"


def test_kueue_and_kai_disagreeing_name_both_fields():
    with pytest.raises(TopologyError, match=f"annotation {KUEUE_REQUIRED}: {RACK} and "
                                            f"annotation {KAI_REQUIRED}: {BLOCK} disagree"):
        read_intent({KUEUE_REQUIRED: RACK, KAI_REQUIRED: BLOCK})


@pytest.mark.parametrize("network, required, preferred", [
    ({"mode": "hard", "highestTierAllowed": 1}, RACK, None),
    ({"mode": "hard", "highestTierAllowed": 2}, BLOCK, None),
    ({"mode": "soft"}, None, RACK),
])
def test_volcano_tiers_count_from_the_narrowest_level_above_the_hosts(network, required, preferred):
    intent = read_intent({}, network).on(TOPOLOGY)
    assert (intent.required, intent.preferred) == (required, preferred)


def test_volcano_tier_beyond_the_topology_is_named():
    with pytest.raises(TopologyError, match="podGroupPolicy.volcano.networkTopology \\(mode hard\\): tier 3 is not "
                                            "a level of the cluster's topology default"):
        read_intent({}, {"mode": "hard", "highestTierAllowed": 3}).on(TOPOLOGY)


@pytest.mark.parametrize("network, message", [
    ({"mode": "strict"}, "mode: 'strict' is not hard or soft"),
    ({"mode": "hard", "highestTierAllowed": 0}, "highestTierAllowed: 0 is not a tier"),
])
def test_bad_volcano_settings(network, message):
    with pytest.raises(TopologyError, match=message):
        read_intent({}, network)


def test_volcano_and_annotations_on_one_job_name_both_fields():
    with pytest.raises(TopologyError, match=f"podGroupPolicy.volcano.networkTopology \\(mode hard\\) and "
                                            f"annotation {KUEUE_REQUIRED} both give"):
        read_intent({KUEUE_REQUIRED: RACK}, {"mode": "hard", "highestTierAllowed": 1})


def test_unknown_level_is_named():
    with pytest.raises(TopologyError, match=f"annotation {KUEUE_REQUIRED}: 'cloud/zone' is not a level"):
        read_intent({KUEUE_REQUIRED: "cloud/zone"}).on(TOPOLOGY)


def test_levels_by_name_become_node_labels():
    assert read_intent({KUEUE_PREFERRED: "rack"}).on(TOPOLOGY) == PlacementIntent(
        preferred=RACK, fields=(("preferred", f"annotation {KUEUE_PREFERRED}"),))
