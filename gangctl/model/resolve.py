"""Merge a TrainJob over its runtime into the one description every builder works from.

Kubeflow Trainer's rules: the TrainJob's `trainer` overrides the runtime's `node` container (image,
command, args; env and resources merged by name) and `mlPolicy.numNodes`; `spec.initializer.dataset` / `.model` set
STORAGE_URI, env and a secret's envFrom in the runtime's `dataset-initializer` / `model-initializer`
containers; `podTemplateOverrides` (Trainer v2.1) and then `runtimePatches` (v2.2+, in list order)
patch the templates of the replicated jobs they name. Works on the raw JSON of objects already
validated by the API (gangctl.api.trainjob), so only what needs the runtime is checked here.

How a runtime patch merges (Trainer merges with Kubernetes' strategic merge patch; the same outcome):
labels, annotations and nodeSelector merge by key; affinity and securityContext merge field by field
(a list inside them is replaced); tolerations are replaced as a whole; volumes, imagePullSecrets and
schedulingGates merge by name, containers' env by name and volumeMounts by mountPath, an entry of the
patch replacing the runtime's entry of the same key; serviceAccountName and
terminationGracePeriodSeconds are set. A later patch wins over an earlier one.
"""
from __future__ import annotations

import copy
import math
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

from gangctl.api.quantity import parse_quantity
from gangctl.api.runtime import GANG_BACKENDS, PODGROUP_ONE_BACKEND_MESSAGE
from gangctl.model import jobset, name_budget, progress
from gangctl.model.topology import PlacementIntent, TopologyError, template_intent

NODE_JOB = "node"  # the replicated job whose pods run torchrun (the SDK looks for this name)
NODE_CONTAINER = "node"
GPU_RESOURCE = "nvidia.com/gpu"
INITIALIZERS = {"dataset": "dataset-initializer", "model": "model-initializer"}
"""spec.initializer.<key> -> the runtime's replicated job (and container) it configures."""
INITIALIZER_VOLUME = "initializer"  # the volume an initializer container must mount (Trainer's rule)
STORAGE_URI_ENV = "STORAGE_URI"
OTHER_FRAMEWORKS = ("mpi", "jax", "xgboost", "flux")  # mlPolicy sources of Trainer that gangctl does not run


class ResolveError(ValueError):
    """The TrainJob and its runtime cannot be combined; the message names the field, `reason` says
    whose fault it is (the runtime's, or the TrainJob's own: InvalidSpec)."""

    def __init__(self, message: str, reason: str = "InvalidRuntime"):
        super().__init__(message)
        self.reason = reason


@dataclass(frozen=True)
class ResolvedStep:
    """A replicated job of the runtime other than `node` (dataset-initializer, model-initializer, ...),
    with the TrainJob's initializer settings and patches merged in."""
    name: str
    replicas: int
    depends_on: tuple[dict, ...]       # JobSet dependsOn of the runtime's replicated job ({name, status})
    job_metadata: dict[str, Any]       # labels and annotations for its Job
    job_spec: dict[str, Any]           # its batch/v1 spec fields other than the template
    pod_template: dict[str, Any]


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
    gang_backend: str | None          # one of api.runtime.GANG_BACKENDS, or None
    gang_settings: dict[str, Any]
    pod_template: dict[str, Any]      # the node job's pod template with the trainer merged in
    job_spec: dict[str, Any]          # the node job's batch/v1 spec fields other than the template
    requests: dict[str, Fraction] = field(default_factory=dict)  # one node pod's requests
    failure_policy: dict | None = None  # JobSet spec.failurePolicy of the runtime template
    success_policy: dict | None = None  # JobSet spec.successPolicy of the runtime template
    elastic: dict | None = None         # mlPolicy.torch.elasticPolicy, with spec.trainer.elasticPolicy over it
    job_metadata: dict = field(default_factory=dict)  # labels/annotations for the node Job: the runtime's
    # template.metadata, then its node job's template.metadata, then runtimePatches' (same order)
    steps: tuple[ResolvedStep, ...] = ()  # the runtime's other replicated jobs, in its order
    depends_on: tuple[dict, ...] = ()   # the node job's JobSet dependsOn ({name, status}): when it starts
    initializer: dict | None = None     # spec.initializer as given ({dataset: {...}, model: {...}})
    active_deadline_seconds: int | None = None  # spec.activeDeadlineSeconds
    group_name: str | None = None       # the gang group's name when not the job's (see gang_name)
    env_containers: tuple[str, ...] = ()  # mlPolicy.torch.envInjection: the node job's other containers
    #                                       that also get the PET_* variables
    claims: tuple[jobset.Claim, ...] = ()  # volumeClaimPolicies' claims some replicated job mounts
    coordinator: str | None = None      # JobSet coordinator's address (label/annotation on children)
    publish_not_ready: bool = True      # network.publishNotReadyAddresses of the headless Service
    stall_timeout_seconds: int | None = None  # the runtime's gangctl.io/stall-timeout (None: never judged stalled)
    restart_in_place: bool = False      # a rigid job's gang restarts in its pods (gangctl.io/restart: InPlace, or
    #                                       unset where the nodes can: `gangctl.policy.restart_mode`)
    restart_mode: str | None = None     # the runtime's gangctl.io/restart as written (None: unset)
    placement: PlacementIntent | None = None  # the topology placement the job asks for, levels as written
    #                                           (`placement.on(topology)` checks them against the cluster's)

    @property
    def gang_name(self) -> str:
        """The name of the gang's group (PodGroup) and what its pods point at: the TrainJob's name;
        another kind sets `group_name` so a TrainJob of the same name keeps its own."""
        return self.group_name or self.name

    @property
    def max_nodes(self) -> int:
        """The most nodes the job may run on (num_nodes; for an elastic job, maxNodes)."""
        return self.num_nodes


def _apply_trainer(container: dict, trainer: dict) -> None:
    """spec.trainer's image, command, args, env and resourcesPerNode onto the node container."""
    for key in ("image", "command", "args"):
        if trainer.get(key) is not None:
            container[key] = list(trainer[key]) if isinstance(trainer[key], list) else trainer[key]
    if trainer.get("env"):
        container["env"] = _merge_by(container.get("env") or [], trainer["env"], "name")
    if trainer.get("resourcesPerNode"):
        # Trainer v2.3 merges: each resource named in requests / limits replaces the runtime's, the rest stay.
        container["resources"] = _merge_fields(container.get("resources") or {}, trainer["resourcesPerNode"])


def _apply_overrides(overrides: list[dict], jobs: dict, runtime_name: str) -> None:
    """spec.podTemplateOverrides onto the pod templates of the replicated jobs they target."""
    job_names = list(jobs)
    for i, override in enumerate(overrides):
        targets = {t.get("name") for t in override.get("targetJobs") or []}
        for j, target in enumerate(override.get("targetJobs") or []):
            if target.get("name") not in job_names:
                raise _no_job(f"spec.podTemplateOverrides[{i}].targetJobs[{j}].name", runtime_name,
                              target.get("name"), job_names)
        for name in targets:
            _apply_override(jobs[name].pod_template, override)


def _job_metadata(spec: dict, template: dict, jobs: dict, runtime_name: str) -> dict:
    """The child Jobs' labels and annotations: the runtime template's, runtimePatches applied (which
    patch the pod templates too), the node job's, then the TrainJob's own."""
    job_metadata = _merge_metadata({}, template.get("metadata"))
    _apply_runtime_patches(spec.get("runtimePatches") or [], jobs, job_metadata, runtime_name)
    job_metadata = _merge_metadata(job_metadata, jobs[NODE_JOB].job_metadata)
    # spec.labels / spec.annotations (Trainer v2.0: "to apply for the derivative JobSet and Jobs") last.
    return _merge_metadata(job_metadata, {"labels": spec.get("labels"), "annotations": spec.get("annotations")})


def _node_range(trainer: dict, ml: dict, torch: dict) -> tuple[int, Any, dict]:
    """(numNodes, or maxNodes when elastic; minNodes; the elasticPolicy, the TrainJob's over the runtime's)."""
    num_nodes = int(trainer.get("numNodes") or ml.get("numNodes") or 1)
    elastic = {**(torch.get("elasticPolicy") or {}), **(trainer.get("elasticPolicy") or {})}
    min_nodes = elastic.get("minNodes")
    if elastic:
        num_nodes = int(elastic.get("maxNodes") or num_nodes)
        if min_nodes is not None and int(min_nodes) > num_nodes:
            raise ResolveError(f"elasticPolicy: minNodes ({min_nodes}) must be less than or equal to "
                               f"maxNodes ({num_nodes}) (spec.trainer.elasticPolicy over the runtime's "
                               "mlPolicy.torch.elasticPolicy)", reason="InvalidSpec")
    return num_nodes, min_nodes, elastic


def resolve(trainjob: dict, runtime: dict) -> ResolvedJob:
    spec = trainjob.get("spec") or {}
    meta = trainjob["metadata"]
    rspec = runtime.get("spec") or {}
    ml = rspec.get("mlPolicy") or {}
    torch = ml.get("torch") or {}
    trainer = spec.get("trainer") or {}
    runtime_name = (spec.get("runtimeRef") or {}).get("name", "")

    others = [key for key in OTHER_FRAMEWORKS if ml.get(key) is not None]
    if others:
        raise ResolveError(f"runtime spec.mlPolicy.{others[0]}: gangctl runs PyTorch (mlPolicy.torch) only; "
                           f"use Kubeflow Trainer for {others[0]} runtimes")
    template = rspec.get("template") or {}
    js = template.get("spec") or {}
    _node_job(rspec)
    jobs = {job.get("name"): _JobParts.of(job, i) for i, job in enumerate(js.get("replicatedJobs") or [])}
    node = jobs[NODE_JOB]
    pod_template, pod_spec = node.pod_template, node.pod_template["spec"]
    container = _node_container(pod_spec)

    _apply_trainer(container, trainer)
    _apply_initializers(spec.get("initializer") or {}, jobs, runtime_name)
    _apply_overrides(spec.get("podTemplateOverrides") or [], jobs, runtime_name)
    job_metadata = _job_metadata(spec, template, jobs, runtime_name)
    claims = _jobset_fields(js, jobs, meta["name"])

    num_nodes, min_nodes, elastic = _node_range(trainer, ml, torch)
    try:
        requests = pod_requests(pod_spec)
    except ValueError as err:
        raise ResolveError(f"{node.where}.spec.template.spec.containers[].resources (with spec.trainer.resourcesPerNode "
                           f"over the node container's): {err}") from None
    nproc = trainer.get("numProcPerNode", torch.get("numProcPerNode", "auto"))
    backend, settings = _gang_policy(rspec.get("podGroupPolicy"))
    placement = _placement(pod_template, settings.get("networkTopology") if backend == "volcano" else None,
                           own=bool(spec.get("podTemplateOverrides") or spec.get("runtimePatches")))
    resolved = ResolvedJob(
        name=meta["name"], namespace=meta["namespace"], uid=meta.get("uid", ""),
        runtime_kind=(spec.get("runtimeRef") or {}).get("kind", "ClusterTrainingRuntime"),
        runtime_name=runtime_name,
        num_nodes=num_nodes, min_nodes=min_nodes,
        num_proc_per_node=procs_per_node(nproc, container),
        suspend=bool(spec.get("suspend")),
        gang_backend=backend, gang_settings=settings,
        pod_template=pod_template, job_spec=node.job_spec, requests=requests,
        failure_policy=js.get("failurePolicy"), success_policy=js.get("successPolicy"),
        elastic=elastic or None,
        job_metadata=job_metadata,
        steps=tuple(part.step() for name, part in jobs.items() if name != NODE_JOB),
        depends_on=node.depends_on,
        initializer=copy.deepcopy(spec["initializer"]) if spec.get("initializer") else None,
        active_deadline_seconds=spec.get("activeDeadlineSeconds"),
        env_containers=tuple(name for target in (torch.get("envInjection") or {}).get("targets") or []
                             if target.get("jobName") == NODE_JOB for name in target.get("containerNames") or []),
        claims=claims, coordinator=jobset.coordinator(js, meta["name"]),
        publish_not_ready=(js.get("network") or {}).get("publishNotReadyAddresses") is not False,
        placement=placement, stall_timeout_seconds=_stall_timeout(runtime), restart_mode=_restart_mode(runtime),
        restart_in_place=_restart_mode(runtime) == "InPlace",
    )
    if (message := name_budget.too_long(resolved)) is not None:
        raise ResolveError(message, reason=name_budget.NAME_TOO_LONG)
    return resolved


def _jobset_fields(js: dict, jobs: dict[str, _JobParts], trainjob: str) -> tuple[jobset.Claim, ...]:
    """The runtime's JobSet fields checked, and its volumeClaimPolicies mounted where JobSet would."""
    try:
        jobset.check(js, trainjob)
        all_claims = jobset.claims(js)
        used = {c.name: c for part in jobs.values()
                for c in jobset.mount_claims(part.pod_template, all_claims, trainjob, part.where)}
    except jobset.Unsupported as err:
        raise ResolveError(str(err)) from None
    return tuple(used.values())


@dataclass
class _JobParts:
    """One replicated job of the runtime, copied apart so the TrainJob's settings can be merged in."""
    name: str
    where: str
    replicas: int
    depends_on: tuple[dict, ...]
    job_metadata: dict
    job_spec: dict
    pod_template: dict

    @classmethod
    def of(cls, job: dict, index: int) -> _JobParts:
        where = f"runtime spec.template.spec.replicatedJobs[{index}].template"
        job_template = _object(copy.deepcopy(job.get("template") or {}), where)
        job_meta = _object(job_template.get("metadata") or {}, f"{where}.metadata")
        job_spec = dict(_object(job_template.get("spec") or {}, f"{where}.spec"))
        pod_template = _object(job_spec.pop("template", None) or {}, f"{where}.spec.template")
        _object(pod_template.setdefault("spec", {}), f"{where}.spec.template.spec")
        _check_pod_template(pod_template, f"{where}.spec.template")
        return cls(name=job.get("name", ""), where=where, replicas=int(job.get("replicas", 1)),
                   depends_on=tuple(job.get("dependsOn") or ()), job_metadata=_merge_metadata({}, job_meta),
                   job_spec=job_spec, pod_template=pod_template)

    def names(self, key: str) -> list[str]:
        """Names of its pod template's containers or initContainers."""
        return [c.get("name") for c in self.pod_template["spec"].get(key) or []]

    def step(self) -> ResolvedStep:
        return ResolvedStep(self.name, self.replicas, self.depends_on, self.job_metadata, self.job_spec,
                            self.pod_template)


def _no_job(where: str, runtime_name: str, name: Any, names: list[str]) -> ResolveError:
    return ResolveError(f"{where}: the runtime {runtime_name!r} has no replicated job {name!r} "
                        f"(it has: {', '.join(map(str, names))})", reason="InvalidSpec")


def _merge_metadata(base: dict, extra: dict | None) -> dict:
    """labels and annotations of `extra` over `base`'s (other metadata is not patchable)."""
    out = {key: dict(base.get(key) or {}) for key in ("labels", "annotations") if base.get(key)}
    for key in ("labels", "annotations"):
        if (extra or {}).get(key):
            out[key] = {**out.get(key, {}), **extra[key]}
    return out


def _apply_initializers(initializer: dict, jobs: dict[str, _JobParts], runtime_name: str) -> None:
    """spec.initializer.dataset / .model into the runtime's initializer job, as Trainer does: the job,
    its container (both named dataset-initializer / model-initializer) and its mount of the
    `initializer` volume must exist."""
    for key, job_name in INITIALIZERS.items():
        settings = initializer.get(key)
        if settings is None:
            continue
        where = f"spec.initializer.{key}"
        part = jobs.get(job_name)
        if part is None:
            raise ResolveError(f"{where}: the runtime {runtime_name!r} has no {job_name!r} replicated job to run it "
                               f"(it has: {', '.join(map(str, jobs))})", reason="InvalidSpec")
        container = next((c for c in part.pod_template["spec"].get("containers") or []
                          if c.get("name") == job_name), None)
        if container is None or not any(isinstance(m, dict) and m.get("name") == INITIALIZER_VOLUME
                                         for m in container.get("volumeMounts") or []):
            raise ResolveError(f"{where}: the runtime {runtime_name!r} job {job_name!r} needs a container named "
                               f"{job_name!r} mounting the volume {INITIALIZER_VOLUME!r}", reason="InvalidSpec")
        extra = list(settings.get("env") or [])
        if settings.get("storageUri") is not None:
            extra.insert(0, {"name": STORAGE_URI_ENV, "value": settings["storageUri"]})
        if extra:
            container["env"] = _merge_by(container.get("env") or [], extra, "name")
        if (settings.get("secretRef") or {}).get("name"):
            container["envFrom"] = list(container.get("envFrom") or []) + [
                {"secretRef": {"name": settings["secretRef"]["name"]}}]


def _apply_runtime_patches(patches: list[dict], jobs: dict[str, _JobParts], job_metadata: dict,
                           runtime_name: str) -> None:
    """spec.runtimePatches in list order: the workload's metadata into `job_metadata`, each replicated
    job patch into the job it names (which must exist, as must the containers it names)."""
    for i, patch in enumerate(patches):
        at = f"spec.runtimePatches[{i}].trainingRuntimeSpec.template"
        template = (patch.get("trainingRuntimeSpec") or {}).get("template") or {}
        job_metadata.update(_merge_metadata(job_metadata, template.get("metadata")))
        for j, job_patch in enumerate((template.get("spec") or {}).get("replicatedJobs") or []):
            where = f"{at}.spec.replicatedJobs[{j}]"
            part = jobs.get(job_patch.get("name"))
            if part is None:
                raise _no_job(f"{where}.name", runtime_name, job_patch.get("name"), list(jobs))
            job_template = job_patch.get("template") or {}
            part.job_metadata = _merge_metadata(part.job_metadata, job_template.get("metadata"))
            pod_patch = (job_template.get("spec") or {}).get("template") or {}
            meta = pod_patch.get("metadata") or {}
            if meta.get("labels") or meta.get("annotations"):
                pod_meta = part.pod_template.setdefault("metadata", {})
                pod_meta.update(_merge_metadata(pod_meta, meta))
            _patch_pod_spec(part, pod_patch.get("spec") or {}, f"{where}.template.spec.template.spec")


def _patch_pod_spec(part: _JobParts, patch: dict, where: str) -> None:
    pod_spec = part.pod_template["spec"]
    for key in ("initContainers", "containers"):
        known = part.names(key)
        for k, container_patch in enumerate(patch.get(key) or []):
            if container_patch.get("name") not in known:
                raise ResolveError(f"{where}.{key}[{k}].name: the runtime's {part.name!r} job has no "
                                   f"{'init container' if key == 'initContainers' else 'container'} "
                                   f"{container_patch.get('name')!r} (it has: {', '.join(map(str, known)) or 'none'})",
                                   reason="InvalidSpec")
            container = next(c for c in pod_spec[key] if c.get("name") == container_patch["name"])
            for field_name, merge_key in (("env", "name"), ("volumeMounts", "mountPath")):
                if container_patch.get(field_name):
                    container[field_name] = _merge_by(container.get(field_name) or [], container_patch[field_name],
                                                      merge_key)
            if container_patch.get("securityContext") is not None:
                container["securityContext"] = _merge_fields(container.get("securityContext") or {},
                                                             container_patch["securityContext"])
    for key in ("serviceAccountName", "terminationGracePeriodSeconds"):
        if patch.get(key) is not None:
            pod_spec[key] = patch[key]
    if patch.get("nodeSelector"):
        pod_spec["nodeSelector"] = {**(pod_spec.get("nodeSelector") or {}), **patch["nodeSelector"]}
    for key in ("affinity", "securityContext"):
        if patch.get(key) is not None:
            pod_spec[key] = _merge_fields(pod_spec.get(key) or {}, patch[key])
    if patch.get("tolerations"):
        pod_spec["tolerations"] = copy.deepcopy(patch["tolerations"])
    for key in ("volumes", "imagePullSecrets", "schedulingGates"):
        if patch.get(key):
            pod_spec[key] = _merge_by(pod_spec.get(key) or [], patch[key], "name")
    volumes = {v.get("name") for v in pod_spec.get("volumes") or []}
    for key in ("initContainers", "containers"):
        for k, container_patch in enumerate(patch.get(key) or []):
            for m, mount in enumerate(container_patch.get("volumeMounts") or []):
                if mount.get("name") not in volumes:
                    raise ResolveError(f"{where}.{key}[{k}].volumeMounts[{m}].name: the {part.name!r} pods have no "
                                       f"volume {mount.get('name')!r} (volumes: {', '.join(sorted(map(str, volumes))) or 'none'}); "
                                       "add it to the patch's volumes", reason="InvalidSpec")


def _merge_fields(base: dict, patch: dict) -> dict:
    """Field by field, recursively into objects; a list or a scalar of the patch replaces, null removes."""
    out = copy.deepcopy(base) if isinstance(base, dict) else {}
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        elif isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _merge_fields(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


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


def _merge_by(base: list[dict], extra: list[dict], key: str) -> list[dict]:
    """`extra`'s entries over `base`'s with the same `key` (in place), the new ones appended."""
    merged = {e.get(key): e for e in base}
    merged.update({e.get(key): copy.deepcopy(e) for e in extra})
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


RESTART_ANNOTATION = "gangctl.io/restart"
RESTART_MODES = ("InPlace", "Recreate")


def _restart_mode(runtime: dict) -> str | None:
    """The runtime's restart mode (gangctl extension): InPlace, Recreate, or None when it leaves the
    choice to gangctl (in place where the nodes can, `gangctl.policy.restart_mode`)."""
    mode = ((runtime.get("metadata") or {}).get("annotations") or {}).get(RESTART_ANNOTATION)
    if mode is not None and mode not in RESTART_MODES:
        raise ResolveError(f"runtime metadata.annotations[{RESTART_ANNOTATION}]: {mode!r} is not one of "
                           f"{', '.join(RESTART_MODES)} (or leave it unset: in place where the nodes can)")
    return mode


def _stall_timeout(runtime: dict) -> int | None:
    try:
        return progress.stall_timeout((runtime.get("metadata") or {}).get("annotations"))
    except ValueError as err:
        raise ResolveError(f"runtime {err}") from None


def _placement(pod_template: dict, network_topology: dict | None, *, own: bool) -> PlacementIntent | None:
    """The node job's placement intent (its pod template with podTemplateOverrides and runtimePatches
    applied, and the runtime's Volcano networkTopology). `own`: the TrainJob patches the template, so
    a bad intent may be its own fault (InvalidSpec) rather than the runtime's."""
    try:
        return template_intent(pod_template, network_topology)
    except TopologyError as err:
        raise ResolveError(f"replicatedJob {NODE_JOB} pod template: {err}",
                           reason="InvalidSpec" if own else "InvalidRuntime") from None


def _gang_policy(policy: dict | None) -> tuple[str | None, dict]:
    if not policy:
        return None, {}
    named = [k for k in GANG_BACKENDS if policy.get(k) is not None]
    if len(named) > 1:
        raise ResolveError(f"spec.{PODGROUP_ONE_BACKEND_MESSAGE} (got {', '.join(named)})")
    if not named:
        return None, {}
    return named[0], dict(policy[named[0]] or {})
