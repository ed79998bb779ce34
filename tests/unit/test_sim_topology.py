"""The simulator's topology: domains of the simulated cluster, how each backend places an asking gang,
gangctl's own choice (the controller's `placement.choose`) deciding where it has none, the report's
topology section, and the racks sweep answering "how many racks"."""
from __future__ import annotations

import random
from pathlib import Path

import pytest
from pydantic import ValidationError

from gangctl.model.quota import QuotaPolicy
from gangctl.model.topology import PlacementIntent
from gangctl.plugins.registry import BACKENDS
from gangctl.policy.placement import Floor, Placed, choose
from gangctl.sim.engine import simulate
from gangctl.sim.model import GPU, Ask, Cluster, Level, NodePool
from gangctl.sim.scenario import Scenario, load_quota_policy, load_scenario, load_workload
from gangctl.sim.sweep import parse_axis, parse_target, smallest_cluster, with_value
from gangctl.sim.topology import Placer
from gangctl.sim.traces import TraceJob

ROOT = Path(__file__).resolve().parents[2]
POLICY = QuotaPolicy.model_validate({"teams": [{"name": "t", "nominal": {"gpu": 100_000}}]})
LEVELS = [Level("block", 8), Level("rack", 4)]
RACK = Ask(level=1, required=True)


def cluster(nodes: int = 16, levels=LEVELS) -> Cluster:
    return Cluster([NodePool("p", nodes, 8)], levels=levels)


def racks_of(c: Cluster, placement) -> set[str]:
    return {c.groups[node][2].name for node, _ in placement}


def take(c: Cluster, nodes: list[int]) -> None:
    c.reserve([(n, 1) for n in nodes], 8)


# --- the model: domains and the schedulers' topology-aware placement ------------------------------

def test_nodes_form_nested_domains_and_a_level_must_be_made_of_whole_narrower_ones():
    c = cluster(16)
    assert [d.name for d in c.level_domains[1]] == ["p-rack-0000", "p-rack-0001", "p-rack-0002", "p-rack-0003"]
    assert [d.name for d in c.level_domains[0]] == ["p-block-0000", "p-block-0001"]
    assert c.groups[5][1].name == "p-block-0000" and c.groups[5][2].name == "p-rack-0001"
    with pytest.raises(ValueError, match="block of 6 nodes is not made of whole racks of 4"):
        Cluster([NodePool("p", 12, 8)], levels=[Level("block", 6), Level("rack", 4)])


def test_a_required_gang_goes_to_the_fullest_rack_that_holds_it_and_waits_when_none_does():
    c = cluster(16)
    take(c, [0, 1, 4])                       # rack 0: 2 free hosts, rack 1: 3, racks 2-3: 4
    placement = c.place(3, 8, ask=RACK)
    assert racks_of(c, placement) == {"p-rack-0001"}   # the fullest rack that holds 3 pods
    split = cluster(16)
    take(split, [0, 1, 4, 5, *range(8, 16)])   # 4 free hosts, 2 in each of two racks
    assert split.free_gpus == 32 and split.place(3, 8, ask=RACK) is None   # a required gang of 3 waits
    assert split.place(3, 8) is not None                                   # one that asks nothing starts


def test_a_block_ask_takes_one_rack_when_a_rack_holds_it():
    c = cluster(16)
    take(c, [0])
    placement = c.place(3, 8, ask=Ask(level=0, required=True))
    assert racks_of(c, placement) == {"p-rack-0000"}   # narrowest first, then the fullest


def test_a_preferred_gang_no_rack_holds_spans_the_fewest_racks_freest_first():
    c = cluster(16)
    take(c, [0, 1, 2, 4, 5, 8])                       # free hosts per rack: 1, 2, 3, 4
    placement = c.place(6, 8, ask=Ask(level=1, required=False))
    assert racks_of(c, placement) == {"p-rack-0003", "p-rack-0002"}
    assert c.domains_spanned(placement, 1) == 2


def test_growth_of_a_required_gang_stays_in_its_rack():
    c = cluster(16)
    placement = c.place(3, 8, ask=RACK)
    near = placement[0][0]
    assert racks_of(c, c.place(1, 8, near=near, ask=RACK)) == racks_of(c, placement)
    assert c.place(1, 8, near=near, ask=RACK) is None          # its rack is full: no pod elsewhere
    assert c.place(1, 8, near=near, ask=Ask(1, required=False)) is not None   # preferred: elsewhere


def test_the_model_and_the_controllers_choice_pick_the_same_domain():
    """gangctl's own choice (`placement.choose`, on the nodes as `Cluster.rooms` shows them) and the
    model's TAS placement agree on the domain for every random state: narrowest, then fullest."""
    rng = random.Random(7)
    placer = Placer(LEVELS, [], BACKENDS["coscheduling"])
    for _ in range(300):
        c = cluster(24)
        for node in rng.sample(range(24), rng.randrange(24)):
            c.reserve([(node, rng.randrange(1, 9))], 1)
        pods, gpp = rng.randrange(1, 7), rng.choice([1, 2, 4, 8])
        level = rng.randrange(2)
        label = LEVELS[level].label
        for required in (True, False):
            intent = PlacementIntent(required=label) if required else PlacementIntent(preferred=label)
            chosen = choose(c.rooms(None), placer.topology, intent, Floor(pods, {GPU: gpp}))
            model = c.best_domain(pods, gpp, None, Ask(level, required))
            if model is None and required:
                assert not isinstance(chosen, Placed)
            elif model is None:   # preferred: over the fewest domains of its level, or none
                assert not isinstance(chosen, Placed) or len(chosen.domains) != 1
            else:
                assert isinstance(chosen, Placed) and chosen.domain == model.name


# --- who places: the backend's scheduler or gangctl ------------------------------------------------

@pytest.mark.parametrize("backend, required_own, preferred_own", [
    ("coscheduling", True, True), ("native", False, True), ("kueue", False, False),
    ("volcano", False, False), ("kai", False, False)])
def test_gangctl_chooses_where_the_backend_has_no_mechanism(backend, required_own, preferred_own):
    shares = Scenario.model_validate(_scenario_doc(placement=[
        {"level": "rack", "mode": "required", "share": 0.5},
        {"level": "rack", "mode": "preferred", "share": 0.5}])).workload.placement
    placer = Placer(LEVELS, shares, BACKENDS[backend])
    asks = {a.kind: a.own for _, a in placer.choices}
    assert asks == {"required rack": required_own, "preferred rack": preferred_own}


def test_gangctls_own_placement_pins_the_gang_where_its_choice_says():
    placer = Placer(LEVELS, [], BACKENDS["coscheduling"])
    asked = next(a for _, a in Placer(LEVELS, Scenario.model_validate(_scenario_doc(placement=[
        {"level": "rack", "mode": "required", "share": 1}])).workload.placement, BACKENDS["coscheduling"]).choices)
    c = cluster(16)
    take(c, [0, 8, 9])
    expected = choose(c.rooms(None), placer.topology, asked.intent, Floor(2, {GPU: 8}))
    assert isinstance(expected, Placed)
    assert racks_of(c, placer.place(c, asked, 2, 8, None)) == {expected.domain} == {"p-rack-0002"}


@pytest.mark.parametrize("backend, packs", [("coscheduling", True), ("native", True), ("kueue", False),
                                             ("volcano", False), ("kai", False)])
def test_a_gang_that_asks_for_nothing_is_packed_by_gangctl_where_its_scheduler_would_scatter_it(backend, packs):
    """The controller pins such a gang (preferred) to the narrowest, fullest domain on coscheduling and
    native; elsewhere the scheduler places it as the cluster's packing says."""
    placer = Placer(LEVELS, [], BACKENDS[backend])
    assert placer.packs is packs
    packed, plain = cluster(16), cluster(16)
    for c in (packed, plain):
        take(c, [0, 8, 9])   # rack 0 has 3 free hosts, rack 2 has 2, racks 1 and 3 have 4
    placement = placer.pack(packed, 2, 8, None)
    if packs:
        assert racks_of(packed, placement) == {"p-rack-0002"}
    else:
        assert placement == plain.place(2, 8, None)


def test_jobs_are_drawn_by_a_stable_hash_in_their_shares():
    shares = Scenario.model_validate(_scenario_doc(placement=[
        {"level": "rack", "mode": "required", "share": 0.3}])).workload.placement
    placer = Placer(LEVELS, shares, BACKENDS["kueue"])
    drawn = [placer.ask_of(f"job-{i:06d}") is not None for i in range(2000)]
    assert drawn == [placer.ask_of(f"job-{i:06d}") is not None for i in range(2000)]
    assert 0.27 < sum(drawn) / 2000 < 0.33


# --- scenarios, runs and the report ----------------------------------------------------------------

def _scenario_doc(backend: str = "coscheduling", nodes: int = 16, placement=None, **workload) -> dict:
    return {"name": "topo", "backend": backend, "quotaPolicy": "unused.yaml", "seed": 1,
            "cluster": {"pools": [{"name": "p", "nodes": nodes, "gpusPerNode": 8}],
                        "topology": [{"name": "block", "nodes": 8}, {"name": "rack", "nodes": 4}]},
            "workload": {"generate": {"jobs": 1, "arrivalsPerHour": 1}, "placement": placement or [], **workload},
            "sampleSeconds": 300}


def test_a_scenario_names_levels_of_its_topology_and_shares_at_most_one():
    with pytest.raises(ValidationError, match=r"workload.placement\[0\].level: 'row' is not a level"):
        Scenario.model_validate(_scenario_doc(placement=[{"level": "row", "mode": "required", "share": 0.5}]))
    with pytest.raises(ValidationError, match="add up to more than 1"):
        Scenario.model_validate(_scenario_doc(placement=[{"level": "rack", "mode": "required", "share": 0.6},
                                                         {"level": "block", "mode": "preferred", "share": 0.6}]))
    doc = _scenario_doc()
    doc["cluster"]["topology"] = [{"name": "block", "nodes": 6}, {"name": "rack", "nodes": 4}]
    with pytest.raises(ValidationError, match="not made of whole racks"):
        Scenario.model_validate(doc)


def gangs(n: int = 120, seed: int = 4) -> list[TraceJob]:
    rng = random.Random(seed)
    return [TraceJob(f"job-{i:06d}", i * 300.0, rng.choice([1800.0, 3600.0, 7200.0]), rng.choice([1, 2, 3, 4]), 8,
                     group="t") for i in range(n)]


@pytest.mark.parametrize("backend", ["coscheduling", "kueue", "volcano", "kai", "native"])
def test_no_required_gang_ever_spans_two_racks_on_any_backend(backend):
    sc = Scenario.model_validate(_scenario_doc(backend, placement=[
        {"level": "rack", "mode": "required", "share": 0.5}, {"level": "rack", "mode": "preferred", "share": 0.25}]))
    seen = []

    def observe(sim):
        for job in sim.by_id.values():
            if job.placement and job.asked is not None and job.asked.ask.required:
                seen.append(len(racks_of(sim.cluster, job.placement)))
    result = simulate(sc, POLICY, gangs(), observer=observe)
    topology = result.summary["topology"]
    assert result.summary["jobs"]["done"] == 120
    assert seen and set(seen) == {1} and topology["required_violations"] == 0
    by = topology["by_ask"]
    assert by["required rack"]["mean_domains"] == 1.0
    assert by["none"]["jobs"] + by["required rack"]["jobs"] + by["preferred rack"]["jobs"] == 120
    assert by["none"]["mean_domains"] >= 1.0 and topology["stranded_gpus_mean"] >= 0


def test_a_required_gang_larger_than_any_rack_is_rejected_with_the_numbers():
    sc = Scenario.model_validate(_scenario_doc(placement=[{"level": "rack", "mode": "required", "share": 1}]))
    result = simulate(sc, POLICY, [TraceJob("big", 0, 60, 5, 8, group="t"), TraceJob("ok", 0, 60, 4, 8, group="t")])
    by = {o.id: o for o in result.outcomes}
    assert by["big"].state == "rejected"
    assert by["big"].reason == ("TopologyUnsatisfiable: no rack can ever hold 5 pods of 8 GPUs "
                                "(the largest has room for 4)")
    assert by["ok"].state == "done"


@pytest.mark.parametrize("backend", ["coscheduling", "kai"])
def test_required_gangs_wait_while_free_gpus_are_stranded_across_racks(backend):
    # Two 3-pod gangs fill 3 of 4 hosts in each rack of an 8-node block; a third waits: 16 GPUs free,
    # 8 in each rack, none usable by it: stranded until a gang ends. KAI's consolidation finds no gang
    # to move (an evicted one would find no rack either), so it waits there too.
    sc = Scenario.model_validate(_scenario_doc(backend, nodes=8, placement=[{"level": "rack", "mode": "required",
                                                                             "share": 1}]) | {"sampleSeconds": 60})
    jobs = [TraceJob(f"g{i}", 0, 600, 3, 8, group="t") for i in range(3)]
    result = simulate(sc, POLICY, jobs)
    by = {o.id: o for o in result.outcomes}
    assert sorted(o.queue_delay for o in result.outcomes) == [0, 0, 600]
    assert all(o.state == "done" for o in by.values())
    stranded = dict(zip(result.series.t, result.series.stranded_gpus))
    assert stranded[60] == stranded[540] == 16       # while the third gang waits
    assert stranded[600] == stranded[660] == 0       # it started: nothing waits
    assert result.summary["topology"]["stranded_gpus_mean"] > 0


def test_the_shipped_topology_scenario_runs():
    sc = load_scenario(ROOT / "simulations/topology-racks.yaml")
    policy = load_quota_policy(sc.quota_policy)
    jobs = load_workload(sc, policy).jobs[:60]
    summary = simulate(sc, policy, jobs).summary
    assert summary["topology"]["levels"] == ["block", "rack"] and summary["topology"]["required_violations"] == 0


# --- how many racks ----------------------------------------------------------------------------------

def test_a_racks_sweep_sizes_the_cluster_in_whole_racks():
    sc = Scenario.model_validate(_scenario_doc(nodes=16))
    assert parse_axis("racks=2..6").values == [2, 3, 4, 5, 6]
    assert with_value(sc, POLICY, "racks", 6)[0].cluster.pools[0].nodes == 24
    assert with_value(sc, POLICY, "racks", 3)[0].cluster.racks == 3


def test_how_many_racks_answers_with_the_smallest_that_meets_the_target():
    sc = Scenario.model_validate(_scenario_doc(nodes=16, placement=[{"level": "rack", "mode": "required", "share": 1}]))
    jobs = [TraceJob(f"j{i}", i * 60.0, 3600, 4, 8, group="t") for i in range(12)]   # a rack-sized gang a minute
    target = parse_target("p95_queue_delay<=1m")
    answer, points = smallest_cluster(sc, POLICY, jobs, parse_axis("racks=2..16:7"), target)
    delays = {p.value: p.summary["queue_delay_seconds"]["p95"] for p in points}
    assert answer == 12 and delays[12] <= 60 and delays[11] > 60   # bisected to one rack



def test_gangctls_recheck_lets_gangs_that_ask_nothing_take_freed_nodes_first():
    """With the controller's recheck modelled, a required gang that waits for a rack has no Job until
    gangctl looks again: a gang that asks nothing, whose pods already wait, takes the rack that frees
    in between. Deciding at every event instead, the required gang (admitted first) takes it."""
    shares = [{"level": "rack", "mode": "required", "share": 0.5}]
    placer = Placer(LEVELS, Scenario.model_validate(_scenario_doc(placement=shares)).workload.placement,
                    BACKENDS["coscheduling"])
    required = next(f"r{i}" for i in range(100) if placer.ask_of(f"r{i}") is not None)
    plain = [f"n{i}" for i in range(100) if placer.ask_of(f"n{i}") is None][:3]

    def starts(recheck: float) -> dict:
        doc = _scenario_doc(nodes=8, placement=shares) | {"controlPlane": {"topologyRecheckSeconds": recheck}}
        jobs = [TraceJob(plain[0], 0, 100, 4, 8, group="t"), TraceJob(plain[1], 0, 300, 4, 8, group="t"),
                TraceJob(required, 1, 60, 4, 8, group="t"), TraceJob(plain[2], 2, 60, 4, 8, group="t")]
        return {o.id: o.start for o in simulate(Scenario.model_validate(doc), POLICY, jobs).outcomes}

    eager, paced = starts(0), starts(5)
    assert (eager[required], eager[plain[2]]) == (100, 160)   # the rack freed at 100 goes to the required gang
    assert (paced[plain[2]], paced[required]) == (100, 161)   # it goes to the plain gang; gangctl looks at 161


def test_kais_consolidation_moves_a_running_gang_to_free_a_rack_and_others_wait():
    """Two 2-pod gangs run in rack 1 and rack 2 of an 8-node block after a third one ends: 4 hosts free,
    2 in each rack, so a gang that requires a whole rack fits in sum but in no rack. KAI's consolidation
    evicts the latest started gang that can be placed again at once (b, which rack 2's free hosts
    hold), and the waiting gang takes its rack at once; b queues again once its pods are gone (30 s
    grace: 2 pods gone after 20 s on average) and runs again from the start. Kueue (no consolidation)
    waits until b ends."""
    shares = [{"level": "rack", "mode": "required", "share": 0.5}]
    placer = Placer(LEVELS, Scenario.model_validate(_scenario_doc(placement=shares)).workload.placement,
                    BACKENDS["kai"])
    required = next(f"r{i}" for i in range(100) if placer.ask_of(f"r{i}") is not None)
    a, b, d = [f"n{i}" for i in range(100) if placer.ask_of(f"n{i}") is None][:3]
    jobs = [TraceJob(a, 0, 5, 2, 8, group="t"), TraceJob(b, 0, 300, 2, 8, group="t"),
            TraceJob(d, 0, 400, 2, 8, group="t"), TraceJob(required, 10, 60, 4, 8, group="t")]

    def run(backend: str) -> dict:
        doc = _scenario_doc(backend, nodes=8, placement=shares) | {"controlPlane": {"evictSeconds": 30},
                                                                   "failures": {"restartOverheadSeconds": 0}}
        return {o.id: o for o in simulate(Scenario.model_validate(doc), POLICY, jobs).outcomes}

    kai = run("kai")
    assert kai[required].start == pytest.approx(10.0) and kai[required].end == pytest.approx(70.0)
    assert kai[b].preemptions == 1 and kai[b].end == pytest.approx(330.0), "b ran again from its start at 30"
    assert kai[b].start == 0, "its queueing delay ends at its first start"
    assert kai[d].preemptions == 0 and kai[d].end == pytest.approx(400.0)
    kueue = run("kueue")
    assert kueue[required].start == pytest.approx(300.0) and kueue[b].preemptions == 0
