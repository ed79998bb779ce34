"""`gangctl explain [pytorchjob/]NAMESPACE/NAME`: read what the decision needs from the cluster, then diagnose.

The reading is here; the deciding is `gangctl.policy.explain` (pure). The gang is sized exactly as
the controller sizes it (resolve over the runtime, then size_gang), so the numbers are the ones
the PodGroup carries.
"""
from __future__ import annotations

from dataclasses import asdict, replace
from datetime import datetime, timezone
from pathlib import Path

from gangctl.api.resources import (CLUSTER_TRAINING_RUNTIMES, CONFIGMAPS, NODES, PODS, PYTORCHJOBS, TRAINING_RUNTIMES,
                                   TRAINJOBS, Resource)
from gangctl.kube.client import ApiError, Kube
from gangctl.model import progress
from gangctl.model.names import TRAINJOB_NAME
from gangctl.policy import pytorchjob as pj
from gangctl.policy.explain import CAPACITY_AVAILABLE, Diagnosis, diagnose, diagnose_pytorchjob, screen_nodes, with_progress
from gangctl.model.gang import Gang, size_gang
from gangctl.model.topology import PlacementIntent, Topology, TopologyError
from gangctl.plugins.quota_objects import POLICY_NAMESPACE, TOPOLOGY_CONFIGMAP, topology_of
from gangctl.policy.placement import Floor, Unsatisfiable, Waiting, domain_rooms
from gangctl.policy.status import is_true
from gangctl.model.resolve import resolve


CORE_EVENTS = Resource("", "v1", "events", "Event")  # core v1: its field selectors include reason


class ExplainError(RuntimeError):
    """The TrainJob or its runtime could not be read; the message says what to check."""


async def explain(kubeconfig: Path | str | None, namespace: str, name: str,
                  retry_seconds: float | None = None) -> tuple[dict, Diagnosis]:
    kube = await Kube.connect(kubeconfig)
    try:
        try:
            trainjob = await kube.get(TRAINJOBS.path(namespace, name))
        except ApiError as err:
            if err.not_found:
                raise ExplainError(f"TrainJob {namespace}/{name} not found (kubectl get trainjobs -n {namespace})") from None
            raise
        ref = trainjob["spec"]["runtimeRef"]
        kind = ref.get("kind", "ClusterTrainingRuntime")
        path = (TRAINING_RUNTIMES.path(namespace, ref["name"]) if kind == "TrainingRuntime"
                else CLUSTER_TRAINING_RUNTIMES.path(None, ref["name"]))
        try:
            runtime = await kube.get(path)
        except ApiError as err:
            if err.not_found:
                raise ExplainError(f"{kind} {ref['name']!r} not found: create it or fix spec.runtimeRef") from None
            raise
        job = resolve(trainjob, runtime)
        gang = size_gang(job.num_nodes, job.requests, min_nodes=job.min_nodes)
        bound, (rooms, excluded), says = await _room(kube, namespace, TRAINJOB_NAME, name, job.pod_template)
        d = diagnose(trainjob.get("status"), gang, bound, rooms, says, retry_seconds, excluded)
        d = with_progress(d, progress.reported(trainjob), job.stall_timeout_seconds, datetime.now(timezone.utc))
        status = trainjob.get("status")
        finished = is_true(status, "Complete") or is_true(status, "Failed")
        return trainjob, with_domains(d, job.placement, await _topology(kube), rooms, gang, finished)
    finally:
        await kube.close()


async def explain_pytorchjob(kubeconfig: Path | str | None, namespace: str, name: str,
                             retry_seconds: float | None = None) -> tuple[dict, Diagnosis]:
    """The same for a PyTorchJob: its gang as the controller maps it (floor = elasticPolicy.minReplicas
    or schedulingPolicy.minAvailable), the room for its Worker pods, and per domain when it asks for a
    topology placement (one intent for every replica, `pj.to_gang`)."""
    kube = await Kube.connect(kubeconfig)
    try:
        try:
            obj = await kube.get(PYTORCHJOBS.path(namespace, name))
        except ApiError as err:
            if err.not_found:
                raise ExplainError(f"PyTorchJob {namespace}/{name} not found (kubectl get pytorchjobs -n {namespace})") from None
            raise
        try:
            mapped = pj.to_gang(obj)
        except pj.PyTorchJobMappingError as err:
            return obj, Diagnosis("InvalidSpec", str(err))
        workers = mapped.groups[-1].job          # the Workers' template: the gang's per-pod size
        bound, (rooms, excluded), says = await _room(kube, namespace, pj.JOB_NAME, name, workers.pod_template)
        gang = mapped.gang()
        d = diagnose_pytorchjob(obj.get("status"), gang, bound, rooms, says, retry_seconds, excluded)
        try:
            stall_timeout = progress.stall_timeout(obj["metadata"].get("annotations"))
        except ValueError as err:   # the controller fails such a job; say why here too
            return obj, Diagnosis("InvalidSpec", str(err))
        d = with_progress(d, progress.reported(obj), stall_timeout, datetime.now(timezone.utc))
        finished = is_true(obj.get("status"), pj.SUCCEEDED) or is_true(obj.get("status"), pj.FAILED)
        return obj, with_domains(d, workers.placement, await _topology(kube), rooms, gang, finished)
    finally:
        await kube.close()


async def _room(kube: Kube, namespace: str, label: str, name: str, pod_template: dict) -> tuple[int, tuple, str]:
    """The job's pods bound so far, the nodes its pods may use (with their free room) and those they
    may not (with why), and the scheduler's word."""
    nodes = (await kube.get(NODES.path()))["items"]
    pods = (await kube.get(PODS.path(), fieldSelector="status.phase!=Succeeded,status.phase!=Failed"))["items"]
    mine = [p for p in pods if p["metadata"]["namespace"] == namespace
            and (p["metadata"].get("labels") or {}).get(label) == name]
    bound = sum(1 for p in mine if (p.get("spec") or {}).get("nodeName"))
    screened = screen_nodes(nodes, pods, pod_template.get("spec") or {})
    says = await _scheduler_says(kube, namespace, [p["metadata"]["name"] for p in mine if not p["spec"].get("nodeName")])
    return bound, screened, says


async def _topology(kube: Kube) -> Topology | None:
    """The cluster's topology as gangctl's controller reads it (None: none stored, or not readable by
    this user)."""
    try:
        return topology_of(await kube.get(CONFIGMAPS.path(POLICY_NAMESPACE, TOPOLOGY_CONFIGMAP)))
    except ApiError as err:
        if err.not_found or err.status == 403:
            return None
        raise
    except ValueError:
        return None


NOT_WAITING = ("GangScheduled", "Binding", "Suspended")


def with_domains(d: Diagnosis, intent: PlacementIntent | None, topology: Topology | None,
                 rooms: list, gang: Gang, finished: bool) -> Diagnosis:
    """The diagnosis of a gang with a placement intent that still waits, with the free room per domain
    at its level."""
    if intent is None or topology is None or finished or d.reason in NOT_WAITING:
        return d
    try:
        on = intent.on(topology)
    except TopologyError:
        return d
    floor = Floor(gang.min_member, gang.per_pod)
    view = domain_rooms(rooms, topology, on, floor)
    d = replace(d, level=view.level, domains=view.rows, next_domain=view.next_domain)
    if d.reason == CAPACITY_AVAILABLE and on.required is not None and isinstance(view.verdict, Waiting | Unsatisfiable):
        # The nodes have room in total, but no domain of the required level holds the gang: it waits for
        # one, whichever scheduler places it (Kueue, KAI and kube-scheduler say so in words of their own).
        d = replace(d, reason=view.verdict.reason, message=f"{view.verdict.message}; the nodes have room for "
                                                           f"{d.slots} pod(s) in total, but the gang requires one "
                                                           f"{view.level}")
    return d


async def _scheduler_says(kube: Kube, namespace: str, pending: list[str]) -> str:
    """The newest FailedScheduling message about one of the job's unbound pods."""
    if not pending:
        return ""
    events = (await kube.get(CORE_EVENTS.path(namespace), fieldSelector="reason=FailedScheduling"))["items"]
    ours = [e for e in events if (e.get("involvedObject") or {}).get("name") in set(pending)]
    if not ours:
        return ""
    newest = max(ours, key=lambda e: e.get("lastTimestamp") or e.get("eventTime") or "")
    return (newest.get("message") or "").strip()


def as_json(job: dict, d: Diagnosis) -> dict:
    meta = job["metadata"]
    out = asdict(d)
    out["rows"] = [{"resource": r.resource, "needed": float(r.needed), "free": float(r.free)} for r in d.rows]
    out["excluded"] = [asdict(e) for e in d.excluded]
    out["domains"] = [{**asdict(r), "gpus_free": float(r.gpus_free)} for r in d.domains]
    return {job["kind"].lower(): f"{meta['namespace']}/{meta['name']}", **out}
