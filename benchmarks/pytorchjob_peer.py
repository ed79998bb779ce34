"""gangctl against Kubeflow Training Operator v1 on PyTorchJobs, side by side in the same run.

    .venv/bin/python benchmarks/pytorchjob_peer.py                    # 200 PyTorchJobs x 4 pods, 100 GPU nodes
    .venv/bin/python benchmarks/pytorchjob_peer.py --jobs 100 --json out.json

The method of benchmarks/controller_peer.py (whose measurement it reuses), for the v1 API: for each
controller in turn (gangctl, then Training Operator v1.9.4 built from integrations/training-operator)
on a fresh local cluster of its own (`gangctl-bench-<side>`: the same pinned control plane,
Coscheduling scheduler and KWOK GPU nodes), submit the same N PyTorchJobs in a burst and measure the
time to every pod created and bound, the per-job latency, the controller's CPU and peak RSS, and the
apiserver's requests and CPU.

The PyTorchJobs are identical on both sides: one Master and `--nodes - 1` Workers, 1 GPU each, on
the KWOK nodes (toleration, nodeSelector), `schedulerName` the Coscheduling profile; gangs made by
each controller's own scheduler-plugins PodGroup (gangctl: `<job>-pytorch`, minMember the floor;
Training Operator: `--gang-scheduler-name=scheduler-plugins`, minMember all replicas, the same here
since these jobs are not elastic). Pods stay Running (KWOK's completion delay: 1 h). Not a test:
nothing asserts.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from benchmarks.controller_peer import (KWOK_COMPLETE_DELAY, NAMESPACE, Result, build_progress, cluster_pids, report, run_rounds,  # noqa: E402
                                        gpu_nodes, machine, measure, parse_args, say, start_gangctl, stop_gangctl)
from gangctl.api.resources import PYTORCHJOBS  # noqa: E402
from gangctl.cluster import lifecycle  # noqa: E402
from gangctl.cluster.build import pinned_version  # noqa: E402
from gangctl.cluster.local import KWOK_NODE_SELECTOR, KWOK_TOLERATION  # noqa: E402
from gangctl.config import ClusterSettings  # noqa: E402
from gangctl.harness import peer, training_operator  # noqa: E402

JOB_NAME_LABEL = "training.kubeflow.org/job-name"


def pytorchjob(name: str, nodes: int, gpus: int) -> dict:
    def replica(count: int) -> dict:
        return {"replicas": count, "restartPolicy": "OnFailure", "template": {
            "metadata": {"annotations": {"pod-complete.stage.kwok.x-k8s.io/delay": KWOK_COMPLETE_DELAY,
                                         "pod-complete.stage.kwok.x-k8s.io/jitter-delay": KWOK_COMPLETE_DELAY}},
            "spec": {"schedulerName": peer.SCHEDULER_NAME, "tolerations": [KWOK_TOLERATION],
                     "nodeSelector": dict(KWOK_NODE_SELECTOR),
                     "containers": [{"name": "pytorch", "image": "pytorch/pytorch:2.7.1-cuda12.8-cudnn9-runtime",
                                     "command": ["python", "/workspace/train.py"],
                                     "resources": {"limits": {"nvidia.com/gpu": str(gpus)}}}]}}}
    specs = {"Master": replica(1)}
    if nodes > 1:
        specs["Worker"] = replica(nodes - 1)
    return {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "metadata": {"name": name, "namespace": NAMESPACE},
            "spec": {"pytorchReplicaSpecs": specs}}


def run(args: argparse.Namespace, measure_kw: dict, side: str, version: str) -> Result:
    settings = ClusterSettings(cluster_name=f"{args.cluster_prefix}-{side}")
    lifecycle.down(settings, lambda m: None)
    say(f"cluster {settings.cluster_name}: starting ({args.gpu_nodes} GPU nodes)")
    controller = None
    try:
        if side == "gangctl":
            cluster = lifecycle.up(settings, lifecycle.UpOptions(gpu_nodes=args.gpu_nodes,
                                                                 gpus_per_node=args.gpus_per_node), say)
            controller = start_gangctl(settings, cluster.kubeconfig)
            pids = {"gangctl": controller.pid}
        else:  # the base cluster as `cluster up` makes it, without gangctl's CRDs: the peer brings its own
            cluster = lifecycle.local_cluster(settings)
            cluster.create()
            asyncio.run(gpu_nodes(cluster.kubeconfig, args.gpu_nodes, args.gpus_per_node))
            pids = training_operator.start(settings, cluster.kubeconfig, say, progress=build_progress).pids
        say(f"{side} running ({pids})")
        res = Result(side, version, args.jobs, args.jobs * args.nodes)
        asyncio.run(measure(cluster.kubeconfig, args.jobs, args.nodes, args.gpus_per_pod, args.concurrency,
                            args.timeout, pids, cluster_pids(settings), res, **measure_kw))
        return res
    finally:
        stop_gangctl(controller)
        if not args.keep:
            lifecycle.down(settings, say)  # stops training-operator too (it runs from the scheduler state folder)


def main() -> int:
    args = parse_args(__doc__, "PyTorchJob")

    integrations = REPO / "integrations"
    head = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    conditions = {
        "machine": machine(), "jobs": args.jobs, "pods_per_job": args.nodes, "pods": args.jobs * args.nodes,
        "gpu_nodes": args.gpu_nodes, "gpus_per_node": args.gpus_per_node, "gpus_per_pod": args.gpus_per_pod,
        "create_concurrency": args.concurrency,
        "kubernetes": pinned_version(integrations / "controlplane", "k8s.io/kubernetes"),
        "scheduler_plugins": pinned_version(integrations / "coscheduling", "sigs.k8s.io/scheduler-plugins"),
        "kwok": pinned_version(integrations / "kwok", "sigs.k8s.io/kwok"),
        "go": subprocess.run([shutil.which("go") or "go", "env", "GOVERSION"], capture_output=True, text=True).stdout.strip(),
        "training_operator": training_operator.version(integrations), "gangctl": "git " + head.stdout.strip(),
    }
    say("conditions: " + json.dumps(conditions))
    measure_kw = {"collection": PYTORCHJOBS.path(namespace=NAMESPACE), "make": pytorchjob, "pod_label": JOB_NAME_LABEL}
    sides = {"gangctl": lambda: run(args, measure_kw, "gangctl", conditions["gangctl"]),
             "training-operator": lambda: run(args, measure_kw, "training-operator", conditions["training_operator"])}
    runs = run_rounds(args, {k: v for k, v in sides.items() if args.only in (None, "gangctl" if k == "gangctl" else "peer")})
    return report(args, conditions, runs, "pytorchjob_peer", "PyTorchJob",
                  f"Kubeflow Training Operator {conditions['training_operator']}")


if __name__ == "__main__":
    sys.exit(main())
