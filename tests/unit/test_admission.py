"""Quota admission (gangctl.model.admission) and the quota policy file (gangctl.model.quota)."""
from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
import yaml
from pydantic import ValidationError

from gangctl.model.admission import (
    GPU, Quotas, Reclaim, TeamQuota, Verdict, Workload, decide, headroom, never_fits, queue_key, usage_of,
)
from gangctl.model.quota import QuotaPolicy

ROOT = Path(__file__).resolve().parents[2]


def wl(id: str, team: str, gpus: int, *, priority: int = 0, created: float = 0.0) -> Workload:
    return Workload(id, team, priority, created, {GPU: gpus})


def queues(*workloads: Workload) -> dict[str, list[Workload]]:
    out: dict[str, list[Workload]] = {}
    for w in workloads:
        out.setdefault(w.team, []).append(w)
    return {t: sorted(q, key=queue_key) for t, q in out.items()}


def admitted_ids(decisions) -> list[str]:
    return [d.workload.id for d in decisions if d.verdict is not Verdict.WAIT]


def cohort(a: dict | None = None, b: dict | None = None) -> Quotas:
    """Two teams of 64 GPUs in cohort "research"."""
    return Quotas({
        "ml-a": TeamQuota("ml-a", {GPU: 64}, cohort="research", **(a or {})),
        "ml-b": TeamQuota("ml-b", {GPU: 64}, cohort="research", **(b or {})),
    })


def test_admits_within_nominal_and_explains_the_wait_with_numbers():
    q = cohort()
    usage = {"ml-a": {GPU: 48}, "ml-b": {GPU: 56}}
    # ml-a may take 16 of its own plus the 8 ml-b leaves unused: 24. It asks for 32.
    decisions = decide(q, usage, queues(wl("big", "ml-a", 32)))
    assert [d.verdict for d in decisions] == [Verdict.WAIT]
    assert decisions[0].reason == "requests 32 GPUs, team ml-a uses 48 of 64 nominal, cohort research has 24 free"
    assert admitted_ids(decide(q, usage, queues(wl("fits", "ml-a", 24)))) == ["fits"]


def test_borrowing_stops_at_the_borrowing_limit():
    q = cohort(a={"borrowing_limit": {GPU: 16}})
    usage = {"ml-a": {GPU: 64}, "ml-b": {GPU: 0}}
    # ml-b has 64 idle, but ml-a may only go 16 above its nominal 64.
    assert admitted_ids(decide(q, usage, queues(wl("x", "ml-a", 16)))) == ["x"]
    decision, = decide(q, usage, queues(wl("y", "ml-a", 17)))
    assert decision.verdict is Verdict.WAIT
    assert decision.shortfall.borrow_left == 16
    assert decision.reason.endswith("borrowing limit leaves 16 GPUs")
    # The limit counts what the call itself admitted: 8 + 8 fit, the third 8 does not.
    three = queues(wl("a", "ml-a", 8, created=1), wl("b", "ml-a", 8, created=2), wl("c", "ml-a", 8, created=3))
    assert admitted_ids(decide(q, {"ml-a": {GPU: 64}}, three)) == ["a", "b"]


def test_lending_limit_keeps_the_guaranteed_part_for_the_lender():
    q = cohort(b={"lending_limit": {GPU: 16}})
    # ml-b is idle but lends only 16 of its 64.
    assert headroom(q, {"ml-a": {GPU: 64}}, "ml-a") == {GPU: 16}
    assert admitted_ids(decide(q, {"ml-a": {GPU: 64}}, queues(wl("x", "ml-a", 17)))) == []
    # While ml-a uses the 16 that ml-b lent, ml-b keeps its 48 guaranteed GPUs.
    assert headroom(q, {"ml-a": {GPU: 80}}, "ml-b") == {GPU: 48}


def test_team_without_cohort_never_borrows():
    q = Quotas({"solo": TeamQuota("solo", {GPU: 8}), "other": TeamQuota("other", {GPU: 64})})
    assert admitted_ids(decide(q, {}, queues(wl("x", "solo", 9)))) == []
    assert never_fits(q, wl("x", "solo", 9)).requested == 9
    assert never_fits(q, wl("x", "solo", 8)) is None


def test_strict_priority_across_teams_then_fifo():
    q = cohort()
    usage = {"ml-a": {GPU: 64}, "ml-b": {GPU: 48}}   # 16 free in the cohort
    pending = queues(
        wl("a-early", "ml-a", 8, priority=0, created=1),
        wl("b-high", "ml-b", 16, priority=10, created=5),
        wl("a-late", "ml-a", 8, priority=0, created=2),
    )
    decisions = decide(q, usage, pending)
    # b-high goes first despite arriving last and takes all 16; the FIFO pair of ml-a then waits.
    assert [(d.workload.id, d.verdict) for d in decisions] == [("b-high", Verdict.ADMIT), ("a-early", Verdict.WAIT)]
    # Without b-high, FIFO within the priority: a-early before a-late.
    pending = queues(wl("a-late", "ml-a", 8, created=2), wl("a-early", "ml-a", 8, created=1))
    assert admitted_ids(decide(q, usage, pending)) == ["a-early", "a-late"]


def test_strict_fifo_blocks_behind_the_head_but_best_effort_goes_on():
    usage = {"ml-a": {GPU: 60}, "ml-b": {GPU: 64}}   # 4 free
    pending = queues(wl("big", "ml-a", 8, created=1), wl("small", "ml-a", 2, created=2))
    strict = decide(cohort(), usage, pending)
    assert [(d.workload.id, d.verdict) for d in strict] == [("big", Verdict.WAIT)]
    best = decide(cohort(a={"best_effort": True}), usage, pending)
    assert [(d.workload.id, d.verdict) for d in best] == [("big", Verdict.WAIT), ("small", Verdict.ADMIT)]
    assert admitted_ids(decide(cohort(a={"best_effort": True}), usage, pending, waits=False)) == ["small"]


def test_best_effort_skip_of_covered_requests_does_not_hide_smaller_ones():
    q = cohort(a={"best_effort": True})
    usage = {"ml-a": {GPU: 61}, "ml-b": {GPU: 64}}   # 3 free
    pending = queues(*(wl(f"g{i}", "ml-a", g, created=i) for i, g in enumerate([8, 4, 16, 2, 8, 1])))
    assert admitted_ids(decide(q, usage, pending)) == ["g3", "g5"]


def test_preempts_lower_priority_of_the_same_team_newest_first_and_no_more_than_needed():
    q = cohort(a={"preempt_within_team": True}, b={"lending_limit": {GPU: 0}})
    running = [Workload("old-low", "ml-a", 0, 10.0, {GPU: 16}), Workload("new-low", "ml-a", 0, 20.0, {GPU: 16}),
               Workload("mid", "ml-a", 5, 30.0, {GPU: 32})]
    usage = usage_of(running)
    decision, = decide(q, usage, queues(wl("urgent", "ml-a", 16, priority=10)), {"ml-a": running})
    assert decision.verdict is Verdict.PREEMPT
    assert [v.id for v in decision.victims] == ["new-low"]
    # Needing 40: greedy takes new-low, old-low (32 freed, not enough) and mid; sparing then gives
    # old-low back (new-low + mid free 48), but not new-low (mid alone frees only 32).
    decision, = decide(q, usage, queues(wl("huge", "ml-a", 40, priority=10)), {"ml-a": running})
    assert sorted(v.id for v in decision.victims) == ["mid", "new-low"]
    # Equal priority is never a victim.
    decision, = decide(q, usage, queues(wl("peer", "ml-a", 16, priority=0)), {"ml-a": running})
    assert decision.verdict is Verdict.WAIT


def test_reclaims_lent_quota_only_from_teams_that_borrow():
    q = cohort(b={"reclaim": Reclaim.ANY})
    borrowed = [Workload("a1", "ml-a", 0, 1.0, {GPU: 64}), Workload("a2", "ml-a", 0, 2.0, {GPU: 32})]
    usage = {"ml-a": {GPU: 96}, "ml-b": {GPU: 16}}   # ml-a borrows 32 of ml-b's nominal
    admitted = {"ml-a": borrowed, "ml-b": [Workload("b1", "ml-b", 0, 0.0, {GPU: 16})]}
    decision, = decide(q, usage, queues(wl("b2", "ml-b", 32)), admitted)
    assert decision.verdict is Verdict.PREEMPT and [v.id for v in decision.victims] == ["a2"]
    # Beyond its own nominal, ml-b may not reclaim.
    decision, = decide(q, usage, queues(wl("b3", "ml-b", 56)), admitted)
    assert decision.verdict is Verdict.WAIT
    # LowerPriority reclaim spares borrowers of equal priority.
    q_low = cohort(b={"reclaim": Reclaim.LOWER_PRIORITY})
    decision, = decide(q_low, usage, queues(wl("b2", "ml-b", 32)), admitted)
    assert decision.verdict is Verdict.WAIT


def test_unlisted_resources_are_not_limited_and_unknown_teams_wait():
    q = Quotas({"t": TeamQuota("t", {GPU: 8})})
    assert admitted_ids(decide(q, {}, {"t": [Workload("x", "t", 0, 0, {GPU: 8, "cpu": 10**6})]})) == ["x"]
    decision, = decide(q, {}, {"nobody": [wl("y", "nobody", 1)]})
    assert decision.verdict is Verdict.WAIT and decision.reason == "team nobody has no quota"


def test_gate_can_veto_after_quota_fits():
    q = cohort()
    decisions = decide(q, {}, queues(wl("x", "ml-a", 8), wl("y", "ml-b", 8, created=1)),
                       gate=lambda w: "no room on the nodes" if w.id == "x" else None)
    assert [(d.workload.id, d.verdict, d.reason) for d in decisions] == [
        ("x", Verdict.WAIT, "no room on the nodes"), ("y", Verdict.ADMIT, "admitted within nominal quota")]


def _naive_admit(quotas: Quotas, usage: dict, pending: dict) -> list[str]:
    """Reference: re-derive availability from scratch for every gang (no shortcuts, no preemption)."""
    used = {t: dict(usage.get(t, {})) for t in quotas.teams}
    order = sorted((w for q in pending.values() for w in q), key=queue_key)
    blocked: set[str] = set()
    out = []
    for w in order:
        team = quotas.teams[w.team]
        if w.team in blocked:
            continue
        fits = True
        for r, amount in w.requests.items():
            members = [t for t in quotas.teams.values() if t.cohort == team.cohort] if team.cohort else [team]
            guaranteed = {t.name: t.nominal[r] - (t.lending_limit.get(r, t.nominal[r]) if t.cohort else 0) for t in members}
            pool_total = sum(t.nominal[r] - guaranteed[t.name] for t in members)
            pool_used = sum(max(0, used[t.name].get(r, 0) - guaranteed[t.name]) for t in members)
            mine = used[w.team].get(r, 0)
            avail = max(0, guaranteed[w.team] - mine) + pool_total - pool_used
            if team.borrowing_limit.get(r) is not None:
                avail = min(avail, team.nominal[r] + team.borrowing_limit[r] - mine)
            fits = fits and amount <= avail
        if fits:
            for r, amount in w.requests.items():
                used[w.team][r] = used[w.team].get(r, 0) + amount
            out.append(w.id)
        elif not team.best_effort:
            blocked.add(w.team)
    return out


@pytest.mark.parametrize("seed", range(40))
def test_decide_agrees_with_a_naive_reference(seed):
    rng = random.Random(seed)
    teams = {}
    for i, name in enumerate(["a", "b", "c", "d"]):
        nominal = rng.choice([0, 8, 16, 32])
        teams[name] = TeamQuota(
            name, {GPU: nominal, "cpu": nominal * 4}, cohort=rng.choice(["x", "y", None]) if i else "x",
            borrowing_limit={GPU: rng.choice([0, 8, 24])} if rng.random() < 0.4 else {},
            lending_limit={GPU: rng.choice([0, nominal // 2, nominal])} if rng.random() < 0.4 else {},
            best_effort=rng.random() < 0.5)
    teams = {n: (t if t.cohort else TeamQuota(n, t.nominal, best_effort=t.best_effort)) for n, t in teams.items()}
    q = Quotas(teams)
    usage = {n: {GPU: rng.choice([0, 4, t.nominal[GPU]]), "cpu": 0} for n, t in teams.items()}
    pending = queues(*(Workload(f"w{i}", rng.choice(list(teams)), rng.choice([0, 0, 5]), float(i),
                                {GPU: rng.choice([1, 2, 4, 8, 16]), "cpu": rng.choice([1, 4, 32])})
                       for i in range(30)))
    full = admitted_ids(decide(q, usage, pending, waits=False))
    assert full == _naive_admit(q, usage, pending)
    # a scheduler that admits one gang at a time asks for the first only: the same one
    assert admitted_ids(decide(q, usage, pending, waits=False, first=True)) == full[:1]


# --- the policy file -----------------------------------------------------------------------------

def load_example() -> QuotaPolicy:
    return QuotaPolicy.model_validate(yaml.safe_load((ROOT / "policies/example-teams.yaml").read_text()))


def test_example_policy_compiles_to_two_cohorts_of_four_teams():
    policy = load_example()
    quotas = policy.to_quotas({"cpu": 1000, "memory": 1024})
    assert {t.cohort for t in quotas.teams.values()} == {"research", "product"}
    assert quotas.teams["ml-a"].nominal == {GPU: 64, "cpu": 512_000, "memory": 4096 * 1024}
    assert quotas.teams["ml-a"].borrowing_limit == {GPU: 32}
    assert quotas.teams["ml-b"].lending_limit == {GPU: 32} and quotas.teams["ml-b"].best_effort
    assert quotas.teams["ml-b"].reclaim is Reclaim.LOWER_PRIORITY
    assert policy.team_of_namespace("ml-a-dev") == "ml-a" and policy.team_of_namespace("nope") is None
    assert policy.priority_of("prod") == 1000 and policy.priority_of("ml-a") == 100
    assert policy.priority_of("ml-a", "low") == 10


@pytest.mark.parametrize("team, message", [
    ({"name": "t", "nominal": {"gpu": 8}, "borrowingLimit": {"gpu": 1}}, "need a cohort"),
    ({"name": "t", "cohort": "c", "nominal": {"gpu": 8}, "lendingLimit": {"gpu": 9}}, "exceeds nominal"),
    ({"name": "t", "nominal": {"gpu": -1}}, "greater than or equal to 0"),
    ({"name": "t", "nominal": {"gpus": 8}}, "Extra inputs"),
    ({"name": "t", "nominal": {"gpu": 8}, "defaultPriority": "urgent"}, "unknown priority class"),
])
def test_policy_file_errors_are_caught(team, message):
    with pytest.raises(ValidationError, match=message):
        QuotaPolicy.model_validate({"teams": [team]})


def test_namespaces_belong_to_one_team():
    with pytest.raises(ValidationError, match="belongs to both"):
        QuotaPolicy.model_validate({"teams": [{"name": "a", "nominal": {}}, {"name": "b", "namespaces": ["a"], "nominal": {}}]})


def test_policy_schema_file_is_current():
    shipped = json.loads((ROOT / "policies/schema.json").read_text())
    assert shipped == QuotaPolicy.model_json_schema(by_alias=True), "run: python -m gangctl.sim.shipped"
