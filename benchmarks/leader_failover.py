"""Leader failover of gangctl running inside the local cluster (deploy/overlays/local: 2 replicas with
leader election on process nodes, in-cluster auth under ServiceAccount gangctl-system/gangctl).

    .venv/bin/python benchmarks/leader_failover.py [--kills 10] [--handovers 10] [--pauses 3]
        [--cluster gangctl-bench-failover] [--json FILE|-] [--keep]

Brings up a cluster of its own (2 KWOK GPU nodes, 3 process nodes) whose kube-apiserver writes an
audit log (`--audit-log-path`, `--audit-policy-file`: every request of gangctl's ServiceAccount at
Metadata level, nothing else), installs the overlay with `kubectl apply --server-side -k`, then:

(a) node loss, `--kills` times: SIGKILL of the node agent of the leader's process node (its pods'
    processes die with it, PDEATHSIG through the shim); a 1-node KWOK TrainJob is submitted as soon
    as the old leader's process is gone (milliseconds; before that, it still leads and may create the
    child Job itself). Measured from the kill: `lease` = the standby holds the Lease, `job` = the
    TrainJob's child Job exists; the audit log says which pod created it.
    Then the lost Node is deleted, its pod force-deleted (what an operator does about a dead node:
    the pod would otherwise wait out the default 300 s unreachable toleration) and a new process
    node started, so the ReplicaSet's replacement has a node.
(b) graceful handover, `--handovers` times: the leader pod deleted (the agent sends SIGTERM; the
    controller drains and releases the Lease) -> the other replica holds the Lease.
(c) a deposed leader alive, `--pauses` times: SIGSTOP of the leader's controller process for
    lease duration + 5 s (a frozen or partitioned leader) while a TrainJob is submitted, then
    SIGCONT: the standby took over meanwhile; the old leader must notice and exit without writing.
    Measured: `lease` = SIGSTOP -> the standby holds the Lease.
Then, for every round of (a), (b), (c), the audit log gives the API writes (create, update, patch,
delete, deletecollection) made with the old leader's token (user
system:serviceaccount:gangctl-system:gangctl, user.extra authentication.kubernetes.io/pod-name =
the old pod) received after its deadline = min(last successful Lease renewal + renew deadline 10 s,
the new leader's first successful Lease write) and before the next round starts (a paused leader's
pod restarts its container, which may lead again in a later round). Goal: 0.

Each round waits first for a steady state: 2 pods Running, one holding the Lease, the standby's
current container's log saying its caches are synced. The cluster is deleted at the end (its audit log is kept, path printed).
"""
from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import os
import signal
import statistics
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import yaml  # noqa: E402

from gangctl.api.resources import JOBS, NODES, TRAINJOBS  # noqa: E402
from gangctl.harness import incluster, results as published  # noqa: E402
from gangctl.cluster.build import ensure_built  # noqa: E402
from gangctl.cluster.lifecycle import UpOptions, down, prepare, process_node_state, start_process_nodes  # noqa: E402
from gangctl.cluster.local import LocalCluster, Ports  # noqa: E402
from gangctl.config import ClusterSettings  # noqa: E402
from gangctl.kube.client import ApiError, Kube  # noqa: E402
from gangctl.nodeagent import launch  # noqa: E402
from gangctl.model.names import child_job_name  # noqa: E402

NS = "bench"
SA_USER = f"system:serviceaccount:{incluster.NAMESPACE}:{incluster.SERVICE_ACCOUNT}"
POD_NAME_EXTRA = "authentication.kubernetes.io/pod-name"
WRITE_VERBS = {"create", "update", "patch", "delete", "deletecollection"}
LEASE_SECONDS, RENEW_DEADLINE = 15.0, 10.0  # the controller's defaults (ControllerSettings)
GOAL_FAILOVER_P95, GOAL_HANDOVER = 17.0, 3.0
AUDIT_POLICY = {
    "apiVersion": "audit.k8s.io/v1", "kind": "Policy", "omitStages": ["RequestReceived"],
    "rules": [{"level": "Metadata", "users": [SA_USER]}, {"level": "None"}],
}


def say(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


@dataclasses.dataclass(frozen=True)
class AuditedCluster(LocalCluster):
    """The local cluster, its kube-apiserver writing an audit log (this benchmark's cluster only)."""
    # Defaults only because LocalCluster's own fields have them; the benchmark always passes both.
    audit_policy: Path = Path("/nonexistent")
    audit_log: Path = Path("/nonexistent")

    def component_args(self, ports: Ports) -> dict[str, dict[str, str]]:
        args = super().component_args(ports)
        args["kube-apiserver"] = {**args["kube-apiserver"], "audit-policy-file": str(self.audit_policy),
                                  "audit-log-path": str(self.audit_log), "audit-log-maxsize": "0"}
        return args


def alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def ts(text: str) -> float:
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def pct(values: list[float], q: float) -> float:
    """Nearest-rank percentile."""
    s = sorted(values)
    return s[max(0, min(len(s) - 1, int(-(-q * len(s) // 100)) - 1))]


def summary(values: list[float]) -> dict:
    if not values:
        return {}
    return {"n": len(values), "p50": round(statistics.median(values), 2), "p95": round(pct(values, 95), 2),
            "min": round(min(values), 2), "max": round(max(values), 2)}


def process_started_at(pid: int) -> float:
    """Wall-clock start of a process (/proc/<pid>/stat field 22, in clock ticks since boot)."""
    ticks = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19])
    btime = next(int(ln.split()[1]) for ln in Path("/proc/stat").read_text().splitlines() if ln.startswith("btime"))
    return btime + ticks / os.sysconf("SC_CLK_TCK")


def synced_since_start(pod: dict, log: str) -> bool:
    """The pod's running controller process logged `caches synced`. A restarted container's log is
    the previous one until it writes its own, and its status may still show the old start: so the
    line must be from after the start of the process itself."""
    found = incluster.controller_process(pod)
    if not found:
        return False
    try:
        started = process_started_at(found[0]) - 1  # btime has whole seconds
    except (OSError, ValueError, IndexError):
        return False
    for line in log.splitlines():
        if "caches synced" in line:
            try:  # "2026-11-23 13:48:38,936 INFO ..." (logging's asctime, UTC on our machines)
                at = datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f").replace(tzinfo=timezone.utc).timestamp()
            except ValueError:
                continue
            if at >= started:
                return True
    return False


class Bench:
    def __init__(self, kube: Kube, settings: ClusterSettings, kubeconfig: Path):
        self.kube, self.settings, self.kubeconfig = kube, settings, kubeconfig
        self.state = process_node_state(settings)
        self.next_index = 3
        self.seq = 0
        self.rounds: list[dict] = []

    async def steady(self, timeout: float = 90) -> tuple[str, str]:
        """2 pods Running, one holding the Lease, the other's caches synced: (leader, standby)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            pods = [p for p in await incluster.controller_pods(self.kube)
                    if (p.get("status") or {}).get("phase") == "Running"]
            names = {p["metadata"]["name"] for p in pods}
            leader = await incluster.lease_holder(self.kube)
            if len(pods) == 2 and leader in names:
                [standby] = names - {leader}
                [pod] = [p for p in pods if p["metadata"]["name"] == standby]
                if synced_since_start(pod, incluster.kubectl(self.kubeconfig, "logs", "-n", incluster.NAMESPACE,
                                                             standby).stdout):
                    return leader, standby
            await asyncio.sleep(0.2)
        raise TimeoutError("no steady state: 2 Running controller pods, one leading, the standby synced")

    async def pod(self, name: str) -> dict:
        return await self.kube.get(f"/api/v1/namespaces/{incluster.NAMESPACE}/pods/{name}")

    async def submit(self) -> str:
        self.seq += 1
        name = f"j{self.seq}"
        await self.kube.create(TRAINJOBS.path(NS), {
            "apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob",
            "metadata": {"name": name, "namespace": NS},
            "spec": {"runtimeRef": {"name": "torch-kwok-gpu", "kind": "ClusterTrainingRuntime"},
                     "trainer": {"numNodes": 1, "resourcesPerNode": {"limits": {"nvidia.com/gpu": "1"}}},
                     "podTemplateOverrides": [{"targetJobs": [{"name": "node"}], "metadata": {"annotations": {
                         "pod-complete.stage.kwok.x-k8s.io/delay": "1s",
                         "pod-complete.stage.kwok.x-k8s.io/jitter-delay": "1s"}}}]}})
        return name

    async def job_exists(self, trainjob: str) -> bool:
        try:
            await self.kube.get(JOBS.path(NS, child_job_name(trainjob)))
            return True
        except ApiError as err:
            if err.not_found:
                return False
            raise

    async def wait_holder(self, holder: str, t0: float, timeout: float = 60) -> float:
        while time.monotonic() - t0 < timeout:
            if await incluster.lease_holder(self.kube) == holder:
                return time.monotonic() - t0
            await asyncio.sleep(0.02)
        pods = {p["metadata"]["name"]: (p.get("status") or {}).get("phase") for p in await incluster.controller_pods(self.kube)}
        raise TimeoutError(f"{holder} did not take the Lease within {timeout:.0f}s; holder "
                           f"{await incluster.lease_holder(self.kube)}, pods {pods}")

    async def kill_round(self, i: int) -> dict:
        leader, standby = await self.steady()
        pod = await self.pod(leader)
        node = pod["spec"]["nodeName"]
        pid = launch.agent_pid(self.state, node)
        found = incluster.controller_process(pod)
        load = os.getloadavg()[0]
        wall, t0 = time.time(), time.monotonic()
        os.kill(pid, signal.SIGKILL)
        # The pod's processes die with the agent (PDEATHSIG via the shim), which takes a moment: the
        # TrainJob goes in once the old leader's process is gone, so the child Job is the new leader's.
        while found and alive(found[0]):
            await asyncio.sleep(0.005)
        died = time.monotonic() - t0
        trainjob = await self.submit()
        lease = job = None
        while lease is None or job is None:
            if time.monotonic() - t0 > 90:
                raise TimeoutError(f"kill {i}: lease={lease} job={job} after 90 s")
            if lease is None and await incluster.lease_holder(self.kube) == standby:
                lease = time.monotonic() - t0
            if job is None and await self.job_exists(trainjob):
                job = time.monotonic() - t0
            await asyncio.sleep(0.05)
        say(f"kill {i}: agent of {node} (leader {leader}) SIGKILLed; {standby} leads after {lease:.2f}s, "
            f"child Job of {trainjob} after {job:.2f}s (load {load:.1f})")
        # replace the lost node: delete it, force-delete its pod, start a new process node
        (self.state / "pids" / f"{node}.pid").unlink(missing_ok=True)
        await self.kube.delete(NODES.path(name=node))
        await self.kube.request("DELETE", f"/api/v1/namespaces/{incluster.NAMESPACE}/pods/{leader}",
                                body={"gracePeriodSeconds": 0})
        await asyncio.to_thread(start_process_nodes, self.settings, self.kubeconfig, 1, lambda m: None,
                                first_index=self.next_index)
        self.next_index += 1
        return {"kind": "sigkill-node", "round": i, "old": leader, "new": standby, "at": wall, "trainjob": trainjob,
                "old_process_gone_s": round(died, 3), "lease_s": round(lease, 3), "child_job_s": round(job, 3),
                "loadavg": load}

    async def handover_round(self, i: int) -> dict:
        leader, standby = await self.steady()
        load = os.getloadavg()[0]
        wall, t0 = time.time(), time.monotonic()
        await self.kube.delete(f"/api/v1/namespaces/{incluster.NAMESPACE}/pods/{leader}")
        took = await self.wait_holder(standby, t0)
        say(f"handover {i}: {leader} deleted (SIGTERM); {standby} leads after {took:.2f}s (load {load:.1f})")
        return {"kind": "sigterm-pod", "round": i, "old": leader, "new": standby, "at": wall,
                "lease_s": round(took, 3), "loadavg": load}

    async def pause_round(self, i: int) -> dict:
        leader, standby = await self.steady()
        found = incluster.controller_process(await self.pod(leader))
        if not found:
            raise RuntimeError(f"no controller process under {leader}")
        pid = found[0]
        load = os.getloadavg()[0]
        wall, t0 = time.time(), time.monotonic()
        os.kill(pid, signal.SIGSTOP)
        try:
            took = await self.wait_holder(standby, t0)
            trainjob = await self.submit()
            while not await self.job_exists(trainjob):
                if time.monotonic() - t0 > 90:
                    raise TimeoutError(f"pause {i}: no child Job for {trainjob}")
                await asyncio.sleep(0.05)
            job = time.monotonic() - t0
            # frozen past the lease's end and the new leader's first writes
            while time.monotonic() - t0 < LEASE_SECONDS + 5:
                await asyncio.sleep(0.2)
        finally:
            os.kill(pid, signal.SIGCONT)
        resumed = time.monotonic()
        while alive(pid):
            if time.monotonic() - resumed > 60:
                raise TimeoutError(f"pause {i}: the deposed leader {leader} (pid {pid}) did not exit")
            await asyncio.sleep(0.1)
        exited = time.monotonic() - resumed
        say(f"pause {i}: {leader} SIGSTOPped; {standby} leads after {took:.2f}s, child Job of {trainjob} "
            f"after {job:.2f}s; SIGCONT after {LEASE_SECONDS + 5:.0f}s: the old leader exited {exited:.2f}s later "
            f"(load {load:.1f})")
        return {"kind": "sigstop-process", "round": i, "old": leader, "new": standby, "at": wall, "trainjob": trainjob,
                "lease_s": round(took, 3), "child_job_s": round(job, 3), "exit_after_sigcont_s": round(exited, 3),
                "loadavg": load}


def audit(events: list[dict], rounds: list[dict]) -> list[dict]:
    """Per round: the old pod's writes received after its deadline (see the module docstring)."""
    def pod_of(e: dict) -> str:
        extra = (e.get("user") or {}).get("extra") or {}
        return (extra.get(POD_NAME_EXTRA) or [""])[0]

    def lease_write_ok(e: dict) -> bool:
        ref = e.get("objectRef") or {}
        return (ref.get("resource") == "leases" and ref.get("name") == incluster.LEASE and e["verb"] in WRITE_VERBS
                and (e.get("responseStatus") or {}).get("code", 0) < 300)

    mine = [e for e in events if (e.get("user") or {}).get("username") == SA_USER and e.get("stage") == "ResponseComplete"]
    out = []
    for n, r in enumerate(rounds):
        # until the next round: a paused leader's pod restarts its container and may lead again later
        until = rounds[n + 1]["at"] if n + 1 < len(rounds) else float("inf")
        old = [e for e in mine if pod_of(e) == r["old"] and ts(e["requestReceivedTimestamp"]) < until]
        renewals = [ts(e["stageTimestamp"]) for e in old if lease_write_ok(e) and ts(e["stageTimestamp"]) <= r["at"] + 1]
        taken = [ts(e["stageTimestamp"]) for e in mine if pod_of(e) == r["new"] and lease_write_ok(e)
                 and ts(e["requestReceivedTimestamp"]) >= r["at"]]
        if not renewals or not taken:
            out.append({**r, "audit": "incomplete: no renewal of the old leader or no Lease write of the new one"})
            continue
        deadline = min(max(renewals) + RENEW_DEADLINE, min(taken))
        late = [e for e in old if e["verb"] in WRITE_VERBS and ts(e["requestReceivedTimestamp"]) > deadline]
        writes_after_event = [e for e in old if e["verb"] in WRITE_VERBS and ts(e["requestReceivedTimestamp"]) > r["at"]]
        creators = sorted({pod_of(e) for e in mine if e["verb"] in ("create", "patch")
                           and (e.get("objectRef") or {}).get("resource") == "jobs"
                           and (e.get("objectRef") or {}).get("name") == child_job_name(r.get("trainjob") or "-")
                           and (e.get("responseStatus") or {}).get("code") == 201})
        out.append({**r, "deadline_after_event_s": round(deadline - r["at"], 3), "child_job_created_by": creators,
                    "old_writes_after_event": len(writes_after_event),
                    "old_writes_after_deadline": len(late),
                    "late": [{"verb": e["verb"], "resource": (e.get("objectRef") or {}).get("resource"),
                              "code": (e.get("responseStatus") or {}).get("code"),
                              "received": e["requestReceivedTimestamp"]} for e in late]})
    return out


def git_commit() -> str:
    return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                          cwd=Path(__file__).resolve().parents[1]).stdout.strip()


async def run(args: argparse.Namespace, settings: ClusterSettings, kubeconfig: Path) -> list[dict]:
    kube = await Kube.connect(kubeconfig)
    try:
        await kube.create("/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}})
        bench = Bench(kube, settings, kubeconfig)
        for i in range(1, args.kills + 1):
            bench.rounds.append(await bench.kill_round(i))
        for i in range(1, args.handovers + 1):
            bench.rounds.append(await bench.handover_round(i))
        for i in range(1, args.pauses + 1):
            bench.rounds.append(await bench.pause_round(i))
        return bench.rounds
    finally:
        await kube.close()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--kills", type=int, default=10, help="(a) SIGKILLs of the leader's node agent")
    ap.add_argument("--handovers", type=int, default=10, help="(b) deletions of the leader pod (SIGTERM)")
    ap.add_argument("--pauses", type=int, default=3, help="(c) SIGSTOPs of the leader's process")
    ap.add_argument("--cluster", default="gangctl-bench-failover")
    ap.add_argument("--keep", action="store_true", help="leave the cluster running")
    ap.add_argument("--json", metavar="FILE", help="also write the results as JSON ('-' for stdout)")
    ap.add_argument("--record", action="store_true", help="write the table to benchmarks/results/leader_failover.json")
    args = ap.parse_args()

    settings = ClusterSettings(cluster_name=args.cluster)
    audit_log = settings.cache_dir / f"{args.cluster}-audit.log"
    policy = settings.cache_dir / f"{args.cluster}-audit-policy.yaml"
    conditions = {"date": time.strftime("%Y-%m-%d %H:%M:%S %z"), "commit": git_commit(),
                  "command": " ".join([Path(sys.executable).name, *sys.argv]), "cores": os.cpu_count(),
                  "loadavg_at_start": os.getloadavg()}
    say("conditions: " + json.dumps(conditions))
    down(settings, lambda m: None)
    audit_log.unlink(missing_ok=True)
    policy.parent.mkdir(parents=True, exist_ok=True)
    policy.write_text(yaml.safe_dump(AUDIT_POLICY))
    cluster = AuditedCluster(settings, ensure_built(settings.integrations_dir, settings.bin_root), audit_policy=policy,
                             audit_log=audit_log)
    try:
        started = time.monotonic()
        cluster.create()
        asyncio.run(prepare(cluster, UpOptions(gpu_nodes=2, gpus_per_node=8), say))
        start_process_nodes(settings, cluster.kubeconfig, 3, say)
        incluster.install(cluster.kubeconfig)
        say(f"cluster {args.cluster} up, gangctl installed from deploy/overlays/local in "
            f"{time.monotonic() - started:.0f}s; audit log {audit_log}")
        rounds = asyncio.run(run(args, settings, cluster.kubeconfig))
    finally:
        conditions["loadavg_at_end"] = os.getloadavg()
        if not args.keep:
            down(settings, say)
    events = [json.loads(line) for line in audit_log.read_text().splitlines() if line.strip()]
    audited = audit(events, rounds)
    by = {k: [r for r in audited if r["kind"] == k] for k in ("sigkill-node", "sigterm-pod", "sigstop-process")}
    results = {
        "failover_sigkill_node_lease_s": summary([r["lease_s"] for r in by["sigkill-node"]]),
        "failover_sigkill_node_child_job_s": summary([r["child_job_s"] for r in by["sigkill-node"]]),
        "handover_sigterm_lease_s": summary([r["lease_s"] for r in by["sigterm-pod"]]),
        "takeover_sigstop_lease_s": summary([r["lease_s"] for r in by["sigstop-process"]]),
        "deposed_leader_writes_after_deadline": {k: sum(r.get("old_writes_after_deadline", 0) for r in v)
                                                 for k, v in by.items()},
        "rounds_not_audited": sum(1 for r in audited if "audit" in r),
        "child_job_created_by_new_leader": {k: f"{sum(1 for r in v if r.get('child_job_created_by') == [r['new']])}/{len(v)}"
                                            for k, v in by.items() if k != "sigterm-pod"},
        "audit_events": len(events),
    }
    conditions["audit_log"] = str(audit_log)
    say("results: " + json.dumps(results))
    fo = results["failover_sigkill_node_lease_s"]
    ho = results["handover_sigterm_lease_s"]
    if fo:
        say(f"failover p95 {fo['p95']} s (goal <= {GOAL_FAILOVER_P95} s): {'met' if fo['p95'] <= GOAL_FAILOVER_P95 else 'MISSED'}")
    if ho:
        say(f"handover p95 {ho['p95']} s (goal <= {GOAL_HANDOVER} s): {'met' if ho['p95'] <= GOAL_HANDOVER else 'MISSED'}")
    if args.json:
        payload = json.dumps({"conditions": conditions, "results": results, "rounds": audited}, indent=2)
        if args.json == "-":
            print(payload)
        else:
            Path(args.json).write_text(payload)
    if args.record:
        record(results, len(audited))
    return 0


def record(results: dict, rounds: int) -> None:
    """The published table (benchmarks/results/leader_failover.json) of one run's `results`."""
    def row(label: str, key: str, goal: str = "") -> list:
        s = results[key]
        return [label, s.get("p50"), s.get("p95"), f"{s.get('min')} – {s.get('max')}" if s else "—", goal]
    fo, ho = results["failover_sigkill_node_lease_s"], results["handover_sigterm_lease_s"]
    rows = [row("**(a) SIGKILL of the leader's node → standby holds the Lease**", "failover_sigkill_node_lease_s",
                f"≤ {GOAL_FAILOVER_P95} s p95: {'met' if fo and fo['p95'] <= GOAL_FAILOVER_P95 else 'MISSED'}"),
            row("(a) → child Job of a TrainJob submitted at the kill exists", "failover_sigkill_node_child_job_s"),
            row("**(b) SIGTERM of the leader pod → the other holds the Lease**", "handover_sigterm_lease_s",
                f"≤ {GOAL_HANDOVER} s: {'met' if ho and ho['p95'] <= GOAL_HANDOVER else 'MISSED'}"),
            row("(c) SIGSTOP of the leader → standby holds the Lease", "takeover_sigstop_lease_s"),
            [f"writes by a deposed leader after its deadline (audit log, {rounds} rounds)",
             f"**{sum(results['deposed_leader_writes_after_deadline'].values())}**", "", "", ""]]
    path = published.record("leader_failover", ["", "p50 (s)", "p95 (s)", "min – max (s)", "goal"], rows,
                            f"{rounds} rounds; {results['audit_events']:,} audit events")
    say(f"recorded {path}; run benchmarks/results_page.py to regenerate the page")


if __name__ == "__main__":
    sys.exit(main())
