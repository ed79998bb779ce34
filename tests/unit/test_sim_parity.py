"""Parity: the simulator and the controller make the same decisions for the same inputs.

The simulator asks the controller's decision of the job's kind through `gangctl.sim.controller` (a
simulated observe and apply), with the scenario's backend. Each scenario job goes through it and
through the reconciler's own calls one by one (`resolve(trainjob, runtime)` → `size_gang(...)` → the
backend's group and node Job, on the TrainJob made by `gangctl.sim.replay` against the shipped
runtime; for a PyTorchJob `to_gang` → the backend's group and the Worker pods), and

1. the gangs agree under every backend: the floor as the backend's own object says it, one pod's
   requests and the Job's size equal the simulator's gang, to the unit (and for coscheduling the
   PodGroup's minMember, minResources and scheduleTimeoutSeconds);
2. quota admission agrees: every time the engine calls `admission.decide`, the same call on
   Workloads derived from the controller's coscheduling PodGroups (`quota.podgroup_workload`,
   amounts in Kubernetes units: cores and bytes) admits, preempts and explains exactly the same;
3. in whole runs under every backend, with failures, node losses, elastic gangs and PyTorchJobs,
   every plan the decision returned is one the engine acted on (restart budget, uncharged node
   losses, shrink sizes, growth probes), and memoizing plans by job shape changes no outcome.
"""

from __future__ import annotations

import copy
from dataclasses import replace
from fractions import Fraction
from pathlib import Path

import pytest

from gangctl.api.quantity import parse_quantity
from gangctl.api.trainjob import parse_trainjob
from gangctl.api.pytorchjob import KIND as PYTORCHJOB_KIND
from gangctl.plugins.base import resizes_jobs, wants_group
from gangctl.plugins.registry import backend_for
from gangctl.plugins.workload import node_job, owner_reference
from gangctl.model import admission
from gangctl.model.admission import CPU, GPU, MEMORY, Verdict, Workload, usage_of
from gangctl.model.gang import size_gang
from gangctl.model.quota import QUANTITY_UNITS, QuotaPolicy, podgroup_workload
from gangctl.policy import pytorchjob
from gangctl.policy.decide import Patch, Snapshot, decide
from gangctl.policy.decide_pytorchjob import ELASTIC_ANNOTATION, gang_group, replica_pod
from gangctl.model.resolve import pod_requests, resolve
from gangctl.sim import engine
from gangctl.sim.controller import SimController, elastic_floor, pytorchjob_manifest, runtime_for
from gangctl.sim.engine import Simulation
from gangctl.sim.model import Cluster
from gangctl.sim import objects
from gangctl.sim.replay import RUNTIME as REPLAY_RUNTIME
from gangctl.sim.replay import trainjob_submissions
from gangctl.sim.scenario import (Backend, ElasticSpec, Scenario, drawn, load_quota_policy, load_scenario,
                                  load_workload)
from gangctl.sim.sweep import _scaled_policy
from gangctl.sim.traces import TraceJob

ROOT = Path(__file__).resolve().parents[2]
RUNTIME = objects.runtime(REPLAY_RUNTIME)
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


class Controller:
    """The controller's pure decisions for each scenario job, keyed by the simulator's job id."""

    def __init__(self, jobs: list[TraceJob], policy: QuotaPolicy, elastic: ElasticSpec, backend_name: str):
        self.policy = policy
        self.pod_groups: dict[str, dict] = {}
        self.node_jobs: dict[str, dict] = {}
        self.priority_class: dict[str, str | None] = {}
        self.requests: dict[str, dict] = {}      # one pod's requests, as resolved
        self.id_of: dict[str, str] = {}          # controller workload id -> sim job id
        by_id = {j.id: j for j in jobs}
        for i, sub in enumerate(trainjob_submissions(jobs, runtime="torch-kwok-gpu",
                                                     namespace_of_team=namespaces(policy), compression=60)):
            spec = by_id[sub.job_id]
            trainjob = copy.deepcopy(sub.trainjob)
            trainjob["metadata"]["uid"] = f"uid-{i}"
            parse_trainjob(trainjob)   # what the API server and the reconciler accept
            floor = elastic_floor(spec, elastic)
            runtime = runtime_for(floor, spec.num_nodes, restart_budget=3, backend=backend_name)
            # The reconciler's calls (gangctl/runtime/reconciler.py), in its order.
            job = resolve(trainjob, runtime)
            backend = backend_for(job.gang_backend)
            gang = size_gang(job.num_nodes, job.requests, min_nodes=job.min_nodes,
                             schedule_timeout_seconds=job.gang_settings.get("scheduleTimeoutSeconds"))
            owner = owner_reference(trainjob)
            self.pod_groups[spec.id] = backend.group(job, gang, owner)
            self.node_jobs[spec.id] = node_job(job, owner, backend, "default-scheduler", gang=gang)
            self.priority_class[spec.id] = job.pod_template["spec"].get("priorityClassName")
            self.requests[spec.id] = dict(job.requests)
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


@pytest.mark.parametrize("backend", [b.value for b in Backend])
@pytest.mark.parametrize("name,max_jobs,elastic", CASES)
def test_same_gang_for_every_job(name, max_jobs, elastic, backend):
    """Under every backend the simulator's gang is the one the reconciler's calls make: its floor as
    that backend's own object says it, one pod's requests, and the Job's size."""
    sc, policy, jobs = load(name, max_jobs)
    spec = ElasticSpec(enabled=elastic, min_fraction=0.5)
    controller = Controller(jobs, policy, spec, backend)
    sim = SimController(spec, restart_budget=3, backend=backend)
    declared = backend_for(backend)
    elastic_jobs = 0
    for job in jobs:
        gang = sim.gang(job)
        pg, child = controller.pod_groups[job.id], controller.node_jobs[job.id]
        assert declared.gang_floor(pg, child) == gang.min_member, job
        assert {r: a * TO_SIM[r] for r, a in controller.requests[job.id].items()} == gang.per_pod, job
        if "minResources" in (pg or {}).get("spec", {}):   # coscheduling, volcano
            assert in_sim_units(pg["spec"]["minResources"]) == gang.min_resources, job
        if backend == Backend.COSCHEDULING.value:
            assert pg["spec"]["minMember"] == gang.min_member, job
            assert pg["spec"]["scheduleTimeoutSeconds"] == RUNTIME["spec"]["podGroupPolicy"]["coscheduling"]["scheduleTimeoutSeconds"]
        child = child["spec"]
        assert child["parallelism"] == gang.size == job.num_nodes
        # an elastic Job's completions are a pool of indexes (each tried once), a rigid one's its size
        assert child["completions"] == (1_000 if "backoffLimitPerIndex" in child else child["parallelism"]), job
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
    # The quota gate's workloads are read from coscheduling PodGroups (podgroup_workload).
    controller = Controller(jobs, policy, sc.workload.elastic, Backend.COSCHEDULING.value)
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

    def spy(quotas, usage, pending, admitted=None, gate=None, *, waits=True, first=False):
        assert gate is None
        result = real_decide(quotas, usage, pending, admitted, gate, waits=waits, first=first)
        pending_c, admitted_c, usage_c = controller_inputs(pending, admitted)
        # The engine's own books agree with the admitted workloads it holds.
        # Compared over both sides' teams: keyed by `usage` alone, a team missing from it went unchecked.
        nonzero = lambda u: {t: n for t, amounts in u.items() if (n := {r: a for r, a in amounts.items() if a})}  # noqa: E731
        held = usage_of(w for ws in sim.admitted.values() for w in ws.values())
        assert nonzero(usage) == nonzero(held)
        ours = real_decide(controller_quotas, usage_c, pending_c, admitted_c, None, waits=waits, first=first)
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


# --- whole runs: every decision is the controller's `decide`, and the engine acts on each plan ----
def _recording(elastic: ElasticSpec, budget: int, backend: Backend, *, memo: bool = True):
    seen: list[tuple[str, Snapshot, object]] = []
    controller = SimController(elastic, budget, backend=backend.value, memo=memo,
                               on_plan=lambda what, snap, plan: seen.append((what, snap, plan)))
    return controller, seen


def _on(sc: Scenario, backend: Backend) -> Scenario:
    """The scenario under `backend` instead of its own."""
    return sc.model_copy(update={"backend": backend})


def _run(sc: Scenario, policy: QuotaPolicy, jobs: list[TraceJob], failures, controller: SimController):
    cluster = Cluster(sc.cluster.node_pools(), sc.cluster.packing, sc.cluster.same_zone)
    return Simulation(jobs, policy, cluster, backend=sc.backend, failures=failures, elastic=sc.workload.elastic,
                      seed=sc.seed, controller=controller).run()


@pytest.mark.parametrize("backend", list(Backend))
@pytest.mark.parametrize("name,max_jobs", [("pai-small.yaml", 40), ("helios-elastic.yaml", 40)])
def test_every_exit_failure_uses_the_budget_decide_allows(name, max_jobs, backend):
    """Every run exits non-zero: the controller's plans restart each job `budget` times, then fail it;
    the engine does exactly that, and no job completes."""
    sc, policy, jobs = load(name, max_jobs)
    sc = _on(sc, backend)
    failures = sc.failures.model_copy(update={"exit_failure_rate": 1.0, "node_mtbf_hours": None})
    controller, seen = _recording(sc.workload.elastic, failures.restart_budget, backend)
    result = _run(sc, policy, jobs, failures, controller)
    ran = [o for o in result.outcomes if o.state != "rejected"]
    assert ran and all(o.state == "failed" for o in ran)
    assert {o.user_restarts for o in ran} == {failures.restart_budget + 1}, "budget restarts, then the final failure"
    # The plans behind it: Restarting while the budget lasts (the judgement in status first, then the
    # attempt deleted), then Failed with the gang released; each TrainJob valid to the API.
    verdicts = {}
    for what, snap, plan in seen:
        parse_trainjob(snap.job)
        if what != "exit":
            continue
        used = snap.job["status"]["restarts"]["user"]
        state = plan.status["gang"]["state"]
        verdicts[used] = state
        if state == "Restarting":
            names = [type(s).__name__ for s in plan.steps]
            assert names[0] == "WriteStatus" and names[-1] == "Delete" and "Event" in names, names
            assert plan.status["restarts"]["user"] == used + 1
        else:
            assert state == "Failed" and plan.status["restarts"]["user"] == used
            assert any(c["type"] == "Failed" and c["status"] == "True" for c in plan.status["conditions"])
    assert verdicts == {**{n: "Restarting" for n in range(failures.restart_budget)},
                        failures.restart_budget: "Failed"}


@pytest.mark.parametrize("backend", list(Backend))
def test_lost_nodes_are_never_charged_and_elastic_jobs_shrink_to_the_size_decide_plans(backend):
    """Node failures only, on elastic gangs: every job completes; a gang that lost a node either
    shrank to the size the controller's plan gives it or restarted uncharged."""
    sc, policy, jobs = load("helios-elastic.yaml")
    sc = _on(sc, backend)
    failures = sc.failures.model_copy(update={"exit_failure_rate": 0.0, "node_mtbf_hours": 20})
    controller, seen = _recording(sc.workload.elastic, failures.restart_budget, backend)
    # Kueue's admission owns the Job; Kubernetes refuses to resize a native gang's Job
    keeps_size = not resizes_jobs(backend_for(backend.value))
    result = _run(sc, policy, jobs, failures, controller)
    assert result.summary["failures"]["node_failures"] > 10
    ran = [o for o in result.outcomes if o.state != "rejected"]
    assert ran and all(o.state == "done" and o.user_restarts == 0 for o in ran)
    kinds: dict[str, set] = {"shrink": set(), "loss": set(), "grow": set()}
    for what, snap, plan in seen:
        if what == "shrink":
            pods = snap.node_job["spec"]["parallelism"]
            lost = sum(1 for p in snap.pods if any(c["type"] == "DisruptionTarget" for c in p["status"]["conditions"]))
            size, floor = plan.status["elastic"]["size"], plan.status["elastic"]["minNodes"]
            resized = [s for s in plan.steps if type(s).__name__ == "Event" and s.reason == "Resized"]
            if keeps_size:                # gangctl never resizes the Job
                assert not resized and size == pods, (pods, lost, size)
                kinds["shrink"].add("kept its size")
            elif size == pods - lost:     # the survivors go on: the engine runs them
                assert resized and f"shrink {pods} -> {size}" in resized[0].message
                kinds["shrink"].add("kept running")
            else:                         # never below minNodes: the lost indexes wait for a node
                assert size == max(floor, pods - lost) and size > pods - lost, (pods, lost, size)
                kinds["shrink"].add("waits at minNodes")
        elif what == "loss":
            assert plan.status["gang"]["state"] == "Restarting"
            assert plan.status["restarts"]["infrastructure"] == snap.job["status"]["restarts"]["infrastructure"] + 1
            assert plan.status["restarts"]["user"] == 0
            kinds["loss"].add("restarted")
        elif what == "grow":
            kinds["grow"].add(plan.status["elastic"]["size"] - snap.node_job["spec"]["parallelism"])
    if keeps_size:   # every loss restarts the gang, and it never grows past its size
        assert kinds == {"shrink": {"kept its size"}, "loss": {"restarted"}, "grow": {0}}, kinds
    else:
        assert kinds == {"shrink": {"kept running", "waits at minNodes"}, "loss": {"restarted"}, "grow": {0, 1}}, kinds


@pytest.mark.parametrize("backend", list(Backend))
@pytest.mark.parametrize("name,elastic", [("pai-small.yaml", False), ("helios-elastic.yaml", True)])
def test_memoized_plans_are_exactly_the_plans_asked_every_time(name, elastic, backend):
    """decide is pure: the simulator asks it once per job shape and situation. The same run asking
    every time gives the same outcome for every job, with far fewer calls memoized."""
    sc, policy, jobs = load(name)
    failures = sc.failures.model_copy(update={"exit_failure_rate": 0.2, "node_mtbf_hours": 50})
    spec = ElasticSpec(enabled=elastic, min_fraction=0.5)
    sc = _on(sc, backend).model_copy(update={"workload": sc.workload.model_copy(update={"elastic": spec})})
    memo, _ = _recording(spec, failures.restart_budget, backend)
    every, _ = _recording(spec, failures.restart_budget, backend, memo=False)
    a, b = _run(sc, policy, jobs, failures, memo), _run(sc, policy, jobs, failures, every)
    assert a.outcomes == b.outcomes and a.summary == b.summary
    assert sum(o.user_restarts for o in a.outcomes) > 0
    assert memo.calls < every.calls / 2, (memo.calls, every.calls)


# --- PyTorchJobs: the same checks through the PyTorchJob decision ----------------------------------
def _with_pytorchjobs(jobs: list[TraceJob], share: float = 0.5) -> list[TraceJob]:
    return [replace(j, kind=PYTORCHJOB_KIND) if drawn(j.id, share) else j for j in jobs]


@pytest.mark.parametrize("backend", [b.value for b in Backend])
@pytest.mark.parametrize("name,max_jobs,elastic", [("pai-generated.yaml", 300, False), ("helios-elastic.yaml", None, True)])
def test_same_gang_for_every_pytorchjob(name, max_jobs, elastic, backend):
    """A PyTorchJob's gang in the simulator is the one the reconciler's PyTorchJob calls make
    (`to_gang` → the backend's group and the Worker pods): floor, size and one pod's requests."""
    sc, policy, jobs = load(name, max_jobs)
    jobs = [replace(j, kind=PYTORCHJOB_KIND) for j in jobs]
    spec = ElasticSpec(enabled=elastic, min_fraction=0.5)
    sim = SimController(spec, restart_budget=3, backend=backend)
    declared = backend_for(backend)
    elastic_jobs = 0
    for i, job in enumerate(jobs):
        gang = sim.gang(job)
        manifest = pytorchjob_manifest(job, 3, elastic_floor(job, spec), backend)
        manifest["metadata"]["uid"] = f"uid-{i}"
        ours = pytorchjob.to_gang(manifest, default_backend=backend)
        owner = owner_reference(manifest)
        group = gang_group(ours, declared, owner) if wants_group(declared) else None
        pods = [replica_pod(ours.groups[0], i, owner, declared, "default-scheduler")
                for i in range(ours.groups[0].job.num_nodes)]
        assert (ours.gang_backend, ours.size, len(pods)) == (backend, gang.size, gang.size), job
        # Kueue's Workload of the PyTorchJob holds its replicas whole: its floor is their number
        assert declared.gang_floor(group, {"metadata": {}, "spec": {"parallelism": len(pods)}}) == gang.min_member, job
        # the gang object carries gangctl's floor; Kueue admits the PyTorchJob's replicas whole
        assert gang.min_member == (ours.min_member if group is not None else ours.size), job
        assert {r: a * TO_SIM[r] for r, a in ours.groups[0].job.requests.items()} == gang.per_pod, job
        assert pod_requests(pods[0]["spec"]) == ours.groups[0].job.requests, job
        assert gang.size == job.num_nodes
        elastic_jobs += ours.min_member < ours.size
    assert (elastic_jobs > 0) == elastic, "the elastic case exercises elastic gangs"


@pytest.mark.parametrize("backend", list(Backend))
def test_elastic_pytorchjobs_shrink_and_grow_as_their_decision_plans(backend):
    """Node failures on elastic PyTorchJobs: every job completes uncharged; a resize is the
    annotation the PyTorchJob decision writes alone (the next pass brings the Workers to it)."""
    sc, policy, jobs = load("helios-elastic.yaml")
    jobs = [replace(j, kind=PYTORCHJOB_KIND) for j in jobs]
    sc = _on(sc, backend)
    failures = sc.failures.model_copy(update={"exit_failure_rate": 0.0, "node_mtbf_hours": 20})
    controller, seen = _recording(sc.workload.elastic, failures.restart_budget, backend)
    result = _run(sc, policy, jobs, failures, controller)
    assert result.summary["failures"]["node_failures"] > 10
    ran = [o for o in result.outcomes if o.state != "rejected"]
    assert ran and all(o.state == "done" and o.user_restarts == 0 for o in ran)
    resizes = {what: [] for what in ("shrink", "grow")}
    for what, snap, plan in seen:
        if what in resizes:
            resized = [p for p in plan.of(Patch) if ELASTIC_ANNOTATION in p.patch.get("metadata", {}).get("annotations", {})]
            resizes[what].append(bool(resized))
            if resized:
                assert [type(s).__name__ for s in plan.steps] == ["Patch", "Event"], plan.steps
    if not resizes_jobs(backend_for(backend.value)):   # Kueue's admission owns the size; native keeps it
        assert not any(resizes["shrink"]) and not any(resizes["grow"]), resizes
    else:
        assert any(resizes["shrink"]) and any(resizes["grow"]) and not all(resizes["grow"]), resizes


@pytest.mark.parametrize("backend", list(Backend))
def test_pytorchjobs_and_trainjobs_in_one_run_use_the_budget_each_decision_allows(backend):
    """Half the jobs are PyTorchJobs, every run exits non-zero: each job is restarted `budget` times
    then failed, the PyTorchJobs by their own decision (the judgement recorded in the annotation)."""
    sc, policy, jobs = load("pai-small.yaml", 40)
    jobs = _with_pytorchjobs(jobs)
    sc = _on(sc, backend)
    failures = sc.failures.model_copy(update={"exit_failure_rate": 1.0, "node_mtbf_hours": None})
    controller, seen = _recording(sc.workload.elastic, failures.restart_budget, backend)
    result = _run(sc, policy, jobs, failures, controller)
    ran = [o for o in result.outcomes if o.state != "rejected"]
    kinds = {j.id: j.kind for j in jobs}
    assert {kinds[o.id] for o in ran} == {PYTORCHJOB_KIND, "TrainJob"}, "both kinds ran"
    assert all(o.state == "failed" for o in ran)
    assert {o.user_restarts for o in ran} == {failures.restart_budget + 1}
    judged = [plan for what, snap, plan in seen if what == "exit" and snap.job["kind"] == PYTORCHJOB_KIND]
    assert judged and all(len(plan.steps) == 1 and isinstance(plan.steps[0], Patch) for plan in judged), \
        "a PyTorchJob's judgement is written alone, to its annotation"


@pytest.mark.parametrize("backend", list(Backend))
def test_memoized_plans_are_exactly_the_plans_asked_every_time_with_pytorchjobs(backend):
    sc, policy, jobs = load("pai-small.yaml")
    jobs = _with_pytorchjobs(jobs, 0.3)
    sc = _on(sc, backend)
    failures = sc.failures.model_copy(update={"exit_failure_rate": 0.2, "node_mtbf_hours": 50})
    memo, _ = _recording(sc.workload.elastic, failures.restart_budget, backend)
    every, _ = _recording(sc.workload.elastic, failures.restart_budget, backend, memo=False)
    a, b = _run(sc, policy, jobs, failures, memo), _run(sc, policy, jobs, failures, every)
    assert a.outcomes == b.outcomes and a.summary == b.summary
    assert sum(o.user_restarts for o in a.outcomes) > 0 and memo.calls < every.calls / 2


def test_a_scenario_share_makes_that_share_of_its_jobs_pytorchjobs():
    sc, policy, _ = load("pai-generated.yaml", 2000)
    sc.workload.pytorchjob_share = 0.25
    jobs = load_workload(sc, policy).jobs
    share = sum(j.kind == PYTORCHJOB_KIND for j in jobs) / len(jobs)
    assert 0.22 < share < 0.28, share
    assert [j.kind for j in load_workload(sc, policy).jobs] == [j.kind for j in jobs], "the same draw every run"
