"""The simulator's engine: determinism, quota limits, elastic resizing and failure accounting."""
from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from gangctl.model.admission import GPU
from gangctl.model.quota import QuotaPolicy
from gangctl.sim.engine import RUNNING, Simulation, backoff_expiry, simulate
from gangctl.sim.generate import generate
from gangctl.sim.scenario import Backend, Scenario
from gangctl.sim.traces import TraceJob

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE_POLICY = QuotaPolicy.model_validate(yaml.safe_load((ROOT / "policies/example-teams.yaml").read_text()))
ONE_TEAM = QuotaPolicy.model_validate({"teams": [{"name": "t", "nominal": {"gpu": 100_000}}]})


def scenario(nodes: int = 8, *, backend: str = "coscheduling", seed: int = 0, failures: dict | None = None,
             elastic: bool = False, gpus_per_node: int = 8) -> Scenario:
    return Scenario.model_validate({
        "name": "t", "seed": seed, "backend": backend, "quotaPolicy": "unused.yaml",
        "cluster": {"pools": [{"name": "p", "nodes": nodes, "gpusPerNode": gpus_per_node}]},
        "failures": failures or {},
        "workload": {"generate": {"jobs": 1, "arrivalsPerHour": 1}, "elastic": {"enabled": elastic, "minFraction": 0.5}},
        "sampleSeconds": 300,
    })


def job(id: str, submit: float, duration: float, nodes: int = 1, gpus: int = 8, team: str = "t", **kw) -> TraceJob:
    return TraceJob(id, submit, duration, nodes, gpus, group=team, **kw)


def busy_workload(n: int = 600, seed: int = 2) -> list[TraceJob]:
    return generate(n, 40, seed=seed, groups={"ml-a": 2, "ml-b": 2, "prod": 1, "eval": 3},
                    priority_classes={"normal": 8, "high": 1, "low": 1})


def outcomes(result) -> list[tuple]:
    return [(o.id, o.start, o.end, o.state, o.user_restarts, o.infra_restarts) for o in result.outcomes]


# --- basics -------------------------------------------------------------------------------------

def test_a_gang_waits_for_the_whole_gang_and_smaller_gangs_may_pass_it():
    jobs = [job("a", 0, 100, nodes=2), job("b", 1, 100, nodes=2), job("c", 2, 50, nodes=1)]
    result = simulate(scenario(nodes=3), ONE_TEAM, jobs)
    by = {o.id: o for o in result.outcomes}
    assert by["a"].start == 0 and by["a"].end == 100
    assert by["b"].start == 100        # needs two free nodes: all-or-nothing, no partial start
    assert by["c"].start == 2          # the one free node takes c meanwhile (no reservation for b)
    assert result.summary["jobs"] == {"done": 3, "failed": 0, "rejected": 0, "total": 3}
    assert result.summary["jct_seconds"]["mean"] == pytest.approx((100 + 199 + 50) / 3)
    assert result.summary["queue_delay_seconds"]["mean"] == pytest.approx(99 / 3)


def test_gangs_that_never_fit_are_rejected_with_a_reason():
    jobs = [job("huge", 0, 10, nodes=9), job("ok", 0, 10)]
    result = simulate(scenario(nodes=8), ONE_TEAM, jobs)
    by = {o.id: o for o in result.outcomes}
    assert by["huge"].state == "rejected" and "never fit" in by["huge"].reason
    assert by["ok"].state == "done"


# --- determinism --------------------------------------------------------------------------------

FLAKY = {"nodeMtbfHours": 50, "repairHours": 2, "exitFailureRate": 0.2, "restartBudget": 2}


def test_same_seed_same_run_other_seed_other_run():
    jobs = busy_workload(300)
    run = lambda seed: simulate(scenario(nodes=24, backend="kueue", seed=seed, failures=FLAKY), EXAMPLE_POLICY, jobs)  # noqa: E731
    first, again, other = run(1), run(1), run(2)
    assert outcomes(first) == outcomes(again)
    assert first.summary == again.summary
    assert outcomes(first) != outcomes(other)


# --- quota ---------------------------------------------------------------------------------------

def _limits(policy: QuotaPolicy):
    team_cap, cohorts = {}, {}
    for t in policy.teams:
        nominal = t.nominal.gpu
        borrow = t.borrowing_limit.gpu if t.borrowing_limit and t.borrowing_limit.gpu is not None else None
        team_cap[t.name] = nominal if t.cohort is None else (nominal + borrow if borrow is not None else float("inf"))
        if t.cohort:
            cohorts.setdefault(t.cohort, []).append(t)
    return team_cap, cohorts


@pytest.mark.parametrize("backend", [b.value for b in Backend])
def test_simulated_usage_never_exceeds_quota(backend):
    policy = EXAMPLE_POLICY
    team_cap, cohorts = _limits(policy)
    lent = {t.name: (t.lending_limit.gpu if t.lending_limit and t.lending_limit.gpu is not None else t.nominal.gpu)
            for t in policy.teams}
    peaks = {t.name: 0 for t in policy.teams}
    checks = 0

    def check(sim: Simulation) -> None:
        nonlocal checks
        checks += 1
        used = {team: u.get(GPU, 0) for team, u in sim.usage.items()}
        for team, gpus in used.items():
            assert gpus <= team_cap[team], f"t={sim.clock.now}: {team} uses {gpus} GPUs, cap {team_cap[team]}"
            assert sim.team_gpus[team] <= gpus, "running pods are always covered by held quota"
            peaks[team] = max(peaks[team], gpus)
        for members in cohorts.values():
            # Borrowed GPUs come out of what members leave unused, and only up to their lending limit.
            borrowed = sum(max(0, used[o.name] - o.nominal.gpu) for o in members)
            lendable = sum(min(lent[o.name], max(0, o.nominal.gpu - used[o.name])) for o in members)
            assert borrowed <= lendable, f"t={sim.clock.now}: cohort borrows {borrowed} of {lendable} lendable"
        assert sim.cluster.busy_gpus <= sim.cluster.total_gpus

    simulate(scenario(nodes=40, backend=backend), policy, busy_workload(500), observer=check)
    assert checks > 500
    # The check ran under pressure: some team borrowed beyond its nominal quota.
    assert any(peaks[t.name] > t.nominal.gpu for t in policy.teams), peaks


# --- elastic --------------------------------------------------------------------------------------

def _pods_over_time(sim_scenario: Scenario, jobs: list[TraceJob], policy: QuotaPolicy = ONE_TEAM):
    seen: dict[str, list[int]] = {}

    def watch(sim: Simulation) -> None:
        for j in sim.by_id.values():
            if j.state == RUNNING:
                history = seen.setdefault(j.spec.id, [])
                if not history or history[-1] != j.pods:
                    history.append(j.pods)
    return simulate(sim_scenario, policy, jobs, observer=watch), seen


def test_elastic_job_starts_at_its_floor_and_grows_when_capacity_frees():
    jobs = [job("blocker", 0, 1000, nodes=2), job("elastic", 10, 4000, nodes=4)]
    result, pods = _pods_over_time(scenario(nodes=4, elastic=True), jobs)
    assert pods["elastic"] == [2, 4]                    # floor = ceil(4 × 0.5), then all 4 nodes
    by = {o.id: o for o in result.outcomes}
    assert by["elastic"].start == 10                    # did not wait for the blocker
    rigid, _ = _pods_over_time(scenario(nodes=4, elastic=False), jobs)
    assert {o.id: o for o in rigid.outcomes}["elastic"].start == 1000
    assert by["elastic"].end < {o.id: o for o in rigid.outcomes}["elastic"].end


def test_elastic_job_shrinks_on_node_loss_instead_of_stopping():
    failures = {"nodeMtbfHours": 20, "repairHours": 1, "restartBudget": 0, "checkpointMinutes": 10}
    jobs = [job(f"e{i}", i * 3600, 20 * 3600, nodes=4) for i in range(4)]
    result, pods = _pods_over_time(scenario(nodes=8, elastic=True, failures=failures, seed=3), jobs)
    shrank = [h for h in pods.values() if any(b < a for a, b in zip(h, h[1:]))]
    assert result.summary["failures"]["node_failures"] > 0
    assert shrank, f"no job ran on fewer pods after a node loss: {pods}"
    assert all(min(h) >= 2 for h in pods.values()), "never below minNodes"
    assert result.summary["jobs"]["done"] == 4


# --- failures ---------------------------------------------------------------------------------------

def test_user_failures_use_the_restart_budget_then_fail_the_job():
    failures = {"exitFailureRate": 1.0, "restartBudget": 2}
    result = simulate(scenario(nodes=4, failures=failures), ONE_TEAM, [job(f"j{i}", i, 600) for i in range(5)])
    assert result.summary["jobs"]["failed"] == 5
    assert result.summary["failures"]["user_restarts"] == 5 * 3     # budget 2: the third failure is final
    assert result.summary["jct_seconds"]["mean"] is None           # no job completed
    assert result.summary["failures"]["goodput_lost_gpu_hours"] > 0


def test_infrastructure_failures_do_not_use_the_restart_budget():
    failures = {"nodeMtbfHours": 5, "repairHours": 0.5, "restartBudget": 0, "checkpointMinutes": 15}
    jobs = [job(f"j{i}", i * 60, 6 * 3600, nodes=2) for i in range(6)]
    result = simulate(scenario(nodes=6, failures=failures, seed=1), ONE_TEAM, jobs)
    f = result.summary["failures"]
    assert f["node_failures"] > 0 and f["infra_restarts"] > len(jobs)   # some job restarted more than once
    assert f["user_restarts"] == 0
    assert result.summary["jobs"]["done"] == len(jobs)                   # budget 0, yet nobody failed
    assert f["goodput_lost_gpu_hours"] > 0
    assert max(o.infra_restarts for o in result.outcomes) > 1


def test_checkpoints_bound_the_work_lost():
    base = {"nodeMtbfHours": 10, "repairHours": 0.5, "restartOverheadSeconds": 0}
    jobs = [job(f"j{i}", 0, 12 * 3600, nodes=1) for i in range(4)]
    often = simulate(scenario(nodes=4, failures=base | {"checkpointMinutes": 5}, seed=2), ONE_TEAM, jobs)
    rarely = simulate(scenario(nodes=4, failures=base | {"checkpointMinutes": 240}, seed=2), ONE_TEAM, jobs)
    assert often.summary["failures"]["node_failures"] > 0
    assert often.summary["failures"]["goodput_lost_gpu_hours"] < rarely.summary["failures"]["goodput_lost_gpu_hours"]



# --- the control plane's latencies (what gangctl sim-check measures) ------------------------------

def with_control_plane(sc: Scenario, **cp) -> Scenario:
    return Scenario.model_validate(sc.model_dump(by_alias=True) | {"controlPlane": cp})


def test_bind_and_finish_latency_add_to_delay_and_jct_but_nodes_free_at_exit():
    jobs = [job("a", 0, 100, nodes=2), job("b", 10, 100, nodes=2)]
    sc = with_control_plane(scenario(nodes=2), bindSeconds=2, finishSeconds=3)
    by = {o.id: o for o in simulate(sc, ONE_TEAM, jobs).outcomes}
    assert (by["a"].start, by["a"].end) == (2, 105)       # bound 2 s after it fits; done 3 s after exit
    # b fits when a's pods exit (t=102), not when a is reported done (t=105).
    assert (by["b"].start, by["b"].end) == (104, 207)


TWO_TEAMS_OF_16 = QuotaPolicy.model_validate({"teams": [{"name": "t", "nominal": {"gpu": 16}},
                                                      {"name": "u", "nominal": {"gpu": 16}}]})


@pytest.mark.parametrize("backend, b_start", [("coscheduling", 105), ("native", 105), ("kueue", 102)])
def test_gangctls_gate_frees_a_jobs_quota_when_the_job_is_reported_done(backend, b_start):
    """gangctl's quota gate counts a job until it sees the TrainJob done (finish latency after its
    pods exit); the nodes are free at the exit. Kueue frees the Workload when the Job finishes."""
    jobs = [job("a", 0, 100, nodes=2), job("b", 10, 100, nodes=2)]
    sc = with_control_plane(scenario(nodes=4, backend=backend), bindSeconds=2, finishSeconds=3)
    by = {o.id: o for o in simulate(sc, TWO_TEAMS_OF_16, jobs).outcomes}
    assert by["a"].end == 105                      # exit at 102, reported done 3 s later
    assert by["b"].start == b_start + 2            # admitted then, bound 2 s after (two nodes were free all along)


def test_kueue_admits_the_next_gang_once_the_last_ones_pods_are_ready():
    """Kueue with blockAdmission (as gangctl configures it) admits one workload at a time: the next only
    when the last one's pods are ready (`readySeconds` after its admission, at least `bindSeconds`),
    though all three fit at once; gangctl's gate and the other backends start them together."""
    jobs = [job("a", 0, 100), job("b", 0, 100), job("c", 0, 100)]
    sc = with_control_plane(scenario(nodes=4, backend="kueue"), bindSeconds=1, readySeconds=4)
    starts = sorted(o.start for o in simulate(sc, ONE_TEAM, jobs).outcomes)
    assert starts == [1, 5, 9]                       # admitted at 0, 4, 8; each bound 1 s after
    at_bind = with_control_plane(scenario(nodes=4, backend="kueue"), bindSeconds=1)
    assert sorted(o.start for o in simulate(at_bind, ONE_TEAM, jobs).outcomes) == [1, 2, 3]   # ready when bound
    together = with_control_plane(scenario(nodes=4), bindSeconds=1, readySeconds=4)
    assert sorted(o.start for o in simulate(together, ONE_TEAM, jobs).outcomes) == [1, 1, 1]


def test_with_retries_modelled_a_waiting_gang_starts_at_the_nudge_or_the_periodic_retry():
    jobs = [job("a", 0, 100, nodes=2), job("b", 10, 100, nodes=2)]
    nudged = with_control_plane(scenario(nodes=2), finishSeconds=5, retrySeconds=1000)
    by = {o.id: o for o in simulate(nudged, ONE_TEAM, jobs).outcomes}
    assert by["b"].start == 106          # a reported done at 105 (PodGroup deleted): gangctl nudges b 1 s later
    # Until a is reported done (t=200), only the periodic retry (every 30 s) tries b again.
    slow = with_control_plane(scenario(nodes=2), finishSeconds=100, retrySeconds=30)
    by = {o.id: o for o in simulate(slow, ONE_TEAM, jobs).outcomes}
    assert by["b"].start == 120
    # Without retries modelled, b starts the moment a's pods exit.
    assert {o.id: o for o in simulate(scenario(nodes=2), ONE_TEAM, jobs).outcomes}["b"].start == 100


def test_default_control_plane_changes_nothing():
    jobs = busy_workload(200)
    sc = scenario(nodes=24, backend="kueue", seed=1, failures=FLAKY)
    explicit = with_control_plane(sc, bindSeconds=0, finishSeconds=0)
    assert outcomes(simulate(sc, EXAMPLE_POLICY, jobs)) == outcomes(simulate(explicit, EXAMPLE_POLICY, jobs))


# --- kube-scheduler's placement and requeueing (what the replay on the local cluster runs) ------

def spread(sc: Scenario) -> Scenario:
    return Scenario.model_validate(sc.model_dump(by_alias=True)
                                   | {"cluster": sc.cluster.model_dump(by_alias=True) | {"packing": "spread"}})


def test_spread_packing_puts_each_pod_on_the_emptiest_node_and_is_deterministic():
    from gangctl.sim.model import Cluster, NodePool, Packing
    c = Cluster([NodePool("p", 4, 8)], Packing.SPREAD, seed=3)
    firsts = [c.place(1, 1)[0][0] for _ in range(4)]
    assert sorted(firsts) == [0, 1, 2, 3]                    # one small pod on every node
    assert c.place(1, 8) is None                             # no node is whole any more
    assert c.place(2, 2) is not None and max(c.free) == 7   # then the next emptiest
    again = Cluster([NodePool("p", 4, 8)], Packing.SPREAD, seed=3)
    assert [again.place(1, 1)[0][0] for _ in range(4)] == firsts
    best = Cluster([NodePool("p", 4, 8)], Packing.BEST_FIT)
    assert {best.place(1, 1)[0][0] for _ in range(4)} == {0}  # best-fit packs them instead
    assert best.place(3, 8) is not None


def test_with_spread_small_jobs_keep_a_whole_node_pod_waiting_that_best_fit_starts_at_once():
    jobs = [job(f"s{i}", i, 100, gpus=1) for i in range(2)] + [job("big", 5, 10, gpus=8)]
    sc = scenario(nodes=2)
    assert {o.id: o for o in simulate(sc, ONE_TEAM, jobs).outcomes}["big"].start == 5
    assert {o.id: o for o in simulate(spread(sc), ONE_TEAM, jobs).outcomes}["big"].start == 100


def test_a_gang_short_node_by_node_is_retried_when_pods_leave_a_node_without_a_nudge():
    # 2 nodes; s0, s1 (1 GPU each) spread over both; the 8-GPU pod fits the GPUs in sum (14 free)
    # but no node: the scheduler retries it when s0's pod leaves (t=50), not at the next nudge.
    jobs = [job("s0", 0, 50, gpus=1), job("s1", 1, 100, gpus=1), job("big", 5, 10, gpus=8)]
    sc = with_control_plane(spread(scenario(nodes=2)), finishSeconds=5, retrySeconds=1000)
    assert {o.id: o for o in simulate(sc, ONE_TEAM, jobs).outcomes}["big"].start == 50


def test_gangctls_nudges_do_not_retry_a_gang_short_node_by_node():
    # old (8 GPUs) fits the 14 free GPUs in sum but no node: NodeResourcesFit rejects it at 5, and only
    # a pod leaving a node moves it back (a PodGroup update does not: in a -v=4 scheduler log, 9 of
    # about 2,500 moves of such pods). So the periodic retries (every 7 s) leave its backoff at 1 s, and
    # when s0 leaves at 50 old is past its backoff and goes before young (came at 48, backing off until
    # 49 ends): the older gang gets the node.
    jobs = [job("s0", 0, 50, gpus=1), job("s1", 1, 1000, gpus=1), job("old", 5, 10, gpus=8),
            job("young", 48, 10, gpus=8)]
    sc = with_control_plane(spread(scenario(nodes=2)), retrySeconds=7)
    by = {o.id: o for o in simulate(sc, ONE_TEAM, jobs).outcomes}
    assert by["old"].start == 50
    # young, tried again at 50, finds 6 GPUs free in sum (Coscheduling rejects it): it waits for
    # gangctl's nudge after old is done (exit 60, +1 s), not for old's pod to leave.
    assert by["young"].start == 61


def test_a_gang_short_in_sum_waits_for_a_coscheduling_event():
    # a holds both nodes; b (a whole-cluster gang) is short in sum: Coscheduling's PreFilter rejects
    # it, and it is retried at gangctl's nudge (a done at 105, +1 s), not when a's pods leave (100)...
    jobs = [job("a", 0, 100, nodes=2), job("b", 10, 100, nodes=2)]
    sc = with_control_plane(scenario(nodes=2), finishSeconds=5, retrySeconds=1000)
    assert {o.id: o for o in simulate(sc, ONE_TEAM, jobs).outcomes}["b"].start == 106
    # ... or when a new gang arrives (its PodGroup and pods are added) before that.
    arrives = jobs + [job("c", 102, 10, nodes=2)]
    by = {o.id: o for o in simulate(sc, ONE_TEAM, arrives).outcomes}
    assert by["b"].start == 102                  # b first: the older PodGroup
    assert by["c"].start == 208                  # c: b's pods exit at 202, reported done 207, nudge 208


def test_kube_schedulers_backoff_doubles_from_one_second_to_ten_in_one_second_windows():
    assert [backoff_expiry(fails, 10.3) for fails in range(1, 8)] == [11, 12, 14, 18, 20, 20, 20]
    assert backoff_expiry(5000, 10.3) == 20      # a gang rejected all day long: still 10 s


def test_a_gang_rejected_often_waits_behind_a_fresher_gang_past_its_backoff():
    # a holds all 4 nodes until 100. big (3 nodes) is rejected at its arrival and at every periodic
    # retry (every 7 s): its pods back off 10 s, last rejected at 98. mid (2 nodes) came at 97 and was
    # rejected twice (backoff over at 100). At gangctl's nudge (101) mid's pods are in the scheduler's
    # active queue and big's still in its backoff queue: mid goes first, and big waits for mid.
    jobs = [job("a", 0, 100, nodes=4), job("big", 1, 10, nodes=3), job("mid", 97, 50, nodes=2)]
    sc = with_control_plane(scenario(nodes=4), retrySeconds=7)
    by = {o.id: o for o in simulate(sc, ONE_TEAM, jobs).outcomes}
    assert by["mid"].start == 101
    assert by["big"].start == 152          # mid's pods exit at 151, the nudge 1 s later
    # Without the control plane modelled, gangs are placed in arrival order: big first.
    by = {o.id: o for o in simulate(scenario(nodes=4), ONE_TEAM, jobs).outcomes}
    assert by["big"].start == 100 and by["mid"].start == 110


def test_gangs_backing_off_are_tried_in_order_of_backoff_end_and_before_a_new_gang():
    # One node frees at 100 (a's). w came at 95, v at 99.5 (both rejected then; w twice). At 100.5 n
    # arrives: its PodGroup requeues w and v, both still backing off (v until 100, w until 101, in 1 s
    # windows), and the scheduler pops them before n's pods exist: v, whose backoff ends first, gets it.
    jobs = [job("a", 0, 100), job("b", 0, 1000), job("w", 95, 10), job("v", 99.5, 10), job("n", 100.5, 10)]
    sc = with_control_plane(scenario(nodes=2), retrySeconds=1000)
    by = {o.id: o for o in simulate(sc, ONE_TEAM, jobs).outcomes}
    assert by["v"].start == 100.5
    assert by["w"].start > by["v"].start and by["n"].start > by["v"].start


@pytest.mark.parametrize("race, old_start, young_start", [(1.0, 60, 50), (0.0, 50, 60)])
def test_a_gang_rejected_at_permit_may_still_hold_the_drained_node_when_the_next_gang_tries(race, old_start, young_start):
    # Three nodes, each with a 1-GPU pod; s0's node drains at 50. Waiting: big (2 x 8, since 5), old and
    # young (1 x 8, since 10 and 20), all rejected node by node, so s0's exit retries them, oldest first.
    # big passes PreFilter (22 GPUs free in sum), its first pod takes the drained node and waits at
    # Permit, its second fits nowhere and the gang is rejected. Whether old's attempt still finds the
    # node held is a race (`permitHoldRace`): if it does, old is moved back behind young, and young
    # takes the node. At young's exit (60) big holds the node again and old loses again, but nobody is
    # behind it: tried again after big's rejection, it finds the node free. On the local cluster's
    # kube-scheduler the hold won about half the time (`gangctl.validate.plan.PERMIT_HOLD_RACE`).
    jobs = [job("s0", 0, 50, gpus=1), job("s1", 0, 1000, gpus=1), job("s2", 0, 1000, gpus=1),
            job("big", 5, 10, nodes=2), job("old", 10, 10), job("young", 20, 10)]
    sc = with_control_plane(spread(scenario(nodes=3)), retrySeconds=1000, permitHoldRace=race)
    by = {o.id: o for o in simulate(sc, ONE_TEAM, jobs).outcomes}
    assert (by["old"].start, by["young"].start) == (old_start, young_start)
    # With no gang to hold the node, the race never arises: the oldest gang takes it.
    alone = [j for j in jobs if j.id != "big"]
    by = {o.id: o for o in simulate(sc, ONE_TEAM, alone).outcomes}
    assert (by["old"].start, by["young"].start) == (50, 60)


@pytest.mark.parametrize("attempt, old_start, young_start", [(0.01, 60.015, 50.015), (0.0, 50.015, 60.015)])
def test_an_event_before_a_gangs_attempt_finds_it_still_queued_with_its_earlier_rejection(attempt, old_start, young_start):
    # One node; old (came at 10) and young (at 20) wait for it whole, and the exits at 30-38 have
    # retried both to the 10 s backoff. s0's exit at 50 retries them, oldest first, one attempt after
    # another (`attemptSeconds`): old is rejected at 50.01; young's attempt, due at 50.02, has not come
    # when s1's exit at 50.015 drains the node. young is still queued with its rejection at 38 (its
    # backoff long over) and old backs off from 50.01: young goes first and takes the node. Tried at
    # the same instant, as without attempt times, both back off alike and the older gang goes first.
    small = [job(f"e{i}", 0, 30 + 2 * i, gpus=1) for i in range(5)]
    jobs = small + [job("s0", 0, 50, gpus=1), job("s1", 0, 50.015, gpus=1), job("old", 10, 10), job("young", 20, 10)]
    sc = with_control_plane(scenario(nodes=1, backend="native"), retrySeconds=1000, attemptSeconds=attempt)
    by = {o.id: o for o in simulate(sc, ONE_TEAM, jobs).outcomes}
    assert (by["old"].start, by["young"].start) == pytest.approx((old_start, young_start))


def test_a_native_gang_short_in_sum_is_retried_when_pods_leave_a_node():
    # The same gangs under Kubernetes' own gang scheduling: no PreFilter rejects b on its sum, and
    # kube-scheduler requeues it when a's pods leave (t=100), without waiting for a nudge (106).
    jobs = [job("a", 0, 100, nodes=2), job("b", 10, 100, nodes=2)]
    sc = with_control_plane(scenario(nodes=2, backend="native"), finishSeconds=5, retrySeconds=1000)
    assert {o.id: o for o in simulate(sc, ONE_TEAM, jobs).outcomes}["b"].start == 100


@pytest.mark.parametrize("backend, held_while_waiting", [("coscheduling", 32), ("kai", 16), ("volcano", 16)])
def test_a_gang_waiting_for_nodes_holds_quota_only_where_admission_precedes_placement(backend, held_while_waiting):
    # Quota 32 GPUs, 2 nodes x 8: a runs on both; b fits the quota but not the nodes. gangctl's gate
    # (coscheduling) admits b and its PodGroup waits holding 16 GPUs of quota; KAI and Volcano take a
    # gang only when quota and nodes both hold it, so b holds nothing until a's nodes free.
    team = QuotaPolicy.model_validate({"teams": [{"name": "t", "nominal": {"gpu": 32}}]})
    seen: list[float] = []

    def check(sim: Simulation) -> None:
        if 1 <= sim.clock.now < 100:
            seen.append(sim.usage["t"].get(GPU, 0))
    result = simulate(scenario(nodes=2, backend=backend), team, [job("a", 0, 100, nodes=2), job("b", 1, 50, nodes=2)],
                      observer=check)
    assert seen and max(seen) == held_while_waiting
    assert {o.id: o.start for o in result.outcomes} == {"a": 0, "b": 100}


def test_the_engine_decides_with_the_scenarios_backend_only():
    """The controller it asks decides with the scenario's backend; one deciding with another is refused."""
    from gangctl.sim.controller import SimController
    from gangctl.sim.model import Cluster

    sc = scenario(nodes=2, backend="kueue")
    cluster = Cluster(sc.cluster.node_pools(), sc.cluster.packing, sc.cluster.same_zone)
    args = dict(backend=sc.backend, failures=sc.failures, elastic=sc.workload.elastic, seed=0)
    assert Simulation([], EXAMPLE_POLICY, cluster, **args).controller.backend.name == "kueue"
    other = SimController(sc.workload.elastic, 3, backend="volcano")
    with pytest.raises(ValueError, match="decides with volcano, the scenario's backend is kueue"):
        Simulation([], EXAMPLE_POLICY, cluster, controller=other, **args)
