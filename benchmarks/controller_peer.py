"""gangctl against the Kubeflow Trainer controller, side by side in the same run.

    .venv/bin/python benchmarks/controller_peer.py                     # 200 TrainJobs x 4 nodes, 100 GPU nodes
    .venv/bin/python benchmarks/controller_peer.py --jobs 500 --nodes 4 --gpu-nodes 250 --json out.json

For each controller in turn (gangctl, then Kubeflow Trainer + JobSet) on a fresh local cluster of its
own (`gangctl-bench-<side>`: the same pinned kube-apiserver, kube-controller-manager, Coscheduling
scheduler, etcd and KWOK GPU nodes), submit the same N TrainJobs in a burst and measure:

- time from the first create to every TrainJob's pods created, and to every pod bound
  (gang-scheduled by the same Coscheduling profile, from PodGroups each controller creates);
- throughput (TrainJobs/s to all pods bound), per-TrainJob create -> all pods bound p50/p95;
- the controller's CPU seconds during the run and peak RSS (VmHWM) from /proc; for the peer the
  sum of trainer-controller-manager and the JobSet controller (gangctl does both jobs), each shown;
- apiserver requests served during the run (all clients, from its apiserver_request_total), and
  the CPU of kube-apiserver and kube-controller-manager.

The TrainJobs are identical on both sides (same runtimeRef name `torch-kwok-gpu`: gangctl's shipped
runtime for KWOK's fake GPU nodes, or Trainer's own torch-distributed under that name, with
`podGroupPolicy.coscheduling` and KWOK's toleration). Pods request 1 nvidia.com/gpu each and
stay Running (KWOK completes Job pods only after the delay the runtime's pod annotation gives: 1 h).
Each cluster is deleted afterwards (`--keep` leaves the last one up). Not a test: nothing asserts.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from gangctl.api.resources import CLUSTER_TRAINING_RUNTIMES, NAMESPACES, PODS, TRAINJOBS  # noqa: E402
from gangctl.cluster import lifecycle, setup  # noqa: E402
from gangctl.harness import peer, results, rounds  # noqa: E402
from gangctl.cluster.build import pinned_version  # noqa: E402
from gangctl.config import ClusterSettings  # noqa: E402
from gangctl.kube.client import ApiError, Kube  # noqa: E402
from gangctl.processes import free_port, wait_http_ok  # noqa: E402

NAMESPACE = "bench"
RUNTIME = "torch-kwok-gpu"
KWOK_COMPLETE_DELAY = "3600s"  # pods stay Running for the whole measurement
JOBSET_NAME_LABEL = "jobset.sigs.k8s.io/jobset-name"
CLK_TCK = os.sysconf("SC_CLK_TCK")


def say(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


# ---------- /proc -----------------------------------------------------------------------------

def cpu_seconds(pid: int) -> float:
    """user + system CPU of one process (its threads included)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def peak_rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return 0.0


def machine() -> dict:
    cpu = next((ln.split(":", 1)[1].strip() for ln in Path("/proc/cpuinfo").read_text().splitlines()
                if ln.startswith("model name")), platform.processor())
    mem = next(int(ln.split()[1]) for ln in Path("/proc/meminfo").read_text().splitlines() if ln.startswith("MemTotal"))
    return {"cpu": cpu, "cores": os.cpu_count(), "memory_gib": round(mem / 2**20, 1),
            "kernel": platform.release(), "python": platform.python_version(),
            "loadavg_at_start": os.getloadavg()[0]}


# ---------- the workload ----------------------------------------------------------------------

def trainjob(name: str, nodes: int, gpus: int) -> dict:
    return {"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob",
            "metadata": {"name": name, "namespace": NAMESPACE},
            "spec": {"runtimeRef": {"name": RUNTIME},
                     "trainer": {"image": "pytorch/pytorch:2.7.1-cuda12.8-cudnn9-runtime",
                                 "command": ["torchrun", "/workspace/train.py"],
                                 "numNodes": nodes,
                                 "resourcesPerNode": {"limits": {"nvidia.com/gpu": str(gpus)}}}}}


def with_kwok_delay(runtime: dict) -> dict:
    """The runtime with KWOK's pod-complete delay on its node pods (so they stay Running)."""
    for job in runtime["spec"]["template"]["spec"]["replicatedJobs"]:
        meta = job["template"]["spec"]["template"].setdefault("metadata", {})
        annotations = meta.setdefault("annotations", {})
        annotations["pod-complete.stage.kwok.x-k8s.io/delay"] = KWOK_COMPLETE_DELAY
        # KWOK waits min(delay, jitter) when the jitter bound is not above the delay, and the stage's
        # jitter is 5 s: without this the pods would complete about 5 s after they run.
        annotations["pod-complete.stage.kwok.x-k8s.io/jitter-delay"] = KWOK_COMPLETE_DELAY
    return runtime


@dataclass
class Result:
    controller: str
    version: str
    jobs: int
    pods: int
    submit_s: float = 0.0  # first create sent -> last create answered
    pods_created_s: float | None = None
    pods_bound_s: float | None = None
    trainjobs_per_s: float | None = None
    pods_bound_per_s: float | None = None
    job_bound_p50_s: float | None = None
    job_bound_p95_s: float | None = None
    controller_cpu_s: float = 0.0
    controller_peak_rss_mib: float = 0.0
    processes: dict = field(default_factory=dict)  # name -> {cpu_s, peak_rss_mib}
    apiserver_requests: int | None = None
    apiserver_requests_by_resource: dict = field(default_factory=dict)  # "verb resource" -> count, top 12
    loadavg_1m_at_start: float = 0.0
    apiserver_cpu_s: float | None = None
    controller_manager_cpu_s: float | None = None
    scheduler_cpu_s: float | None = None
    timed_out: bool = False
    create_errors: int = 0


async def apiserver_requests(kube: Kube) -> dict[str, float] | None:
    """apiserver_request_total summed by "VERB resource" (subresource included)."""
    try:
        text = await kube.text("/metrics")
    except ApiError:
        return None
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith("apiserver_request_total{"):
            labels = dict(re.findall(r'(\w+)="([^"]*)"', line.split("}", 1)[0]))
            key = f"{labels.get('verb', '?')} {labels.get('resource', '') or '-'}"
            if labels.get("subresource"):
                key += "/" + labels["subresource"]
            out[key] = out.get(key, 0.0) + float(line.rsplit(" ", 1)[1])
    return out


async def measure(kubeconfig: Path, jobs: int, nodes: int, gpus: int, concurrency: int, timeout: float,
                  procs: dict[str, int], cluster_pids: dict[str, int], res: Result, *,
                  collection: str = TRAINJOBS.path(namespace=NAMESPACE),
                  make: Callable[[str, int, int], dict] = trainjob, pod_label: str = JOBSET_NAME_LABEL) -> None:
    """Submit `jobs` objects made by `make(name, nodes, gpus)` to `collection` and watch their pods
    (labelled `pod_label` = the job's name) until all are bound; fills `res`."""
    kube = await Kube.connect(kubeconfig)
    try:
        await kube.apply(NAMESPACES.path(name=NAMESPACE),
                         {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}}, "bench")
        listing = await kube.get(PODS.path(namespace=NAMESPACE), labelSelector=pod_label)
        rv = listing["metadata"]["resourceVersion"]
        expected = jobs * nodes
        created: dict[str, float] = {}
        bound: dict[str, float] = {}
        pod_job: dict[str, str] = {}
        submitted: dict[str, float] = {}
        done = asyncio.Event()

        async def watch() -> None:
            nonlocal rv
            while not done.is_set():
                try:
                    async for ev in kube.watch(PODS.path(namespace=NAMESPACE), rv, label_selector=pod_label):
                        obj = ev["object"]
                        if ev["type"] == "BOOKMARK":
                            rv = obj["metadata"]["resourceVersion"]
                            continue
                        if ev["type"] == "ERROR":
                            raise RuntimeError(f"pod watch failed: {obj}")
                        now = time.monotonic()
                        rv = obj["metadata"]["resourceVersion"]
                        uid = obj["metadata"]["uid"]
                        created.setdefault(uid, now)
                        pod_job[uid] = obj["metadata"]["labels"].get(pod_label, "")
                        if obj["spec"].get("nodeName"):
                            bound.setdefault(uid, now)
                        if len(created) >= expected and len(bound) >= expected:
                            done.set()
                            return
                except asyncio.TimeoutError:
                    continue

        res.loadavg_1m_at_start = round(os.getloadavg()[0], 2)
        cpu0 = {n: cpu_seconds(p) for n, p in {**procs, **cluster_pids}.items()}
        req0 = await apiserver_requests(kube)
        watcher = asyncio.create_task(watch())
        await asyncio.sleep(0.5)  # the watch is open before the first create
        sem = asyncio.Semaphore(concurrency)
        t0 = time.monotonic()

        async def submit(i: int) -> None:
            name = f"bench-{i:05d}"
            async with sem:
                submitted[name] = time.monotonic()
                try:
                    await kube.create(collection, make(name, nodes, gpus))
                except ApiError as err:
                    res.create_errors += 1
                    say(f"create {name} failed: {err}")

        await asyncio.gather(*(submit(i) for i in range(jobs)))
        res.submit_s = time.monotonic() - t0
        say(f"{jobs} {make('x', 1, 1)['kind']}s submitted in {res.submit_s:.1f}s; waiting for {expected} pods bound")
        last_report = time.monotonic()
        while not done.is_set():
            if watcher.done():
                watcher.result()  # raises the watch's error
                break
            if time.monotonic() - t0 > timeout:
                res.timed_out = True
                say(f"timed out after {timeout:.0f}s: {len(created)} pods created, {len(bound)} bound of {expected}")
                break
            if time.monotonic() - last_report > 10:
                say(f"  {time.monotonic() - t0:5.0f}s: {len(created)}/{expected} pods created, {len(bound)} bound")
                last_report = time.monotonic()
            await asyncio.sleep(0.1)
        done.set()
        watcher.cancel()
        t_end = time.monotonic()
        cpu1 = {n: cpu_seconds(p) for n, p in {**procs, **cluster_pids}.items()}
        req1 = await apiserver_requests(kube)

        if len(created) >= expected:
            res.pods_created_s = max(created.values()) - t0
        if len(bound) >= expected:
            res.pods_bound_s = max(bound.values()) - t0
            res.trainjobs_per_s = jobs / res.pods_bound_s
            res.pods_bound_per_s = expected / res.pods_bound_s
            last_bound: dict[str, float] = {}
            for uid, t in bound.items():
                job = pod_job[uid]
                last_bound[job] = max(last_bound.get(job, 0.0), t)
            lat = sorted(last_bound[j] - submitted[j] for j in last_bound if j in submitted)
            res.job_bound_p50_s = statistics.median(lat)
            res.job_bound_p95_s = lat[min(len(lat) - 1, int(0.95 * len(lat)))]
        for name, pid in procs.items():
            res.processes[name] = {"cpu_s": round(cpu1[name] - cpu0[name], 2), "peak_rss_mib": round(peak_rss_mib(pid), 1)}
        res.controller_cpu_s = round(sum(p["cpu_s"] for p in res.processes.values()), 2)
        res.controller_peak_rss_mib = round(sum(p["peak_rss_mib"] for p in res.processes.values()), 1)
        for key, comp in (("apiserver_cpu_s", "kube-apiserver"), ("controller_manager_cpu_s", "kube-controller-manager"),
                          ("scheduler_cpu_s", "kube-scheduler")):
            if comp in cluster_pids:
                setattr(res, key, round(cpu1[comp] - cpu0[comp], 2))
        if req0 is not None and req1 is not None:
            delta = {k: int(v - req0.get(k, 0.0)) for k, v in req1.items()}
            res.apiserver_requests = sum(delta.values())
            res.apiserver_requests_by_resource = dict(sorted(((k, v) for k, v in delta.items() if v > 0),
                                                             key=lambda kv: -kv[1])[:12])
        say(f"done in {t_end - t0:.1f}s")
    finally:
        await kube.close()


# ---------- the two sides ---------------------------------------------------------------------

def cluster_pids(settings: ClusterSettings) -> dict[str, int]:
    pid_dir = settings.kwok_workdir / "clusters" / settings.cluster_name / "pids"
    out = {}
    for f in pid_dir.glob("*.pid"):
        try:
            out[f.stem] = int(f.read_text().strip())
        except ValueError:
            pass
    return out


async def apply_runtime(kubeconfig: Path, runtime: dict) -> None:
    kube = await Kube.connect(kubeconfig)
    try:
        await kube.apply(CLUSTER_TRAINING_RUNTIMES.path(name=runtime["metadata"]["name"]), runtime, setup.FIELD_MANAGER)
    finally:
        await kube.close()


def start_gangctl(settings: ClusterSettings, kubeconfig: Path) -> subprocess.Popen:
    """`gangctl controller` from this tree against the cluster, once its /readyz answers."""
    port = free_port()
    log = (settings.cache_dir / "bench-gangctl-controller.log").open("wb")
    controller = subprocess.Popen([str(REPO / ".venv" / "bin" / "gangctl"), "controller", "--metrics-port", str(port)],
                                  env=dict(os.environ, KUBECONFIG=str(kubeconfig)), stdout=log,
                                  stderr=subprocess.STDOUT, start_new_session=True)
    wait_http_ok(f"http://127.0.0.1:{port}/readyz", 60, "gangctl controller", lambda: controller.poll() is None)
    say(f"gangctl controller running (pid {controller.pid})")
    return controller


def stop_gangctl(controller: subprocess.Popen | None) -> None:
    if controller is None:
        return
    controller.terminate()
    try:
        controller.wait(15)
    except subprocess.TimeoutExpired:
        controller.kill()


def run_gangctl(args: argparse.Namespace, res_version: str) -> Result:
    settings = ClusterSettings(cluster_name=f"{args.cluster_prefix}-gangctl")
    lifecycle.down(settings, lambda m: None)
    say(f"cluster {settings.cluster_name}: starting ({args.gpu_nodes} GPU nodes)")
    cluster = lifecycle.up(settings, lifecycle.UpOptions(gpu_nodes=args.gpu_nodes, gpus_per_node=args.gpus_per_node), say)
    controller = None
    try:
        rt = next(d for d in setup.load_manifests(settings.deploy_dir / "runtimes") if d["metadata"]["name"] == RUNTIME)
        asyncio.run(apply_runtime(cluster.kubeconfig, with_kwok_delay(rt)))
        controller = start_gangctl(settings, cluster.kubeconfig)
        res = Result("gangctl", res_version, args.jobs, args.jobs * args.nodes)
        asyncio.run(measure(cluster.kubeconfig, args.jobs, args.nodes, args.gpus_per_pod, args.concurrency,
                            args.timeout, {"gangctl": controller.pid}, cluster_pids(settings), res))
        return res
    finally:
        stop_gangctl(controller)
        if not args.keep:
            lifecycle.down(settings, say)


def run_peer(args: argparse.Namespace) -> Result:
    settings = ClusterSettings(cluster_name=f"{args.cluster_prefix}-trainer")
    lifecycle.down(settings, lambda m: None)
    say(f"cluster {settings.cluster_name}: starting ({args.gpu_nodes} GPU nodes)")
    # The base cluster and nodes as `cluster up` makes them, without gangctl's CRDs and runtimes:
    # the peer brings its own TrainJob CRDs.
    cluster = lifecycle.local_cluster(settings)
    cluster.create()
    try:
        asyncio.run(gpu_nodes(cluster.kubeconfig, args.gpu_nodes, args.gpus_per_node))
        running = peer.start(settings, cluster.kubeconfig, say, progress=build_progress)
        asyncio.run(apply_runtime(cluster.kubeconfig, with_kwok_delay(peer.runtime(settings.integrations_dir, name=RUNTIME))))
        v = peer.versions(settings.integrations_dir)
        res = Result("kubeflow-trainer", f"{v['kubeflow-trainer']} + jobset {v['jobset']}", args.jobs, args.jobs * args.nodes)
        asyncio.run(measure(cluster.kubeconfig, args.jobs, args.nodes, args.gpus_per_pod, args.concurrency,
                            args.timeout, running.pids, cluster_pids(settings), res))
        return res
    finally:
        if not args.keep:
            lifecycle.down(settings, say)  # stops trainer and jobset too (they run from the scheduler state folder)


async def gpu_nodes(kubeconfig: Path, count: int, gpus: int) -> None:
    kube = await Kube.connect(kubeconfig)
    try:
        await setup.create_gpu_nodes(kube, count, gpus)

        async def ready() -> bool:
            return await setup.count_ready_nodes(kube) >= count
        await setup.wait_for(ready, 180, f"{count} GPU nodes to be Ready")
    finally:
        await kube.close()


def build_progress(what: str, done: int, total: int, line: str) -> None:
    if line == "built":
        say(f"built {what} ({done}/{total})")


# ---------- report ----------------------------------------------------------------------------

ROWS = [
    ("submit N TrainJobs (s)", "submit_s", "{:.2f}"),
    ("first create -> all pods created (s)", "pods_created_s", "{:.2f}"),
    ("first create -> all pods bound (s)", "pods_bound_s", "{:.2f}"),
    ("TrainJobs/s (all pods bound)", "trainjobs_per_s", "{:.1f}"),
    ("pods bound/s", "pods_bound_per_s", "{:.1f}"),
    ("TrainJob create -> all bound p50 (s)", "job_bound_p50_s", "{:.2f}"),
    ("TrainJob create -> all bound p95 (s)", "job_bound_p95_s", "{:.2f}"),
    ("controller CPU (s)", "controller_cpu_s", "{:.1f}"),
    ("controller peak RSS (MiB)", "controller_peak_rss_mib", "{:.0f}"),
    ("apiserver requests (all clients)", "apiserver_requests", "{:d}"),
    ("kube-apiserver CPU (s)", "apiserver_cpu_s", "{:.1f}"),
    ("kube-controller-manager CPU (s)", "controller_manager_cpu_s", "{:.1f}"),
    ("kube-scheduler CPU (s)", "scheduler_cpu_s", "{:.1f}"),
]


def table(results: list[Result], kind: str = "TrainJob") -> str:
    heads = ["metric"] + [r.controller for r in results] + (["ratio gangctl/peer"] if len(results) == 2 else [])
    lines = []
    for label, key, fmt in ROWS:
        vals = [getattr(r, key) for r in results]
        cells = [label.replace("TrainJob", kind)] + ["—" if v is None else fmt.format(v) for v in vals]
        if len(results) == 2:
            a, b = vals
            cells.append("—" if a is None or b in (None, 0) else f"{a / b:.2f}")
        lines.append(cells)
    widths = [max(len(str(row[i])) for row in [heads] + lines) for i in range(len(heads))]
    fmt_row = lambda row: "| " + " | ".join(str(c).ljust(w) for c, w in zip(row, widths)) + " |"  # noqa: E731
    out = [fmt_row(heads), "|" + "|".join("-" * (w + 2) for w in widths) + "|"] + [fmt_row(r) for r in lines]
    for r in results:
        procs = ", ".join(f"{n}: {p['cpu_s']} s CPU, {p['peak_rss_mib']} MiB peak" for n, p in r.processes.items())
        out.append(f"{r.controller} ({r.version}; load average {r.loadavg_1m_at_start} at start): {procs}" + (" — TIMED OUT" if r.timed_out else "")
                   + (f" — {r.create_errors} creates failed" if r.create_errors else ""))
        if r.apiserver_requests_by_resource:
            out.append("  apiserver requests: " + ", ".join(f"{k} {v}" for k, v in r.apiserver_requests_by_resource.items()))
    return "\n".join(out)


def run_rounds(args: argparse.Namespace, sides: dict[str, Callable[[], Result]]) -> dict[str, list[Result]]:
    """Each side `args.rounds` times, alternating which goes first (`rounds.order`): {side: its runs}."""
    runs: dict[str, list[Result]] = {side: [] for side in sides}
    for n, side in rounds.order(list(sides), args.rounds):
        say(f"round {n + 1} of {args.rounds}: {side}")
        runs[side].append(sides[side]())
    return runs


def median_rows(runs: dict[str, list[Result]], kind: str = "TrainJob") -> tuple[list[str], list[list]]:
    """The figures of `ROWS` as each side's median and range over its rounds (`rounds.summary`), with the
    ratio of the medians when there are two sides: the columns and rows of the published table."""
    summaries = {side: rounds.aggregate([asdict(r) for r in rs], [key for _, key, _ in ROWS]) for side, rs in runs.items()}
    sides = list(summaries)
    columns = ["metric", *sides] + (["gangctl / peer (medians)"] if len(sides) == 2 else [])
    rows = []
    for label, key, _ in ROWS:
        cells = [summaries[side][key] for side in sides]
        rows.append([label.replace("TrainJob", kind), *cells]
                    + ([rounds.ratio(*cells)] if len(sides) == 2 else []))
    return columns, rows


def publish(args: argparse.Namespace, benchmark: str, runs: dict[str, list[Result]], kind: str, peer_name: str) -> None:
    """Print the medians; with `--record`, write them as the benchmark's current result and say so."""
    columns, rows = median_rows(runs, kind)
    print(f"\nmedian (min-max, n runs) over {args.rounds} round(s) per side, alternating which side goes first:")
    for row in [columns, *rows]:
        print(" | ".join(results.cell(c) for c in row))
    if args.record:
        path = results.record(benchmark, columns, rows, f"{args.rounds} rounds per side, alternating which side "
                              "goes first; each cell the median (range)", peer=peer_name)
        say(f"recorded {path}; run benchmarks/results_page.py to regenerate the page")


def report(args: argparse.Namespace, conditions: dict, runs: dict[str, list[Result]], benchmark: str, kind: str,
           peer_name: str) -> int:
    """Print each round's table and the medians, write --json and --record; the exit status (1 if any run
    timed out or failed a create)."""
    print(f"\n{args.jobs} {kind}s x {args.nodes} pods ({args.jobs * args.nodes} pods, {args.gpus_per_pod} GPU each) "
          f"on {args.gpu_nodes} KWOK nodes x {args.gpus_per_node} GPUs; {conditions['machine']['cores']} cores "
          f"({conditions['machine']['cpu']}); Kubernetes {conditions['kubernetes']}, scheduler-plugins "
          f"{conditions['scheduler_plugins']}\n")
    for n in range(args.rounds):
        print(f"round {n + 1}:\n" + table([rs[n] for rs in runs.values()], kind=kind))
    publish(args, benchmark, runs, kind, peer_name)
    if args.json:
        columns, rows = median_rows(runs, kind)
        payload = json.dumps({"conditions": conditions, "rounds": {side: [asdict(r) for r in rs] for side, rs in runs.items()},
                              "medians": {"columns": columns, "rows": rows}}, indent=2)
        print(payload) if args.json == "-" else Path(args.json).write_text(payload + "\n")
    return 0 if all(not r.timed_out and not r.create_errors for rs in runs.values() for r in rs) else 1


def parse_args(doc: str, kind: str) -> argparse.Namespace:
    """The command line both peer benchmarks share (`kind`: TrainJob or PyTorchJob), checked."""
    ap = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--jobs", type=int, default=200, help=f"{kind}s submitted in one burst")
    ap.add_argument("--nodes", type=int, default=4, help=f"pods per {kind} (one gang)")
    ap.add_argument("--gpu-nodes", type=int, default=100, help="KWOK GPU nodes in each cluster")
    ap.add_argument("--gpus-per-node", type=int, default=8)
    ap.add_argument("--gpus-per-pod", type=int, default=1)
    ap.add_argument("--concurrency", type=int, default=16, help=f"{kind} creates in flight")
    ap.add_argument("--timeout", type=float, default=300, help="seconds to wait for all pods bound, per side")
    ap.add_argument("--only", choices=["gangctl", "peer"], help="run one side only")
    ap.add_argument("--cluster-prefix", default="gangctl-bench")
    ap.add_argument("--keep", action="store_true", help="leave the clusters running (default: delete them)")
    ap.add_argument("--json", metavar="FILE", help="also write the results as JSON ('-' for stdout)")
    ap.add_argument("--rounds", type=int, default=rounds.MIN_ROUNDS,
                    help="runs per side, alternating which side goes first; the medians are published")
    ap.add_argument("--record", action="store_true", help="write the medians to benchmarks/results/ (both sides, "
                    f"--rounds {rounds.MIN_ROUNDS} or more)")
    args = ap.parse_args()
    if args.rounds < 1:
        ap.error("--rounds must be at least 1")
    if (problem := rounds.check_rounds(args.rounds, args.record)) or (args.record and args.only):
        ap.error(problem or "--record publishes both sides: drop --only")
    if not args.cluster_prefix.startswith("gangctl-bench"):
        ap.error("--cluster-prefix must start with gangctl-bench")
    demand = args.jobs * args.nodes * args.gpus_per_pod
    if demand > args.gpu_nodes * args.gpus_per_node:
        ap.error(f"{demand} GPUs asked for but the cluster has {args.gpu_nodes * args.gpus_per_node}: "
                 "every gang must fit at once")
    return args


def main() -> int:
    args = parse_args(__doc__, "TrainJob")
    integrations = REPO / "integrations"
    conditions = {
        "machine": machine(),
        "jobs": args.jobs, "nodes_per_job": args.nodes, "pods": args.jobs * args.nodes,
        "gpu_nodes": args.gpu_nodes, "gpus_per_node": args.gpus_per_node, "gpus_per_pod": args.gpus_per_pod,
        "create_concurrency": args.concurrency,
        "kubernetes": pinned_version(integrations / "controlplane", "k8s.io/kubernetes"),
        "scheduler_plugins": pinned_version(integrations / "coscheduling", "sigs.k8s.io/scheduler-plugins"),
        "etcd": pinned_version(integrations / "controlplane", "go.etcd.io/etcd/server/v3"),
        "kwok": pinned_version(integrations / "kwok", "sigs.k8s.io/kwok"),
        "go": subprocess.run([shutil.which("go") or "go", "env", "GOVERSION"], capture_output=True, text=True).stdout.strip(),
        **peer.versions(integrations),
    }
    gangctl_version = "git " + subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"],
                                              capture_output=True, text=True).stdout.strip()
    conditions["gangctl"] = gangctl_version
    # The controller runs from this working tree: say if it differs from the commit named above.
    dirty = subprocess.run(["git", "-C", str(REPO), "status", "--porcelain", "--", "gangctl"],
                           capture_output=True, text=True).stdout.split("\n")
    conditions["gangctl_uncommitted"] = sorted(line[3:] for line in dirty if line.strip())
    say("conditions: " + json.dumps(conditions))
    sides = {"gangctl": lambda: run_gangctl(args, gangctl_version), "kubeflow-trainer": lambda: run_peer(args)}
    runs = run_rounds(args, {k: v for k, v in sides.items() if args.only in (None, "gangctl" if k == "gangctl" else "peer")})
    return report(args, conditions, runs, "controller_peer", "TrainJob",
                  f"Kubeflow Trainer {conditions['kubeflow-trainer']} + JobSet {conditions['jobset']}")


if __name__ == "__main__":
    sys.exit(main())
