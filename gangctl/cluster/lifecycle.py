"""`gangctl cluster up|down|status|env`: build, start, prepare and stop the local cluster."""
from __future__ import annotations

import asyncio
import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

from gangctl.api.resources import NATIVE_POD_GROUPS
from gangctl.api.runtime import GANG_BACKENDS
from gangctl.cluster import setup
from gangctl.cluster.build import ensure_built
from gangctl.cluster.local import ClusterError, LocalCluster, coscheduling_crd
from gangctl.config import ClusterSettings
from gangctl.kube.client import Kube
from gangctl.processes import running, wait_http_ok

Say = Callable[[str], None]
BuildProgress = Callable[[str, int, int, str], None]


@dataclass(frozen=True)
class UpOptions:
    gpu_nodes: int = 4
    gpus_per_node: int = 8
    process_nodes: int = 0  # node agents: pods bound to them run as real local processes
    scheduler: str = "coscheduling"  # or "volcano" / "kueue" / "native": started beside the base cluster
    topology: setup.Shape | None = None  # block and rack labels on the GPU nodes (then gpu_nodes = its nodes)


def local_cluster(settings: ClusterSettings, progress: BuildProgress | None = None) -> LocalCluster:
    bin_dir = ensure_built(settings.integrations_dir, settings.bin_root, progress)
    return LocalCluster(settings, bin_dir)


def up(settings: ClusterSettings, options: UpOptions, say: Say, progress: BuildProgress | None = None) -> LocalCluster:
    from gangctl.cluster import schedulers

    cluster = local_cluster(settings, progress)
    scheduler = options.scheduler
    created = not cluster.exists()
    if not created:
        say(f"cluster {settings.cluster_name!r} exists; starting its components")
        if scheduler == "coscheduling" and schedulers.chosen(settings) != "coscheduling":
            # Its webhooks (Kueue) or queues (Volcano) are in the cluster: restart what it was made with.
            scheduler = schedulers.chosen(settings)
            say(f"it was brought up with --scheduler {scheduler}; starting {scheduler} again")
        cluster.start()
    else:
        say("starting etcd, kube-apiserver, kube-controller-manager, kube-scheduler (coscheduling), kwok-controller")
        if scheduler == "native":  # the apiserver serves the gang API from its first start
            cluster = dataclasses.replace(cluster, native_gangs=True)
        cluster.create()
    asyncio.run(prepare(cluster, options, say))
    if scheduler != "coscheduling":
        start_scheduler(settings, cluster.kubeconfig, scheduler, say, progress)
    if created:
        # kube-controller-manager started before the CRDs existed and rediscovers kinds only every
        # 30 s: until then its garbage collector cannot look up a TrainJob, so the Job of a TrainJob
        # deleted in that window stays, retried with a growing backoff (seen as a 30 s+ wait in CI).
        # Restarted once, it knows every kind installed above from its first sync.
        cluster.restart_component("kube-controller-manager")
        say("kube-controller-manager restarted to learn the kinds installed after it started")
    if options.process_nodes:
        start_process_nodes(settings, cluster.kubeconfig, options.process_nodes, say, progress)
    return cluster


def process_node_state(settings: ClusterSettings) -> Path:
    return settings.cache_dir / "nodes" / settings.cluster_name


def start_process_nodes(settings: ClusterSettings, kubeconfig: Path, count: int, say: Say,
                        progress: BuildProgress | None = None, timeout: float = 60, *,
                        state: Path | None = None, prefix: str = "process-node", first_index: int = 0) -> list[str]:
    """CoreDNS (built once from integrations/coredns), the pod network and `count` node agents."""
    from gangctl.cluster.build import ensure_coredns
    from gangctl.nodeagent import launch

    coredns = ensure_coredns(settings.integrations_dir, settings.bin_root, progress)
    state = state or process_node_state(settings)
    names = launch.start(settings.cluster_name, kubeconfig, count, state, coredns,
                         prefix=prefix, first_index=first_index)

    async def wait() -> None:
        kube = await Kube.connect(kubeconfig)
        try:
            async def ready() -> bool:
                nodes = (await kube.get("/api/v1/nodes", labelSelector="gangctl.io/process-node=true"))["items"]
                up = {n["metadata"]["name"] for n in nodes
                      if any(c["type"] == "Ready" and c["status"] == "True" for c in n["status"].get("conditions", []))}
                return set(names) <= up
            await setup.wait_for(ready, timeout, f"{count} process nodes to be Ready")
        finally:
            await kube.close()
    asyncio.run(wait())
    say(f"{count} process nodes Ready ({', '.join(names)}); logs in {state / 'logs'}")
    return names


async def prepare(cluster: LocalCluster, options: UpOptions, say: Say) -> None:
    settings = cluster.settings
    kube = await Kube.connect(cluster.kubeconfig)
    try:
        crds = setup.load_manifests(settings.deploy_dir / "crds") + [coscheduling_crd(settings.integrations_dir)]
        names = await setup.install_crds(kube, crds)
        say(f"installed {len(names)} CRDs: {', '.join(names)}")
        # The version ConfigMap the kubeflow SDK reads (TrainerClient warns on every call without it),
        # readable by every authenticated user, as `kubectl apply -k deploy/` installs it.
        await setup.apply_manifests(kube, setup.load_manifests(settings.deploy_dir / "base" / "kubeflow"))
        port = await setup.ensure_host_controller_service(kube)
        say(f"trainer pods report progress through Service gangctl-local/host-controller to 127.0.0.1:{port}")
        runtimes = setup.load_manifests(settings.deploy_dir / "runtimes")
        say(f"applied ClusterTrainingRuntimes: {', '.join(await setup.apply_cluster_runtimes(kube, runtimes))}")
        if options.gpu_nodes:
            await setup.create_gpu_nodes(kube, options.gpu_nodes, options.gpus_per_node, shape=options.topology)

            async def all_ready() -> bool:
                return await setup.count_ready_nodes(kube) >= options.gpu_nodes
            await setup.wait_for(all_ready, 120, f"{options.gpu_nodes} GPU nodes to be Ready")
            say(f"{options.gpu_nodes} KWOK GPU nodes Ready, {options.gpus_per_node} x nvidia.com/gpu each"
                + (f", in {options.topology.blocks} block(s) of {options.topology.racks} rack(s) of "
                   f"{options.topology.hosts} host(s) (labels {', '.join(setup.TOPOLOGY_LABELS)})"
                   if options.topology else ""))
    finally:
        await kube.close()


def down(settings: ClusterSettings, say: Say) -> None:
    from gangctl.nodeagent import launch

    from gangctl.nodeagent import network

    launch.stop(settings.cluster_name, process_node_state(settings))  # agents first: they kill their pods
    stop_scheduler(settings, say)
    network.delete_cluster_network(settings.cluster_name)  # whatever else ran in the pod network
    cluster = LocalCluster(settings, Path("/nonexistent"))
    if not cluster.exists():
        say(f"no cluster {settings.cluster_name!r}; nothing to do")
        return
    kwokctl = _any_kwokctl(settings)
    if kwokctl is None:
        raise ClusterError("kwokctl binary not found in the cache; run `gangctl cluster up` once to build it")
    LocalCluster(settings, kwokctl).delete()
    say(f"cluster {settings.cluster_name!r} deleted; no component is running")


def _any_kwokctl(settings: ClusterSettings) -> Path | None:
    for folder in sorted(settings.bin_root.glob("*"), key=lambda p: p.stat().st_mtime, reverse=True):
        if (folder / "kwokctl").exists():
            return folder
    return None


def status(settings: ClusterSettings) -> dict:
    cluster = LocalCluster(settings, Path("/nonexistent"))
    info: dict = {"name": settings.cluster_name, "exists": cluster.exists(),
                  "kubeconfig": str(cluster.kubeconfig), "components": cluster.components()}
    from gangctl.cluster import schedulers

    info["scheduler"] = schedulers.chosen(settings)
    info["components"] += schedulers.components(schedulers.state_dir(settings))
    info["running"] = bool(info["components"]) and all(c["running"] for c in info["components"])
    if info["running"]:
        info["nodes"] = asyncio.run(_node_summary(cluster.kubeconfig))
    return info


async def _node_summary(kubeconfig: Path) -> dict:
    kube = await Kube.connect(kubeconfig)
    try:
        return {"kwok_ready": await setup.count_ready_nodes(kube, "type=kwok")}
    finally:
        await kube.close()


def start_scheduler(settings: ClusterSettings, kubeconfig: Path, scheduler: str, say: Say,
                    progress: BuildProgress | None = None, timeout: float = 120) -> None:
    """Build (once) and start Kueue, Volcano, KAI or the native gang scheduler beside the cluster, with
    its CRDs (and webhooks)."""
    from gangctl.cluster import kai, kueue, native, schedulers, volcano
    from gangctl.cluster.build import EXTRA_MODULES, ensure_module

    if scheduler not in GANG_BACKENDS:   # the local cluster runs each gang backend's scheduler
        raise ClusterError(f"unknown scheduler {scheduler!r}; choose one of {', '.join(GANG_BACKENDS)}")
    bin_dir = ensure_module(EXTRA_MODULES[scheduler], settings.integrations_dir, settings.bin_root, progress)
    state = schedulers.state_dir(settings)
    schedulers.stop(state)  # a restart of an existing cluster: never two copies
    schedulers.record_choice(settings, scheduler)
    if scheduler == "native":
        if not asyncio.run(_serves(kubeconfig, f"/apis/{NATIVE_POD_GROUPS.group}/{NATIVE_POD_GROUPS.version}")):
            raise ClusterError(f"cluster {settings.cluster_name!r} was created without --scheduler native, so its "
                               f"apiserver does not serve {NATIVE_POD_GROUPS.group}/{NATIVE_POD_GROUPS.version}: "
                               "`gangctl cluster down`, then `gangctl cluster up --scheduler native`")
        proc, ports = native.process(settings, bin_dir, kubeconfig)
        pid = schedulers.spawn(state, proc)
        wait_http_ok(f"https://127.0.0.1:{ports['health']}/healthz", timeout, "the native gang scheduler to be healthy",
                     lambda: running(pid))
        say(f"kube-scheduler {native.NATIVE_SCHEDULER!r} running with GangScheduling (pid {pid}); "
            f"log {state / 'logs' / (proc.name + '.log')}")
    elif scheduler == "kueue":
        proc, ports = kueue.process(settings, bin_dir, kubeconfig)
        ca = (state / "kueue-certs" / "tls.crt").read_bytes()
        crds = kueue.crds(settings.integrations_dir, ports["webhook"], ca)   # with their conversion webhook
        asyncio.run(_install(kubeconfig, crds, namespaces=[kueue.NAMESPACE]))
        say(f"installed {len(crds)} Kueue CRDs")
        pid = schedulers.spawn(state, proc)
        wait_http_ok(f"http://127.0.0.1:{ports['health']}/readyz", timeout, "kueue to be ready",
                                lambda: running(pid))
        hooks = kueue.webhook_configurations(settings.integrations_dir, ports["webhook"], ca)
        asyncio.run(_install(kubeconfig, [], webhooks=hooks))
        say(f"kueue running (pid {pid}); webhooks on https://127.0.0.1:{ports['webhook']}; "
            f"log {state / 'logs' / 'kueue.log'}")
    elif scheduler == "kai":
        procs, ports = kai.processes(settings, bin_dir, kubeconfig)
        crds = kai.crds(settings.integrations_dir)
        asyncio.run(_install(kubeconfig, crds, namespaces=[kai.NAMESPACE], objects=kai.default_queues()))
        say(f"installed {len(crds)} KAI CRDs and its default queues")
        started = {p.name: schedulers.spawn(state, p) for p in procs}
        # Its health probe serves no checks (404): its metrics endpoint answers once its manager runs.
        wait_http_ok(f"http://127.0.0.1:{ports['binder_metrics']}/metrics", timeout, "kai-binder to serve",
                     lambda: running(started["kai-binder"]))
        wait_http_ok(f"http://127.0.0.1:{ports['scheduler_metrics']}/metrics", timeout, "kai-scheduler to serve",
                     lambda: running(started["kai-scheduler"]))
        say(f"KAI Scheduler running ({', '.join(f'{n} pid {p}' for n, p in started.items())}); "
            f"logs in {state / 'logs'}")
    else:
        procs, ports = volcano.processes(settings, bin_dir, kubeconfig)
        crds = volcano.crds(settings.integrations_dir)
        asyncio.run(_install(kubeconfig, crds))
        say(f"installed {len(crds)} Volcano CRDs")
        started = {p.name: schedulers.spawn(state, p) for p in procs}
        wait_http_ok(f"http://127.0.0.1:{ports['scheduler_health']}/healthz", timeout,
                                "vc-scheduler to be healthy", lambda: running(started["vc-scheduler"]))
        asyncio.run(_wait_default_queue(kubeconfig, timeout))
        say(f"volcano running (vc-scheduler pid {started['vc-scheduler']}, vc-controller-manager pid "
            f"{started['vc-controller-manager']}); Queue 'default' exists; logs in {state / 'logs'}")


async def _serves(kubeconfig: Path, path: str) -> bool:
    kube = await Kube.connect(kubeconfig)
    try:
        return await kube.exists(path)
    finally:
        await kube.close()


async def _install(kubeconfig: Path, crds: list[dict], *, namespaces: Sequence[str] = (),
                   webhooks: Sequence[dict] = (), objects: Sequence[dict] = ()) -> None:
    from gangctl.api.resources import NAMESPACES

    kube = await Kube.connect(kubeconfig)
    try:
        for ns in namespaces:
            await kube.apply(NAMESPACES.path(name=ns), {"apiVersion": "v1", "kind": "Namespace",
                                                         "metadata": {"name": ns}}, setup.FIELD_MANAGER)
        if crds:
            await setup.install_crds(kube, crds)
        await setup.apply_webhooks(kube, webhooks)
        await setup.apply_manifests(kube, objects)
    finally:
        await kube.close()


async def _wait_default_queue(kubeconfig: Path, timeout: float) -> None:
    from gangctl.plugins.volcano import VOLCANO_QUEUES

    kube = await Kube.connect(kubeconfig)
    try:
        await setup.wait_for(lambda: kube.exists(VOLCANO_QUEUES.path(name="default")), timeout,
                             "Volcano's default Queue")
    finally:
        await kube.close()


def stop_scheduler(settings: ClusterSettings, say: Say) -> None:
    import shutil

    from gangctl.cluster import schedulers

    state = schedulers.state_dir(settings)
    stopped = schedulers.stop(state)
    if stopped:
        say(f"stopped {', '.join(stopped)}")
    shutil.rmtree(state, ignore_errors=True)
