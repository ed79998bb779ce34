"""Kubernetes objects made up by hand, shaped as the API server shows them: pods, TrainJobs,
PyTorchJobs, training runtimes and nodes.

The simulator builds from these the pods the reconciler would observe (`gangctl.sim.controller`), and
the unit tests build their fixtures from them, so each kind of object has one shape wherever it is
made up. Every builder writes the kind's identity (a pod's and a node's metadata, spec and status
sections, as the API server always serves them) and then only the fields it is given: a caller states
exactly what its object holds, and nothing it did not ask for can change what a decision sees.
"""
from __future__ import annotations

import copy
from collections.abc import Iterable
from functools import lru_cache

import yaml

from gangctl.api import pytorchjob as v1
from gangctl.api.trainjob import TRAINJOB_KIND
from gangctl.config import REPO_ROOT
from gangctl.model.names import COMPLETION_INDEX_ANNOTATION
from gangctl.policy import pytorchjob as pj
from gangctl.policy.convert import DEFAULT_RUNTIME, TRAINER_API


# --- pods ----------------------------------------------------------------------------------------
def pod(name: str | None = None, *, namespace: str | None = None, uid: str | None = None,
        labels: dict | None = None, annotations: dict | None = None, index: int | str | None = None,
        owners: list[dict] | None = None, deleted_at: str | None = None, grace: int | None = None,
        node: str | None = None, gates: Iterable[str] = (), containers: list[dict] | None = None,
        phase: str | None = None, conditions: list[dict] | None = None, container_statuses: list[dict] | None = None,
        **spec) -> dict:
    """A Pod. `index` is its Indexed Job completion index (annotated); `deleted_at` its
    deletionTimestamp, `grace` its deletionGracePeriodSeconds; `gates` the names of its scheduling
    gates; `spec` any further pod spec fields."""
    if index is not None:
        annotations = {**(annotations or {}), COMPLETION_INDEX_ANNOTATION: str(index)}
    meta = _given(name=name, namespace=namespace, uid=uid, labels=labels, annotations=annotations,
                  ownerReferences=owners, deletionTimestamp=deleted_at, deletionGracePeriodSeconds=grace)
    body = _given(nodeName=node, schedulingGates=[{"name": g} for g in gates] or None, containers=containers)
    status = _given(phase=phase, conditions=conditions, containerStatuses=container_statuses)
    return {"metadata": meta, "spec": {**body, **spec}, "status": status}


def job_pod(job: dict, index: int, *, labels: dict | None = None, phase: str = "Running",
            disrupted: str | None = None, exit_code: int | None = None, **fields) -> dict:
    """Pod `index` of the Indexed Job `job` as the Job controller makes it: named after the Job and
    the index, in the Job's namespace, owned by it (its uid), its completion index annotated.
    `disrupted`: the reason of its DisruptionTarget condition (None: none); `exit_code`: the code its
    `node` container exited with."""
    meta = job["metadata"]
    return pod(f"{meta['name']}-{index}", namespace=meta["namespace"], labels=labels, index=index,
               owners=[{"uid": meta["uid"]}], phase=phase, conditions=[disruption(disrupted)] if disrupted else [],
               container_statuses=None if exit_code is None else [terminated(exit_code)], **fields)


def pytorchjob_pod(job: dict, replica_type: str, index: int, *, phase: str = "Running", disrupted: str | None = None,
                   exit_code: int | None = None, **fields) -> dict:
    """Pod `index` of a PyTorchJob's `replica_type` as gangctl makes it: named `<job>-<type>-<index>`,
    in the job's namespace, owned by it (its uid), with v1's job-name, replica-type and replica-index
    labels. `disrupted` and `exit_code` as for `job_pod` (the code of its `pytorch` container)."""
    meta, rtype = job["metadata"], replica_type.lower()
    name = f"{meta['name']}-{rtype}-{index}"
    labels = {pj.JOB_NAME: meta["name"], pj.REPLICA_TYPE: rtype, pj.REPLICA_INDEX: str(index)}
    return pod(name, namespace=meta["namespace"], uid=f"{meta['uid']}-{rtype}-{index}", labels=labels,
               owners=[{"apiVersion": job.get("apiVersion", v1.API_VERSION), "kind": v1.KIND, "name": meta["name"],
                        "uid": meta["uid"], "controller": True}],
               phase=phase, conditions=[disruption(disrupted)] if disrupted else [],
               container_statuses=None if exit_code is None else [terminated(exit_code, container="pytorch")],
               **fields)


def disruption(reason: str | None = None, *, message: str | None = None, at: str | None = None) -> dict:
    """The DisruptionTarget condition Kubernetes sets on a pod it is about to delete (`reason`: who,
    e.g. DeletionByPodGC, DeletionByTaintManager; `at`: its lastTransitionTime)."""
    return {"type": "DisruptionTarget", "status": "True",
            **_given(reason=reason, message=message, lastTransitionTime=at)}


def terminated(exit_code: int, *, container: str = "node", reason: str | None = None, at: str | None = None) -> dict:
    """The status of a pod's container that exited with `exit_code` (`at`: its finishedAt)."""
    return {"name": container, "state": {"terminated": {"exitCode": exit_code, **_given(reason=reason, finishedAt=at)}}}


# --- jobs ----------------------------------------------------------------------------------------
def trainjob(name: str = "llm", *, namespace: str = "team-a", uid: str = "u-1", runtime: str = DEFAULT_RUNTIME,
             trainer: dict | None = None, metadata: dict | None = None, status: dict | None = None,
             runtime_kind: str | None = None, submitted: bool = False, **spec) -> dict:
    """A TrainJob on the runtime named `runtime` (of kind `runtime_kind`, when given); `spec` its
    further spec fields, `metadata` further metadata fields (resourceVersion, generation, labels, ...).
    `submitted`: the TrainJob as its author sends it to the API server, without a uid (the server
    assigns one)."""
    identity = {"name": name, "namespace": namespace, **_given(uid=None if submitted else uid)}
    return {"apiVersion": TRAINER_API, "kind": TRAINJOB_KIND,
            "metadata": {**identity, **(metadata or {})},
            "spec": {"runtimeRef": {"name": runtime, **_given(kind=runtime_kind)}, **_given(trainer=trainer), **spec},
            **_given(status=status)}


def replica(replicas: int | None = None, *, image: str = "pytorch/pytorch:2.5.1",
            command: list[str] | None = None, requests: dict | None = None, **extra) -> dict:
    """A PyTorchJob replica spec: one `pytorch` container (`extra`: restartPolicy and the like)."""
    container = {"name": "pytorch", "image": image,
                 "command": command or ["python", "/opt/mnist.py", "--backend", "gloo"],
                 "resources": {"requests": requests if requests is not None else {"cpu": "2", "memory": "1Gi"}}}
    spec: dict = {"template": {"spec": {"containers": [container]}}, **extra}
    if replicas is not None:
        spec["replicas"] = replicas
    return spec


def pytorchjob(name: str = "mnist", replicas: dict | None = None, *, namespace: str = "team-a", uid: str = "u-1",
               metadata: dict | None = None, **spec) -> dict:
    """A Training Operator v1 PyTorchJob with `replicas` as its pytorchReplicaSpecs (a single Master
    when not given)."""
    return {"apiVersion": v1.API_VERSION, "kind": v1.KIND,
            "metadata": {"name": name, "namespace": namespace, "uid": uid, **(metadata or {})},
            "spec": {"pytorchReplicaSpecs": replicas if replicas is not None else {"Master": replica(1)}, **spec}}


# --- runtimes ------------------------------------------------------------------------------------
@lru_cache(maxsize=None)
def _shipped(name: str) -> dict:
    return yaml.safe_load((REPO_ROOT / "deploy" / "runtimes" / f"{name}.yaml").read_text())


def runtime(name: str = DEFAULT_RUNTIME, *, gang: dict | None = None, failure_policy: dict | None = None,
            elastic: dict | None = None) -> dict:
    """A copy of the shipped runtime `name` (deploy/runtimes), with `gang` as its podGroupPolicy,
    `failure_policy` as its failurePolicy and `elastic` as torch's elasticPolicy when given."""
    rt = copy.deepcopy(_shipped(name))
    if gang is not None:
        rt["spec"]["podGroupPolicy"] = gang
    if failure_policy is not None:
        rt["spec"]["template"]["spec"]["failurePolicy"] = failure_policy
    if elastic is not None:
        rt["spec"]["mlPolicy"].setdefault("torch", {})["elasticPolicy"] = elastic
    return rt


# --- nodes ---------------------------------------------------------------------------------------
def node(name: str = "n1", *, ready: str | None = "True", since: str | None = None,
         allocatable: dict | None = None, labels: dict | None = None, taints: list | None = None,
         unschedulable: bool = False, declared_features: list | None = None) -> dict:
    """A Node. `ready` is its Ready condition's status ("True", "False", "Unknown"; None: no such
    condition), `since` that condition's lastTransitionTime; `declared_features` what its kubelet
    declares in status.declaredFeatures."""
    spec = _given(taints=taints, unschedulable=True if unschedulable else None)
    condition = None if ready is None else {"type": "Ready", "status": ready, **_given(lastTransitionTime=since)}
    status = _given(allocatable=allocatable, conditions=None if condition is None else [condition],
                    declaredFeatures=declared_features)
    return {"metadata": {"name": name, **_given(labels=labels)}, "spec": spec, "status": status}


def _given(**fields) -> dict:
    """The fields that have a value: a builder writes no field it was not given."""
    return {key: value for key, value in fields.items() if value is not None}

