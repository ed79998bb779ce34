"""Pure: the slice of a scenario to replay, and the simulation that must match the real run.

What the real stack does, and so what the simulation of a replay must model:
- the controller makes each TrainJob a gang of the replay's backend (`--backend`, default
  `coscheduling`: a PodGroup per TrainJob), and the simulation decides with the same backend;
- quota: by default the replay runs without a policy, so the simulated quota never binds (one team
  per scenario team, nothing limited); with `quota`, the scenario's policy is stored where the
  controller's quota gate (or the backend's queues) read it (as `gangctl policy apply --backend …`
  does) and the simulation admits by the same policy, with the same decision code;
- KWOK nodes do not fail and KWOK pods exit 0, so no failures;
- no elastic gangs (the replay uses the shipped, rigid runtime) and no priority classes (the
  cluster has no PriorityClass objects for them);
- the cluster is the real one: its Ready GPU nodes, not the scenario's pools;
- the local cluster's kube-scheduler keeps NodeResourcesFit's default LeastAllocated scoring, and
  a replay's CPU and memory requests go with its GPUs, so each pod goes to the node with the most
  free GPUs (`spread` packing): small jobs spread over every node, and pods that take a whole node
  wait until one drains;
- gangs that can never fit those nodes are left out (the real scheduler would keep them pending);
- the control plane is this cluster's (`local_control_plane`): the latencies a replay measures,
  gangctl's retry period and its recheck of gangs waiting for a domain, and its scheduler's pace and
  the race at Coscheduling's Permit, measured in its logs;
- a scenario with a topology is replayed on nodes that carry its levels' labels
  (`gangctl cluster up --topology`), with the nodes per domain the nodes have (`topology_levels`),
  and each job asks the controller for the intent the simulator draws for it (gangctl's own
  placement, the Coscheduling backend's).
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, replace
from typing import Iterable, Mapping

from gangctl.model.quota import QuotaPolicy, Resources, Team
from gangctl.policy.decide import PLACEMENT_RECHECK_SECONDS
from gangctl.sim.model import NodePool, Packing
from gangctl.sim.replay import compressed
from gangctl.model.topology import level_label
from gangctl.sim.scenario import Backend, ControlPlane, Failures, LevelSpec, PoolSpec, Scenario
from gangctl.sim.traces import TraceJob

GPU = "nvidia.com/gpu"

# How often a rejected gang's pods, waiting at Coscheduling's Permit, still hold a node that just drained
# when the next waiting gang that needs it is tried. Measured in the kube-scheduler logs of two replay-check
# runs on the local cluster (2026-11-26 22:29 at -v=2, 2026-11-27 06:29 at -v=4): of the 23 drained nodes
# a waiting 1 x 8 gang took right after a 2 x 8 gang's pod had reserved it ("optimistic rejection in
# PostFilter" in the 60 ms before the bind), an older waiting 1 x 8 gang failed in between 11 times
# (7 of 11 and 4 of 12).
PERMIT_HOLD_RACE = 0.48
# kube-scheduler's mean time per pod attempt while it works through the waiting gangs: the spacing of
# consecutive attempts less than 50 ms apart in the 22:29 run's -v=2 log (19,578 of them; median 0.4 ms,
# a tail of Filter rejections and binds).
ATTEMPT_SECONDS = 0.0043
# A pod a scheduler evicts (KAI's consolidation) is deleted with its grace period, 30 s by default
# (terminationGracePeriodSeconds; the replay's pods set none), and KWOK's pod-delete stage removes it
# at a random moment within it (kwok v0.8.0 kustomize/stage/pod/general/pod-delete.yaml: 1 s plus a
# jitter up to the deletionTimestamp). A stage definition, not a fitted figure.
EVICT_SECONDS = 30.0
# The local cluster's Kueue waitForPodsReady timeout (integrations/kueue/controller-manager-config.yaml;
# a unit test keeps the two equal): a replay runs in the real cluster's seconds.
LOCAL_PODS_READY_TIMEOUT_SECONDS = 120.0


@dataclass(frozen=True)
class ReplayPlan:
    scenario: Scenario            # what to simulate (compressed jobs, the real nodes)
    policy: QuotaPolicy           # quota that never binds, the scenario's teams and namespaces
    jobs: list[TraceJob]          # the slice, uncompressed (replay.trainjob_submissions compresses)
    sim_jobs: list[TraceJob]      # the slice, compressed (simulate these)
    left_out: int                 # jobs whose gang can never fit the real nodes


def _gpus(node: Mapping) -> int:
    return int(str(((node.get("status") or {}).get("allocatable") or {}).get(GPU, "0")))


def _usable(node: Mapping) -> bool:
    ready = any(c.get("type") == "Ready" and c.get("status") == "True"
                for c in (node.get("status") or {}).get("conditions") or [])
    return bool(_gpus(node)) and ready and not (node.get("spec") or {}).get("unschedulable")


def gpu_pools(nodes: Iterable[Mapping]) -> list[NodePool]:
    """Node pools from Node objects: Ready nodes with nvidia.com/gpu, grouped by GPUs per node."""
    counts: Counter[tuple[int, str]] = Counter()
    for node in filter(_usable, nodes):
        product = ((node.get("metadata") or {}).get("labels") or {}).get("nvidia.com/gpu.product", "gpu")
        counts[(_gpus(node), product)] += 1
    return [NodePool(f"{product}-{gpus}", n, gpus, "gpu") for (gpus, product), n in sorted(counts.items())]


def topology_levels(nodes: Iterable[Mapping], names: list[str]) -> list[LevelSpec]:
    """The scenario's topology levels (widest first) as the usable GPU nodes carry them: the nodes in
    one domain of each level, read from the label `topology.gangctl.io/<name>`. ValueError when a node
    lacks one, or a level's domains differ in size (the model's domains are all alike)."""
    usable = [n for n in nodes if _usable(n)]
    levels = []
    for name in names:
        label = level_label(name)
        sizes: Counter[str] = Counter()
        for node in usable:
            value = ((node.get("metadata") or {}).get("labels") or {}).get(label)
            if value is None:
                raise ValueError(f"node {node['metadata']['name']} has no label {label}: replay a topology scenario "
                                 "on nodes labelled by `gangctl cluster up --topology BLOCKSxRACKSxHOSTS`")
            sizes[value] += 1
        if len(set(sizes.values())) != 1:
            raise ValueError(f"the {name}s differ in size ({dict(sorted(sizes.items()))} nodes): the simulator's "
                             f"{name}s are all alike")
        levels.append(LevelSpec(name=name, nodes=next(iter(sizes.values()))))
    return levels

def open_policy(policy: QuotaPolicy) -> QuotaPolicy:
    """The same teams and namespaces with nothing limited: what the controller enforces today."""
    return QuotaPolicy(teams=[Team(name=t.name, namespaces=t.namespaces, nominal=Resources()) for t in policy.teams])


def largest_gang(pools: list[NodePool], gpus_per_pod: int) -> int:
    return sum(p.nodes * (p.gpus_per_node // gpus_per_pod) for p in pools)


def plan(scenario: Scenario, policy: QuotaPolicy, jobs: list[TraceJob], pools: list[NodePool], *,
         count: int, compression: float, control_plane: ControlPlane | None = None,
         quota: bool = False, levels: list[LevelSpec] | None = None,
         backend: Backend = Backend.COSCHEDULING) -> ReplayPlan:
    """`levels`: the topology as the real nodes carry it (`topology_levels`), for a scenario with one;
    `backend`: the gang backend the replay's runtime names."""
    if not pools:
        raise ValueError("the cluster has no Ready GPU nodes")
    if scenario.cluster.topology and (levels is None or len(pools) != 1):
        raise ValueError("a topology scenario is replayed on one pool of like GPU nodes with its levels' labels")
    fitting = [j for j in jobs if largest_gang(pools, j.gpus_per_node) >= j.num_nodes]
    slice_ = [replace(j, priority_class=None) for j in fitting[:count]]
    last = fitting[len(slice_) - 1].submit if slice_ else 0.0
    left_out = sum(1 for j in jobs if j.submit <= last) - len(slice_)
    sim_jobs = compressed(slice_, compression)
    if sim_jobs:
        t0 = sim_jobs[0].submit
        sim_jobs = [replace(j, submit=j.submit - t0) for j in sim_jobs]
    sc = scenario.model_copy(update={
        "cluster": scenario.cluster.model_copy(update={"pools": [
            PoolSpec(name=p.name, nodes=p.nodes, gpus_per_node=p.gpus_per_node, gpu_type=p.gpu_type) for p in pools],
            "same_zone": False, "packing": Packing.SPREAD,
            "topology": levels if scenario.cluster.topology else []}),
        "backend": backend,
        "failures": Failures(restart_overhead_seconds=0),
        "workload": scenario.workload.model_copy(update={
            "elastic": scenario.workload.elastic.model_copy(update={"enabled": False})}),
        "control_plane": control_plane or scenario.control_plane,
        "pods_ready_timeout_seconds": LOCAL_PODS_READY_TIMEOUT_SECONDS,
        "sample_seconds": 5.0,
    })
    sc = Scenario.model_validate(sc.model_dump(by_alias=True))
    return ReplayPlan(sc, policy if quota else open_policy(policy), slice_, sim_jobs, left_out)


def namespaces_of(policy: QuotaPolicy) -> dict[str, str]:
    """Each team's first namespace (where its TrainJobs go)."""
    return {t.name: (t.namespaces or [t.name])[0] for t in policy.teams}


def local_control_plane(bind_seconds: float, finish_seconds: float, retry_seconds: float | None,
                        ready_seconds: float = 0.0) -> ControlPlane:
    """The local cluster's control plane as the model of a replay sees it: the bind, finish and (Kueue)
    admission-to-ready latencies measured in the run, gangctl's retry period, its scheduler's pace
    and Permit race, measured in its logs (`ATTEMPT_SECONDS`, `PERMIT_HOLD_RACE`), and how long an
    evicted pod takes to go (`EVICT_SECONDS`, KWOK's stage)."""
    return ControlPlane(bind_seconds=bind_seconds, finish_seconds=finish_seconds, retry_seconds=retry_seconds,
                        ready_seconds=ready_seconds, evict_seconds=EVICT_SECONDS,
                        attempt_seconds=ATTEMPT_SECONDS, permit_hold_race=PERMIT_HOLD_RACE,
                        topology_recheck_seconds=PLACEMENT_RECHECK_SECONDS)
