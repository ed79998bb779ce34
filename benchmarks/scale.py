"""Scale beside Kubeflow Trainer (issue 12, item 10): one big gang, many small ones, a cold start.

    .venv/bin/python benchmarks/scale.py --json /tmp/scale.json                  # both sides, P1-P3, full size
    .venv/bin/python benchmarks/scale.py --only gangctl --json /tmp/scale.json   # one side (the JSON is merged)
    .venv/bin/python benchmarks/scale.py --report /tmp/scale.json                # tables, ratios, goals
    .venv/bin/python benchmarks/scale.py --gpu-nodes 200 --p1-pods 64 --p2-jobs 50 --p3-pods 2000   # small
    .venv/bin/python benchmarks/scale.py --scenarios p4 --rounds 1 --json /tmp/p4.json   # recovery only

Each side runs in a cluster of its own (`gangctl-bench-scale-gangctl`, `gangctl-bench-scale-trainer`:
the pinned kube-apiserver, kube-controller-manager, Coscheduling scheduler, etcd, KWOK GPU nodes), one
scenario after the other, and the cluster is deleted at the end (`--keep` leaves it up):

- **P1** one TrainJob of `--p1-pods` pods (8 GPUs each: a whole node) on `--gpu-nodes` nodes:
  first create -> all its pods created / bound. The *floor* (gangctl side, before the controller
  starts) creates the TrainJob and then, by hand, the same headless Service, PodGroup and Indexed
  Job gangctl would (built by gangctl's own pure functions), so it is the control plane's time
  with no controller at all; the floor's namespace is deleted before gangctl starts.
- **P2** `--p2-jobs` TrainJobs x `--p2-nodes` pods (1 GPU each) submitted in a burst: first create ->
  every child Job created (the throughput figure), and -> every pod Ready (from the Jobs'
  status.ready), if that comes within `--p2-settle` seconds.
- **P4** recovery (issue 38): `--p4-rounds` times, a fresh TrainJob of `--p1-pods` pods (8 GPUs each)
  runs with every pod Running; then one of its pods fails (KWOK's `pod-container-running-failed`
  stage, exit code 1; both runtimes have `failurePolicy.maxRestarts: 3`, node Jobs with
  `backoffLimit: 0` and pods with a 2 s termination grace, so a failed pod fails the attempt and the
  gang is recreated: gangctl deletes its
  node Job and makes it again, Trainer's JobSet restarts its Jobs). Time from the pod seen Failed
  to every pod of the new attempt Running, and to the new attempt's first pod created. On gangctl's
  cluster the same recovery is also measured in place (a runtime with `gangctl.io/restart: InPlace`,
  rounds alternating with recreate; the nodes then declare RestartAllContainersOnContainerExits and
  gangctl's own KWOK stage restarts every pod's containers at one moment): to every pod Running
  again with one restart more, and to the restart charged in the TrainJob's status. Each round's
  job is deleted (and its pods gone) before the next, so every failure is a first failure.
  `--record` with `--scenarios p4` alone publishes P4 (its medians are over `--p4-rounds`).
- **P3** cold start: the controller is stopped and started again, twice: with what P1 and P2
  left, and after filler pods bring the cluster to `--p3-pods` pods (created directly with a
  nodeName, so KWOK runs them without the scheduler; gangctl's pod template without the GPU request,
  labelled `gangctl.io/managed-by=gangctl` and a trainjob-name of their own, 8 per name, so
  gangctl's label-selected pod informer caches them). Time from process start to /readyz 200 (the
  peer: to its last "Starting workers" log line, i.e. every controller's cache synced; its /readyz
  answers before that), RSS at ready and once the work queue is empty, and the per-pod slope
  between the two restarts (bytes and ms per cached pod, extrapolated to `--extrapolate` pods).

Measured for every window: CPU of the controller(s) and of kube-apiserver, apiserver requests (all
clients: apiserver_request_total) and, from the apiserver's audit log (on for these clusters only:
Metadata level, every request but leases, nodes and pod status/binding), each client's own requests
by user agent (gangctl is `Python/... aiohttp/...`; this script sends its own user agent), so P1
lists gangctl's writes for its one TrainJob by verb and resource. The load average is recorded with
every result. KWOK nodes renew their Lease every `--node-lease-seconds`/4 (default 200 s, kwokctl's
own default: every 50 s, 100 Lease writes a second at 5,000 nodes) and kube-controller-manager's
node-monitor-grace-period is 240 s, not gangctl's fast-failure 20 s / 16 s (5,000 nodes would write
1,000 Leases a second, the kubelet's 40 s lease 500: most of what 2 cores can serve). Not a test:
nothing asserts.
"""
from __future__ import annotations

import argparse
import asyncio
import copy
import json
import os
import re
import statistics
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any, Callable

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from benchmarks import controller_peer as cp  # noqa: E402
from benchmarks.local import controller, own_cluster  # noqa: E402
from gangctl.api.resources import (CLUSTER_TRAINING_RUNTIMES, JOBS, NAMESPACES, NODES, POD_GROUPS, PODS,  # noqa: E402
                                   SERVICES, TRAINJOBS)
from gangctl.cluster import lifecycle, setup  # noqa: E402
from gangctl.harness import chaos, peer, results as published, rounds  # noqa: E402
from gangctl.cluster.local import LocalCluster, coscheduling_crd  # noqa: E402
from gangctl.config import ClusterSettings  # noqa: E402
from gangctl.kube.client import ApiError, Kube  # noqa: E402
from gangctl.plugins.coscheduling import POD_GROUP_LABEL  # noqa: E402
from gangctl.model.names import MANAGED_BY, MANAGER, REPLICATED_JOB, RESULT_FINALIZER, TRAINJOB_NAME  # noqa: E402
from gangctl.plugins.registry import backend_for  # noqa: E402
from gangctl.plugins.workload import IN_PLACE_FEATURE, headless_service, node_job, owner_reference  # noqa: E402
from gangctl.model.gang import size_gang  # noqa: E402
from gangctl.model.resolve import RESTART_ANNOTATION, resolve  # noqa: E402
from gangctl.processes import ControllerProcess  # noqa: E402

RUNTIME = "torch-kwok-gpu"
# P4's in-place side on gangctl's cluster: the same runtime, restarting its gang in place.
RUNTIME_IN_PLACE = "torch-kwok-gpu-in-place"
BENCH_AGENT = "gangctl-scale-bench"
SCHEDULER = "scheduler-plugins-scheduler"
TERMINATION_GRACE = 2   # P4's pods: see `restarting`
STATE = Path("/tmp/gangctl-bench-scale")
say = cp.say


# ---------- the cluster ----------------------------------------------------------------------

AUDIT_POLICY = {
    "apiVersion": "audit.k8s.io/v1", "kind": "Policy",
    "omitStages": ["RequestReceived", "ResponseStarted"],
    "rules": [
        {"level": "None", "resources": [{"group": "coordination.k8s.io", "resources": ["leases"]}]},
        {"level": "None", "resources": [{"group": "", "resources": ["nodes", "nodes/status",
                                                                    "pods/status", "pods/binding"]}]},
        {"level": "Metadata"},
    ],
}


@dataclass(frozen=True)
class ScaleCluster(LocalCluster):
    """The local cluster with an audit log and Kubernetes' default node heartbeat settings."""
    audit_policy: Path | None = None
    audit_log: Path | None = None
    node_lease_seconds: int = 200
    node_monitor_grace: str = "240s"

    def component_args(self, ports):  # noqa: ANN001, ANN201 - as LocalCluster's
        args = super().component_args(ports)
        args["kwok-controller"]["node-lease-duration-seconds"] = str(self.node_lease_seconds)
        args["kube-controller-manager"]["node-monitor-grace-period"] = self.node_monitor_grace
        if self.audit_policy is not None and self.audit_log is not None:
            args["kube-apiserver"].update({"audit-policy-file": str(self.audit_policy),
                                           "audit-log-path": str(self.audit_log),
                                           "audit-log-format": "json", "audit-log-maxsize": "0"})
        return args


class BenchKube(Kube):
    """The API session of this script: its own user agent, so the audit log tells it from gangctl;
    `accept` asks for another representation (metadata only, to count objects cheaply)."""
    accept: str | None = None

    async def _headers(self, content_type: str = "application/json") -> dict[str, str]:
        headers = await super()._headers(content_type)
        headers["User-Agent"] = BENCH_AGENT
        if self.accept:
            headers["Accept"] = self.accept
        return headers


METADATA_ONLY = "application/json;as=PartialObjectMetadataList;v=v1;g=meta.k8s.io,application/json"


def make_cluster(args: argparse.Namespace, side: str) -> Callable[[ClusterSettings], LocalCluster]:
    def make(settings: ClusterSettings) -> LocalCluster:
        STATE.mkdir(parents=True, exist_ok=True)
        policy = STATE / "audit-policy.json"
        policy.write_text(json.dumps(AUDIT_POLICY))
        log = STATE / f"{settings.cluster_name}-audit.log"
        log.unlink(missing_ok=True)
        bin_dir = lifecycle.local_cluster(settings).bin_dir
        cluster = ScaleCluster(settings, bin_dir, audit_policy=policy, audit_log=log,
                               node_lease_seconds=args.node_lease_seconds, node_monitor_grace=args.node_monitor_grace)
        started = time.monotonic()
        say(f"cluster {settings.cluster_name}: starting (audit log {log})")
        cluster.create()
        if side == "gangctl":
            asyncio.run(install_gangctl(settings))
        # P4 restarts in place: the nodes declare what a 1.36 kubelet carrying RestartAllContainers out does
        # (both sides alike; it only matters to pods with such a rule, which only gangctl's in-place side makes).
        declared = [IN_PLACE_FEATURE] if "p4" in args.scenarios.split(",") else []
        asyncio.run(make_nodes(cluster.kubeconfig, args.gpu_nodes, args.gpus_per_node, declared))
        if side == "peer":
            peer.start(settings, cluster.kubeconfig, say, progress=cp.build_progress)
            asyncio.run(cp.apply_runtime(cluster.kubeconfig, restarting(cp.with_kwok_delay(
                peer.runtime(settings.integrations_dir, name=RUNTIME)))))
        say(f"cluster {settings.cluster_name} ready with {args.gpu_nodes} GPU nodes in {time.monotonic() - started:.0f} s")
        return cluster
    return make


def restarting(runtime: dict, mode: str | None = None) -> dict:
    """The runtime whose gang is recreated when a pod fails (P4): node Jobs with backoffLimit 0 (a failed
    pod fails the attempt, not replaced by the Job controller), failurePolicy.maxRestarts 3, and pods
    with a 2 s termination grace (a trainer that exits on SIGTERM; KWOK removes a deleted pod at a
    random moment within its grace, 30 s by default, which would otherwise be most of what P4 measures).
    `mode` is gangctl's `gangctl.io/restart` (Recreate, InPlace; the peer's runtime has none).
    Inert for P1-P3, where no pod fails."""
    runtime = copy.deepcopy(runtime)
    if mode:
        runtime["metadata"].setdefault("annotations", {})[RESTART_ANNOTATION] = mode
    spec = runtime["spec"]["template"]["spec"]
    spec["failurePolicy"] = {"maxRestarts": 3}
    for job in spec["replicatedJobs"]:
        job["template"]["spec"]["backoffLimit"] = 0
        job["template"]["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] = TERMINATION_GRACE
    return runtime


async def install_gangctl(settings: ClusterSettings) -> None:
    kube = await BenchKube.connect(settings.kubeconfig)
    try:
        crds = setup.load_manifests(settings.deploy_dir / "crds") + [coscheduling_crd(settings.integrations_dir)]
        await setup.install_crds(kube, crds)
        rt = next(d for d in setup.load_manifests(settings.deploy_dir / "runtimes") if d["metadata"]["name"] == RUNTIME)
        await kube.apply(CLUSTER_TRAINING_RUNTIMES.path(name=RUNTIME), restarting(cp.with_kwok_delay(rt), "Recreate"),
                         setup.FIELD_MANAGER)
        in_place = restarting(cp.with_kwok_delay(copy.deepcopy(rt)), "InPlace")
        in_place["metadata"]["name"] = RUNTIME_IN_PLACE
        await kube.apply(CLUSTER_TRAINING_RUNTIMES.path(name=RUNTIME_IN_PLACE), in_place, setup.FIELD_MANAGER)
    finally:
        await kube.close()


async def make_nodes(kubeconfig: Path, count: int, gpus: int, declared_features: list[str]) -> None:
    kube = await BenchKube.connect(kubeconfig)
    try:
        started = time.monotonic()
        await setup.create_gpu_nodes(kube, count, gpus, concurrency=32, declared_features=declared_features)
        say(f"{count} GPU nodes created in {time.monotonic() - started:.0f} s; waiting for Ready")
        deadline = time.monotonic() + 300 + count / 10
        while True:
            ready = 0
            async for page in kube.list_pages(NODES.path(), label_selector="type=kwok", limit=1000):
                for node in page.get("items", []):
                    conds = {c["type"]: c["status"] for c in (node.get("status") or {}).get("conditions") or []}
                    ready += conds.get("Ready") == "True"
            if ready >= count:
                break
            if time.monotonic() > deadline:
                raise TimeoutError(f"only {ready} of {count} GPU nodes Ready")
            await asyncio.sleep(3)
        say(f"{count} GPU nodes Ready {time.monotonic() - started:.0f} s after the first create")
    finally:
        await kube.close()


# ---------- measuring --------------------------------------------------------------------------

def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def loadavg() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def agent_of(user_agent: str) -> str:
    if user_agent.startswith(BENCH_AGENT):
        return "bench"
    head = user_agent.split("/", 1)[0] or "?"
    return "gangctl" if head == "Python" else head


class Audit:
    """Reads the apiserver's audit log (JSON lines) between two offsets."""

    def __init__(self, path: Path):
        self.path = path

    def offset(self) -> int:
        return self.path.stat().st_size if self.path.exists() else 0

    def read(self, start: int, end: int | None = None) -> list[dict]:
        if not self.path.exists():
            return []
        with self.path.open("rb") as f:
            f.seek(start)
            data = f.read() if end is None else f.read(end - start)
        out = []
        for line in data.splitlines():
            try:
                out.append(json.loads(line))
            except ValueError:
                continue  # a line cut at the end offset
        return out


WRITE_VERBS = {"create", "update", "patch", "delete", "deletecollection"}


def what(ev: dict) -> str:
    ref = ev.get("objectRef") or {}
    res = ref.get("resource", "-") + (f"/{ref['subresource']}" if ref.get("subresource") else "")
    return f"{ev.get('verb', '?')} {res}"


def summarize_audit(events: list[dict], agents: set[str], namespace: str | None = None) -> dict:
    """Requests of `agents` (all, and writes: total and by verb/resource; also by namespace if given)."""
    by_agent: dict[str, int] = {}
    mine = [e for e in events if agent_of(e.get("userAgent", "")) in agents]
    for e in events:
        a = agent_of(e.get("userAgent", ""))
        by_agent[a] = by_agent.get(a, 0) + 1
    writes = [e for e in mine if e.get("verb") in WRITE_VERBS]
    latency: dict[str, list[float]] = {}
    for e in writes:
        try:
            latency.setdefault(what(e), []).append(_ts(e["stageTimestamp"]) - _ts(e["requestReceivedTimestamp"]))
        except (KeyError, ValueError):
            continue
    out: dict[str, Any] = {"write_latency_ms_p50_p90": {k: [round(1000 * statistics.median(v), 1),
                                                            round(1000 * sorted(v)[int(0.9 * (len(v) - 1))], 1)]
                                                        for k, v in latency.items()},"requests": len(mine), "writes": len(writes), "writes_by_what": _count(what(e) for e in writes),
                           "requests_by_what": dict(list(_count(what(e) for e in mine).items())[:12]),
                           "all_agents": dict(sorted(by_agent.items(), key=lambda kv: -kv[1]))}
    if namespace is not None:
        job_writes = [e for e in writes if (e.get("objectRef") or {}).get("namespace") == namespace]
        out["job_writes"] = len(job_writes)
        out["job_writes_by_what"] = _count(f"{what(e)} {(e.get('objectRef') or {}).get('name', '')}" for e in job_writes)
        out["job_writes_conflicts"] = sum(1 for e in job_writes if (e.get("responseStatus") or {}).get("code") == 409)
    return out


def _ts(stamp: str) -> float:
    return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()


def _count(items) -> dict[str, int]:  # noqa: ANN001
    out: dict[str, int] = {}
    for i in items:
        out[i] = out.get(i, 0) + 1
    return dict(sorted(out.items(), key=lambda kv: -kv[1]))


class Window:
    """CPU of the given processes, apiserver requests (all clients) and the audit log over a span."""

    def __init__(self, kube: Kube, procs: dict[str, int], cluster: dict[str, int], audit: Audit):
        self.kube, self.procs, self.cluster, self.audit = kube, procs, cluster, audit

    async def open(self) -> None:
        self.load = loadavg()
        self.cpu0 = {n: cp.cpu_seconds(p) for n, p in {**self.procs, **self.cluster}.items()}
        self.req0 = await cp.apiserver_requests(self.kube) or {}
        self.off0 = self.audit.offset()
        self.t0 = time.monotonic()

    async def close(self, agents: set[str], namespace: str | None = None) -> dict:
        elapsed = time.monotonic() - self.t0
        cpu1 = {n: cp.cpu_seconds(p) for n, p in {**self.procs, **self.cluster}.items()}
        req1 = await cp.apiserver_requests(self.kube) or {}
        await asyncio.sleep(1.0)  # the audit backend writes each event after the response
        delta = {k: int(v - self.req0.get(k, 0.0)) for k, v in req1.items()}
        out = {"seconds": round(elapsed, 2), "loadavg_at_start": self.load, "loadavg_at_end": loadavg(),
               "cpu_s": {n: round(cpu1[n] - self.cpu0[n], 2) for n in cpu1},
               "controller_cpu_s": round(sum(cpu1[n] - self.cpu0[n] for n in self.procs), 2),
               "apiserver_requests": sum(delta.values()),
               "apiserver_requests_top": dict(sorted(((k, v) for k, v in delta.items() if v > 0), key=lambda kv: -kv[1])[:12]),
               "audit": summarize_audit(self.audit.read(self.off0), agents, namespace)}
        return out


async def watch_loop(kube: Kube, path: str, on_event: Callable[[dict], None], stop: asyncio.Event,
                     label_selector: str | None = None) -> None:
    rv = (await kube.get(path, limit=1, labelSelector=label_selector))["metadata"]["resourceVersion"]
    while not stop.is_set():
        try:
            async for ev in kube.watch(path, rv, label_selector=label_selector, timeout_seconds=600):
                obj = ev["object"]
                if ev["type"] == "ERROR":
                    raise RuntimeError(f"watch {path} failed: {obj}")
                rv = obj["metadata"]["resourceVersion"]
                if ev["type"] != "BOOKMARK":
                    on_event(ev)
                if stop.is_set():
                    return
        except asyncio.TimeoutError:
            continue


async def wait_until(check: Callable[[], bool], timeout: float, progress: Callable[[], str], watchers: list) -> bool:
    started = last = time.monotonic()
    while not check():
        for w in watchers:
            if w.done():
                w.result()
        if time.monotonic() - started > timeout:
            say(f"timed out after {timeout:.0f} s: {progress()}")
            return False
        if time.monotonic() - last > 10:
            say(f"  {time.monotonic() - started:5.0f} s: {progress()}")
            last = time.monotonic()
        await asyncio.sleep(0.05)
    return True


def trainjob(namespace: str, name: str, nodes: int, gpus: int, runtime: str = RUNTIME) -> dict:
    tj = cp.trainjob(name, nodes, gpus)
    tj["metadata"]["namespace"] = namespace
    tj["spec"]["runtimeRef"]["name"] = runtime
    return tj


async def ensure_namespace(kube: Kube, name: str) -> None:
    await kube.apply(NAMESPACES.path(name=name), {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}},
                     "bench")


# ---------- P1: one big gang --------------------------------------------------------------------

async def p1(kubeconfig: Path, side: str, ns: str, pods: int, gpus: int, procs: dict[str, int],
             cluster: dict[str, int], audit: Audit, timeout: float, floor: bool = False) -> dict:
    kube = await BenchKube.connect(kubeconfig)
    try:
        await ensure_namespace(kube, ns)
        created: dict[str, float] = {}
        bound: dict[str, float] = {}
        stop = asyncio.Event()

        def on_pod(ev: dict) -> None:
            obj, now = ev["object"], time.monotonic()
            uid = obj["metadata"]["uid"]
            created.setdefault(uid, now)
            if obj["spec"].get("nodeName"):
                bound.setdefault(uid, now)

        watcher = asyncio.create_task(watch_loop(kube, PODS.path(namespace=ns), on_pod, stop))
        await asyncio.sleep(0.5)
        win = Window(kube, procs, cluster, audit)
        await win.open()
        t0 = time.monotonic()
        answer = await kube.create(TRAINJOBS.path(namespace=ns), trainjob(ns, "big", pods, gpus))
        if floor:
            runtime = await kube.get(CLUSTER_TRAINING_RUNTIMES.path(name=RUNTIME))
            for res, obj in floor_objects(answer, runtime):
                await kube.create(res.path(namespace=ns), obj)
        submitted = time.monotonic() - t0
        ok = await wait_until(lambda: len(created) >= pods and len(bound) >= pods, timeout,
                              lambda: f"{len(created)}/{pods} pods created, {len(bound)} bound", [watcher])
        t_end = time.monotonic()
        agents = {"bench"} if floor else controller_agents(side)
        result = {"scenario": "P1", "side": "floor" if floor else side, "pods": pods, "gpus_per_pod": gpus,
                  "submit_s": round(submitted, 3), "timed_out": not ok,
                  "created_s": round(max(created.values()) - t0, 2) if len(created) >= pods else None,
                  "bound_s": round(max(bound.values()) - t0, 2) if len(bound) >= pods else None,
                  "first_pod_s": round(min(created.values()) - t0, 2) if created else None,
                  "window": await win.close(agents, ns)}
        if not floor:  # what the controller writes in the 10 s after the gang is bound (Running status...)
            after = Window(kube, procs, cluster, audit)
            await after.open()
            await asyncio.sleep(10)
            result["after_bound_10s"] = (await after.close(agents, ns))["audit"]
        stop.set()
        watcher.cancel()
        say(f"P1 {result['side']}: created {result['created_s']} s, bound {result['bound_s']} s, "
            f"{result['window']['audit'].get('job_writes')} writes by {sorted(agents)} for the job while it waited")
        return result | {"window_seconds_to_end": round(t_end - t0, 2)}
    finally:
        await kube.close()


# ---------- P4: recovery of a big gang from one failed pod -------------------------------------

# P4's ways to recover: gangctl's cluster runs both, alternating which goes first; the peer recreates.
RECREATE, IN_PLACE = "recreate", "in place"
IN_PLACE_LEAD_S = 3   # in place: the failure is set this long (plus 1 s per 100 pods) after the pods are seen Running


async def p4(kubeconfig: Path, side: str, ns: str, pods: int, gpus: int, repeats: int, timeout: float) -> dict:
    kube = await BenchKube.connect(kubeconfig)
    try:
        await ensure_namespace(kube, ns)
        modes = [RECREATE, IN_PLACE] if side == "gangctl" else [RECREATE]
        runs: dict[str, list[dict]] = {m: [] for m in modes}
        for r in range(repeats):
            for mode in modes[r % len(modes):] + modes[:r % len(modes)]:
                name = f"{'inp' if mode == IN_PLACE else 'rec'}-{r}"
                runs[mode].append(await _recover_once(kube, ns, name, pods, gpus, timeout, mode == IN_PLACE,
                                                      side == "gangctl"))
                say(f"P4 {side} {mode} round {r + 1}/{repeats}: {runs[mode][-1]}")
        return {"scenario": "P4", "side": side, "pods": pods, "runs": runs,
                "all_running_s": {m: rounds.summary([x["all_running_s"] for x in rs if x.get("all_running_s") is not None])
                                  for m, rs in runs.items()}}
    finally:
        await kube.close()


async def _recover_once(kube: Kube, ns: str, name: str, pods: int, gpus: int, timeout: float, in_place: bool,
                        gangctl: bool) -> dict:
    """One TrainJob up, one pod failed, the time until every pod runs again; the job gone. Recreate: the
    pod fails (KWOK's chaos stage) and the failure counts from when it is seen Failed; every pod of the
    next attempt Running ends it. In place: every pod's containers restart (gangctl's KWOK stage plays
    the kubelet's RestartAllContainers: the failed rank's pod, exit code 3, and every other rank's, whose
    worker loses its peer, exit code 1, as torchrun's do), all at one moment: each pod is annotated
    with that moment (KWOK's delay until a time) a few seconds ahead, so the benchmark's own 1,024
    patches are not in the figure, while KWOK restarting 1,024 pods' containers at once, one process
    on 2 cores where a real cluster has a kubelet per node, is. Every pod of the attempt Running with
    one restart more ends it. On gangctl's side the charge (status.restarts.user 1) is timed too
    (the peer's TrainJob keeps no restart count)."""
    running: dict[str, bool] = {}
    restarted: dict[str, int] = {}
    made: dict[str, float] = {}
    failed_at: list[float] = []
    victim: list[str] = []
    stop = asyncio.Event()

    def on_pod(ev: dict) -> None:
        obj, now = ev["object"], time.monotonic()
        uid, phase = obj["metadata"]["uid"], (obj.get("status") or {}).get("phase")
        made.setdefault(uid, now)
        if ev["type"] == "DELETED":
            running.pop(uid, None)
            return
        running[uid] = phase == "Running" and not obj["metadata"].get("deletionTimestamp")
        restarted[uid] = min((c.get("restartCount") or 0 for c in (obj.get("status") or {}).get("containerStatuses") or []),
                             default=0)
        if victim and obj["metadata"]["name"] == victim[0] and phase == "Failed" and not failed_at:
            failed_at.append(now)

    watcher = asyncio.create_task(watch_loop(kube, PODS.path(namespace=ns), on_pod, stop))
    result: dict = {}
    try:
        await asyncio.sleep(0.5)
        await kube.create(TRAINJOBS.path(namespace=ns), trainjob(ns, name, pods, gpus, RUNTIME_IN_PLACE if in_place else RUNTIME))
        if not await wait_until(lambda: sum(running.values()) >= pods, timeout,
                                lambda: f"{sum(running.values())}/{pods} pods Running", [watcher]):
            return {"error": "the first attempt never ran"}
        first = set(made)   # every pod of the first attempt (and any replaced before it ran whole)
        listed = (await kube.get(PODS.path(namespace=ns)))["items"]   # the round's job is the only one
        victim.append(listed[0]["metadata"]["name"])
        charged = asyncio.create_task(_charged(kube, ns, name, "RestartInPlace" if in_place else "Restart", timeout)
                                      if gangctl else asyncio.sleep(0, None))
        if in_place:
            # Every rank fails at one moment, `lead` seconds ahead: time to annotate every pod first
            lead = IN_PLACE_LEAD_S + pods / 100
            at_wall = datetime.now(timezone.utc) + timedelta(seconds=lead)
            failed_at.append(time.monotonic() + lead)
            when = at_wall.strftime("%Y-%m-%dT%H:%M:%S.%fZ")
            sem = asyncio.Semaphore(32)

            async def restart(pod: dict) -> None:
                code = 3 if pod["metadata"]["name"] == victim[0] else 1
                async with sem:
                    await kube.merge_patch(PODS.path(ns, pod["metadata"]["name"]),
                                           {"metadata": {"annotations": chaos.restart_all(1, code, when)}})
            await asyncio.gather(*(restart(p) for p in listed))
            result["annotated_ahead_s"] = round(failed_at[0] - time.monotonic(), 2)   # negative: too late, not valid
            if result["annotated_ahead_s"] <= 0:
                raise RuntimeError(f"annotating {pods} pods took longer than the {lead:.0f} s lead: raise IN_PLACE_LEAD_S")

            def recovered() -> bool:
                return sum(running.get(u, False) and restarted.get(u, 0) >= 1 for u in first) >= pods
            progress = lambda: f"{sum(running.get(u, False) and restarted.get(u, 0) >= 1 for u in first)}/{pods} pods restarted"
        else:
            await kube.merge_patch(PODS.path(ns, victim[0]), {"metadata": {
                "labels": {chaos.FAIL_LABEL: "true"},
                "annotations": {chaos.FAIL_DELAY: "0s", chaos.FAIL_JITTER: "1s", chaos.FAIL_EXIT_CODE: "1"}}})

            def recovered() -> bool:
                return bool(failed_at) and sum(v for u, v in running.items() if u not in first) >= pods
            progress = lambda: (f"failed: {bool(failed_at)}, "
                                f"{sum(v for u, v in running.items() if u not in first)}/{pods} new pods Running")
        ok = await wait_until(recovered, timeout, progress, [watcher])
        end = time.monotonic()
        new = [t for u, t in made.items() if u not in first]
        result.update({"timed_out": not ok, "all_running_s": round(end - failed_at[0], 2) if ok else None,
                       "first_new_pod_s": round(min(new) - failed_at[0], 2) if new and failed_at else None,
                       "new_pods": len(new)})
        at = await charged
        result["charged_s"] = round(at - failed_at[0], 2) if at is not None and failed_at else None
    finally:
        stop.set()
        watcher.cancel()
    await kube.delete(TRAINJOBS.path(ns, name), propagation="Foreground")

    async def gone() -> bool:
        return not (await kube.get(PODS.path(namespace=ns), limit=1))["items"]
    deadline = time.monotonic() + timeout
    while not await gone() and time.monotonic() < deadline:
        await asyncio.sleep(1)
    return result


async def _charged(kube: Kube, ns: str, name: str, action: str, timeout: float) -> float | None:
    """When (monotonic) the TrainJob's status first shows one restart charged (gangctl's
    status.restarts, lastFailure.action `action`; the peer's JobSet status.restarts); polled every 0.2 s."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        status = (await kube.get(TRAINJOBS.path(ns, name))).get("status") or {}
        restarts = status.get("restarts") or {}
        if isinstance(restarts, dict) and restarts.get("user") == 1 and (restarts.get("lastFailure") or {}).get("action") == action:
            return time.monotonic()
        await asyncio.sleep(0.2)
    return None


def floor_objects(trainjob: dict, runtime: dict) -> list[tuple]:
    """The children gangctl makes for `trainjob`, from gangctl's own pure functions (no controller)."""
    job = resolve(trainjob, runtime)
    backend = backend_for(job.gang_backend)
    gang = size_gang(job.num_nodes, job.requests, min_nodes=job.min_nodes,
                     schedule_timeout_seconds=job.gang_settings.get("scheduleTimeoutSeconds"))
    owner = owner_reference(trainjob)
    return [(SERVICES, headless_service(job, owner)), (POD_GROUPS, backend.group(job, gang, owner)),
            (JOBS, node_job(job, owner, backend, SCHEDULER, None, gang))]


async def drop_floor(kubeconfig: Path, ns: str, timeout: float = 300) -> float:
    """Remove the floor's objects: the Job (its result finalizer first: no gangctl runs to remove
    it), its pods at once (grace 0: nothing runs in them), then the namespace; waits for the pods."""
    kube = await BenchKube.connect(kubeconfig)
    started = time.monotonic()
    try:
        for job in (await kube.get(JOBS.path(namespace=ns)))["items"]:
            await kube.remove_finalizer(JOBS.path(ns, job["metadata"]["name"]), job, RESULT_FINALIZER)
            await kube.delete(JOBS.path(ns, job["metadata"]["name"]), propagation="Orphan")
        while time.monotonic() - started < timeout:
            try:
                await kube.request("DELETE", PODS.path(namespace=ns), body={"gracePeriodSeconds": 0}, timeout=120)
            except ApiError as err:  # a loaded apiserver gives up on 1,024 deletes at its 60 s limit (504)
                if err.status != 504:
                    raise
            if not (await kube.get(PODS.path(namespace=ns), limit=1))["items"]:
                break
            await asyncio.sleep(1)
        await kube.delete(NAMESPACES.path(name=ns))
        while time.monotonic() - started < timeout:  # gone before gangctl starts: it would see the TrainJob
            try:
                await kube.get(NAMESPACES.path(name=ns))
            except ApiError as err:
                if err.not_found:
                    break
                raise
            await asyncio.sleep(0.5)
        return time.monotonic() - started
    finally:
        await kube.close()


def controller_agents(side: str) -> set[str]:
    return {"gangctl"} if side == "gangctl" else {"trainer-controller-manager", "jobset"}


# ---------- P2: many small gangs ---------------------------------------------------------------

async def p2(kubeconfig: Path, side: str, ns: str, jobs: int, nodes: int, concurrency: int, procs: dict[str, int],
             cluster: dict[str, int], audit: Audit, timeout: float, settle: float) -> dict:
    kube = await BenchKube.connect(kubeconfig)
    try:
        await ensure_namespace(kube, ns)
        job_created: dict[str, float] = {}
        ready: dict[str, int] = {}
        stop = asyncio.Event()
        expected_pods = jobs * nodes

        def on_job(ev: dict) -> None:
            obj = ev["object"]
            name = obj["metadata"]["name"]
            if (obj["metadata"].get("labels") or {}).get(REPLICATED_JOB) != "node":
                return
            job_created.setdefault(name, time.monotonic())
            ready[name] = int((obj.get("status") or {}).get("ready") or 0)

        watcher = asyncio.create_task(watch_loop(kube, JOBS.path(namespace=ns), on_job, stop))
        await asyncio.sleep(0.5)
        agents = controller_agents(side)
        win = Window(kube, procs, cluster, audit)
        await win.open()
        sem = asyncio.Semaphore(concurrency)
        errors = 0
        t0 = time.monotonic()

        async def submit(i: int) -> None:
            nonlocal errors
            async with sem:
                try:
                    await kube.create(TRAINJOBS.path(namespace=ns), trainjob(ns, f"p2-{i:05d}", nodes, 1))
                except ApiError as err:
                    errors += 1
                    say(f"create p2-{i:05d} failed: {err}")

        await asyncio.gather(*(submit(i) for i in range(jobs)))
        submitted = time.monotonic() - t0
        say(f"P2 {side}: {jobs} TrainJobs submitted in {submitted:.1f} s")
        ok = await wait_until(lambda: len(job_created) >= jobs, timeout,
                              lambda: f"{len(job_created)}/{jobs} child Jobs, {sum(ready.values())}/{expected_pods} pods ready",
                              [watcher])
        t_jobs = time.monotonic()
        jobs_win = await win.close(agents)
        result: dict[str, Any] = {
            "scenario": "P2", "side": side, "jobs": jobs, "pods_per_job": nodes, "concurrency": concurrency,
            "submit_s": round(submitted, 2), "create_errors": errors, "timed_out": not ok,
            "jobs_created_s": round(max(job_created.values()) - t0, 2) if len(job_created) >= jobs else None,
            "pods_ready_at_jobs_created": sum(ready.values()), "child_jobs_created": len(job_created),
            "window_jobs": jobs_win}
        if result["jobs_created_s"]:
            result["trainjobs_per_s"] = round(jobs / result["jobs_created_s"], 2)
            lat = sorted(job_created[n] - t0 for n in job_created)
            result["job_created_p50_s"] = round(statistics.median(lat), 2)
        result["apiserver_requests_per_trainjob"] = round(jobs_win["apiserver_requests"] / jobs, 2)
        result["controller_requests_per_trainjob"] = round(jobs_win["audit"]["requests"] / jobs, 2)
        result["controller_writes_per_trainjob"] = round(jobs_win["audit"]["writes"] / jobs, 2)
        say(f"P2 {side}: all {jobs} child Jobs {result['jobs_created_s']} s after the first create "
            f"({result.get('trainjobs_per_s')} TrainJobs/s); waiting up to {settle:.0f} s more for every pod Ready")
        # The same window, kept open until every pod is Ready (or `settle` runs out).
        ok = await wait_until(lambda: sum(ready.values()) >= expected_pods, settle,
                              lambda: f"{sum(ready.values())}/{expected_pods} pods ready", [watcher])
        end_win = await win.close(agents)
        result["pods_ready"] = sum(ready.values())
        result["all_ready_s"] = round(time.monotonic() - t0, 2) if ok else None
        result["window_until_ready"] = end_win
        if ok:
            result["apiserver_requests_per_trainjob_until_ready"] = round(end_win["apiserver_requests"] / jobs, 2)
            result["controller_requests_per_trainjob_until_ready"] = round(end_win["audit"]["requests"] / jobs, 2)
        stop.set()
        watcher.cancel()
        say(f"P2 {side}: {result['pods_ready']}/{expected_pods} pods Ready after {end_win['seconds']:.0f} s")
        return result
    finally:
        await kube.close()


# ---------- P3: cold start ---------------------------------------------------------------------

async def count_pods(kubeconfig: Path) -> dict[str, int]:
    """Objects in the cluster (metadata-only lists: cheap even at 50,000 pods)."""
    kube = await BenchKube.connect(kubeconfig)
    kube.accept = METADATA_ONLY
    try:
        total = managed = 0
        async for page in kube.list_pages(PODS.path(), limit=5000):
            for pod in page.get("items") or []:
                total += 1
                managed += (pod["metadata"].get("labels") or {}).get(MANAGED_BY) == MANAGER
        counts = {"pods": total, "pods_managed_label": managed}
        for res in (TRAINJOBS, JOBS, POD_GROUPS, SERVICES):
            n = 0
            try:
                async for page in kube.list_pages(res.path(), limit=5000):
                    n += len(page.get("items") or [])
            except ApiError as err:
                if not err.not_found:
                    raise
            counts[res.plural] = n
        return counts
    finally:
        await kube.close()


async def pod_list_cost(kubeconfig: Path, page_size: int = 500, pages: int = 10) -> dict:
    """What a paginated pod LIST costs per pod, measured in this process: the LIST as gangctl's
    informer asks for it when the apiserver refuses a streaming list (its label selector, pages of
    500; gangctl streams its first list where the server allows it), the JSON bytes, the
    time to fetch them (apiserver + loopback) and to decode them (json.loads + gangctl's strip), and
    the deep size of the decoded, stripped objects (sys.getsizeof over every dict, list and str:
    no allocator overhead), per pod; over the first `pages` pages (a sample)."""
    from gangctl.kube.informer import strip

    kube = await BenchKube.connect(kubeconfig)
    try:
        token, pods, raw_bytes, fetch_s, decode_s, size, slim_size = None, 0, 0, 0.0, 0.0, 0, 0
        while True:
            t = time.perf_counter()
            text = await kube._send("GET", PODS.path(), {"labelSelector": f"{MANAGED_BY}={MANAGER}", "limit": page_size,
                                                         "continue": token}, None, "application/json", 60)
            t1 = time.perf_counter()
            page = json.loads(text)
            items = [strip(o) for o in page.get("items", [])]
            decode_s += time.perf_counter() - t1
            fetch_s += t1 - t
            raw_bytes += len(text)
            pods += len(items)
            size += sum(deep_size(o) for o in items)
            slim_size += sum(deep_size(slim_pod(o)) for o in items)
            token = (page.get("metadata") or {}).get("continue")
            pages -= 1
            if not token or pages <= 0:
                break
        n = max(pods, 1)
        return {"pods": pods, "json_bytes_per_pod": round(raw_bytes / n), "fetch_ms_per_pod": round(fetch_s * 1000 / n, 3),
                "decode_ms_per_pod": round(decode_s * 1000 / n, 3), "deep_size_bytes_per_pod": round(size / n),
                "slim_deep_size_bytes_per_pod": round(slim_size / n)}
    finally:
        await kube.close()


def slim_pod(pod: dict) -> dict:
    """What gangctl's decisions read of a pod (reconciler, failure policy, elastic, lost-pod reaper):
    the size a client-go-style transform would keep, for the proposal in the report."""
    meta, spec, status = pod["metadata"], pod.get("spec") or {}, pod.get("status") or {}
    keep_meta = {k: meta[k] for k in ("name", "namespace", "uid", "resourceVersion", "labels", "ownerReferences",
                                      "deletionTimestamp", "creationTimestamp") if k in meta}
    ann = {k: v for k, v in (meta.get("annotations") or {}).items() if k.startswith("batch.kubernetes.io/")}
    if ann:
        keep_meta["annotations"] = ann
    return {"metadata": keep_meta, "spec": {"nodeName": spec.get("nodeName")},
            "status": {"phase": status.get("phase"), "reason": status.get("reason"),
                       "conditions": [c for c in status.get("conditions") or [] if c.get("type") == "DisruptionTarget"],
                       "containerStatuses": [{k: c.get(k) for k in ("name", "state", "lastState")}
                                             for c in status.get("containerStatuses") or []]}}


def deep_size(obj: Any, seen: set[int] | None = None) -> int:
    seen = set() if seen is None else seen
    if id(obj) in seen:
        return 0
    seen.add(id(obj))
    size = sys.getsizeof(obj)
    if isinstance(obj, dict):
        size += sum(deep_size(k, seen) + deep_size(v, seen) for k, v in obj.items())
    elif isinstance(obj, list):
        size += sum(deep_size(v, seen) for v in obj)
    return size


def filler_pod(template: dict, ns: str, i: int, node: str) -> dict:
    pod = copy.deepcopy(template)
    pod["metadata"]["name"] = f"filler-{i:06d}"
    pod["metadata"]["namespace"] = ns
    pod["metadata"]["labels"][TRAINJOB_NAME] = f"filler-{i // 8:05d}"
    pod["spec"]["nodeName"] = node
    return pod


def filler_template(runtime: dict) -> dict:
    """A pod of an 8-node TrainJob as gangctl's child Job makes it, without the GPU request and the
    PodGroup label (nothing schedules it: it is created on its node), with gangctl's labels."""
    tj = trainjob("bench-p3", "filler", 8, 1)
    tj["metadata"]["uid"] = "00000000-0000-0000-0000-000000000000"
    job = resolve(tj, runtime)
    backend = backend_for(job.gang_backend)
    gang = size_gang(job.num_nodes, job.requests)
    tmpl = node_job(job, owner_reference(tj), backend, SCHEDULER, None, gang)["spec"]["template"]
    spec = copy.deepcopy(tmpl["spec"])
    for c in spec.get("containers") or []:
        c.pop("resources", None)
    spec.pop("schedulerName", None)
    labels = {k: v for k, v in (tmpl["metadata"].get("labels") or {}).items() if k != POD_GROUP_LABEL}
    labels[MANAGED_BY] = MANAGER
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"labels": labels, "annotations": dict(tmpl["metadata"].get("annotations") or {})},
            "spec": spec}


async def seed_fillers(kubeconfig: Path, settings: ClusterSettings, count: int, gpu_nodes: int,
                       concurrency: int = 32) -> dict:
    """`count` filler pods in namespace bench-p3, then wait for the apiserver to go quiet (KWOK done)."""
    kube = await BenchKube.connect(kubeconfig)
    try:
        ns = "bench-p3"
        await ensure_namespace(kube, ns)
        rt = next(d for d in setup.load_manifests(settings.deploy_dir / "runtimes") if d["metadata"]["name"] == RUNTIME)
        template = filler_template(cp.with_kwok_delay(rt))
        sem = asyncio.Semaphore(concurrency)
        started = time.monotonic()
        made = 0

        async def one(i: int) -> None:
            nonlocal made
            async with sem:
                try:
                    await kube.create(PODS.path(namespace=ns), filler_pod(template, ns, i, f"gpu-node-{i % gpu_nodes:03d}"))
                    made += 1
                except ApiError as err:
                    if not err.conflict:
                        raise
                if made and made % 5000 == 0:
                    say(f"  {made}/{count} filler pods created")

        await asyncio.gather(*(one(i) for i in range(count)))
        created_s = time.monotonic() - started
        say(f"{made} filler pods created in {created_s:.0f} s; waiting for KWOK to run them (apiserver quiet)")
        # Quiet: fewer than 20 pod status patches a second (KWOK has moved every pod to Running).
        prev = await cp.apiserver_requests(kube) or {}
        while True:
            await asyncio.sleep(3)
            now = await cp.apiserver_requests(kube) or {}
            rate = sum(now.get(k, 0) - prev.get(k, 0) for k in now if k.endswith("pods/status")) / 3
            prev = now
            if rate < 20 or time.monotonic() - started > 600:
                break
        return {"fillers": made, "fillers_created_s": round(created_s, 1),
                "fillers_quiet_s": round(time.monotonic() - started, 1), "filler_template_bytes": len(json.dumps(template))}
    finally:
        await kube.close()


def cold_start_gangctl(kubeconfig: Path, log: Path, env: dict[str, str], timeout: float) -> tuple[dict, ControllerProcess]:
    ctl = ControllerProcess(kubeconfig, log, env=env)
    t0 = time.monotonic()
    ctl.start()
    pid = ctl.proc.pid
    ready_s = None
    while time.monotonic() - t0 < timeout and ctl.alive():
        try:
            with urllib.request.urlopen(ctl.url + "/readyz", timeout=2) as resp:  # noqa: S310 - loopback
                if resp.status == 200:
                    ready_s = time.monotonic() - t0
                    break
        except OSError:
            pass
        time.sleep(0.05)
    out = {"ready_s": round(ready_s, 2) if ready_s else None, "pid": pid}
    if ready_s is None:
        out["error"] = "not ready" if ctl.alive() else "exited"
        return out, ctl
    out["rss_at_ready_mib"] = round(rss_mib(pid), 1)
    out["cpu_to_ready_s"] = round(cp.cpu_seconds(pid), 2)
    # Settled: the work queue empty and under 5 % of a core for 2 s (at most 120 s).
    settle_started = time.monotonic()
    last_cpu, quiet_since = cp.cpu_seconds(pid), None
    while time.monotonic() - settle_started < 120:
        time.sleep(0.5)
        cpu = cp.cpu_seconds(pid)
        depth = gangctl_queue_depth(ctl.url)
        if cpu - last_cpu < 0.025 and depth == 0:
            quiet_since = quiet_since or time.monotonic()
            if time.monotonic() - quiet_since >= 2:
                break
        else:
            quiet_since = None
        last_cpu = cpu
    out["settled_s"] = round(time.monotonic() - t0, 2)
    out["rss_settled_mib"] = round(rss_mib(pid), 1)
    out["peak_rss_mib"] = round(cp.peak_rss_mib(pid), 1)
    out["cpu_to_settled_s"] = round(cp.cpu_seconds(pid), 2)
    return out, ctl


def gangctl_queue_depth(url: str) -> float | None:
    try:
        with urllib.request.urlopen(url + "/metrics", timeout=2) as resp:  # noqa: S310 - loopback
            for line in resp.read().decode().splitlines():
                if line.startswith("gangctl_workqueue_depth "):
                    return float(line.split()[1])
    except OSError:
        return None
    return None


LOG_TS = re.compile(r'"ts":\s*"?([0-9T:.\-Z+]+)"?|^(\d{4}-\d\d-\d\dT[0-9:.]+(?:Z|[+-]\d\d:?\d\d)?)')


def _log_time(line: str) -> float | None:
    m = LOG_TS.search(line)
    if not m:
        return None
    raw = m.group(1) or m.group(2)
    try:
        return float(raw)
    except ValueError:
        pass
    try:
        return datetime.fromisoformat(raw.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


async def _drop_peer_webhooks(kubeconfig: Path) -> None:
    kube = await BenchKube.connect(kubeconfig)
    try:
        for kind, names in (("mutatingwebhookconfigurations", ("defaulter.trainer.kubeflow.org",
                                                               "jobset-mutating-webhook-configuration")),
                            ("validatingwebhookconfigurations", ("validator.trainer.kubeflow.org",
                                                                 "jobset-validating-webhook-configuration"))):
            for name in names:
                await kube.delete(f"/apis/admissionregistration.k8s.io/v1/{kind}/{name}")
    finally:
        await kube.close()


def process_start_epoch(pid: int) -> float:
    """When `pid` started, as a Unix time (from /proc: boot time + starttime ticks)."""
    ticks = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19])
    btime = next(int(ln.split()[1]) for ln in Path("/proc/stat").read_text().splitlines() if ln.startswith("btime"))
    return btime + ticks / cp.CLK_TCK


def cold_start_peer(settings: ClusterSettings, timeout: float) -> dict:
    state = peer.schedulers.state_dir(settings)
    offsets = {p.name: p.stat().st_size for p in (state / "logs").glob("*.log")}
    peer.stop(settings)
    # peer.start applies the runtime before it starts the processes: with the old webhook
    # configurations still registered, the apiserver would call webhooks that no longer listen.
    asyncio.run(_drop_peer_webhooks(settings.kubeconfig))
    t0 = time.monotonic()
    running = peer.start(settings, settings.kubeconfig, say, timeout=timeout)
    readyz_s = time.monotonic() - t0  # peer.start polls each /readyz every 0.5 s, then applies webhooks
    out: dict[str, Any] = {"readyz_s_upper_bound": round(readyz_s, 2), "processes": {}}
    # Caches synced: controller-runtime logs "Starting workers" per controller after its informers sync.
    deadline = time.monotonic() + timeout
    for name, pid in running.pids.items():
        started = process_start_epoch(pid)
        log = state / "logs" / f"{name}.log"
        synced = None
        while time.monotonic() < deadline:
            with log.open("rb") as f:
                f.seek(offsets.get(log.name, 0))
                lines = [ln.decode(errors="replace") for ln in f.read().splitlines()]
            workers = [ln for ln in lines if "Starting workers" in ln]
            waiting = [ln for ln in lines if "Starting Controller" in ln or "Starting EventSource" in ln]
            controllers = {m.group(1) for ln in waiting if (m := re.search(r'"controller":\s*"([^"]+)"', ln))}
            started_ctrls = {m.group(1) for ln in workers if (m := re.search(r'"controller":\s*"([^"]+)"', ln))}
            if controllers and controllers <= started_ctrls:
                times = [t for ln in workers if (t := _log_time(ln)) is not None]
                synced = (max(times) - started) if times else None
                out["processes"][name] = {"controllers": sorted(started_ctrls)}
                break
            time.sleep(0.2)
        out["processes"].setdefault(name, {})["synced_s"] = round(synced, 2) if synced is not None else None
    time.sleep(1)
    # Settled: both processes under 5 % of a core for 2 s (at most 120 s).
    last = {n: cp.cpu_seconds(p) for n, p in running.pids.items()}
    quiet_since, started = None, time.monotonic()
    while time.monotonic() - started < 120:
        time.sleep(0.5)
        now = {n: cp.cpu_seconds(p) for n, p in running.pids.items()}
        if sum(now[n] - last[n] for n in now) < 0.025:
            quiet_since = quiet_since or time.monotonic()
            if time.monotonic() - quiet_since >= 2:
                break
        else:
            quiet_since = None
        last = now
    for name, pid in running.pids.items():
        p = out["processes"][name]
        p.update({"rss_settled_mib": round(rss_mib(pid), 1), "peak_rss_mib": round(cp.peak_rss_mib(pid), 1),
                  "cpu_to_settled_s": round(cp.cpu_seconds(pid), 2)})
    synced = [p.get("synced_s") for p in out["processes"].values()]
    out["ready_s"] = max(synced) if all(s is not None for s in synced) else None
    out["rss_settled_mib"] = round(sum(p["rss_settled_mib"] for p in out["processes"].values()), 1)
    out["peak_rss_mib"] = round(sum(p["peak_rss_mib"] for p in out["processes"].values()), 1)
    out["pids"] = running.pids
    return out


def per_object(points: list[dict], extrapolate: int) -> dict:
    """Slope between the first and last cold start: MiB... per cached pod, and the extrapolation."""
    if len(points) < 2:
        return {}
    a, b = points[0], points[-1]
    dp = b["objects"]["pods_managed_label"] - a["objects"]["pods_managed_label"]
    if dp <= 0 or a.get("ready_s") is None or b.get("ready_s") is None:
        return {}
    kib = (b["rss_settled_mib"] - a["rss_settled_mib"]) * 1024 / dp
    ms = (b["ready_s"] - a["ready_s"]) * 1000 / dp
    left = extrapolate - b["objects"]["pods_managed_label"]
    return {"pods_between": dp, "kib_per_pod": round(kib, 2), "ms_to_ready_per_pod": round(ms, 3),
            f"rss_settled_mib_at_{extrapolate}": round(b["rss_settled_mib"] + kib * left / 1024, 0),
            f"ready_s_at_{extrapolate}": round(b["ready_s"] + ms * left / 1000, 1)}


# ---------- the two sides ----------------------------------------------------------------------

def idle(kubeconfig: Path, cluster: dict[str, int], audit: Audit, seconds: float = 10) -> dict:
    """The cluster's own background (Lease renewals, controllers), measured after 10 s of calm."""
    async def run() -> dict:
        kube = await BenchKube.connect(kubeconfig)
        try:
            await asyncio.sleep(10)
            win = Window(kube, {}, cluster, audit)
            await win.open()
            await asyncio.sleep(seconds)
            out = await win.close(set())
            out["apiserver_requests_per_s"] = round(out["apiserver_requests"] / seconds, 1)
            return out
        finally:
            await kube.close()
    out = asyncio.run(run())
    say(f"idle cluster: {out['apiserver_requests_per_s']} apiserver requests/s; CPU over {seconds:.0f} s: {out['cpu_s']}")
    return out


def run_side(args: argparse.Namespace, side: str, save: Callable[[str, dict], None]) -> None:
    name = f"{args.cluster_prefix}-{'gangctl' if side == 'gangctl' else 'trainer'}"
    scen = set(args.scenarios.split(","))
    env = dict(kv.split("=", 1) for kv in args.gangctl_env)
    with own_cluster(name, make_cluster(args, side), say, keep=args.keep) as (settings, cluster):
        audit = Audit(STATE / f"{name}-audit.log")
        cpids = cp.cluster_pids(settings)
        save("idle", idle(cluster.kubeconfig, cpids, audit))
        log = STATE / f"{name}-controller.log"
        log.unlink(missing_ok=True)
        if side == "gangctl":
            if "p1" in scen:
                save("p1_floor", asyncio.run(p1(cluster.kubeconfig, side, "bench-floor", args.p1_pods, args.p1_gpus,
                                                 {}, cpids, audit, args.timeout, floor=True)))
                say(f"floor's namespace deleted in {asyncio.run(drop_floor(cluster.kubeconfig, 'bench-floor')):.0f} s")
            ctx = controller(cluster.kubeconfig, log, env=env, ready_timeout=120)
        else:
            ctx = _peer_ctx(settings)
        with ctx as ctl:
            procs = {"gangctl": ctl.proc.pid} if side == "gangctl" else dict(ctl)
            save("baseline", {"rss_mib": {n: round(rss_mib(p), 1) for n, p in procs.items()},
                              "rss_total_mib": round(sum(rss_mib(p) for p in procs.values()), 1)})
            if "p1" in scen:
                save("p1", asyncio.run(p1(cluster.kubeconfig, side, "bench-p1", args.p1_pods, args.p1_gpus,
                                          procs, cpids, audit, args.timeout)))
            if "p4" in scen:
                save("p4", asyncio.run(p4(cluster.kubeconfig, side, "bench-p4", args.p1_pods, args.p1_gpus,
                                          args.p4_rounds, args.timeout)))
            if "p2" in scen:
                save("p2", asyncio.run(p2(cluster.kubeconfig, side, "bench-p2", args.p2_jobs, args.p2_nodes,
                                          args.p2_concurrency, procs, cpids, audit, args.timeout, args.p2_settle)))
        if "p3" in scen:
            points = []
            for step in ("as left", "with fillers"):
                if step == "with fillers":
                    have = points[0]["objects"]["pods"] if points else 0
                    want = max(0, args.p3_pods - have)
                    fill = asyncio.run(seed_fillers(cluster.kubeconfig, settings, want, args.gpu_nodes))
                    say(f"fillers: {fill}")
                objects = asyncio.run(count_pods(cluster.kubeconfig))
                cost = asyncio.run(pod_list_cost(cluster.kubeconfig))
                say(f"P3 {side} cold start ({step}): {objects}; a paged pod LIST, per pod: {cost}")
                load = loadavg()
                if side == "gangctl":
                    res, ctl = cold_start_gangctl(cluster.kubeconfig, log, env, args.p3_timeout)
                    ctl.stop()
                else:
                    res = cold_start_peer(settings, args.p3_timeout)
                res.update({"step": step, "objects": objects, "loadavg_at_start": load, "pod_list_cost": cost})
                if step == "with fillers":
                    res["fillers"] = fill
                say(f"P3 {side} ({step}): ready {res.get('ready_s')} s, RSS settled {res.get('rss_settled_mib')} MiB")
                points.append(res)
                save("p3", {"points": points, "per_pod": per_object(points, args.extrapolate)})
            if side == "peer":
                peer.stop(settings)


class _peer_ctx:
    """The peer's processes as started with the cluster (a context like `controller`)."""

    def __init__(self, settings: ClusterSettings):
        self.settings = settings

    def __enter__(self) -> dict[str, int]:
        return peer.schedulers.pids(peer.schedulers.state_dir(self.settings))

    def __exit__(self, *exc: object) -> None:
        return None


# ---------- report -----------------------------------------------------------------------------

def _get(d: dict | None, *keys: str) -> Any:
    for k in keys:
        if d is None:
            return None
        d = d.get(k)
    return d


def _ratio(a: Any, b: Any) -> str:
    return "—" if a in (None, 0) or b in (None, 0) else f"{a / b:.2f}"


def report(data: dict) -> str:
    g, p = data.get("gangctl", {}), data.get("peer", {})
    lines = []
    for who, d in (("gangctl", g), ("peer", p)):
        if d.get("conditions"):
            lines.append(f"{who} side conditions: {json.dumps(d['conditions'])}")
        if d.get("error"):
            lines.append(f"{who} side FAILED: {d['error']}")
    f1, g1, p1_ = g.get("p1_floor"), g.get("p1"), p.get("p1")
    lines += ["", "P1 one TrainJob of %s pods" % (_get(g1, "pods") or _get(p1_, "pods")),
              "| | floor (no controller) | gangctl | Kubeflow Trainer + JobSet | gangctl/floor | gangctl/peer |",
              "|---|---:|---:|---:|---:|---:|"]
    for label, keys in (("first create -> all pods created (s)", ("created_s",)),
                        ("first create -> all pods bound (s)", ("bound_s",)),
                        ("controller CPU (s)", ("window", "controller_cpu_s")),
                        ("kube-apiserver CPU (s)", ("window", "cpu_s", "kube-apiserver")),
                        ("apiserver requests, all clients", ("window", "apiserver_requests")),
                        ("controller's writes for the job while it waits", ("window", "audit", "job_writes"))):
        vals = [_get(x, *keys) for x in (f1, g1, p1_)]
        lines.append(f"| {label} | " + " | ".join("—" if v is None else str(v) for v in vals)
                     + f" | {_ratio(vals[1], vals[0])} | {_ratio(vals[1], vals[2])} |")
    for who, r in (("gangctl", g1), ("peer", p1_)):
        if r:
            lines.append(f"{who} writes for the job: {_get(r, 'window', 'audit', 'job_writes_by_what')}; "
                         f"load {_get(r, 'window', 'loadavg_at_start')}")
    if f1:
        lines.append(f"floor load {_get(f1, 'window', 'loadavg_at_start')}")
    g2, p2_ = g.get("p2"), p.get("p2")
    lines += ["", "P2", "| | gangctl | Kubeflow Trainer + JobSet | ratio |", "|---|---:|---:|---:|"]
    for label, keys in (("submit (s)", ("submit_s",)), ("first create -> all child Jobs (s)", ("jobs_created_s",)),
                        ("TrainJobs/s (all child Jobs created)", ("trainjobs_per_s",)),
                        ("pods Ready when the last child Job appeared", ("pods_ready_at_jobs_created",)),
                        ("apiserver requests per TrainJob (all clients, to all Jobs)", ("apiserver_requests_per_trainjob",)),
                        ("controller requests per TrainJob (audit, to all Jobs)", ("controller_requests_per_trainjob",)),
                        ("controller writes per TrainJob (audit, to all Jobs)", ("controller_writes_per_trainjob",)),
                        ("controller CPU to all Jobs (s)", ("window_jobs", "controller_cpu_s")),
                        ("kube-apiserver CPU to all Jobs (s)", ("window_jobs", "cpu_s", "kube-apiserver")),
                        ("first create -> every pod Ready (s)", ("all_ready_s",)),
                        ("apiserver requests per TrainJob, to all Ready", ("apiserver_requests_per_trainjob_until_ready",)),
                        ("controller requests per TrainJob, to all Ready", ("controller_requests_per_trainjob_until_ready",))):
        a, b = _get(g2, *keys), _get(p2_, *keys)
        lines.append(f"| {label} | {'—' if a is None else a} | {'—' if b is None else b} | {_ratio(a, b)} |")
    for who, r in (("gangctl", g2), ("peer", p2_)):
        if r:
            lines.append(f"{who}: load {_get(r, 'window_jobs', 'loadavg_at_start')}; controller requests "
                         f"{_get(r, 'window_jobs', 'audit', 'requests_by_what')}")
    lines += ["", "P3 cold start", "| side | step | pods (managed label) | ready (s) | RSS at ready | RSS settled | peak RSS | load |",
              "|---|---|---:|---:|---:|---:|---:|---|"]
    for who, d in (("gangctl", g), ("peer", p)):
        for pt in _get(d, "p3", "points") or []:
            lines.append(f"| {who} | {pt['step']} | {pt['objects']['pods']} ({pt['objects']['pods_managed_label']}) | "
                         f"{pt.get('ready_s')} | {pt.get('rss_at_ready_mib', '—')} | {pt.get('rss_settled_mib')} | "
                         f"{pt.get('peak_rss_mib')} | {pt.get('loadavg_at_start')} |")
        if _get(d, "p3", "per_pod"):
            lines.append(f"{who} per pod: {_get(d, 'p3', 'per_pod')}")
    for who, d in (("gangctl", g), ("peer", p)):
        for pt in _get(d, "p3", "points") or []:
            lines.append(f"{who} P3 {pt['step']}: a paged pod LIST, per pod: {pt.get('pod_list_cost')}")
    lines += ["", "Goals"] + goals(data)
    for who, d in (("gangctl", g), ("peer", p)):
        if d.get("idle"):
            lines.append(f"{who} idle cluster: {d['idle']['apiserver_requests_per_s']} req/s, CPU in 10 s {d['idle']['cpu_s']}")
        if d.get("baseline"):
            lines.append(f"{who} RSS on the empty cluster: {d['baseline']}")
    return "\n".join(lines)


def goals(data: dict) -> list[str]:
    g, p = data.get("gangctl", {}), data.get("peer", {})
    out = []

    def check(name: str, value: Any, limit: float, fmt: str = "{:.2f}", le: bool = True) -> None:
        if value is None:
            out.append(f"- {name}: not measured")
            return
        met = value <= limit if le else value >= limit
        out.append(f"- {name}: {fmt.format(value)} ({'<=' if le else '>='} {limit}) -> {'met' if met else 'MISSED'}")

    fb, gb, pb = _get(g, "p1_floor", "bound_s"), _get(g, "p1", "bound_s"), _get(p, "p1", "bound_s")
    check("P1 gangctl / floor, create -> all bound", gb / fb if gb and fb else None, 1.1)
    check("P1 gangctl / peer, create -> all bound", gb / pb if gb and pb else None, 0.5)
    check("P1 gangctl writes for the job while it waits", _get(g, "p1", "window", "audit", "job_writes"), 10, "{}")
    gt, pt = _get(g, "p2", "trainjobs_per_s"), _get(p, "p2", "trainjobs_per_s")
    check("P2 gangctl TrainJobs/s (all child Jobs created)", gt, 50, "{:.1f}", le=False)
    check("P2 gangctl / peer TrainJobs/s", gt / pt if gt and pt else None, 3, le=False)
    for label, key in (("to all child Jobs", "apiserver_requests_per_trainjob"),
                       ("to every pod Ready", "apiserver_requests_per_trainjob_until_ready")):
        a, b = _get(g, "p2", key), _get(p, "p2", key)
        check(f"P2 apiserver requests per TrainJob gangctl / peer ({label})", a / b if a and b else None, 0.5)
    pts = _get(g, "p3", "points") or []
    last = pts[-1] if pts else {}
    pods = _get(last, "objects", "pods")
    check(f"P3 gangctl process start -> /readyz at {pods} pods (s)", last.get("ready_s"), 30, "{:.1f}")
    check(f"P3 gangctl RSS once settled at {pods} pods (MiB)", last.get("rss_settled_mib"), 512, "{:.0f}")
    check(f"P3 gangctl peak RSS at {pods} pods (MiB)", last.get("peak_rss_mib"), 512, "{:.0f}")
    return out


# The figures published per round and summarised over rounds: (label, side, path in that side's data).
MEDIAN_FIGURES = (
    ("P1 first create → all pods bound (s)", (("floor", ("p1_floor", "bound_s")), ("gangctl", ("p1", "bound_s")),
                                              ("peer", ("p1", "bound_s")))),
    ("P1 controller's writes for the job while it waits", (("gangctl", ("p1", "window", "audit", "job_writes")),
                                                           ("peer", ("p1", "window", "audit", "job_writes")))),
    ("P2 TrainJobs/s (all child Jobs created)", (("gangctl", ("p2", "trainjobs_per_s")), ("peer", ("p2", "trainjobs_per_s")))),
    ("P2 apiserver requests per TrainJob (all clients)", (("gangctl", ("p2", "apiserver_requests_per_trainjob")),
                                                          ("peer", ("p2", "apiserver_requests_per_trainjob")))),
    ("P3 process start → ready, with fillers (s)", (("gangctl", ("p3", "points", -1, "ready_s")),
                                                    ("peer", ("p3", "points", -1, "ready_s")))),
    ("P3 RSS settled, with fillers (MiB)", (("gangctl", ("p3", "points", -1, "rss_settled_mib")),
                                            ("peer", ("p3", "points", -1, "rss_settled_mib")))),
)


def _at(d: Any, path: tuple) -> Any:
    for k in path:
        try:
            d = d[k]
        except (KeyError, IndexError, TypeError):
            return None
    return d


def median_rows(round_data: list[dict]) -> tuple[list[str], list[list]]:
    """Each figure of `MEDIAN_FIGURES` as its median and range over the rounds (`rounds.summary`; the floor
    runs on gangctl's cluster), with gangctl's median over the floor's and the peer's."""
    columns = ["", "floor (no controller)", "gangctl", "peer", "gangctl / floor", "gangctl / peer"]
    rows = []
    for label, cells in MEDIAN_FIGURES:
        got = {who: rounds.summary(_at(r.get("gangctl" if who == "floor" else who), path) for r in round_data)
               for who, path in cells}
        rows.append([label, got.get("floor"), got.get("gangctl"), got.get("peer"),
                     rounds.ratio(got.get("gangctl"), got.get("floor")), rounds.ratio(got.get("gangctl"), got.get("peer"))])
    return columns, rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--scenarios", default="p1,p2,p3", help="comma-separated: p1, p4, p2, p3 (run in this order)")
    ap.add_argument("--p4-rounds", type=int, default=3, help="P4: recoveries, each of a fresh TrainJob")
    ap.add_argument("--only", choices=["gangctl", "peer"], help="run one side only")
    ap.add_argument("--gpu-nodes", type=int, default=5000)
    ap.add_argument("--gpus-per-node", type=int, default=8)
    ap.add_argument("--p1-pods", type=int, default=1024)
    ap.add_argument("--p1-gpus", type=int, default=8, help="GPUs per pod of the P1 TrainJob")
    ap.add_argument("--p2-jobs", type=int, default=2000)
    ap.add_argument("--p2-nodes", type=int, default=8, help="pods per P2 TrainJob (1 GPU each)")
    ap.add_argument("--p2-concurrency", type=int, default=16, help="TrainJob creates in flight")
    ap.add_argument("--p2-settle", type=float, default=240, help="seconds to wait for every P2 pod Ready after the Jobs")
    ap.add_argument("--p3-pods", type=int, default=50000, help="pods in the cluster at the second cold start")
    ap.add_argument("--p3-timeout", type=float, default=300)
    ap.add_argument("--extrapolate", type=int, default=150000)
    ap.add_argument("--node-lease-seconds", type=int, default=200, help="KWOK node Lease duration (renewed every 1/4)")
    ap.add_argument("--node-monitor-grace", default="240s", help="kube-controller-manager's node-monitor-grace-period")
    ap.add_argument("--gangctl-env", action="append", default=[], metavar="KEY=VALUE",
                    help="environment of `gangctl controller`, e.g. GANGCTL_WORKERS=16 (repeatable)")
    ap.add_argument("--timeout", type=float, default=600, help="seconds to wait for a scenario's pods or Jobs")
    ap.add_argument("--cluster-prefix", default="gangctl-bench-scale")
    ap.add_argument("--keep", action="store_true")
    ap.add_argument("--json", metavar="FILE", help="write (merge) the results as JSON after every scenario")
    ap.add_argument("--report", metavar="FILE", help="only print the tables of a JSON written before")
    ap.add_argument("--rounds", type=int, default=rounds.MIN_ROUNDS,
                    help="runs per side, alternating which side goes first; the medians are published")
    ap.add_argument("--record", action="store_true", help="write the medians to benchmarks/results/scale.json")
    args = ap.parse_args()
    if args.report:
        data = json.loads(Path(args.report).read_text())
        print(report(data) + "\n\n" + medians_text(data))
        return 0
    only_p4 = set(args.scenarios.split(",")) == {"p4"}   # P4's medians are over its --p4-rounds recoveries
    if args.rounds < 1 or (problem := rounds.check_rounds(args.p4_rounds if only_p4 else args.rounds, args.record)) \
            or (args.record and args.only):
        ap.error("--rounds must be at least 1" if args.rounds < 1 else
                 problem or "--record publishes both sides: drop --only")
    if not args.cluster_prefix.startswith("gangctl-bench"):
        ap.error("--cluster-prefix must start with gangctl-bench")
    if "p1" in args.scenarios and args.p1_pods * args.p1_gpus > args.gpu_nodes * args.gpus_per_node:
        ap.error("the P1 gang does not fit")
    path = Path(args.json) if args.json else None
    data: dict = json.loads(path.read_text()) if path and path.exists() else {}
    conditions = {"machine": cp.machine(), "gangctl": _git("rev-parse", "--short", "HEAD"),
                  "gangctl_uncommitted": sorted(ln[3:] for ln in _git("status", "--porcelain", "--", "gangctl").split("\n") if ln.strip()),
                  "argv": sys.argv[1:], "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                  "gangctl_env": {**{k: v for k, v in os.environ.items() if k.startswith("GANGCTL_")},
                                  **dict(kv.split("=", 1) for kv in args.gangctl_env)},
                  **{k: vars(args)[k] for k in ("gpu_nodes", "gpus_per_node", "node_lease_seconds", "node_monitor_grace")}}
    integrations = REPO / "integrations"
    conditions.update(peer.versions(integrations))
    conditions["kubernetes"] = cp.pinned_version(integrations / "controlplane", "k8s.io/kubernetes")
    say("conditions: " + json.dumps(conditions))
    failed = False
    if "rounds" not in data:   # a file from before rounds: what it holds is round 1
        data["rounds"] = [{k: data[k] for k in ("gangctl", "peer") if k in data}] if data else []
    for n, side in rounds.order([s for s in ("gangctl", "peer") if args.only in (None, s)], args.rounds):
        say(f"round {n + 1} of {args.rounds}: {side}")
        if n == len(data["rounds"]):
            data["rounds"].append({})
        data[side] = data["rounds"][n][side] = {"conditions": conditions}   # the top level: the latest round

        def save(key: str, value: dict, side: str = side) -> None:
            data[side][key] = value
            if path:
                path.write_text(json.dumps(data, indent=2) + "\n")
        try:
            run_side(args, side, save)
        except Exception as err:  # keep what was measured; the other side still runs
            failed = True
            import traceback
            traceback.print_exc()
            say(f"{side} side failed: {type(err).__name__}: {err}")
            save("error", {"error": f"{type(err).__name__}: {err}"})
    print(report(data) + "\n\n" + medians_text(data))
    if "p4" in args.scenarios.split(","):
        columns, rows = p4_rows(data)
        print("\n" + " | ".join(columns) + "\n" + "\n".join(" | ".join(published.cell(c) for c in row) for row in rows))
        if args.record:
            out = published.record("scale", columns, rows, f"{args.p4_rounds} recoveries per way and side, each of a fresh "
                                   "TrainJob; gangctl's two ways alternate which goes first; each side on a cluster of its "
                                   "own", peer=f"Kubeflow Trainer {conditions['kubeflow-trainer']} + JobSet "
                                   f"{conditions['jobset']}", part="P4 recovery from one failed pod")
            say(f"recorded {out}; run benchmarks/results_page.py to regenerate the page")
    if args.record and not only_p4:
        columns, rows = median_rows(data["rounds"])
        out = published.record("scale", columns, rows, f"{args.rounds} rounds per side, alternating which side goes "
                               "first; each cell the median (range)", peer="Kubeflow Trainer "
                               f"{conditions['kubeflow-trainer']} + JobSet {conditions['jobset']}")
        say(f"recorded {out}; run benchmarks/results_page.py to regenerate the page")
    return 1 if failed else 0


P4_FIGURES = (("the failure → every pod of the gang Running again (s)", "all_running_s"),
              ("the failure → the restart charged in status (s)", "charged_s"),
              ("the failure → the first new pod created (s)", "first_new_pod_s"),
              ("new pods", "new_pods"))


def p4_rows(data: dict) -> tuple[list[str], list[list]]:
    """P4's figures per way of recovering, each the median and range of every recovery of every round,
    with in place over recreate and over the peer."""
    round_data = data.get("rounds") or [{k: data[k] for k in ("gangctl", "peer") if k in data}]
    runs: dict[tuple[str, str], list[dict]] = {}
    pods = None
    for r in round_data:
        for side in ("gangctl", "peer"):
            got = _get(r.get(side), "p4") or {}
            pods = pods or got.get("pods")
            for mode, rs in (got.get("runs") or {}).items():
                runs.setdefault((side, mode), []).extend(rs)
    nodes = _get(round_data[-1].get("gangctl") or round_data[-1].get("peer"), "conditions", "gpu_nodes")
    columns = [f"P4, {pods} pods x 8 GPUs on {nodes} KWOK nodes", "gangctl in place", "gangctl recreate",
               "Trainer + JobSet (recreate)", "in place / recreate", "in place / peer"]
    rows = []
    for label, key in P4_FIGURES:
        cells = [rounds.summary(x.get(key) for x in runs.get(which, [])) for which in
                 (("gangctl", IN_PLACE), ("gangctl", RECREATE), ("peer", RECREATE))]
        rows.append([label, *cells, rounds.ratio(cells[0], cells[1]), rounds.ratio(cells[0], cells[2])])
    return columns, rows


def medians_text(data: dict) -> str:
    """The medians over the rounds of a --json file (an older file without rounds counts as one)."""
    round_data = data.get("rounds") or [{k: data[k] for k in ("gangctl", "peer") if k in data}]
    columns, rows = median_rows(round_data)
    return f"median (min-max, n runs) over {len(round_data)} round(s):\n" + "\n".join(
        " | ".join(published.cell(c) for c in row) for row in [columns, *rows])


def _git(*argv: str) -> str:
    return subprocess.run(["git", "-C", str(REPO), *argv], capture_output=True, text=True).stdout.rstrip()


if __name__ == "__main__":
    sys.exit(main())
