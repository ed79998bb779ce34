"""The discrete-event loop: arrivals, completions, failures and repairs on a heap of timed events.

After every event the engine asks `gangctl.model.admission.decide` which pending gangs the quota
admits (gangs sized by `gangctl.model.gang.size_gang`), then places admitted gangs on nodes
all-or-nothing. Backend differences are described in `gangctl.sim.scenario`.

Job model: a job has `duration` seconds of work at full size. Running with fewer pods (an elastic
job below numNodes) it progresses at pods/numNodes. Every (re)start after the first, and every
resize, costs `restart_overhead_seconds` without progress. An unplanned interruption (node failure,
non-zero exit, preemption) loses the progress since the last checkpoint; a planned resize (an
elastic job growing into free capacity) checkpoints first and loses only the overhead. Elastic jobs
start at their floor (minNodes), shrink instead of stopping when they lose nodes, and grow while
nothing waits for nodes and their team has nothing pending. Infrastructure faults do not count
against a job's restart budget.

What the controller decides, the engine asks the controller's own decision of the job's kind
(TrainJob or PyTorchJob) under the scenario's backend, through `gangctl.sim.controller` (a simulated
observe and apply): the gang of each job and what it asks the quota for, whether a failed run
restarts or fails the job (the restart budget), how an elastic job shrinks on a node loss and when
it probes for growth. It keeps of a job only what those plans wrote (`controller.Written`).
tests/unit/test_sim_parity.py checks the plans behind whole runs under every backend.

With a topology, a job drawn to ask for a level (`gangctl.sim.topology`) is placed as its backend or
gangctl's own choice places it; a gang whose required level has no domain large enough is rejected
(`TopologyUnsatisfiable`, as the controller fails it). The summary's `topology` section counts, per
kind of ask, the domains each multi-pod gang spans at its level, the required gangs that span more
than one (violations), the queueing delay, and the stranded GPUs: free, but in domains that hold none of
the waiting gangs that require a level.
"""
from __future__ import annotations

import heapq
import math
import random
from bisect import bisect_left, insort
from dataclasses import dataclass
from operator import itemgetter
from typing import Callable

from gangctl.model.admission import Verdict, Workload, decide, explain, headroom, never_fits, queue_key
from gangctl.model.gang import Gang
from gangctl.model.quota import QuotaPolicy
from gangctl.plugins import base
from gangctl.plugins.registry import BACKENDS
from gangctl.sim.clock import SimClock
from gangctl.sim.controller import SimController, Written
from gangctl.sim.metrics import JobOutcome, Recorder, Series, summarize, topology_summary
from gangctl.sim.model import Cluster, Placement
from gangctl.sim.scenario import Backend, ControlPlane, ElasticSpec, Failures, Scenario
from gangctl.sim.topology import Asked, Placer
from gangctl.sim.traces import TraceJob
from gangctl.sim.units import SIM_UNITS

(_ARRIVE, _FINISH, _USER_FAIL, _NODE_DOWN, _NODE_UP, _READY_TIMEOUT, _SAMPLE, _RETRY, _RELEASE, _RECHECK,
 _READY, _REQUEUE) = range(12)
PENDING, ADMITTED, RUNNING, DONE, FAILED = "pending", "admitted", "running", "done", "failed"
Held = tuple[Placement, int]   # pods reserved at Coscheduling's Permit for a gang being rejected, their GPUs each


# kube-scheduler's per-pod backoff after a failed attempt (podInitialBackoffSeconds, podMaxBackoffSeconds).
BACKOFF_INITIAL_SECONDS, BACKOFF_MAX_SECONDS = 1.0, 10.0
# KAI Scheduler: a gang of priority below this is preemptible (pkg/common/podgroup/preemptible.go), and
# its consolidation evicts at most this many gangs for one (--max-consolidation-preemptees).
KAI_NON_PREEMPTIBLE, CONSOLIDATION_PREEMPTEES = 100, 16


def backoff_expiry(fails: int, failed_at: float) -> float:
    """When a pod found unschedulable `fails` times, last at `failed_at`, ends its backoff: 1 s doubling
    to 10 s, truncated to the backoff queue's 1 s ordering window (kube-scheduler 1.33+)."""
    return math.floor(failed_at + min(BACKOFF_MAX_SECONDS, BACKOFF_INITIAL_SECONDS * 2 ** min(fails - 1, 30)))


def scheduling_order(gangs: list[SimJob], now: float) -> list[SimJob]:
    """The order in which kube-scheduler tries the waiting gangs a cluster event moved back to its queue.

    Pods past their backoff go to the active queue, sorted as Coscheduling sorts: priority, then the
    PodGroup's creation. Pods still backing off go to the backoff queue, popped when the active queue is
    empty, in order of backoff end (1 s windows), then in that same sort. So a gang rejected often waits
    behind fresher gangs rejected less. A gang that arrives now comes last: its PodGroup (the event) is
    created before its pods, and the queue has moved on when they appear.

    scheduler-plugins 0.34 would sort a gang by its last rejection instead of its creation, but the
    queue's sort is the first profile's plugin (`default-scheduler` in
    integrations/coscheduling/scheduler-config.yaml), whose Coscheduling instance never rejects a gang
    and so keeps no rejection times: a -v=4 scheduler log shows equal windows tried in creation order.

    A gang whose attempt in an earlier round has not come yet (the scheduler was still working through
    that round when this event came) is still queued with its earlier rejection."""
    window = math.floor(now)
    ready, backing, new = [], [], []
    for job in gangs:
        fails, failed_at = job.queue_state(now)
        if not fails:
            (new if job.queued_at == now else ready).append(((-job.workload.priority, job.queued_at, job.seq), job))
            continue
        expiry = backoff_expiry(fails, failed_at)
        if expiry >= window:
            backing.append(((expiry, -job.workload.priority, job.queued_at, job.seq), job))
        else:
            ready.append(((-job.workload.priority, job.queued_at, job.seq), job))
    first = itemgetter(0)
    return [j for _, j in sorted(ready, key=first) + sorted(backing, key=first) + sorted(new, key=first)]


class SimulationStuck(RuntimeError):
    """Jobs remain but no event can ever move them (a bug in the model or an impossible workload)."""


class SimJob:
    __slots__ = ("spec", "team", "gang", "pod_requests", "workload", "gpu_type", "state", "placement",
                 "pods", "held_pods", "remaining", "run_start", "segment_begin", "version", "first_start",
                 "user_restarts", "infra_restarts", "preemptions", "lost_gpu_seconds", "written",
                 "queued_at", "fails", "failed_at", "seq", "before", "asked", "recheck_at", "recheck_event")

    def __init__(self, spec: TraceJob, team: str, priority: int, gang: Gang, gpu_type: str | None,
                 requests: dict[str, int] | None = None) -> None:
        self.spec = spec
        self.team = team
        self.gang = gang
        self.pod_requests = gang.per_pod
        self.workload = Workload(spec.id, team, priority, spec.submit, requests or gang.min_resources)
        self.gpu_type = gpu_type
        self.state = PENDING
        self.placement: Placement | None = None
        self.pods = 0
        self.held_pods = 0          # pods whose requests count against quota
        self.remaining = spec.duration
        self.run_start = 0.0        # progress counts from here (after the restart overhead)
        self.segment_begin = 0.0    # when the current run segment began
        self.version = 0            # bumped to make scheduled events of this job stale
        self.first_start: float | None = None
        self.user_restarts = self.infra_restarts = self.preemptions = 0
        self.lost_gpu_seconds = 0.0
        self.written = Written()    # what the controller's plans wrote to its status
        # The scheduler's view of the gang's pods while they wait (see `scheduling_order`): when they were
        # created, how often they were found unschedulable, and when last.
        self.queued_at = 0.0        # its pods created
        self.fails = 0              # times found unschedulable (each pod's UnschedulableCount)
        self.failed_at = 0.0        # last time found unschedulable
        self.seq = 0                # creation order: ties in Coscheduling's sort (by creation, then rejection)
        self.before = (0, 0.0)      # (fails, failed_at) until the last counted attempt comes
        self.asked: Asked | None = None   # its placement intent in the topology
        self.recheck_at: float | None = None   # gangctl's own placement looks at it then (and every recheck after)
        self.recheck_event = -1.0   # when the event that wakes it for a recheck is (one per recheck)

    def queue_state(self, now: float) -> tuple[int, float]:
        """(fails, failed_at) as kube-scheduler's queue has them at `now`."""
        return (self.fails, self.failed_at) if self.failed_at <= now else self.before

    @property
    def rate(self) -> float:
        return self.pods / self.gang.size


@dataclass
class SimResult:
    summary: dict
    series: Series
    outcomes: list[JobOutcome]


class Simulation:
    def __init__(self, jobs: list[TraceJob], policy: QuotaPolicy, cluster: Cluster, *, backend: Backend,
                 failures: Failures, elastic: ElasticSpec, seed: int, sample_seconds: float = 600.0,
                 pods_ready_timeout_seconds: float = 300.0, control_plane: ControlPlane | None = None,
                 observer: Callable[[Simulation], None] | None = None,
                 controller: SimController | None = None, race_seed: int | None = None,
                 placer: Placer | None = None) -> None:
        self.policy = policy
        declared = BACKENDS[Backend(backend).value]
        self.controller = controller or SimController(elastic, failures.restart_budget, backend=declared.name)
        if self.controller.backend is not declared:
            raise ValueError(f"the controller decides with {self.controller.backend.name}, the scenario's "
                             f"backend is {declared.name}")
        self.quotas = policy.to_quotas(SIM_UNITS)
        self.cluster = cluster
        self.placer = placer
        # Waiting gangs that require a level, by (GPU type, level, GPUs per pod): pods -> how many.
        self._required: dict[tuple[str | None, int, int], dict[int, int]] = {}
        # What the backend declares (gangctl.plugins.base.GangBackend), read on every scheduling round:
        # one that takes a gang only when its quota and free nodes both hold it, in one decision,
        # leaves a waiting gang holding no quota; under gangctl's own gate a job's quota is counted
        # until the TrainJob is seen reported done (finish_seconds after its pods exit), while the
        # nodes are free at the exit already; one that requeues an unready gang frees its quota then;
        # one whose scheduler turns a gang away on its sum retries it only on a gang event (`_parked`);
        # one that admits one gang at a time admits none while an admitted gang is not ready (`_ready_at`).
        self._allocates_whole = base.allocates_whole(declared, bool(cluster.levels))
        self._one_until_ready = base.admits_one_until_ready(declared)
        self._ready_at = 0.0      # when the pods of the gang admitted last are all ready
        self._release_on_report = declared.gated_by_gangctl
        self._requeues_unready = declared.requeues_unready
        self._rejects_short = declared.rejects_short_gangs
        self._consolidates = base.consolidates(declared)
        self._no_consolidation: dict[tuple, int] = {}   # this round: the fewest pods no consolidation made room for
        self.failures = failures
        self.elastic = elastic
        self.sample_seconds = sample_seconds
        self.ready_timeout = pods_ready_timeout_seconds
        self.observer = observer
        self.clock = SimClock()
        self.rng = random.Random(seed)
        teams = [t.name for t in policy.teams]
        self.recorder = Recorder(teams)
        self.specs = sorted(jobs, key=lambda j: (j.submit, j.id))
        self.by_id: dict[str, SimJob] = {}
        self.usage: dict[str, dict[str, int]] = {t: {} for t in teams}
        self.team_gpus = {t: 0 for t in teams}
        self.pending: dict[str, list[Workload]] = {t: [] for t in teams}
        self.pending_count = 0
        self.admitted: dict[str, dict[str, Workload]] = {t: {} for t in teams}
        self._admitted_views = {t: d.values() for t, d in self.admitted.items()}
        self._preemption = self.quotas.preemption_enabled
        self.waiting: dict[str, SimJob] = {}      # admitted, waiting for nodes, in admission order
        # Jobs pending or waiting, by (GPU type, GPUs per pod): what fragmentation is measured against.
        self._queued: dict[tuple[str | None, int], int] = {}
        self.growable: dict[str, SimJob] = {}     # running elastic jobs below numNodes
        self.node_jobs: list[dict[str, int]] = [{} for _ in cluster.capacity]
        self._fits_cache: dict[tuple[int, str | None], int] = {}
        self._requests: dict[tuple, dict[str, int]] = {}
        self._never_fits: dict[tuple, object] = {}
        self._heap: list[tuple] = []
        self._seq = 0
        self._next_arrival = 0
        self._node_down_version = 0
        self._nodes_down = 0
        self.finished = 0
        self.events = 0
        cp = control_plane or ControlPlane()
        self.bind_seconds = cp.bind_seconds
        self.ready_seconds = max(cp.bind_seconds, cp.ready_seconds)
        self.finish_seconds = cp.finish_seconds
        self.evict_seconds = cp.evict_seconds
        self.retry_seconds = cp.retry_seconds
        self.retry_on_arrival = cp.retry_on_arrival
        self.nudge_delay = cp.finish_seconds + cp.nudge_delay_seconds
        self._recheck = cp.topology_recheck_seconds
        # Coscheduling's Permit: a gang rejected with some pods reserved holds their nodes for a moment.
        self._holds = cp.permit_hold_race > 0 and self._rejects_short and cp.retry_seconds is not None
        self._hold_race = cp.permit_hold_race
        self._races = random.Random(seed if race_seed is None else race_seed)
        # kube-scheduler tries the waiting gangs one pod attempt after another: when the current attempt is.
        self._attempt = cp.attempt_seconds if cp.retry_seconds is not None else 0.0
        self._attempt_at = self._round_began = 0.0
        # With retries modelled, a waiting gang that did not fit is set aside as the scheduler sets
        # its pods aside: `_parked` when the free GPUs fell short of the gang in sum (Coscheduling's
        # PreFilter; tried again on a Coscheduling event: a PodGroup added or nudged, a pod bound),
        # `_unfit` when they sufficed in sum but not node by node (Filter, NodeResourcesFit; tried again
        # only when pods leave a node, not at gangctl's nudges). The gangs an event retries are tried
        # in `scheduling_order`.
        self._parked: set[str] = set()
        self._unfit: set[str] = set()

    # --- the loop -------------------------------------------------------------------------------

    def run(self, progress: Callable[[int, int], None] | None = None) -> SimResult:
        total = len(self.specs)
        self._push_next_arrival()
        self._push(0.0, _SAMPLE, None, 0)
        if self.retry_seconds is not None:
            self._push(self.retry_seconds, _RETRY, None, 1)
        self._schedule_node_failure()
        heap = self._heap
        rec = self.recorder
        cluster = self.cluster
        while heap and self.finished < total:
            t, _, kind, job, version = heapq.heappop(heap)
            if kind != _ARRIVE and job is not None and version != job.version:
                continue
            rec.advance(t, cluster.busy_gpus, cluster.total_gpus, self.team_gpus)
            self.clock.advance_to(t)
            if kind == _ARRIVE:
                self._arrive(job)
                self._push_next_arrival()
            elif kind == _FINISH:
                self._finish(job)
            elif kind == _USER_FAIL:
                self._user_fail(job)
            elif kind == _READY_TIMEOUT:
                self._ready_timeout(job)
            elif kind == _NODE_DOWN:
                if version != self._node_down_version:
                    continue
                self._node_down()
            elif kind == _NODE_UP:
                self._node_up(version)
            elif kind == _RELEASE:
                self._hold(job, 0)
            elif kind == _READY:   # an admitted gang's pods are ready: the next may be admitted
                pass
            elif kind == _REQUEUE:   # an evicted gang made anew: it queues again
                self._requeue(job, job.workload)
            elif kind == _RECHECK:   # gangctl looks at a gang waiting for its topology again
                self._parked.discard(job.spec.id)
                self._unfit.discard(job.spec.id)
            elif kind == _RETRY:   # gangctl touches the PodGroups: a Coscheduling event
                self._parked.clear()
                if version == 1:   # the periodic retry, not a nudge after a job is done
                    self._push(t + self.retry_seconds, _RETRY, None, 1)
            else:
                self._sample()
                continue
            self._schedule()
            self.events += 1
            if self.observer is not None:
                self.observer(self)
            if progress is not None and self.events % 1000 == 0:
                progress(self.finished, total)
        if self.finished < total:
            raise SimulationStuck(self._stuck_report())
        end = self.clock.now
        rec.advance(end, cluster.busy_gpus, cluster.total_gpus, self.team_gpus)
        self._sample_now()
        if progress is not None:
            progress(self.finished, total)
        nominal = {t.name: t.nominal.gpu or 0.0 for t in self.policy.teams}
        summary = summarize(rec, end=end, team_nominal_gpus=nominal)
        if cluster.levels:
            summary["topology"] = topology_summary(rec, [lv.name for lv in cluster.levels])
        return SimResult(summary, rec.series, rec.outcomes)

    def _push(self, t: float, kind: int, job: SimJob | None, version: int) -> None:
        self._seq += 1
        heapq.heappush(self._heap, (t, self._seq, kind, job, version))

    def _push_next_arrival(self) -> None:
        if self._next_arrival < len(self.specs):
            spec = self.specs[self._next_arrival]
            self._next_arrival += 1
            self._push(spec.submit, _ARRIVE, spec, 0)

    def _schedule(self) -> None:
        self._no_consolidation.clear()
        if self.pending_count and not self._admission_blocked():
            gate = self._volcano_gate if self._allocates_whole else None
            views = self._admitted_views if self._preemption else None
            # one gang at a time (`first`): the call stops at its first admission, so no later gang of
            # the round is decided, nor placed by the gate
            for d in decide(self.quotas, self.usage, self.pending, views, gate, waits=False,
                            first=self._one_until_ready):
                if d.verdict is Verdict.WAIT:   # vetoed by the Volcano gate
                    continue
                for victim in d.victims:
                    self._preempt(self.by_id[victim.id])
                self._admit(self.by_id[d.workload.id])
        if self.waiting and (self.cluster.free_gpus or self.retry_seconds is not None):
            # With retries modelled, gangs that do not fit are set aside; a gang bound (its pods'
            # add events) makes the scheduler retry the ones Coscheduling rejected.
            while self._place_waiting() and self._parked:
                self._parked.clear()
        if self.growable and not self.waiting and self.cluster.free_gpus:
            self._grow()

    def _admission_blocked(self) -> bool:
        """A backend that admits one gang at a time: an admitted gang waits for nodes, or its pods are
        still binding (ready at `_ready_at`; a `_READY` event schedules again then)."""
        return self._one_until_ready and (bool(self.waiting) or self.clock.now < self._ready_at)

    # --- arrivals and admission -----------------------------------------------------------------

    def _arrive(self, spec: TraceJob) -> None:
        if self.retry_on_arrival:
            self._parked.clear()
        job = self._new_job(spec)
        if isinstance(job, str):
            self._record(spec, spec.group, "rejected", None, job)
            return
        self.by_id[spec.id] = job
        self._enqueue(job.workload)

    def _new_job(self, spec: TraceJob) -> SimJob | str:
        if spec.id in self.by_id:
            raise ValueError(f"job id {spec.id} appears twice in the workload")
        try:
            priority = self.policy.priority_of(spec.group, spec.priority_class)
        except KeyError:
            raise ValueError(f"job {spec.id}: unknown priority class {spec.priority_class!r}") from None
        gang = self.controller.gang(spec)
        gpu_type = spec.gpu_type if spec.gpu_type in self.cluster.gpu_types else None
        key = (spec.gpus_per_node, gpu_type)
        if key not in self._fits_cache:
            self._fits_cache[key] = self.cluster.largest_gang(*key)
        if self._fits_cache[key] < gang.min_member:
            return f"{gang.min_member} pods of {spec.gpus_per_node} GPUs never fit the cluster"
        # Gangs of one shape share one requests mapping: admission's blocked-gang check is then `is`.
        shape = (tuple(gang.per_pod.items()), gang.min_member)
        requests = self._requests.get(shape)
        if requests is None:
            requests = self._requests[shape] = gang.min_resources
        job = SimJob(spec, spec.group, priority, gang, gpu_type, requests)
        job.asked = self.placer.ask_of(spec.id) if self.placer is not None else None
        if job.asked is not None and job.asked.ask.required:
            level = job.asked.ask.level
            largest = self.cluster.largest_gang(spec.gpus_per_node, gpu_type, level)
            if largest < gang.min_member:
                name = self.cluster.levels[level].name
                return (f"TopologyUnsatisfiable: no {name} can ever hold {gang.min_member} pods of "
                        f"{spec.gpus_per_node} GPUs (the largest has room for {largest})")
        # never_fits reads only the team and the requests: asked once per team and gang shape.
        memo = (spec.group, shape)
        if memo in self._never_fits:
            short = self._never_fits[memo]
        else:
            short = self._never_fits[memo] = never_fits(self.quotas, job.workload)
        if short is not None:
            return "never fits the quota: " + explain(short, spec.group)
        return job

    def _enqueue(self, w: Workload) -> None:
        insort(self.pending[w.team], w, key=queue_key)
        self.pending_count += 1
        self._count_queued(self.by_id[w.id], 1)

    def _dequeue(self, w: Workload) -> None:
        queue = self.pending[w.team]
        del queue[bisect_left(queue, queue_key(w), key=queue_key)]
        self.pending_count -= 1
        self._count_queued(self.by_id[w.id], -1)

    def _wait(self, job: SimJob) -> None:
        """Admitted, waiting for nodes (with new pods: the scheduler has not tried them yet)."""
        self.waiting[job.spec.id] = job
        self._seq += 1
        job.queued_at, job.fails, job.failed_at, job.seq = self.clock.now, 0, 0.0, self._seq
        self._count_queued(job, 1)
        if job.asked is not None and job.asked.own:   # gangctl decides it now, then at each recheck
            job.recheck_at = self.clock.now

    def _unwait(self, job: SimJob) -> bool:
        if self.waiting.pop(job.spec.id, None) is None:
            return False
        self._parked.discard(job.spec.id)
        self._unfit.discard(job.spec.id)
        self._count_queued(job, -1)
        return True

    def _count_queued(self, job: SimJob, delta: int) -> None:
        key = (job.gpu_type, job.spec.gpus_per_node)
        n = self._queued.get(key, 0) + delta
        if n:
            self._queued[key] = n
        else:
            del self._queued[key]
        if job.asked is not None and job.asked.ask.required:
            sizes = self._required.setdefault((job.gpu_type, job.asked.ask.level, job.spec.gpus_per_node), {})
            pods = job.gang.min_member
            sizes[pods] = sizes.get(pods, 0) + delta
            if not sizes[pods]:
                del sizes[pods]

    def _place(self, job: SimJob, pods: int) -> Placement | None:
        """Where `pods` pods of the job go now, as its backend (or gangctl's choice) places its intent."""
        if job.asked is None:
            if self.placer is not None:
                return self.placer.pack(self.cluster, pods, job.spec.gpus_per_node, job.gpu_type)
            return self.cluster.place(pods, job.spec.gpus_per_node, job.gpu_type)
        own = job.asked.own and self._recheck
        now = self.clock.now
        if own and job.recheck_at is not None:
            if now > job.recheck_at + 1e-9:   # its rechecks since passed with no event: the next one
                job.recheck_at += math.ceil((now - job.recheck_at) / self._recheck - 1e-9) * self._recheck
            if now < job.recheck_at - 1e-9:
                self._wake_at_recheck(job)
                return None     # no Job yet: gangctl decides again at its recheck
        placement = self.placer.place(self.cluster, job.asked, pods, job.spec.gpus_per_node, job.gpu_type)
        if own:
            job.recheck_at = None if placement is not None else now + self._recheck
            if placement is None:
                self._wake_at_recheck(job)
        return placement

    def _wake_at_recheck(self, job: SimJob) -> None:
        if job.recheck_event != job.recheck_at:
            job.recheck_event = job.recheck_at
            self._push(job.recheck_at, _RECHECK, job, job.version)

    def _volcano_gate(self, w: Workload) -> str | None:
        job = self.by_id[w.id]
        placement = self._place(job, job.gang.min_member)
        if placement is None and self._consolidates:
            placement = self._consolidate(job)
        if placement is None:
            return f"no room on the nodes for {job.gang.min_member} pods of {job.spec.gpus_per_node} GPUs"
        job.placement = placement
        return None

    def _consolidate(self, job: SimJob) -> Placement | None:
        """KAI's consolidation: room for a pending preemptible gang that fits the free GPUs in sum but no
        nodes, made by evicting running preemptible gangs (the lowest priority, then the latest started,
        first; at most `CONSOLIDATION_PREEMPTEES`) when the gang and every evicted one can be placed at
        once. KAI's solver tries sets of victims; this tries the growing prefixes of that order, and of
        the first that works evicts only the gangs on the nodes it gives this one. This one binds at
        once (KAI's binder binds the pods it pipelined onto the evicted pods' nodes without waiting for
        them, and KWOK admits them); the evicted gangs queue again once their pods are gone
        (`evict_seconds`) and run from their last checkpoint wherever they fit. Its placement, or
        None (nothing changed)."""
        gpus = job.spec.gpus_per_node
        if (job.workload.priority >= KAI_NON_PREEMPTIBLE or self.cluster.free_gpus < job.gang.min_member * gpus):
            return None
        # as KAI skips a job no easier to make room for than one that failed this round
        shape = (job.gpu_type, gpus, job.asked.ask if job.asked is not None else None)
        if job.gang.min_member >= self._no_consolidation.get(shape, math.inf):
            return None
        # gangs whose pods run: not one still waiting for evicted pods to go, or for its own to bind
        now = self.clock.now
        running = {jid for on_node in self.node_jobs for jid in on_node}
        candidates = sorted((v for jid in running if (v := self.by_id[jid]).workload.priority < KAI_NON_PREEMPTIBLE
                             and v.gpu_type == job.gpu_type and v.state == RUNNING and v.run_start <= now),
                            key=lambda v: (v.workload.priority, -v.segment_begin, v.spec.id))[:CONSOLIDATION_PREEMPTEES]
        for k in range(1, len(candidates) + 1):
            where = self._room_after_evicting(job, candidates[:k])
            if where is None:
                continue
            self.cluster.reserve(where, gpus)
            on = {node for node, _ in where}
            needed = [v for v in candidates[:k] if any(node in on for node, _ in v.placement)]
            spared = [v for v in candidates[:k] if v not in needed]
            for v in spared:   # back where they run: are the others still placed again at once?
                self.cluster.reserve(v.placement, v.spec.gpus_per_node)
            if not self._all_placed(needed):
                for v in spared:
                    self.cluster.release(v.placement, v.spec.gpus_per_node)
                needed = candidates[:k]
            evicted = sum(v.pods for v in needed)
            wait = self.evict_seconds * evicted / (evicted + 1)
            for v in needed:
                self._evict(v, wait)
            return where
        self._no_consolidation[shape] = job.gang.min_member
        return None

    def _room_after_evicting(self, job: SimJob, victims: list[SimJob]) -> Placement | None:
        """Where the gang would go with `victims` evicted, if they could all be placed again at once too;
        the cluster is left as it was, but for the victims' nodes, which stay free when it works."""
        for v in victims:
            self.cluster.release(v.placement, v.spec.gpus_per_node)
        where = self._place(job, job.gang.min_member)
        if where is not None:
            placed = self._all_placed(victims)
            self.cluster.release(where, job.spec.gpus_per_node)
            if placed:
                return where
        for v in victims:
            self.cluster.reserve(v.placement, v.spec.gpus_per_node)
        return None

    def _all_placed(self, gangs: list[SimJob]) -> bool:
        """Whether the free nodes hold all `gangs` at once, the largest first (the cluster left as it was)."""
        moved: list[tuple[SimJob, Placement]] = []
        for v in sorted(gangs, key=lambda v: -v.pods * v.spec.gpus_per_node):
            if (to := self._place(v, v.pods)) is None:
                break
            moved.append((v, to))
        for v, to in moved:
            self.cluster.release(to, v.spec.gpus_per_node)
        return len(moved) == len(gangs)

    def _evict(self, job: SimJob, wait: float) -> None:
        """A running gang evicted to make room (its nodes already given to the gang it made room for):
        its progress since the last checkpoint is lost, as in any unplanned stop, and its gang, made
        anew once the evicted pods are gone (`wait`), queues again in its old place (its PodGroup stays)."""
        self._interrupt(job, planned=False)
        self._stop(job, given_away=True)
        job.preemptions += 1
        job.state = ADMITTED
        self._push(self.clock.now + wait, _REQUEUE, job, job.version)

    def _admit(self, job: SimJob) -> None:
        now = self.clock.now
        self._dequeue(job.workload)
        self._hold(job, job.gang.min_member)
        job.state = ADMITTED
        job.version += 1
        if job.placement is not None:          # placed by the Volcano gate
            self._start(job, job.placement)
            return
        if self._allocates_whole:    # a preemptor: its victims' nodes are free now
            placement = self._place(job, job.gang.min_member)
            if placement is None:
                self._requeue(job, job.workload)
            else:
                self._start(job, placement)
            return
        self._wait(job)
        if self._requeues_unready:
            self._push(now + self.ready_timeout, _READY_TIMEOUT, job, job.version)

    def _hold(self, job: SimJob, pods: int) -> None:
        """Make the job's quota usage `pods` pods' worth (0 releases it)."""
        delta = pods - job.held_pods
        if delta:
            usage = self.usage[job.team]
            for r, amount in job.pod_requests.items():
                usage[r] = usage.get(r, 0) + amount * delta
            job.held_pods = pods
        admitted = self.admitted[job.team]
        if pods:
            admitted[job.spec.id] = Workload(job.spec.id, job.team, job.workload.priority, self.clock.now,
                                             {r: a * pods for r, a in job.pod_requests.items()})
        else:
            admitted.pop(job.spec.id, None)

    def _requeue(self, job: SimJob, w: Workload) -> None:
        """Back to the quota queue, holding nothing."""
        self._hold(job, 0)
        job.state = PENDING
        job.version += 1
        job.workload = w
        self._enqueue(w)

    def _place_waiting(self) -> int:
        """Place waiting gangs whichever fit, in the scheduler's order (admission order without retries
        modelled); return how many started."""
        cluster = self.cluster
        parked = self._parked if self.retry_seconds is not None else None
        unfit = self._unfit
        started = 0
        now = self.clock.now
        if parked is None:
            order = list(self.waiting.values())
        else:   # the gangs an event retried, and those whose attempt in an earlier round is still to come
            order = scheduling_order([j for j in self.waiting.values() if j.failed_at > now
                                      or (j.spec.id not in parked and j.spec.id not in unfit)], now)
        self._round_began = self._attempt_at = max(now, self._attempt_at)
        held: Held | None = None        # pods of a rejected gang still at Permit
        lost: list[SimJob] = []         # gangs that found a node held: tried again after the rest
        for job in order:
            self._attempt_at += job.gang.min_member * self._attempt
            short, placement = self._try_place(job)
            if placement is None and held is not None:
                placement, held = self._race_for_held(job, held)
                if placement is None and held is None:
                    lost.append(job)
                    self._count_failure(job)
                    continue
            if placement is None:
                if parked is not None:
                    self._set_aside(job, short)
                    if self._holds and held is None and not short and job.gang.min_member > 1:
                        held = self._reserve_what_fits(job)
            else:
                self._unwait(job)
                self._start(job, placement)
                started += 1
                if not cluster.free_gpus and parked is None:
                    break
        if held is not None:
            cluster.release(*held)
        for job in lost:   # the held pods' release moves them back (an assigned pod's delete), behind the rest
            self._attempt_at += job.gang.min_member * self._attempt
            short, placement = self._try_place(job)
            if placement is None:
                self._set_aside(job, short)
            else:
                self._unwait(job)
                self._start(job, placement)
                started += 1
        return started

    def _try_place(self, job: SimJob) -> tuple[bool, Placement | None]:
        """Whether the free GPUs fall short of the gang in sum (Coscheduling's PreFilter), and else where
        it fits node by node, if anywhere."""
        short = self.cluster.free_gpus < job.gang.min_member * job.spec.gpus_per_node
        return short, None if short else self._place(job, job.gang.min_member)

    def _set_aside(self, job: SimJob, short: bool) -> None:
        """Until an event retries it: Coscheduling rejected it (short in sum) or NodeResourcesFit did."""
        (self._parked if short and self._rejects_short else self._unfit).add(job.spec.id)
        self._count_failure(job)

    def _count_failure(self, job: SimJob) -> None:
        now = self.clock.now
        if now < job.failed_at <= self._round_began:   # its attempt in an earlier round was still to come
            job.fails, job.failed_at = job.before       # when this event came: this attempt is that one
        job.before = (job.fails, job.failed_at)
        if not (job.fails and job.queued_at == now):   # a new gang's pods: once at first
            job.fails += 1
        job.failed_at = self._attempt_at

    def _reserve_what_fits(self, job: SimJob) -> Held | None:
        """A gang that passed Coscheduling's PreFilter (enough GPUs in sum) but not Filter: the pods tried
        before the one that failed were reserved and wait at Permit, holding their nodes until the
        gang's rejection lets them go, a few milliseconds later."""
        gpp = job.spec.gpus_per_node
        for pods in range(job.gang.min_member - 1, 0, -1):
            placement = self._place(job, pods)
            if placement is not None:
                return placement, gpp
        return None

    def _race_for_held(self, job: SimJob, held: Held) -> tuple[Placement | None, Held | None]:
        """`job` does not fit beside `held`. If it would fit without it, its attempt races the rejected gang
        letting go: it finds the node still held (`permit_hold_race`) and fails, or free and takes it. The
        hold ends either way; a gang that would not fit without the held node leaves it held."""
        cluster = self.cluster
        cluster.release(*held)
        placement = self._place(job, job.gang.min_member)
        if placement is None:
            cluster.reserve(*held)
            return None, held
        if self._races.random() < self._hold_race:
            cluster.release(placement, job.spec.gpus_per_node)
            return None, None
        return placement, None

    def _ready_timeout(self, job: SimJob) -> None:
        if job.state == ADMITTED and self._unwait(job):
            w = job.workload
            self._requeue(job, Workload(w.id, w.team, w.priority, self.clock.now, w.requests))

    # --- running --------------------------------------------------------------------------------

    def _start(self, job: SimJob, placement: Placement) -> None:
        now = self.clock.now
        job.state = RUNNING
        job.placement = placement
        job.pods = sum(n for _, n in placement)
        for node, n in placement:
            self.node_jobs[node][job.spec.id] = n
        self.team_gpus[job.team] += job.pods * job.spec.gpus_per_node
        if self.cluster.levels and job.pods > 1:
            asked = job.asked
            level = asked.ask.level if asked is not None else len(self.cluster.levels) - 1
            self.recorder.spread(asked.kind if asked is not None else "none", self.cluster.domains_spanned(placement, level),
                                 asked is not None and asked.ask.required)
        restart = job.first_start is not None
        if not restart:
            job.first_start = now + self.bind_seconds
        self._begin_segment(job, overhead=restart, bind=True)
        if self._one_until_ready and now + self.ready_seconds > self._ready_at:
            self._ready_at = now + self.ready_seconds
            self._push(self._ready_at, _READY, None, 0)
        if job.pods < job.gang.size:
            self.growable[job.spec.id] = job

    def _begin_segment(self, job: SimJob, overhead: bool, bind: bool = False) -> None:
        now = self.clock.now
        job.version += 1
        job.segment_begin = now
        job.run_start = (now + (self.failures.restart_overhead_seconds if overhead else 0.0)
                         + (self.bind_seconds if bind else 0.0))
        end = job.run_start + job.remaining / job.rate
        rate = self.failures.exit_failure_rate
        if rate and self.rng.random() < rate:
            self._push(job.run_start + self.rng.random() * (end - job.run_start), _USER_FAIL, job, job.version)
        else:
            self._push(end, _FINISH, job, job.version)

    def _interrupt(self, job: SimJob, planned: bool) -> None:
        """Account the progress of the current segment; unplanned, keep only what was checkpointed."""
        now = self.clock.now
        ran = max(0.0, now - job.run_start)
        ckpt = self.failures.checkpoint_minutes
        saved = ran if planned else (ran - ran % (ckpt * 60) if ckpt else 0.0)
        job.remaining = max(0.0, job.remaining - saved * job.rate)
        job.lost_gpu_seconds += (now - job.segment_begin - saved) * job.pods * job.spec.gpus_per_node
        job.version += 1

    def _stop(self, job: SimJob, given_away: bool = False) -> None:
        """Take all the job's pods off the nodes (`given_away`: their GPUs already went to another gang)."""
        if not given_away:
            self.cluster.release(job.placement, job.spec.gpus_per_node)
        self._unfit.clear()   # pods left nodes: the scheduler retries pods no node fitted
        for node, _ in job.placement:
            del self.node_jobs[node][job.spec.id]
        self.team_gpus[job.team] -= job.pods * job.spec.gpus_per_node
        job.placement = None
        job.pods = 0
        self.growable.pop(job.spec.id, None)

    def _finish(self, job: SimJob) -> None:
        job.remaining = 0.0
        self._stop(job)
        if self._release_on_report and self.finish_seconds:
            self._push(self.clock.now + self.finish_seconds, _RELEASE, job, job.version)
        else:
            self._hold(job, 0)
        self._end(job, DONE)
        if self.retry_seconds is not None:   # the PodGroup goes when the job is reported done: gangctl nudges
            self._push(self.clock.now + self.nudge_delay, _RETRY, None, 0)

    def _end(self, job: SimJob, state: str) -> None:
        job.state = state
        self._record(job.spec, job.team, state, job, "")

    def _record(self, spec: TraceJob, team: str, state: str, job: SimJob | None, reason: str) -> None:
        self.finished += 1
        self.recorder.outcomes.append(JobOutcome(
            spec.id, team, spec.gpus, spec.submit, job.first_start if job else None,
            self.clock.now + (self.finish_seconds if state == DONE else 0.0) if job else None, state,
            job.user_restarts if job else 0, job.infra_restarts if job else 0,
            job.preemptions if job else 0, job.lost_gpu_seconds if job else 0.0, reason,
            job.asked.kind if job and job.asked else ""))

    def _user_fail(self, job: SimJob) -> None:
        self._interrupt(job, planned=False)
        restart, job.written = self.controller.judge(job.spec, "exit", job.pods, job.written)
        job.user_restarts += 1   # user failures (the restarts used, and the final failure)
        if not restart:
            self._fail(job)
        else:
            self._begin_segment(job, overhead=True)

    def _fail(self, job: SimJob) -> None:
        self._stop(job)
        self._hold(job, 0)
        self._end(job, FAILED)

    def _preempt(self, job: SimJob) -> None:
        if job.state == DONE:   # finished, not yet reported: evicting it only frees its quota sooner
            self._hold(job, 0)
            return
        if job.state == RUNNING:
            self._interrupt(job, planned=False)
            self._stop(job)
        else:
            self._unwait(job)
        job.preemptions += 1
        self._requeue(job, job.workload)

    def _grow(self) -> None:
        cluster = self.cluster
        for job in sorted(self.growable.values(), key=lambda j: queue_key(j.workload)):
            gpp = job.spec.gpus_per_node
            if cluster.free_gpus < gpp:
                return
            if self.pending[job.team]:
                continue
            room = headroom(self.quotas, self.usage, job.team)
            want = job.gang.size - job.pods
            for r, amount in job.pod_requests.items():
                if r in room and amount:
                    want = min(want, int(room[r] // amount))
            if want <= 0 or not self.controller.grows(job.spec, job.pods, self.clock.now, job.written):
                continue
            # The gate admits the nodes the quota has room for at once; the controller then probes
            # one node at a time every few seconds, which is at once on the simulator's time scale.
            near = job.placement[0][0]
            for k in range(want, 0, -1):
                extra = cluster.place(k, gpp, near=near, ask=job.asked.ask if job.asked else None)
                if extra is not None:
                    self._resize(job, job.placement + extra, [])
                    break

    def _resize(self, job: SimJob, placement: Placement, lost: Placement) -> None:
        """Restart the job on `placement` (planned growth if nothing was `lost` on failed nodes)."""
        self._interrupt(job, planned=not lost)
        gpp = job.spec.gpus_per_node
        for node, n in lost:
            del self.node_jobs[node][job.spec.id]
        self.cluster.release(lost, gpp)
        for node, n in placement:
            self.node_jobs[node][job.spec.id] = n
        pods = sum(n for _, n in placement)
        self.team_gpus[job.team] += (pods - job.pods) * gpp
        job.placement = placement
        job.pods = pods
        self._hold(job, max(pods, job.gang.min_member))
        if pods < job.gang.size:
            self.growable[job.spec.id] = job
        else:
            self.growable.pop(job.spec.id, None)
        self._begin_segment(job, overhead=True)

    # --- node failures --------------------------------------------------------------------------

    def _schedule_node_failure(self) -> None:
        self._node_down_version += 1
        mtbf = self.failures.node_mtbf_hours
        up = len(self.cluster.capacity) - self._nodes_down
        if mtbf and up:
            t = self.clock.now + self.rng.expovariate(up / (mtbf * 3600))
            self._seq += 1
            heapq.heappush(self._heap, (t, self._seq, _NODE_DOWN, None, self._node_down_version))

    def _node_down(self) -> None:
        cluster = self.cluster
        node = self.rng.randrange(len(cluster.capacity))
        while not cluster.up[node]:
            node = self.rng.randrange(len(cluster.capacity))
        cluster.fail_node(node)
        self._nodes_down += 1
        self.recorder.node_failures += 1
        for job_id, pods in list(self.node_jobs[node].items()):
            self._lose_pods(self.by_id[job_id], node, pods)
        repair = self.rng.expovariate(1 / (self.failures.repair_hours * 3600))
        self._seq += 1
        heapq.heappush(self._heap, (self.clock.now + repair, self._seq, _NODE_UP, None, node))
        self._schedule_node_failure()

    def _node_up(self, node: int) -> None:
        self.cluster.repair_node(node)
        self._nodes_down -= 1
        self._schedule_node_failure()

    def _lose_pods(self, job: SimJob, node: int, pods: int) -> None:
        job.infra_restarts += 1
        size, written = self.controller.size_after_loss(job.spec, job.pods, pods, self.clock.now, job.written)
        if size is not None:
            job.written = written
            keep = [(n, k) for n, k in job.placement if n != node]
            self._resize(job, keep, [(node, pods)])
            return
        self._interrupt(job, planned=False)
        restart, job.written = self.controller.judge(job.spec, "loss", job.pods, job.written)
        if not restart:
            self._fail(job)  # never, as the controller judges it: infrastructure is not charged
            return
        self._stop(job)
        if self._allocates_whole:
            self._requeue(job, job.workload)
            return
        self._hold(job, job.gang.min_member)
        job.state = ADMITTED
        self._wait(job)
        if self._requeues_unready:
            self._push(self.clock.now + self.ready_timeout, _READY_TIMEOUT, job, job.version)

    # --- sampling -------------------------------------------------------------------------------

    def _sample(self) -> None:
        self._sample_now()
        if not self._heap_has_work():
            raise SimulationStuck(self._stuck_report())
        self._push(self.clock.now + self.sample_seconds, _SAMPLE, None, 0)

    def _sample_now(self) -> None:
        smallest: dict[str | None, int] = {}
        for gpu_type, gpus in self._queued:
            if gpus < smallest.get(gpu_type, gpus + 1):
                smallest[gpu_type] = gpus
        c = self.cluster
        self.recorder.sample(self.clock.now, c.busy_gpus, c.total_gpus, self.pending_count, len(self.waiting),
                             c.fragmented_gpus(smallest), self.team_gpus)
        if c.levels:
            self.recorder.series.stranded_gpus.append(
                c.stranded_gpus({key: min(sizes) for key, sizes in self._required.items() if sizes}))

    def _heap_has_work(self) -> bool:
        """Whether an event other than sampling and node failures could still move a job."""
        return (any(e[2] not in (_SAMPLE, _NODE_DOWN, _RETRY) for e in self._heap)
                or bool(self.waiting and (self._nodes_down or self.retry_seconds is not None)))

    def _stuck_report(self) -> str:
        stuck = [w.id for q in self.pending.values() for w in q][:5] + list(self.waiting)[:5]
        return (f"{len(self.specs) - self.finished} job(s) can never finish at t={self.clock.now:.0f}s, "
                f"e.g. {', '.join(stuck)}")


def simulate(scenario: Scenario, policy: QuotaPolicy, jobs: list[TraceJob],
             progress: Callable[[int, int], None] | None = None,
             observer: Callable[[Simulation], None] | None = None, placement_seed: int | None = None) -> SimResult:
    """Run one scenario on already loaded jobs (teams in `TraceJob.group`). `placement_seed` draws
    spread packing's ties between equally free nodes (default: the scenario's seed)."""
    spec = scenario.cluster
    cluster = Cluster(spec.node_pools(), spec.packing, spec.same_zone,
                      seed=scenario.seed if placement_seed is None else placement_seed, levels=spec.levels())
    placer = (Placer(spec.levels(), scenario.workload.placement, BACKENDS[Backend(scenario.backend).value])
              if spec.topology else None)
    sim = Simulation(jobs, policy, cluster, backend=scenario.backend, failures=scenario.failures,
                     elastic=scenario.workload.elastic, seed=scenario.seed, sample_seconds=scenario.sample_seconds,
                     pods_ready_timeout_seconds=scenario.pods_ready_timeout_seconds,
                     control_plane=scenario.control_plane, observer=observer,
                     race_seed=placement_seed, placer=placer)
    return sim.run(progress)
