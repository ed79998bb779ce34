"""kube-scheduler's Coscheduling churn on a gang that fits in sum but not node by node, and the pods it loses.

    .venv/bin/python benchmarks/coscheduling_churn.py                  # 10 minutes of churn, then free the nodes
    .venv/bin/python benchmarks/coscheduling_churn.py --pods 2 --minutes 3 --json out.json

On a local cluster of P + 2 8-GPU KWOK nodes (P: the gang's pods, 4 by default, as in the incident), a
1 x 8 job fills one node and two 1 x 4 jobs half-fill two more, so 8 x P GPUs are free but only P - 1
nodes are whole. A P x 8 gang then passes Coscheduling's PreFilter (the free GPUs suffice in sum) and
fails node by node: P - 1 pods wait at Permit on the whole nodes, Permit moves their siblings back to the
active queue, the last pod fails, PostFilter rejects the waiting ones, and around it goes, milliseconds
a turn (scheduler-plugins v0.34.7 sets no PodGroup backoff unless
`podGroupBackoffSeconds` is configured). This script counts the turns and the times kube-scheduler discards
a pod it still has in flight ("The same pod is tracked in multiple places in the scheduler, and just
discard it"), then ends the holding jobs so that three nodes are whole, and waits for the gang. A gang
that does not bind then has lost a pod to the scheduler (exit 3); the gangctl controller runs throughout,
as in production. Seen first in a fidelity run (benchmarks/README.md, "kube-scheduler lost a gang's pod").
"""
from __future__ import annotations

import argparse
import asyncio
import json
import re
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.local import cluster_with_controller  # noqa: E402
from gangctl.api.resources import PODS, TRAINJOBS  # noqa: E402
from gangctl.cluster.lifecycle import UpOptions  # noqa: E402
from gangctl.harness import results  # noqa: E402
from gangctl.kube.client import Kube  # noqa: E402
from gangctl.sim.replay import RUNTIME, trainjob_submissions  # noqa: E402
from gangctl.sim.traces import TraceJob  # noqa: E402

NAMESPACE = "default"
GANG = "gang"
HOLDERS = [TraceJob("hold-8", 0.0, 36000.0, 1, 8, 6.0, 48.0), TraceJob("hold-4a", 0.0, 36000.0, 1, 4, 6.0, 48.0),
           TraceJob("hold-4b", 0.0, 36000.0, 1, 4, 6.0, 48.0)]
WAITING = re.compile(r'^I\d{4} (\d\d:\d\d:\d\d\.\d+) .*"Pod is waiting to be scheduled to node".*pod="[^/]+/sim-gang-node-0-(\d+)-')
DISCARD = re.compile(r'^E\d{4} (\d\d:\d\d:\d\d\.\d+) .*tracked in multiple places.*pod="[^/]+/(sim-gang-[^"]+)"')


def say(msg: str) -> None:
    print(f"[{datetime.now(timezone.utc):%H:%M:%S}] {msg}", flush=True)


def read_log(text: str) -> dict:
    """Pure: the gang's Permit turns (per pod, with the last one's time) and the discarded pods, from a
    kube-scheduler log."""
    turns: dict[str, int] = {}
    last: dict[str, str] = {}
    discards = []
    for line in text.splitlines():
        if m := WAITING.match(line):
            pod = f"pod {m.group(2)}"
            turns[pod] = turns.get(pod, 0) + 1
            last[pod] = m.group(1)
        elif m := DISCARD.match(line):
            discards.append({"at": m.group(1), "pod": m.group(2)})
    return {"permit_turns": dict(sorted(turns.items())), "last_turn": dict(sorted(last.items())), "discards": discards}


async def submit(kube: Kube, jobs: list[TraceJob]) -> None:
    for s in trainjob_submissions(jobs, runtime=RUNTIME, namespace_of_team={"": NAMESPACE}):
        await kube.create(TRAINJOBS.path(NAMESPACE), s.trainjob)


async def pods_of(kube: Kube, job: str) -> list[dict]:
    return [p for p in (await kube.get(PODS.path(NAMESPACE)))["items"]
            if p["metadata"]["name"].startswith(f"sim-{job}-")]


async def wait_for(what: str, check, timeout: float) -> float | None:
    """Seconds until `check()` holds, polled each second; None after `timeout`."""
    started = time.monotonic()
    while time.monotonic() - started < timeout:
        if await check():
            return time.monotonic() - started
        await asyncio.sleep(1)
    say(f"{what}: not within {timeout:.0f} s")
    return None


async def scenario(kubeconfig: Path, log: Path, pods: int, minutes: float, settle: float) -> dict:
    kube = await Kube.connect(kubeconfig)
    try:
        await submit(kube, HOLDERS[:1])      # one at a time, so that spread packing puts each on its own node
        await wait_for("hold-8 running", lambda: running(kube, "hold-8"), 60)
        for holder in HOLDERS[1:]:
            await submit(kube, [holder])
            await wait_for(f"{holder.id} running", lambda h=holder.id: running(kube, h), 60)
        await submit(kube, [TraceJob(GANG, 0.0, 10.0, pods, 8, 6.0, 48.0)])
        say(f"{pods} x 8 gang submitted: {8 * pods} GPUs free, {pods - 1} node(s) whole; churning for {minutes:g} min")
        started = time.monotonic()
        while (elapsed := time.monotonic() - started) < minutes * 60:
            await asyncio.sleep(min(30.0, minutes * 60 - elapsed))
            seen = read_log(log.read_text())
            say(f"{time.monotonic() - started:4.0f} s: Permit turns {seen['permit_turns']}, "
                f"discards {len(seen['discards'])}, last turn {seen['last_turn']}")
        churn = read_log(log.read_text())
        for holder in HOLDERS[1:]:
            await kube.delete(TRAINJOBS.path(NAMESPACE) + f"/sim-{holder.id}")
        say(f"the two 1 x 4 jobs deleted: {pods + 1} nodes whole; waiting for the gang to bind")
        bound_after = await wait_for("gang bound", lambda: all_bound(kube, GANG, pods), settle)
        after = read_log(log.read_text())
        return {"pods": pods, "minutes": minutes, "permit_turns": churn["permit_turns"],
                "permit_turns_per_second": round(sum(churn["permit_turns"].values()) / (minutes * 60), 1),
                "discards": after["discards"], "last_turn": after["last_turn"],
                "gang_bound_seconds_after_nodes_freed": None if bound_after is None else round(bound_after, 1)}
    finally:
        await kube.close()


async def running(kube: Kube, job: str) -> bool:
    pods = await pods_of(kube, job)
    return bool(pods) and all(p["status"].get("phase") == "Running" for p in pods)


async def all_bound(kube: Kube, job: str, size: int) -> bool:
    pods = await pods_of(kube, job)
    return len(pods) == size and all(p["spec"].get("nodeName") for p in pods)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--pods", type=int, default=4, help="the gang's pods, 8 GPUs each (2 or more)")
    ap.add_argument("--minutes", type=float, default=10.0, help="how long to let the gang churn")
    ap.add_argument("--settle", type=float, default=300.0, help="seconds the gang gets to bind once nodes are free")
    ap.add_argument("--json", help="write the result here")
    ap.add_argument("--cluster-name", default="gangctl-bench-churn")
    ap.add_argument("--record", action="store_true", help="write the result to benchmarks/results/")
    args = ap.parse_args()
    if args.pods < 2:
        ap.error("--pods: a gang of one pod never waits at Permit")
    nodes = UpOptions(gpu_nodes=args.pods + 2, gpus_per_node=8)
    with cluster_with_controller(args.cluster_name, nodes, say) as (_, cluster, _c):
        result = asyncio.run(scenario(cluster.kubeconfig, cluster.logs_dir / "kube-scheduler.log",
                                      args.pods, args.minutes, args.settle))
    result["date"] = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    print(json.dumps(result, indent=2))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
    lost = result["gang_bound_seconds_after_nodes_freed"] is None
    if args.record:
        turns = sum(result["permit_turns"].values())
        row = [f"{args.pods} × 8, {args.pods + 2} nodes", f"{args.minutes:g} min", turns,
               result["permit_turns_per_second"], len(result["discards"]),
               "never" if lost else f"{result['gang_bound_seconds_after_nodes_freed']} s"]
        path = results.record("coscheduling_churn", ["gang", "churn", "Permit turns", "per second", "discards",
                                                      "gang bound after the nodes freed"], [row], "one run",
                              part=f"{args.pods} × 8 gang")
        say(f"recorded {path}; run benchmarks/results_page.py to regenerate the page")
    say("the gang never bound: kube-scheduler lost its pod(s)" if lost else
        f"the gang bound {result['gang_bound_seconds_after_nodes_freed']} s after the nodes were freed")
    return 3 if lost else 0


if __name__ == "__main__":
    sys.exit(main())
