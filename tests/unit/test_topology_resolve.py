"""A TrainJob's placement intent in the resolve step: from the runtime's pod template, the TrainJob's
podTemplateOverrides, and the runtime's Volcano networkTopology; bad intents name the field."""
from __future__ import annotations

import pytest

from gangctl.model.resolve import ResolveError, resolve
from gangctl.model.topology import KAI_REQUIRED, KUEUE_PREFERRED, KUEUE_REQUIRED, template_intent
from gangctl.sim import objects

RACK = "topology.gangctl.io/rack"


def runtime_annotated(annotations: dict, gang: dict | None = None) -> dict:
    rt = objects.runtime(gang=gang)
    node = next(j for j in rt["spec"]["template"]["spec"]["replicatedJobs"] if j["name"] == "node")
    node["template"]["spec"]["template"].setdefault("metadata", {})["annotations"] = annotations
    return rt


def test_no_intent_by_default():
    assert resolve(objects.trainjob(), objects.runtime()).placement is None


def test_runtime_pod_template_annotation():
    job = resolve(objects.trainjob(), runtime_annotated({KUEUE_REQUIRED: RACK}))
    assert job.placement.required == RACK


def test_trainjob_override_annotation():
    tj = objects.trainjob(podTemplateOverrides=[{"targetJobs": [{"name": "node"}],
                                                 "metadata": {"annotations": {KUEUE_PREFERRED: RACK}}}])
    assert resolve(tj, objects.runtime()).placement.preferred == RACK


def test_volcano_network_topology():
    rt = objects.runtime(gang={"volcano": {"networkTopology": {"mode": "hard", "highestTierAllowed": 2}}})
    job = resolve(objects.trainjob(), rt)
    assert job.placement.required == 2


def test_conflict_is_a_resolve_error_naming_both_fields():
    rt = runtime_annotated({KUEUE_REQUIRED: RACK, KAI_REQUIRED: "block"})
    with pytest.raises(ResolveError, match=f"annotation {KUEUE_REQUIRED}: {RACK} and annotation {KAI_REQUIRED}: "
                                           f"block disagree") as err:
        resolve(objects.trainjob(), rt)
    assert err.value.reason == "InvalidRuntime"


def test_conflict_through_an_override_is_the_trainjobs_fault():
    tj = objects.trainjob(podTemplateOverrides=[{"targetJobs": [{"name": "node"}],
                                                 "metadata": {"annotations": {KAI_REQUIRED: "block"}}}])
    with pytest.raises(ResolveError, match="disagree") as err:
        resolve(tj, runtime_annotated({KUEUE_REQUIRED: RACK}))
    assert err.value.reason == "InvalidSpec"


def test_pytorchjob_replica_template():
    replica = objects.replica(2)
    replica["template"].setdefault("metadata", {})["annotations"] = {KAI_REQUIRED: RACK}
    assert template_intent(replica["template"]).required == RACK
