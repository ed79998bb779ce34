"""What a fresh local cluster needs before gangctl runs: CRDs, the shipped runtimes, fake GPU nodes."""
from __future__ import annotations

import asyncio
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable, Sequence

import yaml

from gangctl.api.resources import CLUSTER_TRAINING_RUNTIMES, CRDS, NODES, Resource, object_path
from gangctl.cluster.local import KWOK_NODE_ANNOTATION, KWOK_NODE_TAINT
from gangctl.kube.client import ApiError, Kube
from gangctl.model.topology import HOSTNAME, level_label

FIELD_MANAGER = "gangctl-cluster"
GPU_PRODUCT = "NVIDIA-H100-80GB-HBM3"
ZONES = ("zone-a", "zone-b", "zone-c", "zone-d")


def load_manifests(folder: Path) -> list[dict]:
    docs: list[dict] = []
    for path in sorted(folder.glob("*.yaml")):
        docs += [d for d in yaml.safe_load_all(path.read_text()) if d]
    return docs


async def install_crds(kube: Kube, crds: Iterable[dict], timeout: float = 60) -> list[str]:
    names = []
    for crd in crds:
        await kube.apply(CRDS.path(name=crd["metadata"]["name"]), crd, FIELD_MANAGER)
        names.append(crd["metadata"]["name"])
    for name in names:
        await _wait_established(kube, name, timeout)
    return names


async def _wait_established(kube: Kube, name: str, timeout: float) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        crd = await kube.get(CRDS.path(name=name))
        conds = {c["type"]: c["status"] for c in (crd.get("status") or {}).get("conditions") or []}
        if conds.get("Established") == "True":
            return
        if loop.time() > deadline:
            raise TimeoutError(f"CRD {name} not Established after {timeout:.0f}s: {conds}")
        await asyncio.sleep(0.2)


async def apply_webhooks(kube: Kube, hooks: Iterable[dict]) -> None:
    """Server-side apply Validating/MutatingWebhookConfigurations (cluster-scoped, plural of their kind)."""
    for hook in hooks:
        kind = hook["kind"]
        res = Resource("admissionregistration.k8s.io", "v1", kind.lower() + "s", kind, namespaced=False)
        await kube.apply(res.path(name=hook["metadata"]["name"]), hook, FIELD_MANAGER)


async def apply_manifests(kube: Kube, docs: Iterable[dict]) -> list[str]:
    """Server-side apply plain manifests (of `APPLIED_KINDS`), in order; `Kind/name` of each."""
    applied = []
    for doc in docs:
        await kube.apply(object_path(doc), doc, FIELD_MANAGER)
        applied.append(f"{doc['kind']}/{doc['metadata']['name']}")
    return applied


async def apply_cluster_runtimes(kube: Kube, runtimes: Iterable[dict]) -> list[str]:
    names = []
    for rt in runtimes:
        await kube.apply(CLUSTER_TRAINING_RUNTIMES.path(name=rt["metadata"]["name"]), rt, FIELD_MANAGER)
        names.append(rt["metadata"]["name"])
    return names


# The local cluster's topology labels, widest level first (`gangctl cluster up --topology`): a block
# (e.g. an InfiniBand spine), a rack (a leaf switch or NVLink domain), and the host, whose label every
# node carries anyway and which Kueue's TAS asks as the lowest level.
BLOCK_LABEL = level_label("block")
RACK_LABEL = level_label("rack")
HOST_LABEL = HOSTNAME
TOPOLOGY_LABELS = (BLOCK_LABEL, RACK_LABEL, HOST_LABEL)


@dataclass(frozen=True)
class Shape:
    """BLOCKS x RACKS (per block) x HOSTS (per rack): the GPU nodes' place in the local topology."""

    blocks: int
    racks: int
    hosts: int

    @property
    def nodes(self) -> int:
        return self.blocks * self.racks * self.hosts

    def labels(self, index: int) -> dict[str, str]:
        """The block and rack labels of GPU node `index` (hosts fill a rack, racks fill a block, in order).
        Rack names are unique in the cluster (`block-1-rack-0`), so a rack needs no block to be named."""
        block, rest = divmod(index, self.racks * self.hosts)
        return {BLOCK_LABEL: f"block-{block}", RACK_LABEL: f"block-{block}-rack-{rest // self.hosts}"}

    def __str__(self) -> str:
        return f"{self.blocks}x{self.racks}x{self.hosts}"


def parse_shape(text: str) -> Shape:
    """"2x4x8" -> Shape(2, 4, 8); a ValueError that shows the expected form otherwise."""
    try:
        numbers = [int(p) for p in text.lower().split("x")]
    except ValueError:
        numbers = []
    if len(numbers) != 3 or min(numbers) < 1:
        raise ValueError(f"--topology {text!r}: give BLOCKSxRACKSxHOSTS, three positive numbers, e.g. 2x4x8 "
                         "(2 blocks of 4 racks of 8 hosts: 64 GPU nodes)")
    return Shape(*numbers)


def gpu_node(index: int, gpus: int, *, cpu: int = 96, memory_gi: int = 1024, prefix: str = "gpu-node",
             shape: Shape | None = None, declared_features: Sequence[str] = ()) -> dict:
    """A KWOK-managed Node with `gpus` nvidia.com/gpu, labelled like a real GPU node and tainted as KWOK's
    fake nodes are (`kwok.x-k8s.io/node=fake:NoSchedule`): only pods that tolerate it land here. With a
    `shape`, it also carries its block and rack labels; with `declared_features`, it declares them in
    status.declaredFeatures as a 1.36 kubelet does (KWOK carries out RestartAllContainers with gangctl's
    own stage, integrations/kwok/stages/)."""
    allocatable = {"cpu": str(cpu), "memory": f"{memory_gi}Gi", "pods": "110", "nvidia.com/gpu": str(gpus)}
    name = f"{prefix}-{index:03d}"
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "annotations": {KWOK_NODE_ANNOTATION[0]: KWOK_NODE_ANNOTATION[1], "node.alpha.kubernetes.io/ttl": "0"},
            "labels": {
                "type": "kwok",
                HOST_LABEL: name,
                "kubernetes.io/os": "linux",
                "kubernetes.io/arch": "amd64",
                "nvidia.com/gpu.product": GPU_PRODUCT,
                "nvidia.com/gpu.count": str(gpus),
                "topology.kubernetes.io/zone": ZONES[index % len(ZONES)],
                "gangctl.io/node-kind": "kwok-gpu",
                **(shape.labels(index) if shape else {}),
            },
        },
        "spec": {"taints": [dict(KWOK_NODE_TAINT)]},
        "status": {"capacity": allocatable, "allocatable": allocatable,
                   **({"declaredFeatures": list(declared_features)} if declared_features else {})},
    }


async def create_gpu_nodes(kube: Kube, count: int, gpus: int, on_progress: Callable[[int], None] | None = None,
                           concurrency: int = 16, shape: Shape | None = None,
                           declared_features: Sequence[str] = ()) -> list[str]:
    sem = asyncio.Semaphore(concurrency)
    done = 0

    async def one(i: int) -> str:
        nonlocal done
        node = gpu_node(i, gpus, shape=shape, declared_features=declared_features)
        async with sem:
            try:
                await kube.create(NODES.path(), node)
            except ApiError as err:
                if not err.conflict:
                    raise
        done += 1
        if on_progress:
            on_progress(done)
        return node["metadata"]["name"]

    return list(await asyncio.gather(*(one(i) for i in range(count))))


async def count_ready_nodes(kube: Kube, label_selector: str = "type=kwok") -> int:
    nodes = await kube.get(NODES.path(), labelSelector=label_selector)
    ready = 0
    for node in nodes.get("items", []):
        conds = {c["type"]: c["status"] for c in (node.get("status") or {}).get("conditions") or []}
        ready += conds.get("Ready") == "True"
    return ready


async def wait_for(check: Callable[[], "asyncio.Future[bool]"], timeout: float, what: str, interval: float = 0.25) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not await check():
        if loop.time() > deadline:
            raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what}")
        await asyncio.sleep(interval)



async def ensure_host_controller_service(kube: Kube) -> int:
    """The Service standing for a controller on the host (gangctl.kube.host_controller): namespace, a
    selector-less Service with a ClusterIP, and the host port trainer pods' reports are relayed to,
    chosen once and kept for the cluster's life. Returns that port."""
    from gangctl.kube import host_controller as host
    from gangctl.plugins.quota_objects import POLICY_NAMESPACE
    from gangctl.processes import free_port

    ns, name = host.NAMESPACE, host.SERVICE
    # ... and the controller's own namespace, as `kubectl apply -k deploy/` makes it: the Secret of
    # the progress endpoint's certificate, the leader Lease and the quota policy live there.
    for namespace in (ns, POLICY_NAMESPACE):
        try:
            await kube.create("/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace",
                                                     "metadata": {"name": namespace}})
        except ApiError as err:
            if not err.conflict:
                raise
    path = f"/api/v1/namespaces/{ns}/services"
    try:
        svc = await kube.get(f"{path}/{name}")
    except ApiError as err:
        if not err.not_found:
            raise
        svc = await kube.create(path, {
            "apiVersion": "v1", "kind": "Service",
            "metadata": {"name": name, "namespace": ns, "labels": dict([host.LABEL]),
                         "annotations": {host.HOST_PORT_ANNOTATION: str(free_port())}},
            "spec": {"ports": [{"name": "trainer-status", "port": host.PORT, "protocol": "TCP"}]}})
    return int(svc["metadata"]["annotations"][host.HOST_PORT_ANNOTATION])
