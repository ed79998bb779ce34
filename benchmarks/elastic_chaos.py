"""Elastic TrainJobs at scale under chaos: N elastic TrainJobs on M KWOK GPU nodes while random nodes
go NotReady and some jobs' workers exit non-zero; reports the invariants and what the chaos cost.

    .venv/bin/python benchmarks/elastic_chaos.py                       # 200 jobs, 500 GPU nodes (slow on 2 cores)
    .venv/bin/python benchmarks/elastic_chaos.py --jobs 30 --gpu-nodes 64 --outages 8 --window 45   # quick
    .venv/bin/python benchmarks/elastic_chaos.py --json out.json

Brings up its own cluster (`gangctl-bench-chaos` unless --cluster), its own controller, submits every
job at once (min 1-2 / max 2-4 nodes, workers finish 30-90 s after they run; --failing of them have
workers that exit 1, 3 or 137 against a restart budget of --max-restarts), plays a seeded outage plan
(gangctl.harness.chaos: --outages nodes NotReady for 20-60 s within --window s, at most --max-down at
once), watches every pod (gangctl.harness.audit) and, once every job is finished, checks the end
state. Reports: two-live-pods-per-index violations, outcomes by reason, leaked PodGroups, pods left
running or stuck Terminating, resizes and restarts by cause (the controller's metrics), time to
finish. The cluster is deleted at the end (--keep leaves it).
"""
from __future__ import annotations

import argparse
import asyncio
import json
import re
import sys
import time
from dataclasses import asdict
from pathlib import Path

import aiohttp

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gangctl.api.resources import CLUSTER_TRAINING_RUNTIMES, NAMESPACES, TRAINJOBS  # noqa: E402
from gangctl.harness import chaos, results  # noqa: E402
from gangctl.harness.audit import PodAuditor, finished, settled_audit  # noqa: E402
from gangctl.cluster.lifecycle import UpOptions  # noqa: E402
from gangctl.kube.client import Kube  # noqa: E402
from benchmarks.local import cluster_with_controller  # noqa: E402

NS, RUNTIME = "chaos", "elastic-chaos"
METRIC = re.compile(r'^(gangctl_elastic_resizes_total|gangctl_trainjob_restarts_total)\{([^}]*)\} ([0-9.e+]+)$', re.M)


def say(msg: str) -> None:
    print(f"[bench] {msg}", file=sys.stderr, flush=True)


async def metrics(url: str) -> dict[str, float]:
    async with aiohttp.ClientSession() as s, s.get(url + "/metrics") as r:
        text = await r.text()
    return {f"{name}{{{labels}}}": float(value) for name, labels, value in METRIC.findall(text)}


async def run(args, kubeconfig: Path, metrics_url: str) -> dict:
    kube = await Kube.connect(kubeconfig)
    try:
        await kube.create(NAMESPACES.path(), {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}})
        await kube.create(CLUSTER_TRAINING_RUNTIMES.path(), chaos.elastic_runtime(RUNTIME, max_restarts=args.max_restarts))
        jobs = chaos.plan_jobs(args.seed, args.jobs, min_nodes=(1, 2), max_nodes=(2, 4),
                               run_for=(args.run_min, args.run_max), failing=args.failing)
        nodes = await chaos.gpu_nodes(kube)
        outages = chaos.plan_outages(nodes, args.seed, args.outages, window=args.window,
                                     down_for=(args.down_min, args.down_max), max_down=args.max_down)
        auditor = PodAuditor()
        watch = asyncio.create_task(auditor.run(kube, NS))
        driver = chaos.NodeChaos(kube)
        await asyncio.sleep(1)
        t0 = time.monotonic()
        sem = asyncio.Semaphore(16)

        async def submit(job) -> None:
            async with sem:
                await kube.create(TRAINJOBS.path(NS), chaos.trainjob(job, NS, RUNTIME))
        try:
            await asyncio.gather(*(submit(j) for j in jobs))
            submitted = time.monotonic() - t0
            say(f"{len(jobs)} TrainJobs submitted in {submitted:.1f} s; {len(outages)} outages over {args.window} s")
            chaos_task = asyncio.create_task(driver.run(outages))
            done_at = None
            while time.monotonic() - t0 < args.timeout:
                done, total = await finished(kube, NS)
                if done == total and chaos_task.done():
                    done_at = time.monotonic() - t0
                    break
                say(f"t={time.monotonic() - t0:.0f}s finished {done}/{total}, nodes down {len(driver.down)}, "
                    f"live workers {auditor.live_pods}")
                await asyncio.sleep(10)
            if not chaos_task.done():
                chaos_task.cancel()
        finally:
            await driver.restore_all()
        audit = await settled_audit(kube, NS, grace=60)
        watch.cancel()
        return {"jobs": len(jobs), "gpu_nodes": len(nodes), "failing_jobs": sum(j.exit_code is not None for j in jobs),
                "outages": len(outages), "seed": args.seed, "submit_seconds": round(submitted, 1),
                "finish_seconds": round(done_at, 1) if done_at is not None else None,
                "violations": auditor.violations, "pod_events": auditor.events, "max_live_workers": auditor.max_live_pods,
                "disrupted_pods": len(auditor.disrupted), "exit_code_pods": len(auditor.failed_exit),
                "audit": {k: v for k, v in asdict(audit).items() if k != "by_job"},
                "user_restarts_on_jobs_without_exit_code": sum(
                    audit.by_job[j.name]["restarts"]["user"] for j in jobs if j.exit_code is None),
                "metrics": await metrics(metrics_url), "chaos_actions": driver.actions}
    finally:
        await kube.close()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--jobs", type=int, default=200)
    p.add_argument("--gpu-nodes", type=int, default=500)
    p.add_argument("--failing", type=int, default=20)
    p.add_argument("--max-restarts", type=int, default=1)
    p.add_argument("--outages", type=int, default=60)
    p.add_argument("--window", type=float, default=240)
    p.add_argument("--down-min", type=float, default=20)
    p.add_argument("--down-max", type=float, default=60)
    p.add_argument("--max-down", type=int, default=10)
    p.add_argument("--run-min", type=int, default=30)
    p.add_argument("--run-max", type=int, default=90)
    p.add_argument("--seed", type=int, default=20261124)
    p.add_argument("--timeout", type=float, default=1800)
    p.add_argument("--cluster", default="gangctl-bench-chaos")
    p.add_argument("--json", type=Path)
    p.add_argument("--keep", action="store_true")
    p.add_argument("--record", action="store_true", help="write the outcome to benchmarks/results/elastic_chaos.json")
    args = p.parse_args()
    with cluster_with_controller(args.cluster, UpOptions(args.gpu_nodes, 8), say, keep=args.keep) as (_, cluster, ctl):
        result = asyncio.run(run(args, cluster.kubeconfig, ctl.url))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))
    a = result["audit"]
    ok = not (result["violations"] or a["unfinished"] or a["leaked_pod_groups"] or a["running_pods"]
              or a["terminating_pods"] or a["active_jobs"])
    print(f"{result['jobs']} elastic TrainJobs on {result['gpu_nodes']} GPU nodes, {result['outages']} node outages, "
          f"{result['failing_jobs']} jobs with failing workers (seed {result['seed']})")
    print(f"finished in {result['finish_seconds']} s after submit (submit took {result['submit_seconds']} s)")
    print(f"two live pods for one (job, index): {len(result['violations'])} (over {result['pod_events']} pod events)")
    print(f"outcomes: {a['outcomes']}; unfinished: {a['unfinished']}")
    print(f"leaked PodGroups: {len(a['leaked_pod_groups'])}; pods left running: {len(a['running_pods'])}; "
          f"stuck Terminating: {len(a['terminating_pods'])}; child Jobs still active: {len(a['active_jobs'])}")
    print(f"worker pods disrupted by node loss: {result['disrupted_pods']}; exited non-zero: {result['exit_code_pods']}")
    print(f"restarts (status, summed): {a['restarts']}; user restarts on jobs without exit-code failures: "
          f"{result['user_restarts_on_jobs_without_exit_code']}")
    for k, v in sorted(result["metrics"].items()):
        print(f"  {k} {v:g}")
    if args.record:
        rows = [[f"all {result['jobs']} TrainJobs finished", f"{result['finish_seconds']} s after submit"],
                ["two live pods for one (job, index)", f"**{len(result['violations'])}** over {result['pod_events']:,} pod events"],
                ["outcomes", str(a["outcomes"])], ["unfinished", str(a["unfinished"])],
                ["worker pods lost with their node / exited non-zero", f"{result['disrupted_pods']} / {result['exit_code_pods']}"],
                ["restarts (status, summed)", str(a["restarts"])],
                ["user restarts on jobs hit only by node loss", str(result["user_restarts_on_jobs_without_exit_code"])],
                ["leaked PodGroups / pods stuck Terminating", f"{len(a['leaked_pod_groups'])} / {len(a['terminating_pods'])}"],
                ["child Jobs still active / worker pods left running", f"**{len(a['active_jobs'])} / {len(a['running_pods'])}**"]]
        path = results.record("elastic_chaos", ["invariant or figure", "measured"], rows,
                              f"one run (seed {result['seed']}); invariants {'held' if ok else 'BROKEN'}")
        say(f"recorded {path}; run benchmarks/results_page.py to regenerate the page")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
