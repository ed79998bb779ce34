"""Chaos for elastic TrainJobs on KWOK GPU nodes: node-not-ready outages and exit-code failures.

Both go through KWOK's own chaos Stages (configured in `gangctl.cluster.local.KWOK_STAGES`):

- `node-not-ready`: a KWOK node labelled `node-not-ready.stage.kwok.x-k8s.io=true` gets Ready=False
  (KWOK stops its heartbeat). kube-controller-manager taints it, and gangctl's pods (5 s NoExecute
  tolerations) are evicted: a real node loss as the controllers see it. Removing the label lets the
  heartbeat stage report the node Ready again.
- `pod-container-running-failed`: a running pod labelled `pod-container-running-failed.stage.kwok.x-k8s.io=true`
  fails after the annotation `.../delay`, its container terminated with the exit code in `.../exit-code`.

The plans (which nodes go down when and for how long, which jobs fail) are pure and deterministic for
a seed; `NodeChaos` carries out an outage plan against the API server and records what it did.
Used by tests/integration/test_chaos.py (CI-sized) and benchmarks/elastic_chaos.py (500 nodes).
"""
from __future__ import annotations

import asyncio
import random
import time
from dataclasses import dataclass, field

from gangctl.api.resources import NODES
from gangctl.cluster.local import KWOK_NODE_SELECTOR, KWOK_TOLERATION
from gangctl.kube.client import ApiError, Kube
from gangctl.sim import objects

NOT_READY_LABEL = "node-not-ready.stage.kwok.x-k8s.io"
FAIL_LABEL = "pod-container-running-failed.stage.kwok.x-k8s.io"
FAIL_DELAY = "pod-container-running-failed.stage.kwok.x-k8s.io/delay"
FAIL_JITTER = "pod-container-running-failed.stage.kwok.x-k8s.io/jitter-delay"
FAIL_EXIT_CODE = "pod-container-running-failed.stage.kwok.x-k8s.io/exit-code"
# gangctl's own stage (integrations/kwok/stages/pod-restart-all-containers.yaml): the pod's containers
# are restarted in place until each has this many restarts, the last run ending with the exit code given.
RESTART_ALL = "pod-restart-all-containers.stage.gangctl.io/restarts"
RESTART_ALL_EXIT_CODE = "pod-restart-all-containers.stage.gangctl.io/exit-code"
RESTART_ALL_AT = "pod-restart-all-containers.stage.gangctl.io/delay"   # a duration, or a time (RFC 3339) to wait for
COMPLETE_WEIGHT = "pod-complete.stage.kwok.x-k8s.io/weight"
COMPLETE_DELAY = "pod-complete.stage.kwok.x-k8s.io/delay"
# KWOK completes a pod between `delay` and `jitter-delay`; when jitter-delay is not above delay it uses
# jitter-delay alone (5 s by default), so both are always set.
COMPLETE_JITTER = "pod-complete.stage.kwok.x-k8s.io/jitter-delay"
GPU = "nvidia.com/gpu"


def restart_all(restarts: int, exit_code: int, at: str | None = None) -> dict[str, str]:
    """A pod's annotations asking gangctl's KWOK stage to restart its containers in place until each has
    `restarts` restarts, the last run ending with `exit_code`, at time `at` (RFC 3339; None: at once).
    KWOK picks one of the stages that match a pod at random by their weights, and pod-complete (weight
    1) matches a running Job pod too: its weight is 0 here, so the restart is never left to chance
    (once the restarts are done, pod-complete is the only stage that matches and runs as before)."""
    out = {RESTART_ALL: str(restarts), RESTART_ALL_EXIT_CODE: str(exit_code), COMPLETE_WEIGHT: "0"}
    return out | ({RESTART_ALL_AT: at} if at else {})


# --- plans (pure) -----------------------------------------------------------------------------------

@dataclass(frozen=True)
class Outage:
    node: str
    start: float      # seconds after the chaos starts
    duration: float   # seconds the node stays NotReady


def plan_outages(nodes: list[str], seed: int, count: int, *, window: float, down_for: tuple[float, float],
                 max_down: int) -> list[Outage]:
    """`count` outages of random nodes at random times in [0, window), each `down_for` seconds long;
    never more than `max_down` nodes down at once and never one node twice at a time (an outage that
    would break either is moved to just after the next end of an overlapping one)."""
    rng = random.Random(seed)
    pool = sorted(nodes)
    starts = sorted(rng.uniform(0, window) for _ in range(count))
    out: list[Outage] = []
    for start in starts:
        duration = rng.uniform(*down_for)
        while True:
            end = start + duration
            overlapping = [o for o in out if o.start < end and start < o.start + o.duration]
            # Concurrency only rises at a start: check ours and every start inside our interval.
            peak = max(sum(1 for o in overlapping if o.start <= p < o.start + o.duration)
                       for p in [start] + [o.start for o in overlapping if o.start > start])
            free = [n for n in pool if n not in {o.node for o in overlapping}]
            if peak < max_down and free:
                break
            start = min(o.start + o.duration for o in overlapping if o.start + o.duration > start) + 0.001
        out.append(Outage(rng.choice(free), start, duration))
    return sorted(out, key=lambda o: o.start)


@dataclass(frozen=True)
class ChaosJob:
    name: str
    min_nodes: int
    max_nodes: int
    run_for: int                 # seconds until KWOK completes a worker (from when it runs)
    exit_code: int | None = None  # set: every worker exits with this code `fail_after` s after it runs
    fail_after: int = 3


def plan_jobs(seed: int, count: int, *, min_nodes: tuple[int, int], max_nodes: tuple[int, int],
              run_for: tuple[int, int], failing: int, exit_codes: tuple[int, ...] = (1, 3, 137),
              prefix: str = "el") -> list[ChaosJob]:
    """`count` elastic jobs with random bounds and durations; `failing` of them (chosen at random)
    have workers that exit non-zero."""
    rng = random.Random(seed)
    fail_at = set(rng.sample(range(count), failing))
    jobs = []
    for i in range(count):
        lo = rng.randint(*min_nodes)
        hi = max(lo, rng.randint(*max_nodes))
        code = rng.choice(exit_codes) if i in fail_at else None
        jobs.append(ChaosJob(f"{prefix}-{i:03d}", lo, hi, rng.randint(*run_for), code))
    return jobs


def elastic_runtime(name: str, *, max_restarts: int) -> dict:
    """A KWOK ClusterTrainingRuntime for the chaos jobs: elastic (bounds per job), a restart budget."""
    return {"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "ClusterTrainingRuntime",
            "metadata": {"name": name, "labels": {"trainer.kubeflow.org/framework": "torch"}},
            "spec": {"mlPolicy": {"numNodes": 1, "torch": {"numProcPerNode": "auto",
                                                          "elasticPolicy": {"minNodes": 1, "maxNodes": 1}}},
                     "podGroupPolicy": {"coscheduling": {"scheduleTimeoutSeconds": 60}},
                     "template": {"spec": {
                         "failurePolicy": {"maxRestarts": max_restarts},
                         "replicatedJobs": [{"name": "node", "replicas": 1, "template": {
                             "metadata": {"labels": {"trainer.kubeflow.org/trainjob-ancestor-step": "trainer"}},
                             "spec": {"template": {"spec": {
                                 "restartPolicy": "Never", "nodeSelector": dict(KWOK_NODE_SELECTOR),
                                 "tolerations": [dict(KWOK_TOLERATION)], "containers": [
                                 {"name": "node", "image": "pytorch", "command": ["torchrun", "t.py"]}]}}}}}]}}}}


def trainjob(job: ChaosJob, namespace: str, runtime: str, *, gpus: int = 8) -> dict:
    """The TrainJob a user would submit, with the KWOK annotations that make its workers finish or fail."""
    annotations = {COMPLETE_DELAY: f"{job.run_for}s", COMPLETE_JITTER: f"{job.run_for + 2}s"}
    labels: dict[str, str] = {}
    if job.exit_code is not None:
        labels[FAIL_LABEL] = "true"
        annotations.update({FAIL_DELAY: f"{job.fail_after}s", FAIL_JITTER: f"{job.fail_after + 1}s",
                            FAIL_EXIT_CODE: str(job.exit_code)})
    trainer = {"numNodes": job.max_nodes, "elasticPolicy": {"minNodes": job.min_nodes, "maxNodes": job.max_nodes},
               "resourcesPerNode": {"limits": {GPU: str(gpus)}}}
    return objects.trainjob(job.name, namespace=namespace, runtime=runtime, runtime_kind="ClusterTrainingRuntime",
                            submitted=True, trainer=trainer,
                            podTemplateOverrides=[{"targetJobs": [{"name": "node"}],
                                                   "metadata": {"labels": labels, "annotations": annotations}}])


# --- the driver (I/O) -------------------------------------------------------------------------------

@dataclass
class NodeChaos:
    """Carries out an outage plan: label a node NotReady at its start, remove the label at its end.

    `actions` records every change made ({t, node, action}); `restore_all()` (call it in a finally)
    removes the label from every node this driver labelled."""

    kube: Kube
    actions: list[dict] = field(default_factory=list)
    down: set[str] = field(default_factory=set)
    touched: set[str] = field(default_factory=set)
    _t0: float = 0.0

    async def run(self, outages: list[Outage], stop: asyncio.Event | None = None) -> None:
        """Play the plan; returns when every outage is over (or `stop` is set: remaining outages are
        skipped and nodes down are restored)."""
        self._t0 = time.monotonic()
        steps = sorted([(o.start, 1, o.node) for o in outages] + [(o.start + o.duration, 0, o.node) for o in outages])
        try:
            for at, up_down, node in steps:
                delay = at - (time.monotonic() - self._t0)
                if delay > 0:
                    if stop is None:
                        await asyncio.sleep(delay)
                    else:
                        try:
                            await asyncio.wait_for(stop.wait(), delay)
                            return
                        except asyncio.TimeoutError:
                            pass
                if up_down:
                    await self.fail(node)
                else:
                    await self.restore(node)
        finally:
            for node in sorted(self.down):
                await self.restore(node)

    def _record(self, node: str, action: str) -> None:
        self.actions.append({"t": round(time.monotonic() - self._t0, 3), "node": node, "action": action})

    async def fail(self, node: str) -> None:
        self.touched.add(node)
        self.down.add(node)
        await self.kube.merge_patch(NODES.path(name=node), {"metadata": {"labels": {NOT_READY_LABEL: "true"}}})
        self._record(node, "NotReady")

    async def restore(self, node: str) -> None:
        try:
            await self.kube.request("PATCH", NODES.path(name=node), body=[
                {"op": "remove", "path": "/metadata/labels/" + NOT_READY_LABEL.replace("/", "~1")}],
                content_type="application/json-patch+json")
        except ApiError as err:
            if err.status not in (404, 422):  # 422: the label is not there (already restored)
                raise
        self.down.discard(node)
        self._record(node, "restored")

    async def restore_all(self) -> None:
        """Restore every node this driver left NotReady (idempotent; for a finally)."""
        for node in sorted(self.down):
            await self.restore(node)


async def gpu_nodes(kube: Kube) -> list[str]:
    """Names of the KWOK GPU nodes (KWOK-managed, with GPUs)."""
    items = (await kube.get(NODES.path()))["items"]
    return sorted(n["metadata"]["name"] for n in items
                  if (n["metadata"].get("annotations") or {}).get("kwok.x-k8s.io/node") == "fake"
                  and GPU in ((n.get("status") or {}).get("allocatable") or {}))


async def not_ready_nodes(kube: Kube) -> list[str]:
    items = (await kube.get(NODES.path()))["items"]
    out = []
    for n in items:
        ready = next((c for c in (n.get("status") or {}).get("conditions") or [] if c.get("type") == "Ready"), None)
        if not ready or ready.get("status") != "True":
            out.append(n["metadata"]["name"])
    return sorted(out)
