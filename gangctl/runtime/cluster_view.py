"""What gangctl's own topology placement reads besides its caches: the cluster's topology and, when a
gang is about to be placed, every Node and every pod bound to one.

- The topology is the ConfigMap gangctl-system/gangctl-topology (key `topology.yaml`) that
  `gangctl policy apply` writes from the policy's `topology:` section, read from the informer the
  quota gate already keeps on gangctl-system; parsed once per version. An invalid one is logged and
  treated as absent (no gang is placed by topology) rather than stopping the controller.
- Nodes and pods are listed only when a decision asks (`Plan.wants_nodes`: a gang with a placement
  intent whose backend cannot place it), in pages, pods by field selector (bound, not finished), and reused for `max_age` seconds so a burst of gangs costs
  one listing. Gangs gangctl pinned within one listing are counted by their reservations
  (`placement.pinned_gangs`); pods bound by others since are not seen until the next listing: such
  a gang may be refused by its scheduler and is placed again (documented in docs/topology.md). A
  listing never outlives capacity the controller saw freed (`forget`): its pods finished or
  deleted, its gang objects deleted. Reused after that, it would count the freed nodes as taken
  and send the next gang elsewhere (a packed gang to the emptier rack, a rack gang to wait).
"""
from __future__ import annotations

import asyncio
import logging
import time

from gangctl.api.resources import NODES, PODS
from gangctl.kube.client import Kube
from gangctl.kube.informer import Informer
from gangctl.model.topology import Topology
from gangctl.plugins.quota_objects import POLICY_NAMESPACE, TOPOLOGY_CONFIGMAP, topology_of
from gangctl.policy.decide import ClusterView

log = logging.getLogger(__name__)

BOUND_UNFINISHED = "spec.nodeName!=,status.phase!=Succeeded,status.phase!=Failed"


class TopologySource:
    """The cluster's topology from the ConfigMap, parsed once per resourceVersion."""

    def __init__(self, configmaps: Informer):
        self.configmaps = configmaps
        self._seen: tuple[str, Topology | None] = ("", None)

    def __call__(self) -> Topology | None:
        cm = self.configmaps.get(f"{POLICY_NAMESPACE}/{TOPOLOGY_CONFIGMAP}")
        if cm is None:
            return None
        version = cm["metadata"].get("resourceVersion", "")
        if version != self._seen[0]:
            self._seen = (version, _parse(cm))
        return self._seen[1]


def _parse(cm: dict) -> Topology | None:
    try:
        return topology_of(cm)
    except ValueError as err:
        log.error("%s (no gang is placed by topology until it is)", err)
        return None


class ClusterLister:
    """Nodes and bound unfinished pods, listed on demand and shared for `max_age` seconds, or until
    capacity is freed (`forget`)."""

    def __init__(self, kube: Kube, max_age: float = 2.0):
        self.kube = kube
        self.max_age = max_age
        self._view: tuple[float, int, ClusterView] | None = None   # listed at (monotonic time, generation)
        self._generation = 0
        self._lock = asyncio.Lock()

    def forget(self) -> None:
        """Capacity was freed: a listing begun before now is not reused (one in flight included)."""
        self._generation += 1

    async def __call__(self) -> ClusterView:
        async with self._lock:
            if (self._view is None or self._view[1] != self._generation
                    or time.monotonic() - self._view[0] > self.max_age):
                generation = self._generation
                nodes = [n async for page in self.kube.list_pages(NODES.path()) for n in page["items"]]
                pods = [p async for page in self.kube.list_pages(PODS.path(), field_selector=BOUND_UNFINISHED)
                        for p in page["items"]]
                self._view = (time.monotonic(), generation, ClusterView(tuple(nodes), tuple(pods)))
            return self._view[2]
