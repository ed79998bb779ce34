"""The cluster side of `gangctl sim-check`: submit TrainJobs on schedule, watch them finish.

Times are this process's wall clock (the controller stamps `gang.boundAt` with the same machine's
clock): `submitted` is the midpoint of the create request, `finished` the moment a watch event
first shows the TrainJob Complete or Failed.
"""
from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Callable

from gangctl.api.resources import CLUSTER_TRAINING_RUNTIMES, CONFIGMAPS, NAMESPACES, NODES, PODS, TRAINJOBS
from gangctl.commands.policy_apply import apply_policy
from gangctl.kube.client import ApiError, Kube
from gangctl.model.quota import QuotaPolicy
from gangctl.model.quota_plan import timestamp
from gangctl.policy.status import parse_time
from gangctl.model.names import TRAINJOB_NAME, child_job_name
from gangctl.plugins.kueue import WORKLOADS
from gangctl.model.topology import Topology
from gangctl.plugins.quota_objects import POLICY_CONFIGMAP, POLICY_NAMESPACE, TOPOLOGY_CONFIGMAP, stored_topology
from gangctl.sim.replay import SIM_RUN_LABEL, Submission
from gangctl.validate.measure import finished_condition


class ReplayError(RuntimeError):
    pass


@dataclass
class ReplayRecord:
    submitted: dict[str, float] = field(default_factory=dict)        # TrainJob key -> epoch seconds
    finished: dict[str, float] = field(default_factory=dict)         # TrainJob key -> first seen finished
    objects: dict[str, dict] = field(default_factory=dict)           # TrainJob key -> last seen object
    # TrainJob key -> the first gang.boundAt seen (epoch seconds): a gang restarted later (a scheduler's
    # preemption or consolidation) is stamped again, and its queueing delay ends at its first start
    bound: dict[str, float] = field(default_factory=dict)


def key_of(trainjob: dict) -> str:
    meta = trainjob["metadata"]
    return f"{meta['namespace']}/{meta['name']}"


async def gpu_nodes(kube: Kube) -> list[dict]:
    return (await kube.get(NODES.path()))["items"]


async def check_runtime(kube: Kube, name: str) -> None:
    try:
        await kube.get(CLUSTER_TRAINING_RUNTIMES.path(None, name))
    except ApiError as err:
        if err.not_found:
            raise ReplayError(f"ClusterTrainingRuntime {name!r} not found (gangctl cluster up installs it)") from None
        raise


async def ensure_namespaces(kube: Kube, names: set[str]) -> None:
    for ns in sorted(names):
        try:
            await kube.create(NAMESPACES.path(), {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})
        except ApiError as err:
            if not err.conflict:
                raise


async def replay(kube: Kube, submissions: list[Submission], run_id: str, *, timeout: float,
                 progress: Callable[[int, int], None] = lambda done, total: None,
                 picked_up_within: float = 60.0) -> ReplayRecord:
    """Submit each TrainJob at its offset, and return when all are finished (or raise on timeout)."""
    record = ReplayRecord()
    total = len(submissions)
    all_done = asyncio.Event()
    selector = f"{SIM_RUN_LABEL}={run_id}"

    def see(obj: dict) -> None:
        k = key_of(obj)
        record.objects[k] = obj
        if k not in record.bound and (at := ((obj.get("status") or {}).get("gang") or {}).get("boundAt")):
            record.bound[k] = parse_time(at).timestamp()
        if k not in record.finished and finished_condition(obj) is not None:
            record.finished[k] = time.time()
            progress(len(record.finished), total)
            if len(record.finished) == total:
                all_done.set()

    async def watch() -> None:
        while not all_done.is_set():
            listing = await kube.get(TRAINJOBS.path(), labelSelector=selector)
            for obj in listing["items"]:
                see(obj)
            try:
                async for event in kube.watch(TRAINJOBS.path(), listing["metadata"]["resourceVersion"],
                                              label_selector=selector, timeout_seconds=60):
                    if event.get("type") in ("ADDED", "MODIFIED"):
                        see(event["object"])
                    elif event.get("type") == "ERROR":
                        break
                    if all_done.is_set():
                        return
            except (ApiError, OSError, asyncio.TimeoutError):
                await asyncio.sleep(0.5)

    async def submit() -> None:
        start = time.time()
        for sub in submissions:
            delay = start + sub.at_seconds - time.time()
            if delay > 0:
                await asyncio.sleep(delay)
            body = sub.trainjob
            before = time.time()
            await kube.create(TRAINJOBS.path(body["metadata"]["namespace"]), body)
            record.submitted[key_of(body)] = (before + time.time()) / 2

    async def picked_up() -> None:
        """Fail fast when no controller serves TrainJobs."""
        await asyncio.sleep(picked_up_within)
        if not any(o.get("status") for o in record.objects.values()):  # status.gang at least
            raise ReplayError(f"no TrainJob got a status within {picked_up_within:.0f}s: is `gangctl controller` running?")

    deadline = time.monotonic() + timeout
    waiter = asyncio.create_task(all_done.wait())
    tasks = {asyncio.create_task(watch()), asyncio.create_task(picked_up()), asyncio.create_task(submit()), waiter}
    try:
        while not all_done.is_set():
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise ReplayError(f"{total - len(record.finished)} of {total} TrainJobs not finished after {timeout:.0f}s")
            done, tasks = await asyncio.wait(tasks, timeout=remaining, return_when=asyncio.FIRST_COMPLETED)
            for task in done:
                if task.exception() is not None:
                    raise task.exception()
    finally:
        for task in tasks:
            task.cancel()
    return record


async def admission_to_ready(kube: Kube, record: ReplayRecord) -> list[float]:
    """Kueue: for each replayed job's Workload that was admitted and whose pods became ready, the
    seconds between its `Admitted` and `PodsReady` conditions (to the second, as the API stores them).
    With blockAdmission Kueue admits the next workload only after that: it sets the pace of a queue.
    Read before the run is deleted (the Workloads go with their Jobs)."""
    nodes_jobs: dict[str, set[str]] = {}
    for k in record.submitted:
        ns, name = k.split("/", 1)
        nodes_jobs.setdefault(ns, set()).add(child_job_name(name))
    out: list[float] = []
    for ns, jobs in sorted(nodes_jobs.items()):
        for wl in (await kube.get(WORKLOADS.path(ns)))["items"]:
            if not {o.get("name") for o in wl["metadata"].get("ownerReferences") or []} & jobs:
                continue
            at = {c["type"]: c.get("lastTransitionTime") for c in (wl.get("status") or {}).get("conditions") or []
                  if c.get("status") == "True"}
            if at.get("Admitted") and at.get("PodsReady"):
                out.append(timestamp(at["PodsReady"]) - timestamp(at["Admitted"]))
    return out


async def delete_run(kube: Kube, record: ReplayRecord) -> None:
    for k in list(record.submitted):
        ns, name = k.split("/", 1)
        await kube.delete(TRAINJOBS.path(ns, name))


async def _stored(kube: Kube, name: str) -> dict | None:
    """The ConfigMap gangctl-system/`name` (None: there is none)."""
    try:
        return await kube.get(CONFIGMAPS.path(POLICY_NAMESPACE, name))
    except ApiError as err:
        if not err.not_found:
            raise
        return None


async def install_policy(kube: Kube, policy: QuotaPolicy, text: str, backend: str = "coscheduling") -> dict | None:
    """Store `policy` where the controller's quota gate reads it and make `backend`'s queue and
    topology objects, as `gangctl policy apply --backend` does; return the policy ConfigMap that was
    there before (None: there was none). The backend's objects stay after the run."""
    before = await _stored(kube, POLICY_CONFIGMAP)
    await apply_policy(kube, policy, backend, dry_run=False, text=text)
    return before


# What a replayed TrainJob's gang asks of each backend on the local cluster: the queue is the team's,
# named by the controller from the quota policy (Kueue: the LocalQueue `policy apply` makes in each
# team namespace); native gangs go to the local cluster's second kube-scheduler (its name is
# gangctl.cluster.native.NATIVE_SCHEDULER, which sim-check may not import: a unit test keeps them equal).
REPLAY_GANG_SETTINGS = {"kueue": {}, "kai": {}, "volcano": {}, "native": {"schedulerName": "native-gang-scheduler"}}


async def backend_runtime(kube: Kube, base: str, backend: str) -> str:
    """The ClusterTrainingRuntime replayed TrainJobs name for `backend`: `base` itself for coscheduling
    (the shipped runtimes' backend), else `<base>-<backend>`, a copy of it whose podGroupPolicy names
    `backend` (applied; kept after the run)."""
    if backend == "coscheduling":
        return base
    shipped = await kube.get(CLUSTER_TRAINING_RUNTIMES.path(None, base))
    name = f"{base}-{backend}"
    runtime = {"apiVersion": shipped["apiVersion"], "kind": shipped["kind"],
               "metadata": {"name": name, "labels": shipped["metadata"].get("labels") or {}},
               "spec": {**shipped["spec"], "podGroupPolicy": {backend: REPLAY_GANG_SETTINGS[backend]}}}
    await kube.apply(CLUSTER_TRAINING_RUNTIMES.path(None, name), runtime, "gangctl-sim-check")
    return name


async def install_topology(kube: Kube, topology: Topology) -> dict | None:
    """Store `topology` where the controller reads it (as `gangctl policy apply` does); return the
    ConfigMap that was there before (None: there was none)."""
    before = await _stored(kube, TOPOLOGY_CONFIGMAP)
    for obj in stored_topology(topology):
        meta = obj["metadata"]
        target = (CONFIGMAPS.path(meta["namespace"], meta["name"]) if obj["kind"] == "ConfigMap"
                  else NAMESPACES.path(None, meta["name"]))
        await kube.apply(target, obj, "gangctl-sim-check")
    return before


async def restore(kube: Kube, name: str, before: dict | None) -> None:
    """Put back the ConfigMap gangctl-system/`name` a replay replaced (`install_policy`,
    `install_topology`), or remove the replay's when there was none."""
    path = CONFIGMAPS.path(POLICY_NAMESPACE, name)
    if before is None:
        await kube.delete(path)
        return
    await kube.merge_patch(path, {"data": before.get("data") or {}})


async def placed_pods(kube: Kube, namespaces: set[str]) -> list[dict]:
    """The TrainJobs' pods in `namespaces` (finished ones too: where each gang ran)."""
    pods: list[dict] = []
    for ns in sorted(namespaces):
        pods += (await kube.get(PODS.path(ns), labelSelector=TRAINJOB_NAME))["items"]
    return pods
