"""Merge a TrainJob over its runtime into the one description every builder works from.

Kubeflow Trainer's rules: the TrainJob's `trainer` overrides the runtime's `node` container (image,
command, args, env, resources) and `mlPolicy.numNodes`; `podTemplateOverrides` patch the pod
templates of the jobs they target. Works on the raw JSON of objects already validated by the API.
"""
from __future__ import annotations

import copy
import math
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

from gangctl.api.quantity import parse_quantity

NODE_JOB = "node"  # the replicated job whose pods run torchrun (the SDK looks for this name)
NODE_CONTAINER = "node"
GPU_RESOURCE = "nvidia.com/gpu"


class ResolveError(ValueError):
    """The TrainJob and its runtime cannot be combined; the message names the field, `reason` says
    whose fault it is (the runtime's, or the TrainJob's own: InvalidSpec)."""

    def __init__(self, message: str, reason: str = "InvalidRuntime"):
        super().__init__(message)
        self.reason = reason


@dataclass(frozen=True)
class ResolvedJob:
    name: str
    namespace: str
    uid: str
    runtime_kind: str
    runtime_name: str
    num_nodes: int
    min_nodes: int | None
    num_proc_per_node: str
    suspend: bool
    gang_backend: str | None          # "coscheduling", "volcano", "kueue" or None
    gang_settings: dict[str, Any]
    pod_template: dict[str, Any]      # the node job's pod template with the trainer merged in
    job_spec: dict[str, Any]          # the node job's batch/v1 spec fields other than the template
    requests: dict[str, Fraction] = field(default_factory=dict)  # one node pod's requests
    failure_policy: dict | None = None  # JobSet spec.failurePolicy of the runtime template
    success_policy: dict | None = None  # JobSet spec.successPolicy of the runtime template
    elastic: dict | None = None         # mlPolicy.torch.elasticPolicy, with spec.trainer.elasticPolicy over it

    @property
    def max_nodes(self) -> int:
        """The most nodes the job may run on (num_nodes; for an elastic job, maxNodes)."""
        return self.num_nodes


def resolve(trainjob: dict, runtime: dict) -> ResolvedJob:
    spec = trainjob.get("spec") or {}
    meta = trainjob["metadata"]
    rspec = runtime.get("spec") or {}
    ml = rspec.get("mlPolicy") or {}
    torch = ml.get("torch") or {}
    trainer = spec.get("trainer") or {}

    js = (rspec.get("template") or {}).get("spec") or {}
    node_job = _node_job(rspec)
    where = f"runtime spec.template.spec.replicatedJobs[{_node_index(rspec)}].template"
    job_template = _object(copy.deepcopy(node_job.get("template") or {}), where)
    job_spec = dict(_object(job_template.get("spec") or {}, f"{where}.spec"))
    pod_template = _object(job_spec.pop("template", None) or {}, f"{where}.spec.template")
    pod_spec = _object(pod_template.setdefault("spec", {}), f"{where}.spec.template.spec")
    _check_pod_template(pod_template, f"{where}.spec.template")
    container = _node_container(pod_spec)

    for key in ("image", "command", "args"):
        if trainer.get(key) is not None:
            container[key] = list(trainer[key]) if isinstance(trainer[key], list) else trainer[key]
    if trainer.get("env"):
        container["env"] = _merge_env(container.get("env") or [], trainer["env"])
    if trainer.get("resourcesPerNode"):
        container["resources"] = copy.deepcopy(trainer["resourcesPerNode"])

    job_names = [j.get("name") for j in js.get("replicatedJobs") or []]
    for i, override in enumerate(spec.get("podTemplateOverrides") or []):
        targets = {t.get("name") for t in override.get("targetJobs") or []}
        for j, target in enumerate(override.get("targetJobs") or []):
            if target.get("name") not in job_names:
                raise ResolveError(
                    f"spec.podTemplateOverrides[{i}].targetJobs[{j}].name: the runtime "
                    f"{(spec.get('runtimeRef') or {}).get('name', '')!r} has no replicated job "
                    f"{target.get('name')!r} (it has: {', '.join(map(str, job_names))})", reason="InvalidSpec")
        if NODE_JOB in targets:
            _apply_override(pod_template, override)

    num_nodes = int(trainer.get("numNodes") or ml.get("numNodes") or 1)
    elastic = {**(torch.get("elasticPolicy") or {}), **(trainer.get("elasticPolicy") or {})}
    min_nodes = elastic.get("minNodes")
    if elastic:
        num_nodes = int(elastic.get("maxNodes") or num_nodes)
        if min_nodes is not None and int(min_nodes) > num_nodes:
            raise ResolveError(f"elasticPolicy: minNodes ({min_nodes}) must be less than or equal to "
                               f"maxNodes ({num_nodes}) (spec.trainer.elasticPolicy over the runtime's "
                               "mlPolicy.torch.elasticPolicy)", reason="InvalidSpec")

    try:
        requests = pod_requests(pod_spec)
    except ValueError as err:
        raise ResolveError(f"{where}.spec.template.spec.containers[].resources (with spec.trainer.resourcesPerNode "
                           f"over the node container's): {err}") from None
    nproc = trainer.get("numProcPerNode", torch.get("numProcPerNode", "auto"))
    backend, settings = _gang_policy(rspec.get("podGroupPolicy"))
    return ResolvedJob(
        name=meta["name"], namespace=meta["namespace"], uid=meta.get("uid", ""),
        runtime_kind=(spec.get("runtimeRef") or {}).get("kind", "ClusterTrainingRuntime"),
        runtime_name=(spec.get("runtimeRef") or {}).get("name", ""),
        num_nodes=num_nodes, min_nodes=min_nodes,
        num_proc_per_node=procs_per_node(nproc, container),
        suspend=bool(spec.get("suspend")),
        gang_backend=backend, gang_settings=settings,
        pod_template=pod_template, job_spec=job_spec, requests=requests,
        failure_policy=js.get("failurePolicy"), success_policy=js.get("successPolicy"),
        elastic=elastic or None,
    )


def _object(value: Any, where: str) -> dict:
    if not isinstance(value, dict):
        raise ResolveError(f"{where} must be an object, got {type(value).__name__} {value!r:.60}")
    return value


def _list(value: Any, where: str) -> list:
    if not isinstance(value, list):
        raise ResolveError(f"{where} must be a list, got {type(value).__name__} {value!r:.60}")
    return value


def _check_pod_template(pod_template: dict, where: str) -> None:
    """The shapes of the runtime's pod template fields gangctl reads or merges into (the rest is the
    Job API's to judge): a wrong shape is the runtime's error, named, instead of a crash."""
    meta = _object(pod_template.get("metadata") or {}, f"{where}.metadata")
    for key in ("labels", "annotations"):
        _object(meta.get(key) or {}, f"{where}.metadata.{key}")
    spec = pod_template["spec"]
    for key in ("nodeSelector", "affinity", "securityContext"):
        _object(spec.get(key) or {}, f"{where}.spec.{key}")
    for key in ("containers", "tolerations", "volumes", "initContainers", "imagePullSecrets"):
        for i, item in enumerate(_list(spec.get(key) or [], f"{where}.spec.{key}")):
            _object(item, f"{where}.spec.{key}[{i}]")
    for i, c in enumerate(spec.get("containers") or []):
        _object(c.get("resources") or {}, f"{where}.spec.containers[{i}].resources")
        for part in ("limits", "requests"):
            _object((c.get("resources") or {}).get(part) or {}, f"{where}.spec.containers[{i}].resources.{part}")
        for j, env in enumerate(_list(c.get("env") or [], f"{where}.spec.containers[{i}].env")):
            if not isinstance(_object(env, f"{where}.spec.containers[{i}].env[{j}]").get("name"), str):
                raise ResolveError(f"{where}.spec.containers[{i}].env[{j}].name must be a string")


def _node_index(rspec: dict) -> int:
    jobs = ((rspec.get("template") or {}).get("spec") or {}).get("replicatedJobs") or []
    return next(i for i, job in enumerate(jobs) if job.get("name") == NODE_JOB)


def _node_job(rspec: dict) -> dict:
    jobs = ((rspec.get("template") or {}).get("spec") or {}).get("replicatedJobs") or []
    for job in jobs:
        if job.get("name") == NODE_JOB:
            return job
    raise ResolveError(f"runtime spec.template.spec.replicatedJobs has no job named {NODE_JOB!r}")


def _node_container(pod_spec: dict) -> dict:
    containers = pod_spec.setdefault("containers", [])
    for c in containers:
        if c.get("name") == NODE_CONTAINER:
            return c
    if len(containers) == 1:
        return containers[0]
    raise ResolveError(f"runtime node job has no container named {NODE_CONTAINER!r}")


def _merge_env(base: list[dict], extra: list[dict]) -> list[dict]:
    merged = {e["name"]: e for e in base}
    merged.update({e["name"]: e for e in extra})
    return list(merged.values())


def _apply_override(pod_template: dict, override: dict) -> None:
    meta = override.get("metadata") or {}
    target_meta = pod_template.setdefault("metadata", {})
    for key in ("labels", "annotations"):
        if meta.get(key):
            target_meta.setdefault(key, {}).update(meta[key])
    spec = override.get("spec") or {}
    pod_spec = pod_template.setdefault("spec", {})
    for key in ("nodeSelector",):
        if spec.get(key):
            pod_spec.setdefault(key, {}).update(spec[key])
    for key in ("tolerations", "volumes", "initContainers", "imagePullSecrets"):
        if spec.get(key):
            pod_spec[key] = list(pod_spec.get(key) or []) + list(spec[key])
    for key in ("affinity", "serviceAccountName", "priorityClassName", "securityContext"):
        if spec.get(key) is not None:
            pod_spec[key] = spec[key]


def pod_requests(pod_spec: dict) -> dict[str, Fraction]:
    """What one pod asks the scheduler for: container requests (limits when requests are unset)."""
    total: dict[str, Fraction] = {}
    for c in pod_spec.get("containers") or []:
        res = c.get("resources") or {}
        merged = {**(res.get("limits") or {}), **(res.get("requests") or {})}
        for name, qty in merged.items():
            total[name] = total.get(name, Fraction(0)) + parse_quantity(str(qty))
    return total


def procs_per_node(value: Any, container: dict) -> str:
    """PET_NPROC_PER_NODE: an explicit count, or for "auto" the GPU count, or the CPU count without GPUs."""
    if value not in (None, "auto"):
        return str(value)
    res = container.get("resources") or {}
    merged = {**(res.get("requests") or {}), **(res.get("limits") or {})}
    if GPU_RESOURCE in merged:
        return str(int(parse_quantity(str(merged[GPU_RESOURCE]))))
    if "cpu" in merged:
        return str(max(1, math.floor(parse_quantity(str(merged["cpu"])))))
    return "auto"


def _gang_policy(policy: dict | None) -> tuple[str | None, dict]:
    if not policy:
        return None, {}
    named = [k for k in ("coscheduling", "volcano", "kueue") if policy.get(k) is not None]
    if len(named) > 1:
        raise ResolveError(f"spec.podGroupPolicy: set exactly one of coscheduling, volcano, kueue (got {', '.join(named)})")
    if not named:
        return None, {}
    return named[0], dict(policy[named[0]] or {})
