"""The simulated cluster: GPU nodes in pools (GPU type, zone), and all-or-nothing gang placement.

A gang is `pods` pods of `gpus_per_pod` GPUs each, all on one GPU type (and in one zone when
`same_zone`); several pods of a gang may share a node. Placement is all-or-nothing: either every
pod gets a node or nothing changes. Only GPUs are placed; CPU and memory count against quota only.

With a topology (`levels`, widest first, e.g. block then rack), each pool's nodes form domains of
`Level.nodes` consecutive nodes at every level (a rack inside one block, never across pools). A gang
that asks for a level (`Ask`) is placed as the schedulers with topology-aware scheduling place it
(Kueue's TAS, Volcano's network topology, KAI, native gangs): in the narrowest domain, at the
asked level or below it, that holds it now, the fullest of those (fewest GPUs left free, then by
name); none holding it, a required ask waits and a preferred one spans the fewest domains of its
level (the freest first). Where gangctl chooses the domain itself, the caller pins the gang with
`place_in`.

Nodes of a placement domain sit in buckets by free GPUs, so the feasibility check costs
O(GPUs per node) and best-fit placement touches only the nodes it uses.
"""
from __future__ import annotations

import random
from dataclasses import dataclass
from enum import Enum
from typing import Mapping, Sequence

from gangctl.model.room import NodeRoom
from gangctl.model.topology import level_label

GPU = "nvidia.com/gpu"


class Packing(str, Enum):
    BEST_FIT = "best-fit"     # fill the fullest nodes that still fit a pod (keeps whole nodes free)
    FIRST_FIT = "first-fit"   # nodes in declaration order
    SPREAD = "spread"         # the node with the most free GPUs, ties at random (kube-scheduler's default)


@dataclass(frozen=True)
class NodePool:
    name: str
    nodes: int
    gpus_per_node: int
    gpu_type: str = "gpu"
    zone: str = "zone-a"


@dataclass(frozen=True)
class Level:
    """One topology level: its name (the node label's last part) and the nodes in one of its domains."""
    name: str
    nodes: int

    @property
    def label(self) -> str:
        return level_label(self.name)


@dataclass(frozen=True)
class Ask:
    """A gang's placement intent: all its pods in one domain of `level` (an index into the cluster's
    levels, 0 the widest) when `required`, else as few of them as it can."""
    level: int
    required: bool


Placement = list[tuple[int, int]]   # (node index, pods on it)


class _Domain:
    """Nodes a gang may span: one GPU type (and one zone when gangs stay in a zone), or one topology
    domain (`name` at `level`) inside one pool."""

    __slots__ = ("gpu_type", "nodes", "buckets", "free_gpus", "name", "level", "capacity")

    def __init__(self, gpu_type: str, max_gpus: int, name: str = "", level: int = -1) -> None:
        self.gpu_type = gpu_type
        self.nodes: list[int] = []
        self.buckets: list[dict[int, None]] = [{} for _ in range(max_gpus + 1)]  # free GPUs -> nodes
        self.free_gpus = 0
        self.name = name
        self.level = level
        self.capacity = 0

    def slots(self, gpus_per_pod: int) -> int:
        return sum(len(self.buckets[k]) * (k // gpus_per_pod) for k in range(gpus_per_pod, len(self.buckets)))

    def holds(self, pods: int, gpus_per_pod: int) -> bool:
        return self.free_gpus >= pods * gpus_per_pod and self.slots(gpus_per_pod) >= pods


class Cluster:
    def __init__(self, pools: list[NodePool], packing: Packing = Packing.BEST_FIT, same_zone: bool = False,
                 seed: int = 0, levels: Sequence[Level] = ()) -> None:
        if not pools or any(p.nodes < 0 or p.gpus_per_node < 1 for p in pools):
            raise ValueError("a cluster needs node pools with at least 1 GPU per node")
        self.levels = list(levels)
        for wide, narrow in zip(self.levels, self.levels[1:]):
            if narrow.nodes > wide.nodes or wide.nodes % narrow.nodes:
                raise ValueError(f"topology: a {wide.name} of {wide.nodes} nodes is not made of whole "
                                 f"{narrow.name}s of {narrow.nodes}")
        self.packing = packing
        self._rng = random.Random(seed) if packing is Packing.SPREAD else None   # spread's ties
        max_gpus = max(p.gpus_per_node for p in pools)
        self.max_gpus_per_node = max_gpus
        self.capacity: list[int] = []
        self.free: list[int] = []
        self.up: list[bool] = []
        self.domain_of: list[_Domain] = []
        self.domains: list[_Domain] = []
        # Every domain a node is in: its GPU type's (and zone's) first, then one per topology level.
        self.groups: list[tuple[_Domain, ...]] = []
        self.level_domains: list[list[_Domain]] = [[] for _ in self.levels]
        self._named: dict[str, _Domain] = {}     # topology domains by name (names are unique)
        self._rooms: list[NodeRoom | None] = []
        by_key: dict[tuple[str, str], _Domain] = {}
        for pool in pools:
            key = (pool.gpu_type, pool.zone if same_zone else "")
            domain = by_key.get(key)
            if domain is None:
                domain = by_key[key] = _Domain(pool.gpu_type, max_gpus)
                self.domains.append(domain)
            for i in range(pool.nodes):
                node = len(self.capacity)
                self.capacity.append(pool.gpus_per_node)
                self.free.append(pool.gpus_per_node)
                self.up.append(True)
                self.domain_of.append(domain)
                self._rooms.append(None)
                self.groups.append((domain, *(self._topology_domain(pool, i, at, max_gpus)
                                              for at in range(len(self.levels)))))
                for d in self.groups[node]:
                    d.nodes.append(node)
                    d.buckets[pool.gpus_per_node][node] = None
                    d.free_gpus += pool.gpus_per_node
                    d.capacity += pool.gpus_per_node
        self.gpu_types = sorted({p.gpu_type for p in pools})
        self.total_gpus = sum(self.capacity)   # GPUs on nodes that are up
        self.free_gpus = self.total_gpus       # free GPUs on nodes that are up

    @property
    def busy_gpus(self) -> int:
        return self.total_gpus - self.free_gpus

    def _topology_domain(self, pool: NodePool, index: int, at: int, max_gpus: int) -> _Domain:
        """The domain at level `at` of the pool's `index`th node (made when its first node is)."""
        level = self.levels[at]
        name = f"{pool.name}-{level.name}-{index // level.nodes:04d}"
        if index % level.nodes == 0:
            self.level_domains[at].append(_Domain(pool.gpu_type, max_gpus, name, at))
            self._named[name] = self.level_domains[at][-1]
        return self.level_domains[at][-1]

    def largest_gang(self, gpus_per_pod: int, gpu_type: str | None = None, level: int | None = None) -> int:
        """Most pods of this size an empty cluster could hold in one domain (of topology level `level`
        when given; 0: never placeable)."""
        best = 0
        for d in self._domains(gpu_type, level):
            best = max(best, sum(self.capacity[n] // gpus_per_pod for n in d.nodes))
        return best

    def place(self, pods: int, gpus_per_pod: int, gpu_type: str | None = None, near: int | None = None,
              ask: Ask | None = None) -> Placement | None:
        """Place all pods or none, on one GPU type (or in the domain of node `near`), as `ask` asks
        (see the module docstring); say where."""
        if pods * gpus_per_pod > self.free_gpus or gpus_per_pod > self.max_gpus_per_node:
            return None
        if ask is not None and self.levels:
            return self._place_asked(pods, gpus_per_pod, gpu_type, near, ask)
        domains = [self.domain_of[near]] if near is not None else self._domains(gpu_type)
        fitting = [d for d in domains if d.holds(pods, gpus_per_pod)]
        if not fitting:
            return None
        return self._fill(fitting, pods, gpus_per_pod)

    def place_in(self, names: tuple[str, ...], pods: int, gpus_per_pod: int) -> Placement | None:
        """Place all pods or none inside the topology domains `names` (a gang pinned there), filling
        them in the order given, as many pods in each as it holds."""
        chosen = [self._named.get(name) for name in names]
        if not chosen or None in chosen:
            return None
        slots = [d.slots(gpus_per_pod) for d in chosen]
        if sum(slots) < pods:
            return None
        placement: Placement = []
        left = pods
        for domain, room in zip(chosen, slots):
            take = min(left, room)
            if take:
                placement += self._fill([domain], take, gpus_per_pod)
                left -= take
        return placement

    def best_domain(self, pods: int, gpus_per_pod: int, gpu_type: str | None, ask: Ask) -> _Domain | None:
        """The narrowest domain at the ask's level or below that holds the gang now, the fullest of
        that level (fewest GPUs left free, then by name); None when none does."""
        for at in range(len(self.levels) - 1, ask.level - 1, -1):
            fitting = [d for d in self._domains(gpu_type, at) if d.holds(pods, gpus_per_pod)]
            if fitting:
                return min(fitting, key=lambda d: (d.free_gpus, d.name))
        return None

    def _place_asked(self, pods: int, gpus_per_pod: int, gpu_type: str | None, near: int | None,
                     ask: Ask) -> Placement | None:
        if near is not None:    # more pods of a placed gang: its domain, or (preferred) its GPU type's
            home = self.groups[near][1 + ask.level]
            if home.holds(pods, gpus_per_pod):
                return self._fill([home], pods, gpus_per_pod)
            return None if ask.required else self.place(pods, gpus_per_pod, near=near)
        domain = self.best_domain(pods, gpus_per_pod, gpu_type, ask)
        if domain is not None:
            return self._fill([domain], pods, gpus_per_pod)
        return None if ask.required else self._place_fewest(pods, gpus_per_pod, gpu_type, ask.level)

    def _place_fewest(self, pods: int, gpus_per_pod: int, gpu_type: str | None, level: int) -> Placement | None:
        """A preferred gang no domain holds: over the fewest domains of its level (of one GPU type and
        zone), the freest first."""
        for base in self._domains(gpu_type):
            if not base.holds(pods, gpus_per_pod):
                continue
            placement: Placement = []
            left = pods
            inside = [d for d in self.level_domains[level] if d.nodes and self.domain_of[d.nodes[0]] is base]
            for d in sorted(inside, key=lambda d: (-d.slots(gpus_per_pod), d.name)):
                take = min(left, d.slots(gpus_per_pod))
                if take:
                    placement += self._fill([d], take, gpus_per_pod)
                    left -= take
                if not left:
                    return placement
            raise AssertionError("the base domain said the gang fits")
        return None

    def domains_spanned(self, placement: Placement, level: int) -> int:
        return len({id(self.groups[node][1 + level]) for node, _ in placement})

    def rooms(self, gpu_type: str | None) -> list[NodeRoom]:
        """The nodes that are up (of one GPU type) as gangctl's placement weighs them: free and
        allocatable GPUs, and a label per topology level naming the node's domain."""
        out = []
        for node in (n for d in self._domains(gpu_type) for n in d.nodes):
            if not self.up[node]:
                continue
            room = self._rooms[node]
            if room is None:
                labels = {lv.label: d.name for lv, d in zip(self.levels, self.groups[node][1:])}
                room = self._rooms[node] = NodeRoom(f"node-{node:05d}", {GPU: self.free[node]}, labels,
                                                    {GPU: self.capacity[node]})
            out.append(room)
        return out

    def stranded_gpus(self, waiting: Mapping[tuple[str | None, int, int], int]) -> int:
        """Free GPUs in topology domains that hold none of the waiting gangs that require a level
        (`waiting`: (GPU type, level, GPUs per pod) -> the fewest pods of such a gang), counted
        once each and only while such gangs wait: room no required gang can use."""
        if not waiting or not self.levels:
            return 0
        useful: set[int] = set()
        for (gpu_type, level, gpp), pods in waiting.items():
            useful.update(id(d) for d in self._domains(gpu_type, level) if d.holds(pods, gpp))
        levels = sorted({level for _, level, _ in waiting})
        return sum(d.free_gpus for d in self.level_domains[-1]
                   if not any(id(self.groups[d.nodes[0]][1 + at]) in useful for at in levels))

    def _fill(self, fitting: list[_Domain], pods: int, gpus_per_pod: int) -> Placement:
        """Place the gang in one of `fitting` (each holds it) by the cluster's packing."""
        if self.packing is Packing.BEST_FIT:
            domain = min(fitting, key=lambda d: d.free_gpus)
            placement = self._select_best_fit(domain, pods, gpus_per_pod)
        elif self.packing is Packing.SPREAD:
            domain = max(fitting, key=lambda d: d.free_gpus)
            return self._place_spread(domain, pods, gpus_per_pod)
        else:
            domain = fitting[0]
            placement = self._select_first_fit(domain, pods, gpus_per_pod)
        for node, n in placement:
            self._set_free(node, self.free[node] - n * gpus_per_pod)
        return placement

    def reserve(self, placement: Placement, gpus_per_pod: int) -> None:
        """Take exactly these pods' GPUs (a placement released a moment ago)."""
        for node, n in placement:
            self._set_free(node, self.free[node] - n * gpus_per_pod)

    def release(self, placement: Placement, gpus_per_pod: int) -> None:
        for node, n in placement:
            self._set_free(node, self.free[node] + n * gpus_per_pod)

    def fail_node(self, node: int) -> None:
        """Take a node down; the caller releases the pods that ran on it."""
        for domain in self.groups[node]:
            del domain.buckets[self.free[node]][node]
            domain.free_gpus -= self.free[node]
        self.free_gpus -= self.free[node]
        self.total_gpus -= self.capacity[node]
        self.up[node] = False

    def repair_node(self, node: int) -> None:
        if self.free[node] != self.capacity[node]:
            raise ValueError(f"node {node} still has pods; release them before repairing it")
        self.up[node] = True
        for domain in self.groups[node]:
            domain.buckets[self.free[node]][node] = None
            domain.free_gpus += self.free[node]
        self.free_gpus += self.free[node]
        self.total_gpus += self.capacity[node]

    def fragmented_gpus(self, smallest_pending_pod: Mapping[str | None, int]) -> int:
        """Free GPUs that no pending gang can use: on nodes with less room than the smallest pending
        pod that may go to that node's GPU type (key None: pods that take any type)."""
        if not smallest_pending_pod:
            return 0
        anywhere = smallest_pending_pod.get(None)
        total = 0
        for d in self.domains:
            sizes = [s for s in (anywhere, smallest_pending_pod.get(d.gpu_type)) if s is not None]
            smallest = min(sizes) if sizes else len(d.buckets)
            total += sum(k * len(d.buckets[k]) for k in range(1, min(smallest, len(d.buckets))))
        return total

    def _domains(self, gpu_type: str | None, level: int | None = None) -> list[_Domain]:
        domains = self.domains if level is None else self.level_domains[level]
        return domains if gpu_type is None else [d for d in domains if d.gpu_type == gpu_type]

    def _set_free(self, node: int, free: int) -> None:
        old = self.free[node]
        self.free[node] = free
        self._rooms[node] = None
        if not self.up[node]:
            return
        for domain in self.groups[node]:
            del domain.buckets[old][node]
            domain.buckets[free][node] = None
            domain.free_gpus += free - old
        self.free_gpus += free - old

    @staticmethod
    def _select_best_fit(domain: _Domain, pods: int, gpus_per_pod: int) -> Placement:
        placement: Placement = []
        remaining = pods
        for k in range(gpus_per_pod, len(domain.buckets)):
            per_node = k // gpus_per_pod
            for node in domain.buckets[k]:
                n = min(per_node, remaining)
                placement.append((node, n))
                remaining -= n
                if not remaining:
                    return placement
        raise AssertionError("slots said the gang fits")

    def _place_spread(self, domain: _Domain, pods: int, gpus_per_pod: int) -> Placement:
        """Pod by pod (as the scheduler assumes them), each on a node with the most free GPUs."""
        rng = self._rng
        on: dict[int, int] = {}
        buckets = domain.buckets
        for _ in range(pods):
            k = len(buckets) - 1
            while not buckets[k]:
                k -= 1
            if k < gpus_per_pod:
                raise AssertionError("slots said the gang fits")
            nodes = buckets[k]
            node = next(iter(nodes)) if len(nodes) == 1 else rng.choice(list(nodes))
            self._set_free(node, self.free[node] - gpus_per_pod)
            on[node] = on.get(node, 0) + 1
        return list(on.items())

    def _select_first_fit(self, domain: _Domain, pods: int, gpus_per_pod: int) -> Placement:
        placement: Placement = []
        remaining = pods
        for node in domain.nodes:
            n = min(self.free[node] // gpus_per_pod, remaining) if self.up[node] else 0
            if n:
                placement.append((node, n))
                remaining -= n
                if not remaining:
                    return placement
        raise AssertionError("slots said the gang fits")
