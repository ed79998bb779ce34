"""One quota policy, five backends, side by side: 200 TrainJobs of 1-32 GPUs against a 64-GPU quota.

    .venv/bin/python benchmarks/quota_backends.py                                  # all five, 200 jobs
    .venv/bin/python benchmarks/quota_backends.py --backends kueue,volcano --jobs 100 --json out.json

For each backend (gangctl's own admission under coscheduling and native gangs, Kueue, Volcano, KAI) it brings up a cluster
of its own (`gangctl-bench-quota-<backend>`, --gpu-nodes KWOK nodes x 8 GPUs, so the quota and not
the nodes binds), applies `tests/integration/data/one-team-64.yaml` with `gangctl policy apply`,
installs one TrainingRuntime whose podGroupPolicy names the backend, starts `gangctl controller`,
submits the same seeded jobs at once (the mix of the quota integration test, seed 200: 1, 1, 2 or 4 nodes of
1, 2, 4 or 8 GPUs, KWOK finishes each pod 2-4 s after it runs) and samples every 100 ms, from pod
and TrainJob watches, the GPUs bound pods hold (and, under coscheduling, the GPUs gangctl admitted).
Reports per backend: jobs Complete, time until the last finished, peak GPUs held and samples over
the quota, quota efficiency (the jobs' GPU-seconds of work over 64 GPUs x that time) and the time
from submit to gang bound (p50/p95). Each cluster is deleted before the next starts. Every backend runs
`--rounds` times (default 3), the backends' order reversed every other round; the table gives each figure's
median and range over the rounds, and `--record` writes it to benchmarks/results/quota_backends.json.
"""
from __future__ import annotations

import argparse
import asyncio
import copy
import os
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gangctl.api.resources import TRAINING_RUNTIMES, TRAINJOBS  # noqa: E402
from gangctl.cluster.native import NATIVE_SCHEDULER  # noqa: E402
from gangctl.cluster.lifecycle import UpOptions  # noqa: E402
from gangctl.config import REPO_ROOT  # noqa: E402
from gangctl.kube.client import Kube  # noqa: E402
from gangctl.policy.status import parse_time, phase  # noqa: E402
from benchmarks.local import cluster_with_controller  # noqa: E402
# The usage sampler and the TrainJob a user writes are the integration tests' own (same checks).
from gangctl.harness import results as published, rounds  # noqa: E402
from tests.integration.helpers import trainjob  # noqa: E402
from tests.integration.quota_common import RUNTIME, UsageSampler  # noqa: E402

POLICY = REPO_ROOT / "tests/integration/data/one-team-64.yaml"
NS, TEAM, QUOTA, RT = "solo", "solo", 64, "gang-bench"
GANG_POLICY = {"coscheduling": {"scheduleTimeoutSeconds": 60}, "kueue": {}, "volcano": {"queue": TEAM},
               "native": {"schedulerName": NATIVE_SCHEDULER}, "kai": {"queue": TEAM}}


def say(msg: str) -> None:
    print(f"[bench] {msg}", file=sys.stderr, flush=True)


def jobs_of(count: int, seed: int) -> list[tuple[str, int, int, int]]:
    rng = random.Random(seed)
    return [(f"j{i:03d}", rng.choice((1, 1, 2, 4)), rng.choice((1, 2, 4, 8)), rng.randint(2, 4)) for i in range(count)]


def runtime(backend: str) -> dict:
    rt = copy.deepcopy(RUNTIME)
    rt["kind"] = "TrainingRuntime"
    rt["metadata"] = {"name": RT, "namespace": NS, "labels": rt["metadata"].get("labels", {})}
    rt["spec"]["podGroupPolicy"] = {backend: GANG_POLICY[backend]}
    return rt


async def drive(kubeconfig: Path, backend: str, jobs: list[tuple[str, int, int, int]], timeout: float) -> dict:
    kube = await Kube.connect(kubeconfig)
    try:
        await kube.create(TRAINING_RUNTIMES.path(NS), runtime(backend))
        sampler = UsageSampler(kube, limits={TEAM: QUOTA}, namespaces={NS: TEAM}, interval=0.1)
        stop = asyncio.Event()
        task = asyncio.create_task(sampler.run(stop))
        await asyncio.sleep(2)
        t0 = time.time()
        sem = asyncio.Semaphore(16)

        async def submit(job) -> None:
            name, nodes, gpus, run_for = job
            async with sem:
                await kube.create(TRAINJOBS.path(NS), trainjob(name, NS, nodes=nodes, gpus=gpus, run_for=f"{run_for}s",
                                                               runtime=RT, runtime_kind="TrainingRuntime"))
        await asyncio.gather(*(submit(j) for j in jobs))
        say(f"{backend}: {len(jobs)} TrainJobs submitted in {time.time() - t0:.1f} s")
        listing: list[dict] = []
        while time.time() - t0 < timeout:
            listing = (await kube.get(TRAINJOBS.path(NS)))["items"]
            done = sum(phase(tj.get("status")) in ("Complete", "Failed") for tj in listing)
            if done == len(jobs):
                break
            say(f"{backend}: t={time.time() - t0:.0f}s finished {done}/{len(jobs)}, peak held "
                f"{sampler.peak.get(TEAM, 0):g} GPUs")
            await asyncio.sleep(5)
        finished_at = max((parse_time(c["lastTransitionTime"]).timestamp() for tj in listing
                           for c in (tj.get("status") or {}).get("conditions") or []
                           if c.get("type") in ("Complete", "Failed") and c.get("status") == "True"), default=None)
        stop.set()
        await task
    finally:
        await kube.close()
    phases = [phase(tj.get("status")) for tj in listing]
    waits = sorted(parse_time(tj["status"]["gang"]["boundAt"]).timestamp()
                   - parse_time(tj["metadata"]["creationTimestamp"]).timestamp()
                   for tj in listing if ((tj.get("status") or {}).get("gang") or {}).get("boundAt"))
    makespan = finished_at - t0 if finished_at else None
    work = sum(nodes * gpus * run_for for _, nodes, gpus, run_for in jobs)
    return {"backend": backend, "jobs": len(jobs), "complete": phases.count("Complete"),
            "seconds_to_last_finish": round(makespan, 1) if makespan else None,
            "peak_held_gpus": sampler.peak.get(TEAM, 0), "peak_admitted_gpus": sampler.peak_admitted.get(TEAM, 0),
            "samples": sampler.samples, "samples_over_quota": len(sampler.over),
            "quota_efficiency": round(work / (QUOTA * makespan), 3) if makespan else None,
            "wait_p50": round(statistics.median(waits), 1) if waits else None,
            "wait_p95": round(waits[int(0.95 * (len(waits) - 1))], 1) if waits else None}


def one_backend(backend: str, args) -> dict:
    options = UpOptions(args.gpu_nodes, 8, scheduler=backend)
    with cluster_with_controller(f"gangctl-bench-quota-{backend}", options, say) as (settings, cluster, _):
        env = dict(os.environ, KUBECONFIG=str(cluster.kubeconfig), GANGCTL_CLUSTER_NAME=settings.cluster_name)
        applied = subprocess.run([sys.executable, "-m", "gangctl.cli", "policy", "apply", str(POLICY), "--backend",
                                  backend], env=env, capture_output=True, text=True)
        if applied.returncode:
            raise SystemExit(f"policy apply failed: {applied.stdout}{applied.stderr}")
        return asyncio.run(drive(cluster.kubeconfig, backend, jobs_of(args.jobs, args.seed), args.timeout))


SUMMED = ("seconds_to_last_finish", "quota_efficiency", "wait_p50", "wait_p95")


def median_rows(runs: dict[str, list[dict]]) -> tuple[list[str], list[list]]:
    """Per backend its rounds in one row: every round's Complete count and samples over the quota (an
    invariant: all of them count), the medians and ranges of the timings (`rounds.summary`)."""
    columns = ["backend", "complete", "samples over 64", "last finished (s)", "efficiency", "wait p50 (s)",
               "wait p95 (s)"]
    rows = []
    for backend, rs in runs.items():
        s = rounds.aggregate(rs, SUMMED)
        rows.append([backend, " ".join(f"{r['complete']}/{r['jobs']}" for r in rs),
                     f"{sum(r['samples_over_quota'] for r in rs)} of {sum(r['samples'] for r in rs):,}",
                     *(s[k] for k in SUMMED)])
    return columns, rows


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--backends", default="coscheduling,kueue,volcano,native,kai")
    p.add_argument("--jobs", type=int, default=200)
    p.add_argument("--gpu-nodes", type=int, default=16, help="KWOK nodes x 8 GPUs (default 128 GPUs: twice the quota)")
    p.add_argument("--seed", type=int, default=200)
    p.add_argument("--timeout", type=float, default=1200)
    args = rounds.parse_args(p, "quota_backends")
    runs = rounds.run_sides(args.backends.split(","), args.rounds, lambda backend: one_backend(backend, args), say)
    every = published.report_sides(
        "quota_backends", args, runs,
        f"{args.jobs} TrainJobs (seed {args.seed}) against one team's {QUOTA}-GPU quota on {args.gpu_nodes * 8} GPUs, "
        f"{args.rounds} round(s) per backend: median (min-max, n runs)",
        median_rows, f"{args.rounds} rounds per backend, the order reversed every other round; timings the median "
        "(range)", say)
    return 0 if all(r["samples_over_quota"] == 0 and r["complete"] == r["jobs"] for r in every) else 1


if __name__ == "__main__":
    sys.exit(main())
