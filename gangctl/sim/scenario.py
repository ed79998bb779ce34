"""A simulation scenario (`simulations/*.yaml`, schema in simulations/schema.json).

Backend semantics, i.e. what differs between the scheduler backends in the model:
- `coscheduling`: gangctl's own quota admission unsuspends the job; the PodGroup then waits for
  nodes as long as it takes, holding its quota (scheduleTimeoutSeconds only retries the pods).
- `kueue`: the same quota reservation, but a gang not running `podsReadyTimeoutSeconds` after
  admission is evicted and requeued at the back of its queue, freeing its quota (waitForPodsReady),
  and with `blockAdmission` (as gangctl configures Kueue) nothing is admitted while an admitted gang
  waits for nodes or its pods bind. With a topology, Topology-Aware Scheduling admits a gang only
  where its pods fit now, as `volcano` below.
- `volcano`: a gang is enqueued only when its quota AND free nodes both hold it (the enqueue action
  checks idle capacity), so waiting gangs never hold quota.
- `kai` (NVIDIA KAI Scheduler): as `volcano` — its allocate action takes a gang only when its queue's
  quota or limit and free nodes both hold it, in one cycle, so waiting gangs hold no quota; its
  preempt and reclaim actions evict victims and place the preemptor in the same cycle. (KAI's
  fair share of idle quota by overQuotaWeight is not modelled: the policy's borrowing is.)
  Its consolidation action is modelled too: a preemptible gang (priority below 100, KAI's
  threshold) that fits the free GPUs in sum but no nodes evicts running preemptible gangs, the
  lowest priority and latest started first, up to 16 (KAI's default), when it and every one of
  them can be placed at once; it binds at once, and the evicted gangs queue again once their pods
  are gone (`controlPlane.evictSeconds`) and run from their last checkpoint.
- `native` (Kubernetes 1.36 gang scheduling): admitted by gangctl's quota gate as `coscheduling`;
  with the control plane's retries modelled, a gang that does not fit is tried again as soon as pods
  leave a node (kube-scheduler's own requeueing), not only on a nudge or the periodic retry, since
  no PreFilter rejects it on the gang's sum.
With a topology (`cluster.topology`) and jobs asking for a level (`workload.placement`), a backend
whose scheduler takes the intent places the gang in the narrowest, fullest domain that holds it
(Kueue TAS, Volcano networkTopology, KAI, native's required level), and where it has none
(Coscheduling, native's preferred level) gangctl's own choice picks the domain (`gangctl.sim.topology`).
In all of them, admitted gangs are placed in admission order by whichever fits (no node reservation
for big gangs: small gangs may pass them), and preemption follows the quota policy file. The
controller decides with the scenario's backend (`gangctl.sim.controller`), and the engine reads the
differences above from the capabilities each backend module declares (`gangctl.plugins`), so a
`kueue` scenario's elastic jobs, whose size Kueue owns, are never resized by gangctl.
"""
from __future__ import annotations

import zlib
from dataclasses import replace
from enum import Enum
from pathlib import Path

import yaml
from pydantic import BaseModel, ConfigDict, Field, model_validator
from pydantic.alias_generators import to_camel

from gangctl.api.pytorchjob import KIND as PYTORCHJOB_KIND
from gangctl.api.runtime import GANG_BACKENDS
from gangctl.model.quota import QuotaPolicy
from gangctl.sim.generate import Shape, generate
from gangctl.sim.model import Level, NodePool, Packing
from gangctl.sim.traces import Trace, TraceFormat, load_trace


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True, alias_generator=to_camel)


# A scenario's gang backend: one of gangctl.api.runtime.GANG_BACKENDS (Backend.KUEUE is "kueue").
Backend = Enum("Backend", {name.upper(): name for name in GANG_BACKENDS}, type=str)


class PoolSpec(_Model):
    name: str
    nodes: int = Field(ge=0)
    gpus_per_node: int = Field(8, ge=1)
    gpu_type: str = "gpu"
    zone: str = "zone-a"


class LevelSpec(_Model):
    name: str = Field(pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$", description="e.g. block or rack; nodes get the "
                      "label topology.gangctl.io/<name> naming their domain, as `gangctl cluster up --topology` labels them")
    nodes: int = Field(ge=1, description="nodes in one domain of this level (consecutive nodes of one pool; a pool's "
                       "last domain may be smaller)")


class ClusterSpec(_Model):
    pools: list[PoolSpec] = Field(min_length=1)
    packing: Packing = Packing.BEST_FIT
    same_zone: bool = Field(False, description="place each gang within one zone")
    topology: list[LevelSpec] = Field(default_factory=list, description="topology levels from the widest to the "
                                      "narrowest above the hosts (e.g. block, rack); each level's nodes a multiple "
                                      "of the next one's")

    @model_validator(mode="after")
    def _nested(self) -> ClusterSpec:
        names = [lv.name for lv in self.topology]
        if len(set(names)) != len(names):
            raise ValueError(f"topology: level names must differ, got {names}")
        for wide, narrow in zip(self.topology, self.topology[1:]):
            if wide.nodes % narrow.nodes:
                raise ValueError(f"topology: a {wide.name} of {wide.nodes} nodes is not made of whole "
                                 f"{narrow.name}s of {narrow.nodes} nodes")
        return self

    def node_pools(self) -> list[NodePool]:
        return [NodePool(p.name, p.nodes, p.gpus_per_node, p.gpu_type, p.zone) for p in self.pools]

    def levels(self) -> list[Level]:
        return [Level(lv.name, lv.nodes) for lv in self.topology]

    @property
    def racks(self) -> int:
        """Domains of the narrowest topology level, over all pools."""
        narrowest = self.topology[-1].nodes
        return sum(-(-p.nodes // narrowest) for p in self.pools)

    @property
    def total_gpus(self) -> int:
        return sum(p.nodes * p.gpus_per_node for p in self.pools)


class Failures(_Model):
    node_mtbf_hours: float | None = Field(None, gt=0, description="mean time between failures of one node; absent: nodes never fail")
    repair_hours: float = Field(4.0, gt=0, description="a failed node comes back after this long")
    exit_failure_rate: float = Field(0.0, ge=0, le=1, description="chance that a run of a job exits non-zero before finishing")
    restart_budget: int = Field(3, ge=0, description="restarts after user failures before the job fails (infra faults do not count)")
    checkpoint_minutes: float | None = Field(30.0, gt=0, description="progress is saved this often; absent: a restart starts over")
    restart_overhead_seconds: float = Field(60.0, ge=0, description="pod start and rendezvous time after each restart or resize")


class ControlPlane(_Model):
    """Latencies of the real control plane around each gang; all 0 (the default): instantaneous.

    `gangctl sim-check` measures them on the local cluster; see gangctl/validate."""

    bind_seconds: float = Field(0.0, ge=0, description="from a gang fitting the free nodes to all its pods bound (ends its queueing delay)")
    finish_seconds: float = Field(0.0, ge=0, description="from the pods' exit to the job reported done (adds to JCT; the nodes are free at exit)")
    ready_seconds: float = Field(0.0, ge=0, description="a backend that admits one gang at a time until its pods are "
                                 "ready (Kueue's blockAdmission): from a gang's admission to its pods reported ready, "
                                 "when the next may be admitted (at least bindSeconds)")
    retry_seconds: float | None = Field(None, gt=0, description="a gang that did not fit is tried again only when a job is reported done "
                                        "and every this many seconds (gangctl's GANGCTL_GANG_RETRY_SECONDS); absent: after every event")
    retry_on_arrival: bool = Field(True, description="with retrySeconds: a new gang's pods also make the scheduler retry waiting gangs")
    nudge_delay_seconds: float = Field(1.0, ge=0, description="with retrySeconds: from a job reported done (its PodGroup deleted) "
                                       "to gangctl nudging the waiting gangs (its debounce)")
    attempt_seconds: float = Field(0.0, ge=0, description="with retrySeconds: kube-scheduler's time per pod attempt; it works "
                                   "through the waiting gangs one pod after another, so a gang's attempt comes later than the "
                                   "event that retried it, and an event in between finds it still queued")
    topology_recheck_seconds: float = Field(0.0, ge=0, description="gangctl's own topology placement: a gang that no "
                                            "domain holds when it is decided is looked at again only this often "
                                            "(the controller's WaitingForTopology recheck); 0: at every event")
    evict_seconds: float = Field(0.0, ge=0, description="a scheduler that moves running gangs (KAI's consolidation): the "
                                 "evicted pods' grace period, over which they are gone spread evenly (n pods after "
                                 "evictSeconds·n/(n+1) on average, as KWOK's pod-delete stage does); the evicted gangs "
                                 "queue again then")
    permit_hold_race: float = Field(0.0, ge=0, le=1, description="coscheduling, with retrySeconds: how often the pods of a "
                                    "rejected gang, waiting at Permit, still hold their node when the next gang that needs it "
                                    "is tried (a race inside kube-scheduler; that gang then waits behind the rest)")


class TraceSpec(_Model):
    path: Path
    format: TraceFormat
    task_table: Path | None = Field(None, description="PAI pai_task_table.csv (default: next to path)")
    skip_bad_rows: bool = False


class GeneratorSpec(_Model):
    jobs: int = Field(ge=0)
    arrivals_per_hour: float = Field(gt=0)
    shape: Shape = Shape.PAI
    diurnal: bool = False
    gpus_per_node: int = Field(8, ge=1)
    teams: dict[str, float] | None = Field(None, description="team -> share of jobs (default: equal)")
    priority_classes: dict[str, float] | None = Field(None, description="class -> share (default: each team's default)")
    max_duration_seconds: float = Field(14 * 86400.0, gt=0, description="cut the duration tail here")


class ElasticSpec(_Model):
    enabled: bool = False
    min_fraction: float = Field(0.5, gt=0, le=1, description="minNodes = ceil(numNodes × this) for multi-node jobs")


class PlacementMode(str, Enum):
    REQUIRED = "required"
    PREFERRED = "preferred"


class PlacementShare(_Model):
    level: str = Field(description="a level of cluster.topology")
    mode: PlacementMode
    share: float = Field(gt=0, le=1, description="share of the jobs asking for it, drawn by a stable hash of each job's id")


class WorkloadSpec(_Model):
    trace: TraceSpec | None = None
    generate: GeneratorSpec | None = None
    team_of_group: dict[str, str] = Field(default_factory=dict, description="trace user/VC -> team; others spread over teams by hash")
    max_jobs: int | None = Field(None, ge=1, description="use only the first N jobs")
    elastic: ElasticSpec = Field(default_factory=ElasticSpec)
    pytorchjob_share: float = Field(0.0, ge=0, le=1, description="share of the jobs submitted as Training Operator v1 "
                                    "PyTorchJobs (Worker replicas only, elasticPolicy as `elastic` says) instead of TrainJobs, drawn by a stable "
                                    "hash of each job's id")

    placement: list[PlacementShare] = Field(default_factory=list, description="what shares of the jobs require or "
                                            "prefer one domain of a topology level (as Kueue's podset annotations, "
                                            "Volcano's networkTopology or KAI's annotations ask); the rest ask nothing")

    @model_validator(mode="after")
    def _one_source(self) -> WorkloadSpec:
        if (self.trace is None) == (self.generate is None):
            raise ValueError("workload needs exactly one of trace or generate")
        return self


class Scenario(_Model):
    name: str
    seed: int = 0
    cluster: ClusterSpec
    quota_policy: Path = Field(description="a policies/ file, relative to the scenario file")
    backend: Backend = Backend.KUEUE
    pods_ready_timeout_seconds: float = Field(300.0, gt=0, description="kueue backend: waitForPodsReady timeout")
    failures: Failures = Field(default_factory=Failures)
    control_plane: ControlPlane = Field(default_factory=ControlPlane)
    workload: WorkloadSpec
    sample_seconds: float = Field(600.0, gt=0, description="interval of the time series in the report")

    @model_validator(mode="after")
    def _placement_levels(self) -> Scenario:
        levels = [lv.name for lv in self.cluster.topology]
        for i, ask in enumerate(self.workload.placement):
            if ask.level not in levels:
                raise ValueError(f"workload.placement[{i}].level: {ask.level!r} is not a level of cluster.topology "
                                 f"({', '.join(levels) or 'none declared'})")
        if sum(a.share for a in self.workload.placement) > 1 + 1e-9:
            raise ValueError("workload.placement: the shares add up to more than 1")
        return self


def load_scenario(path: Path) -> Scenario:
    """Read a scenario; its relative paths become relative to the scenario file."""
    scenario = Scenario.model_validate(yaml.safe_load(path.read_text()))
    base = path.parent
    scenario.quota_policy = base / scenario.quota_policy
    if scenario.workload.trace is not None:
        t = scenario.workload.trace
        t.path = base / t.path
        if t.task_table is not None:
            t.task_table = base / t.task_table
    return scenario


def load_quota_policy(path: Path) -> QuotaPolicy:
    return QuotaPolicy.model_validate(yaml.safe_load(path.read_text()))


def load_workload(scenario: Scenario, policy: QuotaPolicy) -> Trace:
    """The scenario's jobs, from its trace file or its generator, with `group` set to a team name."""
    w = scenario.workload
    teams = [t.name for t in policy.teams]
    if w.generate is not None:
        g = w.generate
        trace = Trace(jobs=generate(g.jobs, g.arrivals_per_hour, seed=scenario.seed, shape=g.shape,
                                    groups=g.teams or {t: 1.0 for t in teams},
                                    priority_classes=g.priority_classes, gpus_per_node=g.gpus_per_node,
                                    diurnal=g.diurnal, max_seconds=g.max_duration_seconds))
    else:
        t = w.trace
        trace = load_trace(t.format, t.path, task_table=t.task_table, skip_bad=t.skip_bad_rows)
    if w.max_jobs is not None:
        trace.jobs = trace.jobs[:w.max_jobs]
    unknown = sorted(set(w.team_of_group.values()) - set(teams))
    if unknown:
        raise ValueError(f"teamOfGroup names teams not in the quota policy: {', '.join(unknown)}")
    trace.jobs = [j if j.group in teams else replace(j, group=team_of(j.group, w.team_of_group, teams))
                  for j in trace.jobs]
    if w.pytorchjob_share:
        trace.jobs = [replace(j, kind=PYTORCHJOB_KIND) if drawn(j.id, w.pytorchjob_share) else j for j in trace.jobs]
    return trace


def drawn(job_id: str, share: float) -> bool:
    """Whether job `job_id` falls in a `share` of the jobs: a stable hash of its id, the same on every run."""
    return zlib.crc32(f"pytorchjob:{job_id}".encode()) < share * 2**32


def team_of(group: str, mapping: dict[str, str], teams: list[str]) -> str:
    """A trace's user/VC as a team: by the scenario's map, else spread by a stable hash."""
    if group in mapping:
        return mapping[group]
    return sorted(teams)[zlib.crc32(group.encode()) % len(teams)]

