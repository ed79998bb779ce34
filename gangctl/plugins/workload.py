"""Desired child objects of a TrainJob: the headless Service and the node Job.

The child workload is one Indexed batch/v1 Job per replicated job, not a JobSet: the Job controller
in kube-controller-manager then owns pod lifecycle (completion indexes, podFailurePolicy,
successPolicy, backoffLimitPerIndex, podReplacementPolicy, elastic parallelism), no extra
controller or webhook has to run, and the pods carry the JobSet labels the kubeflow SDK selects by.
"""
from __future__ import annotations

import copy
import hashlib
import json
from typing import Mapping

from gangctl.plugins import base
from gangctl.plugins.base import GangBackend
from gangctl.model.names import (ANCESTOR_STEP, JOB_INDEX, MANAGED_BY, MANAGER, RESULT_FINALIZER, SPEC_HASH,
                                   TRAINJOB_NAME, child_job_name, child_labels)
from gangctl.plugins.torch import torch_env
from gangctl.model import progress
from gangctl.model.gang import Gang
from gangctl.model.jobset import COORDINATOR
from gangctl.model.resolve import NODE_CONTAINER, NODE_JOB, ResolvedJob, ResolvedStep


# A gang cannot make progress without all its members, so a pod on a lost node is evicted after a
# few seconds instead of the default 300 s (DefaultTolerationSeconds). With kube-controller-manager's
# --node-monitor-grace-period=16s and --node-monitor-period=2s, a node that stops renewing its Lease
# is NotReady/Unreachable within ~16-18 s and its gang pods are gone ~5 s later.
NODE_LOSS_TOLERATION_SECONDS = 5
NODE_LOSS_TOLERATIONS = tuple(
    {"key": key, "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": NODE_LOSS_TOLERATION_SECONDS}
    for key in ("node.kubernetes.io/not-ready", "node.kubernetes.io/unreachable"))


def owner_reference(trainjob: dict) -> dict:
    return {
        "apiVersion": trainjob["apiVersion"],
        "kind": trainjob["kind"],
        "name": trainjob["metadata"]["name"],
        "uid": trainjob["metadata"]["uid"],
        "controller": True,
        "blockOwnerDeletion": True,
    }


def with_spec_hash(obj: dict) -> dict:
    """Stamp `obj` with a hash of itself so an unchanged object is not applied again."""
    digest = hashlib.sha256(json.dumps(obj, sort_keys=True).encode()).hexdigest()[:16]
    obj["metadata"].setdefault("annotations", {})[SPEC_HASH] = digest
    return obj


def headless_service(job: ResolvedJob, owner: dict) -> dict:
    return with_spec_hash({
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {
            "name": job.name,
            "namespace": job.namespace,
            "labels": {MANAGED_BY: MANAGER, TRAINJOB_NAME: job.name},
            "ownerReferences": [owner],
        },
        "spec": {
            "clusterIP": "None",
            "selector": {TRAINJOB_NAME: job.name},
            # Workers must resolve each other while they start, before readiness (JobSet's default;
            # the runtime's network.publishNotReadyAddresses may turn it off).
            "publishNotReadyAddresses": job.publish_not_ready,
        },
    })


# An elastic Job must not fail when a node is lost (the lost pod counts as a failure for backoffLimit);
# gangctl judges its pod failures itself (user exit code: the failure policy; disruption: shrink).
ELASTIC_BACKOFF_LIMIT = 2147483647
# An elastic Job is done when any worker finishes: torchrun's workers end together, and an index
# still waiting for a node must not keep the Job open.
ELASTIC_SUCCESS_POLICY = {"rules": [{"succeededCount": 1}]}
# An elastic Job draws its workers from a pool of completion indexes far larger than its size
# (parallelism), each index tried once (backoffLimitPerIndex 0): a worker lost with its node fails its
# index for good, and the Job controller starts the next unused index at once. A fresh index has no
# failed pod, so none of the controller's pod-failure backoff applies (per index it doubles with the
# index's failures, job-wide with every failure since the last success: a job that lost ten nodes
# would wait minutes to grow back). torchrun's c10d rendezvous gives the ranks, so an index is only a
# name. A user's failure is still judged by gangctl (`elastic.failed_worker`) as the attempt's.
ELASTIC_INDEXES_PER_NODE = 100
MAX_INDEXES = 100_000   # completions above this with backoffLimitPerIndex need further limits


def elastic_job_spec(user_spec: dict, max_nodes: int, size: int, pooled: bool = True) -> dict:
    """The batch/v1 fields of an elastic Job of `size` workers (at most `max_nodes`). `pooled` False:
    the shape of a Job an older gangctl made (completions = parallelism, no backoffLimitPerIndex, which
    is immutable), kept for that Job's life so an upgrade never makes its Job unappliable."""
    pool = min(MAX_INDEXES, max(1_000, ELASTIC_INDEXES_PER_NODE * max_nodes))
    spec = {**copy.deepcopy(user_spec), "backoffLimit": ELASTIC_BACKOFF_LIMIT, "completionMode": "Indexed",
            "completions": size, "parallelism": size}
    if pooled:
        spec.update({"backoffLimitPerIndex": 0, "completions": pool})
    spec.setdefault("successPolicy", copy.deepcopy(ELASTIC_SUCCESS_POLICY))
    return spec


# A runtime with gangctl.io/restart: InPlace: when the trainer exits with a failure, the kubelet
# restarts every container of its pod in place (Kubernetes 1.36 RestartAllContainers, KEP-5532);
# torchrun's static rendezvous is then formed again by all ranks (the others' workers fail when a
# peer goes, so their pods restart too). gangctl charges the episode to the budget from the pods'
# restart counts (gangctl.policy.decide).
IN_PLACE_RESTART = {"restartPolicy": "Never", "restartPolicyRules": [
    {"action": "RestartAllContainers", "exitCodes": {"operator": "NotIn", "values": [0]}}]}
# What a kubelet that carries such a rule out declares in node.status.declaredFeatures.
IN_PLACE_FEATURE = "RestartAllContainersOnContainerExits"


def restarts_all_containers(job: Mapping | None) -> bool:
    """Whether a node Job's pods restart in place: a container of its template has a
    RestartAllContainers rule."""
    spec = ((((job or {}).get("spec") or {}).get("template") or {}).get("spec")) or {}
    return any(rule.get("action") == "RestartAllContainers"
               for c in spec.get("containers") or [] for rule in c.get("restartPolicyRules") or [])


# ... and with a stall timeout too, a stalled gang restarts in place the same way: gangctl raises the
# pods' restart attempt (an annotation); each trainer's liveness probe compares it, as its downward API
# file shows it now, with the value its env took when the container started, and fails when they differ:
# the kubelet stops the trainer and its RestartAllContainers rule restarts the pod's containers, the env
# then taking the new value. A trainer with a liveness probe of its own keeps it (its stalls recreate).
RESTART_ATTEMPT_ANNOTATION = "gangctl.io/restart-attempt"
RESTART_ATTEMPT_ENV = "GANGCTL_RESTART_ATTEMPT"
RESTART_ATTEMPT_VOLUME = "gangctl-restart-attempt"
RESTART_ATTEMPT_DIR = "/var/run/secrets/gangctl.io/restart"
_ATTEMPT_FIELD = {"fieldPath": f"metadata.annotations['{RESTART_ATTEMPT_ANNOTATION}']"}
RESTART_ATTEMPT_PROBE = {
    # `read` and `[` are built into every POSIX shell: no tool of the image is needed but `sh`.
    "exec": {"command": ["sh", "-c", f'read -r now < {RESTART_ATTEMPT_DIR}/attempt; [ "$now" = "${RESTART_ATTEMPT_ENV}" ]']},
    "periodSeconds": 5, "timeoutSeconds": 10, "failureThreshold": 1}


def _watch_restart_attempt(spec: dict, container: dict) -> None:
    container["env"] = [*(container.get("env") or []), {"name": RESTART_ATTEMPT_ENV, "valueFrom": {"fieldRef": _ATTEMPT_FIELD}}]
    container["volumeMounts"] = [*(container.get("volumeMounts") or []),
                                 {"name": RESTART_ATTEMPT_VOLUME, "mountPath": RESTART_ATTEMPT_DIR, "readOnly": True}]
    container["livenessProbe"] = copy.deepcopy(RESTART_ATTEMPT_PROBE)
    spec["volumes"] = [*(spec.get("volumes") or []), {"name": RESTART_ATTEMPT_VOLUME, "projected": {"sources": [
        {"downwardAPI": {"items": [{"path": "attempt", "fieldRef": dict(_ATTEMPT_FIELD)}]}}]}}]


def watches_restart_attempt(job: dict | None) -> bool:
    """Whether a node Job's trainer restarts in place when its pods' restart attempt is raised."""
    spec = ((((job or {}).get("spec") or {}).get("template") or {}).get("spec")) or {}
    return any(e.get("name") == RESTART_ATTEMPT_ENV for c in spec.get("containers") or [] for e in c.get("env") or [])


def _set_up_trainer(spec: dict, job: ResolvedJob) -> None:
    """The trainer container (and the runtime's envInjection targets) get torchrun's PET_* variables;
    the trainer, with a runtime that restarts in place, its RestartAllContainers rule, and with a
    stall timeout too, the liveness probe that restarts it when gangctl raises the restart attempt."""
    for container in spec.get("containers") or []:
        trainer = container.get("name") == NODE_CONTAINER or len(spec["containers"]) == 1
        if trainer or container.get("name") in job.env_containers:
            env = {e["name"]: e for e in container.get("env") or []}
            env.update({e["name"]: e for e in torch_env(job)})
            container["env"] = list(env.values())
        if trainer and job.restart_in_place and not job.elastic:
            container.update(IN_PLACE_RESTART)
            if job.stall_timeout_seconds is not None and not container.get("livenessProbe"):
                _watch_restart_attempt(spec, container)


def indexed_spec(job: ResolvedJob, size: int, pooled: bool = True) -> dict:
    """The batch/v1 fields of the Indexed Job of `job` at `size` (its template and suspend aside): the
    runtime's own fields, with an elastic job's pool of indexes (`elastic_job_spec`), else `size`
    completions that fail on the first failure unless the runtime says otherwise."""
    if job.elastic:
        return elastic_job_spec(job.job_spec, job.num_nodes, size, pooled)
    return {"backoffLimit": 0, **copy.deepcopy(job.job_spec), "completionMode": "Indexed",
            "completions": size, "parallelism": size}


def pooled(observed: dict | None) -> bool:
    """Whether an elastic Job is (to be) made with the pool of indexes: a new one, or one made so."""
    return observed is None or "backoffLimitPerIndex" in (observed.get("spec") or {})


def node_job(job: ResolvedJob, owner: dict, backend: GangBackend | None, scheduler_name: str,
             size: int | None = None, gang: Gang | None = None, progress_url: str | None = None,
             pooled: bool = True) -> dict:
    """The Indexed Job; `size` is an elastic job's current parallelism (default: max; its completions
    are a pool of indexes, `elastic_job_spec`; `pooled` False for a Job made before the pool).

    With `progress_url` (the controller's status endpoint), every container may report training
    progress (gangctl.model.progress).

    With `gang`, the backend's Job labels and annotations are added (Kueue's queue name, its minimum
    parallelism). A backend that owns spec.suspend (Kueue) gets the Job created suspended: its
    admission unsuspends it, and gangctl never applies this Job again (see the reconciler)."""
    template = copy.deepcopy(job.pod_template)
    meta = template.setdefault("metadata", {})
    labels = {**(meta.get("labels") or {}), **child_labels(job.name, NODE_JOB), ANCESTOR_STEP: "trainer",
              **coordinator_keys(job)}
    annotations = {**(meta.get("annotations") or {}), **coordinator_keys(job)}
    spec = template.setdefault("spec", {})
    spec.setdefault("restartPolicy", "Never")
    spec["subdomain"] = job.name
    gang_pod(meta, spec, labels, annotations, job, backend, scheduler_name)
    _set_up_trainer(spec, job)
    if progress_url:
        progress.inject(spec, progress_url, job.namespace, job.name)

    nodes = size or job.num_nodes
    job_spec = {**indexed_spec(job, nodes, pooled), "suspend": job.suspend or base.controls_suspend(backend),
                "template": template}
    # The runtime's (and its runtimePatches') Job labels and annotations; gangctl's own win.
    metadata = {
        "name": child_job_name(job.name, NODE_JOB),
        "namespace": job.namespace,
        "labels": {**(job.job_metadata.get("labels") or {}), **child_labels(job.name, NODE_JOB),
                   **coordinator_keys(job)},
        "ownerReferences": [owner],
        "finalizers": [RESULT_FINALIZER],
    }
    annotations = {**(job.job_metadata.get("annotations") or {}), **coordinator_keys(job)}
    if gang is not None:
        metadata["labels"].update(base.job_labels(backend, job, gang))
        annotations.update(base.job_annotations(backend, job, gang))
    if annotations:
        metadata["annotations"] = annotations
    return with_spec_hash({"apiVersion": "batch/v1", "kind": "Job", "metadata": metadata, "spec": job_spec})


def step_job(job: ResolvedJob, step: ResolvedStep, index: int, owner: dict) -> dict:
    """Job `index` of one of the runtime's other replicated jobs (dataset-initializer, model-initializer),
    as JobSet would make it: `<trainjob>-<step>-<index>`, the runtime's template with the TrainJob's
    settings merged in, no gang (its pods are not the trainer's). It carries the result finalizer, so
    a step that finished is read, never run again, until the TrainJob is done."""
    template = copy.deepcopy(step.pod_template)
    meta = template.setdefault("metadata", {})
    labels = {**(step.job_metadata.get("labels") or {}), **child_labels(job.name, step.name), JOB_INDEX: str(index),
              **coordinator_keys(job)}
    meta["labels"] = {**(meta.get("labels") or {}), **child_labels(job.name, step.name), JOB_INDEX: str(index),
                      ANCESTOR_STEP: labels.get(ANCESTOR_STEP, step.name), **coordinator_keys(job)}
    if job.coordinator:
        meta["annotations"] = {**(meta.get("annotations") or {}), **coordinator_keys(job)}
    template.setdefault("spec", {}).setdefault("restartPolicy", "Never")
    metadata = {"name": child_job_name(job.name, step.name, index), "namespace": job.namespace, "labels": labels,
                "ownerReferences": [owner], "finalizers": [RESULT_FINALIZER]}
    if (annotations := {**(step.job_metadata.get("annotations") or {}), **coordinator_keys(job)}):
        metadata["annotations"] = annotations
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": metadata,
            "spec": {**copy.deepcopy(step.job_spec), "template": template}}


def coordinator_keys(job: ResolvedJob) -> dict[str, str]:
    """JobSet's coordinator label and annotation (the same key), when the runtime names a coordinator."""
    return {COORDINATOR: job.coordinator} if job.coordinator else {}


def claims(job: ResolvedJob, owner: dict) -> list[dict]:
    """The PVCs of the runtime's volumeClaimPolicies that this job's pods mount."""
    return [c.object(job.name, job.namespace, owner) for c in job.claims]


def gang_pod(meta: dict, spec: dict, labels: dict, annotations: dict, job, backend, scheduler_name: str) -> None:
    """What every pod of a gang gets, whichever API made it: the node-loss tolerations (unless the
    template sets its own), the backend's labels, annotations and scheduler; then `labels` and
    `annotations` become the template's."""
    tolerations = list(spec.get("tolerations") or [])
    for tol in NODE_LOSS_TOLERATIONS:
        if not any(t.get("key") == tol["key"] and t.get("effect") in (None, "NoExecute") for t in tolerations):
            tolerations.append(dict(tol))
    spec["tolerations"] = tolerations
    if backend is not None:
        labels.update(backend.pod_labels(job))
        annotations.update(backend.pod_annotations(job))
        name = backend.scheduler_name(job, scheduler_name)
        if name:
            spec["schedulerName"] = name
        spec.update(base.pod_spec(backend, job))
    meta["labels"] = labels
    if annotations:
        meta["annotations"] = annotations
