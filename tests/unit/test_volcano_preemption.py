"""Volcano priority preemption as gangctl decides it (gangctl.plugins.volcano.preemptions): pure."""
from __future__ import annotations

from pathlib import Path

import yaml

from gangctl.model.quota import QUANTITY_UNITS, QuotaPolicy
from gangctl.plugins.volcano import Group, preemptions
from gangctl.commands.policy_apply import objects_for

TWO_TEAMS = QuotaPolicy.model_validate(yaml.safe_load(
    (Path(__file__).parents[1] / "integration/data/two-teams.yaml").read_text()))
QUOTAS = TWO_TEAMS.to_quotas(QUANTITY_UNITS)


def podgroup(key: str, gpus: int, phase: str | None, priority_class: str | None, created: str) -> dict:
    ns, name = key.split("/")
    pg = {"metadata": {"namespace": ns, "name": name, "creationTimestamp": created},
          "spec": {"minMember": gpus // 8, "minResources": {"nvidia.com/gpu": str(gpus), "cpu": "4"}}}
    if priority_class:
        pg["spec"]["priorityClassName"] = priority_class
    if phase:
        pg["status"] = {"phase": phase}
    return pg


def groups(*pgs: dict) -> list[Group]:
    return [Group.from_podgroup(pg) for pg in pgs]


def decided(*pgs: dict) -> list[tuple[str, list[str]]]:
    return [(d.workload.id, [v.id for v in d.victims]) for d in preemptions(TWO_TEAMS, QUOTAS, groups(*pgs))]


def test_an_urgent_gang_held_by_its_full_queue_evicts_the_batch_gang_of_its_team():
    # team-a may hold 24 GPUs (16 nominal + 8 borrowed); withinTeam: LowerPriority.
    low = podgroup("team-a/low", 24, "Running", "batch", "2026-01-01T00:00:00Z")
    high = podgroup("team-a/high", 16, "Pending", "urgent", "2026-01-01T00:01:00Z")
    assert decided(low, high) == [("team-a/high", ["team-a/low"])]
    g = groups(high)[0]
    assert (g.key, g.phase, g.priority_class, g.requests["nvidia.com/gpu"]) == ("team-a/high", "Pending", "urgent", 16)
    # not yet seen by Volcano (no status): waiting too
    assert decided(low, podgroup("team-a/high", 16, None, "urgent", "2026-01-01T00:01:00Z")) == \
        [("team-a/high", ["team-a/low"])]


def test_no_eviction_for_equal_priority_for_a_gang_that_fits_or_in_a_team_without_preemption():
    low = podgroup("team-a/low", 24, "Inqueue", "batch", "2026-01-01T00:00:00Z")
    assert decided(low, podgroup("team-a/same", 16, "Pending", "batch", "2026-01-01T00:01:00Z")) == []
    assert decided(podgroup("team-a/low", 8, "Running", "batch", "2026-01-01T00:00:00Z"),
                   podgroup("team-a/high", 16, "Pending", "urgent", "2026-01-01T00:01:00Z")) == [], \
        "16 more fit in team-a's 24: Volcano admits it, nobody is evicted"
    # team-b's policy has no preemption
    assert decided(podgroup("team-b/low", 16, "Running", "batch", "2026-01-01T00:00:00Z"),
                   podgroup("team-b/high", 16, "Pending", "urgent", "2026-01-01T00:01:00Z")) == []


def test_finished_gangs_and_namespaces_outside_the_policy_hold_nothing():
    done = podgroup("team-a/done", 24, "Completed", "batch", "2026-01-01T00:00:00Z")
    other = podgroup("elsewhere/big", 24, "Running", "batch", "2026-01-01T00:00:00Z")
    assert decided(done, other, podgroup("team-a/high", 16, "Pending", "urgent", "2026-01-01T00:01:00Z")) == []


def test_the_victim_queued_again_behind_the_urgent_gang_is_not_evicted_again():
    high = podgroup("team-a/high", 16, "Inqueue", "urgent", "2026-01-01T00:01:00Z")
    again = podgroup("team-a/low", 24, "Pending", "batch", "2026-01-01T00:02:00Z")
    assert decided(high, again) == []


def test_policy_apply_for_volcano_stores_the_policy_next_to_the_queues():
    objs = objects_for(TWO_TEAMS, "volcano", "the file as written\n")
    kinds = [o["kind"] for o in objs]
    assert kinds.count("Queue") == 2 and kinds[-1] == "ConfigMap"
    assert objs[-1]["data"] == {"policy.yaml": "the file as written\n"}
