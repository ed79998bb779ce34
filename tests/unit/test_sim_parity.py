"""Parity: the simulator and the controller make the same decisions for the same inputs.

The controller's pure path for a TrainJob is the reconciler's: `resolve(trainjob, runtime)` →
`size_gang(...)` → the coscheduling backend's PodGroup. The simulator's is `engine.gang_of(job)`.
Each scenario job goes through both (the TrainJob made by `gangctl.sim.replay`, against the
shipped runtime), and

1. the gangs agree: PodGroup minMember and minResources equal the simulator's gang, to the unit,
   and the Job runs the simulator's gang size;
2. quota admission agrees: every time the engine calls `admission.decide`, the same call on
   Workloads derived from the controller's PodGroups (`quota.podgroup_workload`, amounts in
   Kubernetes units: cores and bytes) admits, preempts and explains exactly the same.
"""
from __future__ import annotations

import copy
from datetime import datetime, timedelta, timezone
from fractions import Fraction
from pathlib import Path

import pytest
import yaml

from gangctl.api.quantity import parse_quantity
from gangctl.api.trainjob import parse_trainjob
from gangctl.plugins.names import TRAINJOB_NAME
from gangctl.plugins.registry import backend_for
from gangctl.plugins.workload import node_job, owner_reference
from gangctl.policy import admission
from gangctl.policy.admission import CPU, GPU, MEMORY, Verdict, Workload, usage_of
from gangctl.policy.gang import size_gang
from gangctl.policy.quota import QUANTITY_UNITS, QuotaPolicy, podgroup_workload
from gangctl.policy.decide import Snapshot, decide
from gangctl.policy.resolve import resolve
from gangctl.policy.status import timestamp
from gangctl.sim import engine
from gangctl.sim.engine import SIM_UNITS, Simulation, elastic_floor, gang_of
from gangctl.sim.model import Cluster
from gangctl.sim.replay import trainjob_submissions
from gangctl.sim.scenario import Backend, ElasticSpec, Scenario, load_quota_policy, load_scenario, load_workload
from gangctl.sim.sweep import _scaled_policy
from gangctl.sim.traces import TraceJob

ROOT = Path(__file__).resolve().parents[2]
RUNTIME = yaml.safe_load((ROOT / "deploy/runtimes/torch-distributed.yaml").read_text())
# Kubernetes units (GPUs, cores, bytes) -> the simulator's (GPUs, millicores, MiB).
TO_SIM = {GPU: Fraction(1), CPU: Fraction(1000), MEMORY: Fraction(1, 2**20)}


def load(name: str, max_jobs: int | None = None) -> tuple[Scenario, QuotaPolicy, list[TraceJob]]:
    sc = load_scenario(ROOT / "simulations" / name)
    if max_jobs:
        sc.workload.max_jobs = max_jobs
    policy = load_quota_policy(sc.quota_policy)
    return sc, policy, load_workload(sc, policy).jobs


def namespaces(policy: QuotaPolicy) -> dict[str, str]:
    return {t.name: (t.namespaces or [t.name])[0] for t in policy.teams}


def elastic_runtime(runtime: dict, min_nodes: int, max_nodes: int) -> dict:
    """The runtime with gangctl's elasticPolicy extension (how a TrainJob becomes elastic)."""
    r = copy.deepcopy(runtime)
    r["spec"]["mlPolicy"].setdefault("torch", {})["elasticPolicy"] = {"minNodes": min_nodes, "maxNodes": max_nodes}
    return r


class Controller:
    """The controller's pure decisions for each scenario job, keyed by the simulator's job id."""

    def __init__(self, jobs: list[TraceJob], policy: QuotaPolicy, elastic: ElasticSpec):
        self.policy = policy
        self.pod_groups: dict[str, dict] = {}
        self.node_jobs: dict[str, dict] = {}
        self.priority_class: dict[str, str | None] = {}
        self.id_of: dict[str, str] = {}          # controller workload id -> sim job id
        by_id = {j.id: j for j in jobs}
        for i, sub in enumerate(trainjob_submissions(jobs, runtime="torch-distributed",
                                                     namespace_of_team=namespaces(policy), compression=60)):
            spec = by_id[sub.job_id]
            trainjob = copy.deepcopy(sub.trainjob)
            trainjob["metadata"]["uid"] = f"uid-{i}"
            parse_trainjob(trainjob)   # what the API server and the reconciler accept
            floor = elastic_floor(spec, elastic)
            runtime = RUNTIME if floor is None else elastic_runtime(RUNTIME, floor, spec.num_nodes)
            # The reconciler's calls (gangctl/runtime/reconciler.py), in its order.
            job = resolve(trainjob, runtime)
            backend = backend_for(job.gang_backend)
            gang = size_gang(job.num_nodes, job.requests, min_nodes=job.min_nodes,
                             schedule_timeout_seconds=job.gang_settings.get("scheduleTimeoutSeconds"))
            owner = owner_reference(trainjob)
            self.pod_groups[spec.id] = backend.group(job, gang, owner)
            self.node_jobs[spec.id] = node_job(job, owner, backend, "default-scheduler")
            self.priority_class[spec.id] = job.pod_template["spec"].get("priorityClassName")
            meta = trainjob["metadata"]
            self.id_of[f"{meta['namespace']}/{meta['name']}"] = spec.id

    def workload(self, sim_job_id: str, created: float, pods: int | None = None) -> Workload:
        """The PodGroup's workload; with `pods`, holding that many pods (an admitted elastic gang)."""
        pg = self.pod_groups[sim_job_id]
        w = podgroup_workload(self.policy, pg, created=created, priority_class=self.priority_class[sim_job_id])
        if pods is None:
            return w
        per_pod = {r: a / pg["spec"]["minMember"] for r, a in w.requests.items()}
        return Workload(w.id, w.team, w.priority, w.created, {r: a * pods for r, a in per_pod.items()})


def in_sim_units(amounts: dict[str, str]) -> dict[str, Fraction]:
    return {r: parse_quantity(q) * TO_SIM[r] for r, q in amounts.items()}


CASES = [("pai-small.yaml", None, False), ("pai-small.yaml", None, True),
         ("helios-elastic.yaml", None, True), ("pai-generated.yaml", 600, False)]


@pytest.mark.parametrize("name,max_jobs,elastic", CASES)
def test_same_gang_for_every_job(name, max_jobs, elastic):
    sc, policy, jobs = load(name, max_jobs)
    spec = ElasticSpec(enabled=elastic, min_fraction=0.5)
    controller = Controller(jobs, policy, spec)
    elastic_jobs = 0
    for job in jobs:
        gang = gang_of(job, spec)
        pg = controller.pod_groups[job.id]["spec"]
        assert pg["minMember"] == gang.min_member, job
        assert in_sim_units(pg["minResources"]) == gang.min_resources, job
        assert pg["scheduleTimeoutSeconds"] == RUNTIME["spec"]["podGroupPolicy"]["coscheduling"]["scheduleTimeoutSeconds"]
        child = controller.node_jobs[job.id]["spec"]
        assert child["parallelism"] == child["completions"] == gang.size == job.num_nodes
        elastic_jobs += gang.min_member < gang.size
    assert (elastic_jobs > 0) == elastic, "the elastic cases exercise elastic gangs"


def _decisions(decisions: list, id_of=lambda i: i) -> list[tuple]:  # noqa: E731
    """Comparable decisions; a preemption's reason lists victim ids, compared through `victims`."""
    return [(id_of(d.workload.id), d.verdict, tuple(id_of(v.id) for v in d.victims), d.borrows,
             "" if d.verdict is Verdict.PREEMPT else d.reason) for d in decisions]


@pytest.mark.parametrize("name,max_jobs,backend,quota", [
    ("pai-small.yaml", None, Backend.KUEUE, 0.25),
    ("pai-generated.yaml", 300, Backend.COSCHEDULING, 0.25),
    ("pai-generated.yaml", 300, Backend.KUEUE, 0.5),
])
def test_same_admission_decisions_at_every_event(monkeypatch, name, max_jobs, backend, quota):
    sc, policy, jobs = load(name, max_jobs)
    policy = _scaled_policy(policy, quota)          # make quota bind, so there is something to decide
    controller = Controller(jobs, policy, sc.workload.elastic)
    controller_quotas = policy.to_quotas(QUANTITY_UNITS)
    cluster = Cluster(sc.cluster.node_pools(), sc.cluster.packing, sc.cluster.same_zone)
    sim = Simulation(jobs, policy, cluster, backend=backend, failures=sc.failures, elastic=sc.workload.elastic,
                     seed=sc.seed, pods_ready_timeout_seconds=sc.pods_ready_timeout_seconds)
    real_decide = admission.decide
    seen = {"calls": 0, "admit": 0, "preempt": 0, "wait": 0}

    def controller_inputs(pending, admitted):
        pending_c = {}
        for team, queue in pending.items():
            pending_c[team] = []
            for w in queue:
                c = controller.workload(w.id, w.created)
                assert (c.team, c.priority) == (w.team, w.priority), w.id
                pending_c[team].append(c)
        admitted_c = {}
        for team, workloads in sim.admitted.items():
            admitted_c[team] = []
            for w in workloads.values():
                pods = sim.by_id[w.id].held_pods
                c = controller.workload(w.id, w.created, pods)
                assert {r: a * TO_SIM[r] for r, a in c.requests.items()} == dict(w.requests), w.id
                admitted_c[team].append(c)
        usage_c = usage_of(w for ws in admitted_c.values() for w in ws)
        return pending_c, (admitted_c if admitted is not None else None), usage_c

    def spy(quotas, usage, pending, admitted=None, gate=None, *, waits=True):
        assert gate is None
        result = real_decide(quotas, usage, pending, admitted, gate, waits=waits)
        pending_c, admitted_c, usage_c = controller_inputs(pending, admitted)
        # The engine's own books agree with the admitted workloads it holds.
        # Compared over both sides' teams: keyed by `usage` alone, a team missing from it went unchecked.
        nonzero = lambda u: {t: n for t, amounts in u.items() if (n := {r: a for r, a in amounts.items() if a})}  # noqa: E731
        held = usage_of(w for ws in sim.admitted.values() for w in ws.values())
        assert nonzero(usage) == nonzero(held)
        ours = real_decide(controller_quotas, usage_c, pending_c, admitted_c, None, waits=waits)
        assert _decisions(ours, controller.id_of.__getitem__) == _decisions(result)
        # And with every WAIT and its reason (what `kubectl describe` would show).
        full_sim = real_decide(quotas, usage, pending, admitted, None, waits=True)
        full_ctl = real_decide(controller_quotas, usage_c, pending_c, admitted_c, None, waits=True)
        assert _decisions(full_ctl, controller.id_of.__getitem__) == _decisions(full_sim)
        seen["calls"] += 1
        for d in full_sim:
            seen[d.verdict.value] += 1
        return result

    monkeypatch.setattr(engine, "decide", spy)
    sim.run()
    # The run exercised every kind of decision (the example policy allows preemption).
    assert seen["calls"] > 100 and seen["admit"] > 100 and seen["wait"] > 100 and seen["preempt"] > 0, seen


# --- failures and elastic sizing: the reconciler's `decide` against the engine's -------------------
# The controller's side goes through `gangctl.policy.decide.decide` on snapshots of the scenario job's
# TrainJob (as `gangctl.sim.replay` submits it) with a failed or shrinking child Job; the simulator's
# side through the engine's own calls (`engine.judge_failure`, `size_after_loss`, `may_grow`) and, for
# the restart budget, a whole run in which every run exits non-zero.
NOW = datetime(2026, 1, 1, tzinfo=timezone.utc)
SAMPLE = 25   # scenario jobs per case (each decided many times)


def _snapshot(trainjob: dict, runtime: dict, child: dict, pods: list[dict]) -> Snapshot:
    key = f"{trainjob['metadata']['namespace']}/{trainjob['metadata']['name']}"
    return Snapshot(key, NOW, trainjob, runtime=runtime, node_job=child, pods=tuple(pods),
                    groups={"coscheduling": None})


def _child(trainjob: dict, uid: str, parallelism: int, failed: bool = False) -> dict:
    meta = trainjob["metadata"]
    conds = [{"type": "Failed", "status": "True", "reason": "BackoffLimitExceeded"}] if failed else []
    return {"metadata": {"name": f"{meta['name']}-node-0", "namespace": meta["namespace"], "uid": uid,
                         "labels": {TRAINJOB_NAME: meta["name"]}},
            "spec": {"parallelism": parallelism}, "status": {"conditions": conds}}


def _pod(child: dict, index: int, *, phase: str = "Running", disrupted: bool = False, exit_code: int | None = None):
    meta = child["metadata"]
    status: dict = {"phase": phase, "conditions": [{"type": "DisruptionTarget", "status": "True",
                                                    "reason": "DeletionByPodGC"}] if disrupted else []}
    if exit_code is not None:
        status["containerStatuses"] = [{"name": "node", "state": {"terminated": {"exitCode": exit_code}}}]
    return {"metadata": {"name": f"{meta['name']}-{index}", "namespace": meta["namespace"],
                         "labels": dict(meta["labels"]), "ownerReferences": [{"uid": meta["uid"]}],
                         "annotations": {"batch.kubernetes.io/job-completion-index": str(index)}},
            "spec": {"nodeName": f"n{index}"}, "status": status}


def _scenario_jobs(name: str, max_jobs: int | None, elastic: bool, multi_node: bool = False):
    """(scenario, sim job, its gang, the TrainJob, its runtime) for the first SAMPLE jobs of a
    scenario (with `multi_node`, of its jobs on more than one node: the ones that can be elastic)."""
    sc, policy, jobs = load(name, max_jobs)
    spec = ElasticSpec(enabled=elastic, min_fraction=0.5)
    by_id = {j.id: j for j in jobs}
    subs = [s for s in trainjob_submissions(jobs, runtime="torch-distributed", namespace_of_team=namespaces(policy))
            if not multi_node or by_id[s.job_id].num_nodes > 1]
    for i, sub in enumerate(subs[:SAMPLE]):
        job = by_id[sub.job_id]
        trainjob = copy.deepcopy(sub.trainjob)
        trainjob["metadata"]["uid"] = f"uid-{i}"
        floor = elastic_floor(job, spec)
        runtime = copy.deepcopy(RUNTIME if floor is None else elastic_runtime(RUNTIME, floor, job.num_nodes))
        runtime["spec"]["template"]["spec"]["failurePolicy"] = {"maxRestarts": sc.failures.restart_budget}
        yield sc, job, gang_of(job, spec), trainjob, runtime


@pytest.mark.parametrize("name,max_jobs,elastic", CASES)
def test_same_restart_budget_decisions(name, max_jobs, elastic):
    checked = 0
    for sc, job, gang, trainjob, runtime in _scenario_jobs(name, max_jobs, elastic):
        budget, status, attempts = sc.failures.restart_budget, {}, []
        for n in range(budget + 2):
            child = _child(trainjob, f"job-{n}", gang.size, failed=True)
            pods = [_pod(child, 0, phase="Failed", exit_code=1)]
            plan = decide(_snapshot({**trainjob, "status": status}, runtime, child, pods))
            status = plan.status
            failed = any(c["type"] == "Failed" and c["status"] == "True" for c in status.get("conditions") or [])
            controller = "Fail" if failed else "Restart"
            assert engine.judge_failure(engine.EXIT_FAILURE, n, budget).action == controller, (job.id, n)
            attempts.append(controller)
            if failed:
                break
        assert attempts == ["Restart"] * budget + ["Fail"], (job.id, attempts)
        assert status["restarts"]["user"] == budget
        # A lost node is never charged, whatever was used already (the controller's rule, and the engine's).
        assert engine.judge_failure(engine.NODE_LOST, budget, budget).action == "Restart"
        checked += 1
    assert checked == SAMPLE


@pytest.mark.parametrize("name,max_jobs", [("pai-small.yaml", 40), ("helios-elastic.yaml", 40)])
def test_every_exit_failure_uses_the_same_budget_in_a_whole_run(name, max_jobs):
    """The engine end to end: every run exits non-zero, so every job fails after the budget the
    controller's `decide` allowed (budget restarts, then Failed) and no job completes."""
    sc, policy, jobs = load(name, max_jobs)
    failures = sc.failures.model_copy(update={"exit_failure_rate": 1.0, "node_mtbf_hours": None})
    cluster = Cluster(sc.cluster.node_pools(), sc.cluster.packing, sc.cluster.same_zone)
    result = Simulation(jobs, policy, cluster, backend=sc.backend, failures=failures, elastic=sc.workload.elastic,
                        seed=sc.seed).run()
    ran = [o for o in result.outcomes if o.state != "rejected"]
    assert ran and all(o.state == "failed" for o in ran)
    assert {o.user_restarts for o in ran} == {failures.restart_budget + 1}, "budget restarts, then the final failure"


@pytest.mark.parametrize("name,max_jobs", [("pai-small.yaml", None), ("helios-elastic.yaml", None)])
def test_same_elastic_shrink_and_grow_sizes(name, max_jobs):
    elastic_jobs, seen = 0, set()
    for _, job, gang, trainjob, runtime in _scenario_jobs(name, max_jobs, True, multi_node=True):
        if gang.min_member == gang.size:
            continue
        elastic_jobs += 1
        size = gang.size
        for lost in range(1, size + 1):
            child = _child(trainjob, "job-1", size)
            pods = [_pod(child, i, disrupted=i >= size - lost) for i in range(size)]
            plan = decide(_snapshot(trainjob, runtime, child, pods))
            controller = plan.status["elastic"]["size"]
            sim = engine.size_after_loss(gang, size, lost, 0.0, None)
            # The engine keeps running at the controller's size; where the controller can only shrink
            # to minNodes and waits there for the lost indexes' replacements, the engine restarts the
            # gang at minNodes (it does not track indexes).
            assert (sim if sim is not None else gang.min_member) == controller, (job.id, size, lost)
            seen.add("shrink" if sim is not None else "restart")
        for pods_now in range(gang.min_member, gang.size):
            for shrunk_ago in (None, 5.0, 600.0):
                child = _child(trainjob, "job-1", pods_now)
                status = {"elastic": {"currentNodes": pods_now, "size": pods_now, "minNodes": gang.min_member,
                                      "maxNodes": gang.size}}
                if shrunk_ago is not None:
                    status["elastic"]["lastShrinkTime"] = timestamp(NOW - timedelta(seconds=shrunk_ago))
                plan = decide(_snapshot({**trainjob, "status": status}, runtime, child,
                                        [_pod(child, i) for i in range(pods_now)]))
                grows = plan.status["elastic"]["size"] == pods_now + 1
                now = 10_000.0
                sim = engine.may_grow(gang, pods_now, now, None if shrunk_ago is None else now - shrunk_ago)
                assert sim == grows, (job.id, pods_now, shrunk_ago)
                seen.add("grow" if grows else "hold")
    assert elastic_jobs > 0 and seen == {"shrink", "restart", "grow", "hold"}, seen
