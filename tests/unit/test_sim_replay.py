"""The pure parts of the sim-versus-real replay: the TrainJobs it submits, the plan, the measurements."""
from __future__ import annotations

import re
from datetime import datetime, timezone
from pathlib import Path

import pytest
import yaml
from rich.console import Console

from gangctl.api.trainjob import parse_trainjob
from gangctl.model.admission import GPU, Verdict, Workload, decide, queue_key
from gangctl.model.quota import QuotaPolicy
from gangctl.model.resolve import resolve
from gangctl.sim import objects
from gangctl.sim.engine import simulate
from gangctl.sim.metrics import JobOutcome
from gangctl.sim.model import NodePool
from gangctl.sim.replay import trainjob_submissions
from gangctl.sim.scenario import Backend, load_quota_policy, load_scenario, load_workload
from gangctl.sim.traces import TraceJob
from gangctl.sim.model import Packing
from gangctl.validate import cli as validate_cli
from gangctl.validate.cli import alone, measured_latency, per_job_rows
from gangctl.validate.expectation import expected
from gangctl.validate.measure import (RealOutcome, compare, in_arrival_order, oldest_first, outcome_of, rank, rank_bias,
                                      summarize, verdict)
from gangctl.validate.plan import LOCAL_PODS_READY_TIMEOUT_SECONDS, gpu_pools, namespaces_of, open_policy, plan

ROOT = Path(__file__).resolve().parents[2]
RUNTIME = objects.runtime()
COMPLETE = "pod-complete.stage.kwok.x-k8s.io/"


def job(id: str, submit: float, duration: float, nodes: int = 1, gpus: int = 8, **kw) -> TraceJob:
    return TraceJob(id, submit, duration, nodes, gpus, cpu_per_node=6.0 * gpus, memory_per_node=48.0 * gpus,
                    group="ml-a", **kw)


# --- the TrainJobs -------------------------------------------------------------------------------

def test_trainjobs_finish_on_kwok_after_the_compressed_duration_exactly():
    jobs = [job("j-2", 1200, 600, nodes=2), job("j-1", 600, 90.5)]
    subs = trainjob_submissions(jobs, runtime="torch-distributed", namespace_of_team={"ml-a": "ml-a"},
                                compression=60, run_id="r1")
    assert [(s.job_id, s.at_seconds) for s in subs] == [("j-1", 10.0), ("j-2", 20.0)]
    for sub, seconds in zip(subs, ["1508ms", "10000ms"]):
        tj = sub.trainjob
        parse_trainjob(tj | {"metadata": tj["metadata"] | {"uid": "u"}})   # valid for the API
        assert re.fullmatch(r"[a-z]([-a-z0-9]*[a-z0-9])?", tj["metadata"]["name"]) and len(tj["metadata"]["name"]) <= 40
        # The override reaches the node pods, which KWOK reads.
        pod = resolve(tj | {"metadata": tj["metadata"] | {"uid": "u"}}, RUNTIME).pod_template
        annotations = pod["metadata"]["annotations"]
        # KWOK uses jitter-delay instead of delay when it is not larger: both are the run time.
        assert annotations[COMPLETE + "delay"] == annotations[COMPLETE + "jitter-delay"] == seconds
        for stage in ("pod-create", "pod-ready"):
            assert annotations[f"{stage}.stage.kwok.x-k8s.io/delay"] == "0ms"
            assert annotations[f"{stage}.stage.kwok.x-k8s.io/jitter-delay"] == "0ms"
        assert tj["metadata"]["labels"]["gangctl.io/sim-run"] == "r1"
    requests = subs[1].trainjob["spec"]["trainer"]["resourcesPerNode"]["requests"]
    assert requests == {GPU: "8", "cpu": "48000m", "memory": "393216Mi"}
    assert subs[1].trainjob["spec"]["trainer"]["numNodes"] == 2


# --- the plan ------------------------------------------------------------------------------------

def node(name: str, gpus: int | None, ready: bool = True) -> dict:
    return objects.node(name, labels={}, ready="True" if ready else "False",
                        allocatable={"cpu": "96"} | ({GPU: str(gpus)} if gpus is not None else {}))


def test_pools_are_the_ready_gpu_nodes():
    nodes = [node("a", 8), node("b", 8), node("c", 4), node("cpu", None), node("down", 8, ready=False)]
    pools = gpu_pools(nodes)
    assert sorted((p.nodes, p.gpus_per_node) for p in pools) == [(1, 4), (2, 8)]


def test_plan_models_what_the_real_stack_does():
    sc = load_scenario(ROOT / "simulations/replay-check.yaml")
    policy = load_quota_policy(sc.quota_policy)
    jobs = load_workload(sc, policy).jobs
    pools = [NodePool("g", 4, 8)]                          # 32 GPUs: bigger gangs never fit
    p = plan(sc, policy, jobs, pools, count=100, compression=60)
    assert len(p.jobs) == 100 and all(j.gpus <= 32 for j in p.jobs)
    assert p.left_out == sum(1 for j in jobs if j.gpus > 32 and j.submit <= p.jobs[-1].submit) > 0
    assert p.scenario.backend is Backend.COSCHEDULING and p.scenario.cluster.total_gpus == 32
    assert p.scenario.cluster.packing is Packing.SPREAD     # the local scheduler's default scoring
    assert p.scenario.failures.node_mtbf_hours is None and p.scenario.failures.exit_failure_rate == 0
    assert not p.scenario.workload.elastic.enabled
    assert all(j.priority_class is None for j in p.jobs)
    assert p.sim_jobs[0].submit == 0
    assert p.sim_jobs[5].duration == pytest.approx(p.jobs[5].duration / 60)
    # Quota never binds (the controller has no quota admission yet): everything pending is admitted.
    quotas = p.policy.to_quotas()
    pending = {}
    for j in p.jobs:
        w = Workload(j.id, "ml-a", 0, j.submit, {GPU: j.gpus * 1000})
        pending.setdefault("ml-a", []).append(w)
    pending["ml-a"].sort(key=queue_key)
    assert all(d.verdict is Verdict.ADMIT for d in decide(quotas, {}, pending))
    assert namespaces_of(p.policy) == namespaces_of(policy)


def test_plan_with_quota_admits_by_the_scenarios_policy():
    sc = load_scenario(ROOT / "simulations/replay-check-quota.yaml")
    policy = load_quota_policy(sc.quota_policy)
    jobs = load_workload(sc, policy).jobs
    p = plan(sc, policy, jobs, [NodePool("g", 8, 8)], count=50, compression=60, quota=True)
    assert p.policy is policy and sorted(namespaces_of(p.policy)) == ["eval", "ml-a", "ml-b", "prod"]
    # The policy binds: with the cohort's 64 GPUs in use, eval (nominal 8) waits for 16 more.
    quotas = p.policy.to_quotas()
    usage = {"ml-a": {GPU: 64}}
    pending = {"eval": [Workload("e", "eval", 0, 0.0, {GPU: 16})]}
    assert [d.verdict for d in decide(quotas, usage, pending)] != [Verdict.ADMIT]
    assert [d.verdict for d in decide(quotas, {}, pending)] == [Verdict.ADMIT]


def test_a_replay_on_another_backend_is_simulated_with_it_and_its_runtime_names_it():
    """`sim-check --backend kueue`: the simulation decides with Kueue, and the replayed TrainJobs'
    runtime (a copy of the shipped one) asks each backend for what the local cluster runs."""
    from gangctl.cluster.native import NATIVE_SCHEDULER
    from gangctl.plugins.registry import BACKENDS
    from gangctl.validate.runner import REPLAY_GANG_SETTINGS

    sc = load_scenario(ROOT / "simulations/replay-check-quota.yaml")
    policy = load_quota_policy(sc.quota_policy)
    p = plan(sc, policy, load_workload(sc, policy).jobs, [NodePool("g", 8, 8)], count=20, compression=60,
             quota=True, backend=Backend.KUEUE)
    assert p.scenario.backend is Backend.KUEUE
    # the local Kueue's waitForPodsReady timeout, in the replay's (real) seconds
    kueue_config = yaml.safe_load((ROOT / "integrations/kueue/controller-manager-config.yaml").read_text())
    assert kueue_config["waitForPodsReady"]["timeout"] == "2m"
    assert p.scenario.pods_ready_timeout_seconds == LOCAL_PODS_READY_TIMEOUT_SECONDS == 120
    assert set(REPLAY_GANG_SETTINGS) == set(BACKENDS) - {"coscheduling"}, "the shipped runtime is coscheduling's"
    assert REPLAY_GANG_SETTINGS["native"]["schedulerName"] == NATIVE_SCHEDULER


def test_open_policy_keeps_teams_and_namespaces():
    policy = QuotaPolicy.model_validate({"teams": [{"name": "a", "namespaces": ["x", "y"], "nominal": {"gpu": 1}}]})
    opened = open_policy(policy)
    assert opened.team_of_namespace("y") == "a" and opened.teams[0].nominal.gpu is None


# --- measuring -----------------------------------------------------------------------------------

def stamp(t: float, precise: bool = True) -> str:
    d = datetime.fromtimestamp(t, tz=timezone.utc)
    return d.strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z" if precise else d.strftime("%Y-%m-%dT%H:%M:%SZ")


def trainjob(bound: float | None, done: float | None, kind: str = "Complete") -> dict:
    status: dict = {"conditions": []}
    if bound is not None:
        status["gang"] = {"createdAt": stamp(bound - 1), "boundAt": stamp(bound)}
    if done is not None:
        status["conditions"].append({"type": kind, "status": "True", "lastTransitionTime": stamp(done, precise=False)})
    return objects.trainjob(status=status)


def test_outcomes_from_trainjob_status():
    t0 = 1_700_000_000.0
    o = outcome_of("j", trainjob(t0 + 12.25, t0 + 40), submitted=t0 + 2, seen_finished=t0 + 40.4)
    assert (o.state, o.queue_delay, o.jct) == ("done", pytest.approx(10.25), pytest.approx(38.4))
    fallback = outcome_of("j", trainjob(t0 + 12.25, t0 + 40), submitted=t0 + 2, seen_finished=None)
    assert fallback.jct == pytest.approx(38.0)              # the condition's whole-second time
    failed = outcome_of("j", trainjob(t0 + 3, t0 + 5, "Failed"), submitted=t0, seen_finished=t0 + 5)
    assert failed.state == "failed" and failed.jct is None and failed.queue_delay == pytest.approx(3)
    waiting = outcome_of("j", trainjob(None, None), submitted=t0, seen_finished=None)
    assert waiting.state == "unfinished" and waiting.queue_delay is None
    # a gang a scheduler preempted after it started is stamped again when it runs again: its queueing
    # delay ends at the first boundAt the replay saw, as the simulator's start is its first
    restarted = outcome_of("j", trainjob(t0 + 50, t0 + 60), submitted=t0 + 2, seen_finished=t0 + 60, first_bound=t0 + 3)
    assert restarted.queue_delay == pytest.approx(1.0) and restarted.jct == pytest.approx(58.0)


def test_summary_and_verdict():
    real = summarize([RealOutcome(str(i), 0.0, float(i), 10.0 + i, "done") for i in range(1, 11)])
    assert real["jobs"] == {"done": 10, "failed": 0, "unfinished": 0, "total": 10}
    assert real["queue_delay_seconds"]["mean"] == pytest.approx(5.5)
    assert real["jct_seconds"]["mean"] == pytest.approx(15.5)
    close = {"jct_seconds": {"mean": 15.5 * 1.04, "p50": 1, "p95": 1}, "queue_delay_seconds": {"mean": 5.5 * 0.96, "p50": 0, "p95": 0}}
    far = {"jct_seconds": {"mean": 15.5 * 1.06, "p50": 1, "p95": 1}, "queue_delay_seconds": {"mean": 5.5, "p50": 0, "p95": 0}}
    assert verdict(compare(real, close)) is True
    rows = compare(real, far)
    assert verdict(rows) is False
    assert [r.metric for r in rows if r.checked and not r.ok()] == ["mean JCT (s)"]


def test_latency_is_measured_on_jobs_that_had_nothing_to_wait_for():
    ideal = [JobOutcome("a", "t", 8, 0, 0, 10, "done"), JobOutcome("b", "t", 8, 0, 10, 20, "done"),
             JobOutcome("c", "t", 8, 5, 5, 15, "done")]
    real = [RealOutcome("a", 100.0, 101.0, 112.5, "done"),     # bound 1 s after submit, done 1.5 s after its 10 s
            RealOutcome("b", 100.0, 111.0, 122.0, "done"),     # waited for a: not a bind-latency sample
            RealOutcome("c", 105.0, 106.0, 117.5, "done")]
    lat = measured_latency(real, ideal, {"a": 10, "b": 10, "c": 10})
    assert lat == {"bind_seconds": 1.0, "finish_seconds": 1.5}
    # one gang admitted at a time (Kueue's blockAdmission): c had room, but was admitted after b
    serial = real[:2] + [RealOutcome("c", 105.0, 112.0, 123.5, "done")]
    assert measured_latency(serial, ideal, {"a": 10, "b": 10, "c": 10})["bind_seconds"] == 4.0
    assert measured_latency(serial, ideal, {"a": 10, "b": 10, "c": 10}, serial=True)["bind_seconds"] == 1.0
    assert alone(serial) == {"a"} and alone([RealOutcome("x", 0.0, None, None, "unfinished")]) == {"x"}


def test_per_job_dump_rows_put_real_times_after_the_first_submission_beside_the_simulations():
    sim_jobs = [TraceJob("a", 0, 10, 1, 8), TraceJob("b", 5, 10, 2, 8)]
    real = [RealOutcome("a", 100.0, 100.5, 111.5, "done"), RealOutcome("b", 105.0, 120.0, None, "unfinished")]
    ideal = [JobOutcome("a", "t", 8, 0, 0, 10, "done"), JobOutcome("b", "t", 16, 5, 10, 20, "done")]
    rows = per_job_rows(sim_jobs, real, ideal, ideal)
    assert rows[0]["real"] == {"submit": 0.0, "start": 0.5, "end": 11.5} and rows[0]["pods"] == 1
    assert rows[1]["real"] == {"submit": 5.0, "start": 20.0, "end": None}
    assert rows[1]["ideal"] == rows[1]["model"] == {"start": 10, "end": 20}


# --- the model's expectation over tie draws ---------------------------------------------------------

def test_the_model_is_the_mean_over_the_schedulers_tie_draws_with_their_spread():
    sc = load_scenario(ROOT / "simulations/replay-check.yaml")
    policy = load_quota_policy(sc.quota_policy)
    p = plan(sc, policy, load_workload(sc, policy).jobs, [NodePool("g", 8, 8)], count=60, compression=60)
    runs = [simulate(p.scenario, p.policy, p.sim_jobs, placement_seed=p.scenario.seed + i) for i in range(4)]
    queue = [r.summary["queue_delay_seconds"]["mean"] for r in runs]
    assert len(set(queue)) > 1, "spread's random ties change when whole nodes drain"
    e = expected(p.scenario, p.policy, p.sim_jobs, draws=4)
    assert e.draws == 4
    assert e.summary["queue_delay_seconds"]["mean"] == pytest.approx(sum(queue) / 4)
    low, high = e.bands["queue_delay_seconds"]["mean"]
    assert min(queue) <= low < high <= max(queue)
    starts = {o.id: o.start for o in e.outcomes}
    waited = max(runs[0].outcomes, key=lambda o: o.queue_delay)
    assert starts[waited.id] == pytest.approx(sum(next(o.start for o in r.outcomes if o.id == waited.id)
                                                   for r in runs) / 4)
    assert [[o.start for o in d] for d in e.draw_outcomes] == [[o.start for o in r.outcomes] for r in runs]
    assert e.draw_values["queue_delay_seconds"]["mean"] == queue
    one = expected(p.scenario, p.policy, p.sim_jobs, draws=1)
    assert one.summary["jct_seconds"] == runs[0].summary["jct_seconds"]
    with pytest.raises(ValueError):
        expected(p.scenario, p.policy, p.sim_jobs, draws=0)


def test_oldest_first_counts_the_starts_that_went_to_the_longest_waiting_gang_of_their_shape():
    shapes = {"a": (1, 8), "b": (1, 8), "c": (1, 8), "d": (2, 8), "e": (1, 8)}
    submits = {"a": 0.0, "b": 1.0, "c": 2.0, "d": 0.5, "e": 3.0}
    in_order = {"a": 10.0, "b": 20.0, "c": 30.0, "d": 40.0, "e": 3.5}   # e waited half a second: not counted
    assert oldest_first(shapes, submits, in_order) == {(1, 8): (3, 3), (2, 8): (1, 1)}
    # c jumps the queue while a and b still wait (a 2 x 8 gang is no rival of theirs); a never starts
    jumped = {"a": None, "b": 20.0, "c": 15.0, "d": 40.0, "e": 3.5}
    assert oldest_first(shapes, submits, jumped) == {(1, 8): (0, 2), (2, 8): (1, 1)}
    # gangs bound within half a second of each other are one turn, whichever bound first
    together = {"a": 10.2, "b": 10.0, "c": 30.0, "d": 40.0, "e": 3.5}
    assert oldest_first(shapes, submits, together) == {(1, 8): (3, 3), (2, 8): (1, 1)}


def test_a_real_figure_ranks_by_the_share_of_model_draws_below_it_ties_counting_half():
    draws = [10.0, 20.0, 30.0, 40.0]
    assert rank(5.0, draws) == 0.0 and rank(45.0, draws) == 1.0
    assert rank(25.0, draws) == 0.5
    assert rank(20.0, draws) == pytest.approx(1.5 / 4)
    with pytest.raises(ValueError):
        rank(1.0, [])


def test_rank_bias_is_the_mean_rank_and_its_distance_from_one_half_in_standard_deviations():
    assert rank_bias([0.5, 0.5, 0.5]) == (0.5, 0.0)
    mean, z = rank_bias([1.0, 1.0, 1.0])   # three runs above every draw: sd of the mean is 1/sqrt(36)
    assert mean == 1.0 and z == pytest.approx(3.0)
    mean, z = rank_bias([0.2, 0.3])
    assert mean == pytest.approx(0.25) and z < -1


def test_the_sim_check_table_shows_the_share_of_model_draws_below_each_real_figure(monkeypatch):
    stats = lambda mean, p95: {"mean": mean, "p50": mean, "p95": p95}   # noqa: E731
    result = {"scenario": "s", "jobs": 3, "compression": 60.0, "model_draws": 4,
              "real": {"jobs": {"done": 3}, "jct_seconds": stats(25.0, 45.0), "queue_delay_seconds": stats(5.0, 9.0)},
              "ideal": {"jct_seconds": stats(20.0, 40.0), "queue_delay_seconds": stats(1.0, 2.0)},
              "model": {"jct_seconds": stats(25.0, 40.0), "queue_delay_seconds": stats(4.0, 8.0)},
              "model_draw_values": {"jct_seconds": {"mean": [10.0, 20.0, 30.0, 40.0], "p50": [], "p95": [50.0] * 4},
                                    "queue_delay_seconds": {"mean": [1.0, 2.0, 3.0, 4.0], "p50": [], "p95": [1.0] * 4}},
              "measured_latency": {"bind_seconds": 0.1, "finish_seconds": 1.0, "retry_seconds": 20.0},
              "scheduler_modelled": {"attempt_seconds": 0.0043, "permit_hold_race": 0.48}}
    console = Console(width=250, record=True)
    monkeypatch.setattr(validate_cli, "out", console)
    rows = compare(result["real"], result["model"])
    validate_cli._print(result, rows, 0.05, verdict(rows))
    text = console.export_text()
    lines = {line.split("│")[1].strip(): [c.strip() for c in line.split("│")[2:-1]]
             for line in text.splitlines() if line.count("│") > 3}
    assert lines["mean JCT (s)"][4] == "50%"                  # 2 of 4 draws below 25
    assert lines["p95 JCT (s)"][4] == "0%"                    # every draw above 45
    assert lines["mean queueing delay (s)"][4] == "100%"      # every draw below 5
    assert lines["p50 JCT (s)"][4] == "-"                     # no draws kept for it
    assert "4.3 ms per pod attempt" in text and "48% of the time" in text   # the scheduler's races modelled


def test_in_arrival_order_hands_each_shapes_real_starts_to_its_gangs_first_come_first_served():
    shapes = {"a": (1, 8), "b": (1, 8), "c": (1, 8), "d": (2, 8), "e": (1, 8)}
    submits = {"a": 0.0, "b": 1.0, "c": 2.0, "d": 0.5, "e": 3.0}
    starts = {"a": 30.0, "b": 10.0, "c": 20.0, "d": 40.0, "e": None}   # c and b jumped a; e never started
    assert in_arrival_order(shapes, submits, starts) == {"a": 10.0, "b": 20.0, "c": 30.0, "d": 40.0}
    served = {"a": 10.0, "b": 20.0, "c": 30.0, "d": 40.0}
    assert in_arrival_order(shapes, submits, served) == served


def test_the_replay_refuses_jobs_a_scenario_made_pytorchjobs():
    from dataclasses import replace

    from gangctl.sim.replay import trainjob_submissions
    from gangctl.sim.traces import TraceJob

    jobs = [TraceJob("a", 0, 10, 1, 8, group="t"), replace(TraceJob("b", 1, 10, 1, 8, group="t"), kind="PyTorchJob")]
    with pytest.raises(ValueError, match="job b is a PyTorchJob"):
        trainjob_submissions(jobs, runtime="torch-kwok-gpu", namespace_of_team={"t": "t"})
    assert len(trainjob_submissions(jobs[:1], runtime="torch-kwok-gpu", namespace_of_team={"t": "t"})) == 1
