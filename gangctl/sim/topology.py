"""Placement in the simulated topology: which jobs ask for a level, and who chooses their domain.

A scenario's workload says what share of its jobs requires or prefers one domain of which level
(`workload.placement`); each job is drawn by a stable hash of its id, the same on every run and at
every point of a sweep. Who places an asking gang follows what the scenario's backend declares, by
the controller's own test (`gangctl.policy.placement.places_itself`):
- a backend whose scheduler takes the intent (Kueue's TAS annotations, Volcano's networkTopology,
  KAI's topology constraint, native gangs' required level) places it as `gangctl.sim.model` does:
  the narrowest, fullest domain that holds it now; a preferred gang no domain holds spans the
  fewest domains of its level;
- where it does not (Coscheduling; native's preferred level), gangctl's own choice decides:
  `gangctl.policy.placement.choose`, the controller's code, on the nodes as the reconciler would see
  them (`Cluster.rooms`), and the gang is pinned to the domain it names; a preferred gang no domain
  holds is pinned to the fewest domains of its level that hold it together (the most room first).
gangctl chooses at the moment the gang fits (the simulator has no schedule timeout to re-choose after).
A gang that asks for nothing is packed by gangctl's choice too where its scheduler would scatter it
(`pack`: `gangctl.policy.placement.packing`, as the controller does on coscheduling and native); on
Kueue, Volcano and KAI their scheduler places it as the cluster's packing says.
"""
from __future__ import annotations

import zlib
from dataclasses import dataclass

from gangctl.model.topology import KUEUE_PREFERRED, KUEUE_REQUIRED, PlacementIntent, Topology, TopologyLevel
from gangctl.plugins.base import GangBackend
from gangctl.policy.placement import Floor, Placed, choose, packing, places_itself
from gangctl.sim.model import GPU, Ask, Cluster, Level, Placement
from gangctl.sim.scenario import PlacementMode, PlacementShare


@dataclass(frozen=True)
class Asked:
    """One job's placement intent in the simulator: the model's `ask`, the controller's `intent`
    (levels as node labels), and whether gangctl chooses the domain (`own`)."""
    ask: Ask
    intent: PlacementIntent
    own: bool
    kind: str                 # "required rack", "preferred block": how reports group jobs


class Placer:
    def __init__(self, levels: list[Level], shares: list[PlacementShare], backend: GangBackend) -> None:
        self.levels = levels
        self.topology = Topology(levels=[TopologyLevel(name=lv.name, node_label=lv.label) for lv in levels])
        self.packs = not places_itself(backend, packing(self.topology), self.topology)   # gangctl packs the rest
        self.choices: list[tuple[float, Asked]] = []
        bound = 0.0
        for share in shares:
            at = [lv.name for lv in levels].index(share.level)
            required = share.mode is PlacementMode.REQUIRED
            label = levels[at].label
            intent = PlacementIntent(required=label) if required else PlacementIntent(preferred=label)
            bound += share.share
            self.choices.append((bound, Asked(Ask(at, required), intent, not places_itself(backend, intent, self.topology),
                                              f"{share.mode.value} {share.level}")))

    def annotations(self, job_id: str) -> dict[str, str]:
        """The pod template annotations that ask the real controller for the job's intent (Kueue's
        podset annotations, which gangctl reads on every backend): what a replay submits."""
        asked = self.ask_of(job_id)
        if asked is None:
            return {}
        key = KUEUE_REQUIRED if asked.ask.required else KUEUE_PREFERRED
        return {key: self.levels[asked.ask.level].label}

    def ask_of(self, job_id: str) -> Asked | None:
        """The job's intent, drawn by a stable hash of its id (None: it asks for nothing)."""
        draw = zlib.crc32(f"placement:{job_id}".encode()) / 2**32
        return next((asked for bound, asked in self.choices if draw < bound), None)

    def place(self, cluster: Cluster, asked: Asked, pods: int, gpus_per_pod: int,
              gpu_type: str | None) -> Placement | None:
        """Place the gang as its backend would, or where gangctl's own choice pins it."""
        if not asked.own:
            return cluster.place(pods, gpus_per_pod, gpu_type, ask=asked.ask)
        if asked.ask.required and cluster.best_domain(pods, gpus_per_pod, gpu_type, asked.ask) is None:
            return None     # no domain holds it now: gangctl's choice waits (without weighing every node)
        chosen = choose(cluster.rooms(gpu_type), self.topology, asked.intent, Floor(pods, {GPU: gpus_per_pod}))
        if not isinstance(chosen, Placed):
            return None
        if chosen.domain is None:   # preferred, and its level's domains cannot hold it together
            return cluster.place(pods, gpus_per_pod, gpu_type)
        return cluster.place_in(chosen.domains, pods, gpus_per_pod)

    def pack(self, cluster: Cluster, pods: int, gpus_per_pod: int, gpu_type: str | None) -> Placement | None:
        """Place a gang that asks for nothing: where gangctl's packing pins it (`packs`), else, or when
        no domain holds it now, as the cluster's packing places any gang."""
        if self.packs:
            chosen = choose(cluster.rooms(gpu_type), self.topology, packing(self.topology),
                            Floor(pods, {GPU: gpus_per_pod}))
            if isinstance(chosen, Placed) and chosen.domain is not None:
                return cluster.place_in(chosen.domains, pods, gpus_per_pod)
        return cluster.place(pods, gpus_per_pod, gpu_type)
