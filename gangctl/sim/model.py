"""The simulated cluster: GPU nodes in pools (GPU type, zone), and all-or-nothing gang placement.

A gang is `pods` pods of `gpus_per_pod` GPUs each, all on one GPU type (and in one zone when
`same_zone`); several pods of a gang may share a node. Placement is all-or-nothing: either every
pod gets a node or nothing changes. Only GPUs are placed; CPU and memory count against quota only.

Nodes of a placement domain sit in buckets by free GPUs, so the feasibility check costs
O(GPUs per node) and best-fit placement touches only the nodes it uses.
"""
from __future__ import annotations

import random
from dataclasses import dataclass
from enum import Enum
from typing import Mapping


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


Placement = list[tuple[int, int]]   # (node index, pods on it)


class _Domain:
    """Nodes a gang may span: one GPU type (and one zone when gangs stay in a zone)."""

    __slots__ = ("gpu_type", "nodes", "buckets", "free_gpus")

    def __init__(self, gpu_type: str, max_gpus: int) -> None:
        self.gpu_type = gpu_type
        self.nodes: list[int] = []
        self.buckets: list[dict[int, None]] = [{} for _ in range(max_gpus + 1)]  # free GPUs -> nodes
        self.free_gpus = 0

    def slots(self, gpus_per_pod: int) -> int:
        return sum(len(self.buckets[k]) * (k // gpus_per_pod) for k in range(gpus_per_pod, len(self.buckets)))


class Cluster:
    def __init__(self, pools: list[NodePool], packing: Packing = Packing.BEST_FIT, same_zone: bool = False,
                 seed: int = 0) -> None:
        if not pools or any(p.nodes < 0 or p.gpus_per_node < 1 for p in pools):
            raise ValueError("a cluster needs node pools with at least 1 GPU per node")
        self.packing = packing
        self._rng = random.Random(seed) if packing is Packing.SPREAD else None   # spread's ties
        max_gpus = max(p.gpus_per_node for p in pools)
        self.max_gpus_per_node = max_gpus
        self.capacity: list[int] = []
        self.free: list[int] = []
        self.up: list[bool] = []
        self.domain_of: list[_Domain] = []
        self.domains: list[_Domain] = []
        by_key: dict[tuple[str, str], _Domain] = {}
        for pool in pools:
            key = (pool.gpu_type, pool.zone if same_zone else "")
            domain = by_key.get(key)
            if domain is None:
                domain = by_key[key] = _Domain(pool.gpu_type, max_gpus)
                self.domains.append(domain)
            for _ in range(pool.nodes):
                node = len(self.capacity)
                self.capacity.append(pool.gpus_per_node)
                self.free.append(pool.gpus_per_node)
                self.up.append(True)
                self.domain_of.append(domain)
                domain.nodes.append(node)
                domain.buckets[pool.gpus_per_node][node] = None
                domain.free_gpus += pool.gpus_per_node
        self.gpu_types = sorted({p.gpu_type for p in pools})
        self.total_gpus = sum(self.capacity)   # GPUs on nodes that are up
        self.free_gpus = self.total_gpus       # free GPUs on nodes that are up

    @property
    def busy_gpus(self) -> int:
        return self.total_gpus - self.free_gpus

    def largest_gang(self, gpus_per_pod: int, gpu_type: str | None = None) -> int:
        """Most pods of this size an empty cluster could hold in one domain (0: never placeable)."""
        best = 0
        for d in self._domains(gpu_type):
            best = max(best, sum(self.capacity[n] // gpus_per_pod for n in d.nodes))
        return best

    def place(self, pods: int, gpus_per_pod: int, gpu_type: str | None = None, near: int | None = None) -> Placement | None:
        """Place all pods or none, on one GPU type (or in the domain of node `near`); say where."""
        if pods * gpus_per_pod > self.free_gpus or gpus_per_pod > self.max_gpus_per_node:
            return None
        domains = [self.domain_of[near]] if near is not None else self._domains(gpu_type)
        fitting = [d for d in domains if d.free_gpus >= pods * gpus_per_pod and d.slots(gpus_per_pod) >= pods]
        if not fitting:
            return None
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
        domain = self.domain_of[node]
        del domain.buckets[self.free[node]][node]
        domain.free_gpus -= self.free[node]
        self.free_gpus -= self.free[node]
        self.total_gpus -= self.capacity[node]
        self.up[node] = False

    def repair_node(self, node: int) -> None:
        if self.free[node] != self.capacity[node]:
            raise ValueError(f"node {node} still has pods; release them before repairing it")
        domain = self.domain_of[node]
        self.up[node] = True
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

    def _domains(self, gpu_type: str | None) -> list[_Domain]:
        return self.domains if gpu_type is None else [d for d in self.domains if d.gpu_type == gpu_type]

    def _set_free(self, node: int, free: int) -> None:
        old = self.free[node]
        self.free[node] = free
        if not self.up[node]:
            return
        domain = self.domain_of[node]
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
