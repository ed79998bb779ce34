"""TrainJob (trainer.kubeflow.org/v1alpha1), with the Kubeflow Trainer v2 field names.

Status carries the upstream fields (conditions, jobsStatus, trainerStatus) plus gangctl extensions
(restartCount, gang). Dump with `to_dict()` (by_alias, exclude_none).
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import ConfigDict, Field, ValidationError, field_validator, model_validator

from gangctl.api.runtime import (
    API_VERSION,
    CLUSTER_TRAINING_RUNTIME_KIND,
    DNS_LABEL_MAX,
    GROUP,
    MAX_NODES,
    TRAINING_RUNTIME_KIND,
    ElasticPolicy,
    EnvVar,
    FreeForm,
    K8sModel,
    NumProcPerNode,
    ObjectMeta,
    OpenModel,
    Quantity,
    ResourceRequirements,
    TemplateMetadata,
    validation_message,
)

TRAINJOB_KIND = "TrainJob"
TRAINJOB_PLURAL = "trainjobs"

MAX_NAME_LENGTH = DNS_LABEL_MAX - len("-node-0-") - len(str(MAX_NODES - 1))
"""50: 63 (a hostname label) minus len("-node-0-") minus the digits of the largest pod index (numNodes
goes to MAX_NODES): pods' hostnames are "<trainjob>-node-0-<index>". Children that depend on the
runtime (its other replicated jobs) are checked against it before they are made
(gangctl.model.name_budget)."""
DNS1035_LABEL = r"^[a-z]([-a-z0-9]*[a-z0-9])?$"
NAME_MESSAGE = (
    f"metadata.name must be a DNS-1035 label (lowercase letters, digits and '-', starting with a letter, "
    f"ending with a letter or digit) of at most {MAX_NAME_LENGTH} characters: gangctl names the child Job "
    f"'<trainjob>-node-0' and its pods '<trainjob>-node-0-<index>' (index up to {len(str(MAX_NODES - 1))} digits), "
    "which must stay within 63 characters"
)
NAME_RULE = {
    "rule": f"self.metadata.name.size() <= {MAX_NAME_LENGTH} && self.metadata.name.matches('{DNS1035_LABEL}')",
    "message": NAME_MESSAGE,
}
MANAGED_BY_MESSAGE = "spec.managedBy is immutable"
PATCHES_FROZEN_MESSAGE = ("spec.runtimePatches can change only while the TrainJob is suspended (before or after "
                          "the update): the pods already made from them would not change")

# Kubernetes label keys (an optional DNS-subdomain prefix, then a name of at most 63 characters) and
# values (at most 63): spec.labels and spec.annotations are checked here, since nothing else would.
QUALIFIED_NAME = (r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?([.][a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
                  r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$")
LABEL_VALUE = r"^(([A-Za-z0-9][-A-Za-z0-9_.]{0,61})?[A-Za-z0-9])?$"
MAX_METADATA_ENTRIES = 128
KEY_MESSAGE = ("keys must be qualified names: an optional DNS subdomain prefix and '/', then at most 63 "
               "characters of letters, digits, '-', '_', '.', starting and ending with a letter or digit")
VALUE_MESSAGE = ("values must be at most 63 characters of letters, digits, '-', '_', '.', starting and ending "
                 "with a letter or digit")


def _metadata_map(values: bool) -> Any:
    rules = [{"rule": f"self.all(k, k.size() <= 317 && k.matches('{QUALIFIED_NAME}'))", "message": KEY_MESSAGE}]
    if values:
        rules.append({"rule": f"self.all(k, self[k].matches('{LABEL_VALUE}'))", "message": VALUE_MESSAGE})
    return Field(None, json_schema_extra={"maxProperties": MAX_METADATA_ENTRIES, "x-kubernetes-validations": rules})


def _check_metadata_map(value: dict[str, str] | None, values: bool) -> dict[str, str] | None:
    for key, val in (value or {}).items():
        if len(key) > 317 or not re.fullmatch(QUALIFIED_NAME, key):
            raise ValueError(f"{KEY_MESSAGE}, got {key!r}")
        if values and not re.fullmatch(LABEL_VALUE, val):
            raise ValueError(f"{VALUE_MESSAGE}, got {val!r} for {key!r}")
    if len(value or {}) > MAX_METADATA_ENTRIES:
        raise ValueError(f"at most {MAX_METADATA_ENTRIES} entries")
    return value


class ConditionType:
    """status.conditions[].type values: Kubeflow Trainer v2.3's, with Trainer's meaning."""

    SUSPENDED = "Suspended"
    COMPLETE = "Complete"
    FAILED = "Failed"
    FINISHED = (COMPLETE, FAILED)


GangState = Literal["Pending", "Waiting", "Running", "Suspended", "Restarting", "Complete", "Failed"]


class RuntimeRef(K8sModel):
    """The runtime a TrainJob is built from."""

    name: str = Field(min_length=1)
    api_group: Literal["trainer.kubeflow.org"] = GROUP
    kind: Literal["TrainingRuntime", "ClusterTrainingRuntime"] = CLUSTER_TRAINING_RUNTIME_KIND

    @property
    def namespaced(self) -> bool:
        """True for a TrainingRuntime (looked up in the TrainJob's namespace)."""
        return self.kind == TRAINING_RUNTIME_KIND


STORAGE_URI_MESSAGE = "storageUri must be empty or a URI (scheme://...)"
STORAGE_URI = r"^[A-Za-z][A-Za-z0-9+.-]*://.+$"
ENV_LIST = {"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["name"]}


class LocalObjectReference(OpenModel):
    """core/v1 LocalObjectReference."""

    name: str = Field(min_length=1, max_length=253)


class AssetInitializer(K8sModel):
    """initializer.dataset / initializer.model: where the asset comes from (Trainer v2 fields)."""

    storage_uri: str | None = Field(None, max_length=2048, json_schema_extra={"x-kubernetes-validations": [
        {"rule": f"self == '' || self.matches('{STORAGE_URI}')", "message": STORAGE_URI_MESSAGE}]})
    env: list[EnvVar] | None = Field(None, max_length=128, json_schema_extra=ENV_LIST)
    secret_ref: LocalObjectReference | None = None

    @field_validator("storage_uri")
    @classmethod
    def _uri(cls, value: str | None) -> str | None:
        if value and not re.fullmatch(STORAGE_URI, value):
            raise ValueError(f"{STORAGE_URI_MESSAGE}, got {value!r}")
        return value


class Initializer(K8sModel):
    """Dataset and model initializers: the runtime's dataset-initializer / model-initializer jobs."""

    dataset: AssetInitializer | None = None
    model: AssetInitializer | None = None


class Trainer(K8sModel):
    """Per-job overrides of the runtime's trainer ("node") container."""

    image: str | None = Field(None, min_length=1)
    command: list[str] | None = None
    args: list[str] | None = None
    env: list[EnvVar] | None = Field(
        None, json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["name"]}
    )
    num_nodes: int | None = Field(None, ge=1, le=MAX_NODES)
    resources_per_node: ResourceRequirements | None = None
    num_proc_per_node: NumProcPerNode | None = None
    elastic_policy: ElasticPolicy | None = Field(
        None, description="gangctl extension: overrides the runtime's mlPolicy.torch.elasticPolicy for this job")


class PodTemplateOverrideTargetJob(K8sModel):
    """A replicated job of the runtime an override applies to."""

    name: str = Field(min_length=1, max_length=DNS_LABEL_MAX)


class PodTemplateOverrideSpec(OpenModel):
    """The pod spec fields an override sets or extends (Kubeflow Trainer's PodTemplateOverrideSpec)."""

    service_account_name: str | None = Field(None, min_length=1)
    node_selector: dict[str, str] | None = None
    affinity: FreeForm | None = None
    tolerations: list[FreeForm] | None = None
    volumes: list[FreeForm] | None = None
    init_containers: list[FreeForm] | None = None
    containers: list[FreeForm] | None = None
    scheduling_gates: list[FreeForm] | None = None
    image_pull_secrets: list[FreeForm] | None = None
    priority_class_name: str | None = Field(None, min_length=1)
    security_context: FreeForm | None = None


class PodTemplateOverride(OpenModel):
    """podTemplateOverrides[]: labels, annotations and pod spec fields for the pods of the target jobs."""

    target_jobs: list[PodTemplateOverrideTargetJob] = Field(min_length=1)
    metadata: TemplateMetadata | None = None
    spec: PodTemplateOverrideSpec | None = None


# --- runtimePatches (Trainer v2.2+) ------------------------------------------------------------

MANAGER_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?([.][a-z0-9]([-a-z0-9]*[a-z0-9])?)*/[-A-Za-z0-9/._~%!$&'()*+,;=:]+$"
MANAGER_MESSAGE = ("spec.runtimePatches[].manager must be a domain-prefixed path such as "
                   "'example.com/my-controller' (the SDK writes 'trainer.kubeflow.org/kubeflow-sdk', "
                   "Kueue 'kueue.x-k8s.io/manager')")
RESERVED_ENV_CONTAINERS = ("node", "dataset-initializer", "model-initializer")
PATCH_ENV_MESSAGE = ("runtimePatches: containers named node, dataset-initializer or model-initializer take env "
                     "from spec.trainer.env and spec.initializer, not from a patch")
PatchName = Annotated[str, Field(min_length=1, max_length=253)]


def _map_list(key: str, max_items: int) -> Any:
    return Field(None, max_length=max_items,
                 json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": [key]})


class ContainerPatch(K8sModel):
    """A container (or init container) of the runtime's pod template, by name: env, mounts, securityContext."""

    model_config = ConfigDict(json_schema_extra={"x-kubernetes-validations": [{
        "rule": "!has(self.env) || !(self.name in ['node', 'dataset-initializer', 'model-initializer'])",
        "message": PATCH_ENV_MESSAGE}]})

    name: PatchName
    env: list[EnvVar] | None = _map_list("name", 128)
    volume_mounts: list[FreeForm] | None = Field(None, max_length=128)
    security_context: FreeForm | None = None

    @model_validator(mode="after")
    def _env_not_reserved(self) -> ContainerPatch:
        if self.env and self.name in RESERVED_ENV_CONTAINERS:
            raise ValueError(f"{PATCH_ENV_MESSAGE} (container {self.name!r})")
        return self


class Volume(OpenModel):
    """core/v1 Volume: a name and its source, kept as is."""

    name: str = Field(min_length=1, max_length=DNS_LABEL_MAX)


class PodSpecPatch(K8sModel):
    """The pod spec fields a runtime patch may set (Trainer v2.3's PodSpecPatch)."""

    service_account_name: str | None = Field(None, min_length=1, max_length=253)
    volumes: list[Volume] | None = _map_list("name", 128)
    init_containers: list[ContainerPatch] | None = _map_list("name", 64)
    containers: list[ContainerPatch] | None = _map_list("name", 64)
    image_pull_secrets: list[LocalObjectReference] | None = _map_list("name", 64)
    security_context: FreeForm | None = None
    node_selector: dict[str, str] | None = None
    affinity: FreeForm | None = None
    tolerations: list[FreeForm] | None = Field(None, max_length=128)
    scheduling_gates: list[LocalObjectReference] | None = _map_list("name", 16)
    termination_grace_period_seconds: int | None = Field(None, ge=0)


class PodTemplatePatch(K8sModel):
    """Labels, annotations and pod spec fields of a replicated job's pods."""

    metadata: TemplateMetadata | None = None
    spec: PodSpecPatch | None = None


class JobSpecPatch(K8sModel):
    """The Job spec part of a replicated job patch: its pod template only."""

    template: PodTemplatePatch | None = None


class JobTemplatePatch(K8sModel):
    """Labels and annotations of a replicated job's Job, and its pod template."""

    metadata: TemplateMetadata | None = None
    spec: JobSpecPatch | None = None


class ReplicatedJobPatch(K8sModel):
    """A patch of one replicated job of the runtime, by name."""

    name: PatchName
    template: JobTemplatePatch | None = None


class JobSetSpecPatch(K8sModel):
    """Per replicated job patches, keyed by name."""

    replicated_jobs: list[ReplicatedJobPatch] | None = _map_list("name", 100)


class JobSetTemplatePatch(K8sModel):
    """Labels and annotations of the whole workload, and per replicated job patches."""

    metadata: TemplateMetadata | None = None
    spec: JobSetSpecPatch | None = None


class TrainingRuntimeSpecPatch(K8sModel):
    """What a runtime patch may change in the runtime: its template."""

    template: JobSetTemplatePatch | None = None


class RuntimePatch(K8sModel):
    """spec.runtimePatches[]: one manager's patch of the runtime template, applied in list order."""

    manager: str = Field(min_length=1, max_length=253, json_schema_extra={"x-kubernetes-validations": [
        {"rule": f"self.matches(\"{MANAGER_PATTERN}\")", "message": MANAGER_MESSAGE},
        {"rule": "self == oldSelf", "message": "spec.runtimePatches[].manager is immutable"}]})
    time: str | None = Field(None, json_schema_extra={"format": "date-time"})
    training_runtime_spec: TrainingRuntimeSpecPatch | None = None

    @field_validator("manager")
    @classmethod
    def _manager(cls, value: str) -> str:
        if not re.fullmatch(MANAGER_PATTERN, value):
            raise ValueError(f"{MANAGER_MESSAGE}, got {value!r}")
        return value


def _unique_managers(patches: list[RuntimePatch] | None) -> list[RuntimePatch] | None:
    seen: dict[str, int] = {}
    for i, patch in enumerate(patches or []):
        if patch.manager in seen:
            raise ValueError(f"entries {seen[patch.manager]} and {i} have the same manager {patch.manager!r}: "
                             "one entry per manager")
        seen[patch.manager] = i
    return patches


IMMUTABLE = {"x-kubernetes-validations": [{"rule": "self == oldSelf", "message": "field is immutable"}]}


class TrainJobSpec(K8sModel):
    """What to train and with which runtime."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                {"rule": "has(oldSelf.managedBy) == has(self.managedBy)", "message": MANAGED_BY_MESSAGE},
                {"rule": "(has(self.suspend) && self.suspend) || (has(oldSelf.suspend) && oldSelf.suspend) || "
                         "(has(self.runtimePatches) ? has(oldSelf.runtimePatches) && "
                         "self.runtimePatches == oldSelf.runtimePatches : !has(oldSelf.runtimePatches))",
                 "message": PATCHES_FROZEN_MESSAGE},
            ]
        }
    )

    # Trainer v2.3's rule and message (its CEL on TrainJobSpec.runtimeRef and .initializer).
    runtime_ref: RuntimeRef = Field(json_schema_extra=IMMUTABLE)
    initializer: Initializer | None = Field(None, json_schema_extra=IMMUTABLE)
    trainer: Trainer | None = None
    labels: dict[str, Annotated[str, Field(max_length=63)]] | None = _metadata_map(values=True)
    annotations: dict[str, str] | None = _metadata_map(values=False)
    pod_template_overrides: list[PodTemplateOverride] | None = None
    runtime_patches: list[RuntimePatch] | None = _map_list("manager", 16)
    suspend: bool | None = None
    managed_by: str | None = Field(
        None,
        max_length=DNS_LABEL_MAX,
        json_schema_extra={"x-kubernetes-validations": [{"rule": "self == oldSelf", "message": MANAGED_BY_MESSAGE}]},
    )
    active_deadline_seconds: int | None = Field(None, ge=1, json_schema_extra={"x-kubernetes-validations": [
        {"rule": "self == oldSelf", "message": "spec.activeDeadlineSeconds is immutable"}]})

    @field_validator("runtime_patches")
    @classmethod
    def _runtime_patches(cls, value: list[RuntimePatch] | None) -> list[RuntimePatch] | None:
        return _unique_managers(value)

    @field_validator("labels")
    @classmethod
    def _labels(cls, value: dict[str, str] | None) -> dict[str, str] | None:
        return _check_metadata_map(value, values=True)

    @field_validator("annotations")
    @classmethod
    def _annotations(cls, value: dict[str, str] | None) -> dict[str, str] | None:
        return _check_metadata_map(value, values=False)


class Condition(K8sModel):
    """metav1.Condition."""

    type: str = Field(min_length=1)
    status: Literal["True", "False", "Unknown"]
    reason: str = Field(min_length=1)
    message: str = ""
    last_transition_time: str = Field(json_schema_extra={"format": "date-time"})
    observed_generation: int | None = Field(None, ge=0)


class JobStatus(K8sModel):
    """Counts for one child job (jobsStatus[])."""

    name: str
    ready: int = 0
    succeeded: int = 0
    failed: int = 0
    active: int = 0
    suspended: int = 0


class GangStatus(K8sModel):
    """gangctl extension: the TrainJob's state as gangctl sees it, and how its gang was scheduled.

    status.conditions holds only Trainer's types (a running job has none, as under Trainer): the
    finer state is here. Pending: no child Job yet (reason: RuntimeNotFound, BackendNotInstalled,
    Creating…); Waiting: the gang is not bound yet (reason: WaitingForGang, WaitingForQuota, the
    backend's); Running: every pod of the gang is bound; Suspended; Restarting: a failed attempt
    is replaced; Complete; Failed. A change the API keeps refusing shows in reason and message."""

    state: GangState | None = None
    reason: str | None = None
    message: str | None = None
    last_transition_time: str | None = Field(None, json_schema_extra={"format": "date-time"},
                                             description="when state last changed")
    resumed_at: str | None = Field(None, json_schema_extra={"format": "date-time"},
                                   description="the last resume from spec.suspend (activeDeadlineSeconds counts from it)")
    wait_seconds: float | None = Field(None, ge=0)
    bound_at: str | None = Field(None, json_schema_extra={"format": "date-time"})
    created_at: str | None = Field(None, json_schema_extra={"format": "date-time"})


class LastFailure(K8sModel):
    """The most recent failure of a child Job and what gangctl did about it."""

    kind: Literal["user", "infrastructure"]
    reason: str
    message: str = ""
    job: str | None = None
    job_uid: str | None = Field(None, alias="jobUID")
    pod: str | None = None
    exit_code: int | None = None
    action: Literal["Fail", "Restart", "RestartInPlace"] | None = None
    attempt_restarts: int | None = Field(None, ge=0, description="RestartInPlace: the in-place restarts of the Job "
                                                                 "(jobUID) charged so far")
    restart_attempt: int | None = Field(None, ge=1, description="RestartInPlace of a stall: the restart attempt the "
                                                                "pods' gangctl.io/restart-attempt is raised to")
    streak: int | None = Field(None, ge=1, description="Restart: attempts in a row that failed within 10 min of starting")
    backoff_seconds: int | None = Field(None, ge=0, description="Restart: the next attempt is made this long after "
                                                                "time (crash-loop pacing)")
    time: str | None = Field(None, json_schema_extra={"format": "date-time"})


class RestartsStatus(K8sModel):
    """gangctl extension: restarts by cause; counters only grow (sticky across controller restarts)."""

    user: int = Field(0, ge=0, description="charged to failurePolicy.maxRestarts")
    infrastructure: int = Field(0, ge=0, description="node loss, eviction, preemption: never charged")
    ignored: int = Field(0, ge=0, description="RestartJobSetAndIgnoreMaxRestarts: not charged")
    stalled: int = Field(0, ge=0, description="of the infrastructure restarts, those because progress reports stopped "
                                               "(gangctl.io/stall-timeout); at most failurePolicy.maxRestarts")
    last_failure: LastFailure | None = None


class ElasticStatus(K8sModel):
    """gangctl extension: the elastic job's current size and why it last changed."""

    current_nodes: int = Field(ge=0, description="healthy workers: torchrun's effective world size")
    size: int = Field(ge=0, description="the node Job's completions = parallelism")
    min_nodes: int = Field(ge=1)
    max_nodes: int = Field(ge=1)
    resizes: int = Field(0, ge=0)
    last_resize_reason: str | None = None
    last_resize_time: str | None = Field(None, json_schema_extra={"format": "date-time"})
    last_shrink_time: str | None = Field(None, json_schema_extra={"format": "date-time"})
    lost_accounted: int | None = Field(None, ge=0, description="lost pods already answered by a shrink")


class AdmissionStatus(K8sModel):
    """gangctl extension: the quota admission of a coscheduling TrainJob.

    Written only by gangctl's quota gate (field manager `gangctl-admission`); present = admitted.
    It records what was charged, so usage survives controller restarts and policy edits."""

    team: str = Field(min_length=1, description="the quota policy team charged")
    admitted_at: str = Field(json_schema_extra={"format": "date-time"})
    priority: int = Field(0, description="the priority value admission used (orders preemption victims)")
    requests: dict[str, Quantity] = Field(default_factory=dict, description="what is charged to the team: the gang "
                                          "floor, plus the nodes above it an elastic gang was admitted with")
    nodes: int | None = Field(None, ge=1, description="an elastic gang: the nodes it was admitted with, the most it runs")


class Metric(K8sModel):
    """trainerStatus.metrics[]: a named value, as a string."""

    name: str = Field(min_length=1, max_length=64)
    value: str = Field(min_length=1, max_length=64)


TRAINER_STATUS_TIME_MESSAGE = "status.trainerStatus.lastUpdatedTime is required when trainerStatus is present"


class TrainerStatus(K8sModel):
    """status.trainerStatus (Trainer v2.2+): training progress as the trainer reports it."""

    model_config = ConfigDict(json_schema_extra={"x-kubernetes-validations": [
        {"rule": "has(self.lastUpdatedTime)", "message": TRAINER_STATUS_TIME_MESSAGE}]})

    progress_percentage: int | None = Field(None, ge=0, le=100)
    estimated_remaining_seconds: int | None = Field(None, ge=0)
    metrics: list[Metric] | None = Field(None, max_length=256)
    last_updated_time: str = Field(json_schema_extra={"format": "date-time"})


class TrainJobStatus(K8sModel):
    """Observed state."""

    conditions: list[Condition] | None = Field(
        None, json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["type"]}
    )
    jobs_status: list[JobStatus] | None = Field(
        None, json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["name"]}
    )
    trainer_status: TrainerStatus | None = None
    restart_count: int | None = Field(None, ge=0, description="gangctl extension: restarts charged to the job")
    gang: GangStatus | None = Field(None, description="gangctl extension: state, reason, message and gang scheduling times")
    restarts: RestartsStatus | None = Field(None, description="gangctl extension: restarts by cause")
    elastic: ElasticStatus | None = Field(None, description="gangctl extension: elastic size")
    admission: AdmissionStatus | None = Field(
        None, description="gangctl extension: quota admission (coscheduling backend); absent = not admitted")

    def condition(self, type_: str) -> Condition | None:
        """The condition of this type."""
        return next((c for c in self.conditions or [] if c.type == type_), None)

    def is_true(self, type_: str) -> bool:
        """True when the condition of this type has status True."""
        cond = self.condition(type_)
        return cond is not None and cond.status == "True"

    @property
    def finished(self) -> bool:
        """Complete or Failed."""
        return any(self.is_true(t) for t in ConditionType.FINISHED)


class TrainJob(K8sModel):
    """A whole TrainJob object as the API server returns it."""

    api_version: str = API_VERSION
    kind: str = TRAINJOB_KIND
    metadata: ObjectMeta = Field(default_factory=ObjectMeta)
    spec: TrainJobSpec
    status: TrainJobStatus | None = None

    @model_validator(mode="after")
    def _name_fits_child_names(self) -> TrainJob:
        name = self.metadata.name
        # The API refuses new names over MAX_NAME_LENGTH (NAME_RULE). A stored TrainJob may be longer
        # (made before the limit was 50, or on CRDs without the rule): it runs when its children's names
        # fit at its own size, and fails NameTooLong naming the child otherwise (policy.name_budget),
        # so an upgrade never fails a running job whose names fit.
        if name is not None and (len(name) > DNS_LABEL_MAX or not re.fullmatch(DNS1035_LABEL, name)):
            raise ValueError(f"{NAME_MESSAGE} (got {name!r})")
        return self

    @property
    def num_nodes(self) -> int | None:
        """spec.trainer.numNodes (None: take the runtime's)."""
        return self.spec.trainer.num_nodes if self.spec.trainer else None


def parse_trainjob(obj: dict[str, Any]) -> TrainJob:
    """A TrainJob from a Kubernetes object dict; ValueError names the field path of each problem."""
    try:
        return TrainJob.model_validate(obj)
    except ValidationError as err:
        raise ValueError(validation_message(err)) from None

