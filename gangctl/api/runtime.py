"""TrainingRuntime and ClusterTrainingRuntime (trainer.kubeflow.org/v1alpha1), plus the building blocks
shared with TrainJob.

Conventions: camelCase JSON names; dump with `model_dump(by_alias=True, exclude_none=True)`.
`K8sModel` parts are closed (unknown fields ignored here, pruned by the API server); `OpenModel` parts
mirror other APIs (JobSet, Kubernetes core) and keep unknown fields (x-kubernetes-preserve-unknown-fields).
Validation rules for the API server (CEL) live next to the fields they check; gangctl.api.crds
turns these models into the CRDs.
"""

from __future__ import annotations

import re
from fractions import Fraction
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PlainValidator,
    ValidationError,
    WithJsonSchema,
    field_validator,
    model_validator,
)
from pydantic.alias_generators import to_camel

from gangctl.api.quantity import QUANTITY_PATTERN, ResourceList, parse_quantity

# The most nodes a gang may have: an Indexed Job's completions and parallelism stop at 100,000.
MAX_NODES = 100_000
MAX_INT32 = 2**31 - 1  # counters and seconds that land in int32 fields of the child objects
DNS_LABEL_MAX = 63  # a DNS label: replicated job and rule names, managedBy
DNS_SUBDOMAIN_MAX = 253  # a DNS subdomain: scheduler names
REPLICATED_JOB_NAME_MAX = 20  # Trainer v2.4's bound: child Jobs are `<trainjob>-<replicated job>-<index>`
MAX_REPLICATED_JOBS = 32  # bounds for the API server's CEL cost estimate of the cross-reference rules
MAX_RULES = 32
MAX_RESOURCES = 64  # resource names in one requests or limits map (bounds the CEL cost of their rules)

GROUP = "trainer.kubeflow.org"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"

TRAINING_RUNTIME_KIND = "TrainingRuntime"
CLUSTER_TRAINING_RUNTIME_KIND = "ClusterTrainingRuntime"
TRAINING_RUNTIME_PLURAL = "trainingruntimes"
CLUSTER_TRAINING_RUNTIME_PLURAL = "clustertrainingruntimes"

FRAMEWORK_LABEL = "trainer.kubeflow.org/framework"
"""The kubeflow SDK lists only runtimes carrying this label (value e.g. "torch")."""
ANCESTOR_LABEL = "trainer.kubeflow.org/trainjob-ancestor-step"
"""On a replicated job template: which TrainJob step it runs ("trainer", "dataset-initializer", ...)."""
NODE_JOB = "node"
"""The replicated job (and its container) that runs the trainer; the SDK requires this name."""

# The gang backends a runtime's podGroupPolicy may name (Trainer's coscheduling and volcano; gangctl's
# kueue, native and kai extensions).
GANG_BACKENDS = ("coscheduling", "volcano", "kueue", "native", "kai")
PODGROUP_ONE_BACKEND_MESSAGE = f"podGroupPolicy: set exactly one of {', '.join(GANG_BACKENDS)}"
ELASTIC_RANGE_MESSAGE = "elasticPolicy: minNodes must be less than or equal to maxNodes"
NUM_PROC_VALUES = ("auto", "cpu", "gpu")
NUM_PROC_MESSAGE = "numProcPerNode must be an integer >= 1 or one of auto, cpu, gpu"


class K8sModel(BaseModel):
    """A closed part of a CRD: camelCase names, unknown fields ignored."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="ignore")

    def to_dict(self) -> dict[str, Any]:
        """The Kubernetes JSON form."""
        return self.model_dump(mode="json", by_alias=True, exclude_none=True)


class OpenModel(K8sModel):
    """A part that mirrors another API: unknown fields are kept, here and in the API server."""

    model_config = ConfigDict(extra="allow")


def validation_message(err: ValidationError) -> str:
    """One line per problem, each naming the field path: "spec.trainer.numNodes: must be ≥ 1"."""
    lines = []
    for error in err.errors():
        path = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in error["loc"]).lstrip(".")
        text = _error_text(error)
        last = str(error["loc"][-1]) if error["loc"] else ""
        if last and text.startswith(f"{last}: "):
            text = text[len(last) + 2 :]  # the path already names it
        lines.append(f"{path}: {text}" if path else text)
    return "; ".join(lines)


def _error_text(error: Any) -> str:
    ctx = error.get("ctx") or {}
    kind = error["type"]
    if kind == "value_error":
        return str(ctx.get("error", error["msg"]))
    texts = {
        "missing": "required",
        "greater_than_equal": f"must be ≥ {ctx.get('ge')}",
        "less_than_equal": f"must be ≤ {ctx.get('le')}",
        "literal_error": f"must be one of {ctx.get('expected')}",
        "string_too_short": "must not be empty",
        "string_too_long": f"must be at most {ctx.get('max_length')} characters",
        "int_type": "must be an integer",
        "int_parsing": "must be an integer",
        "int_from_float": "must be an integer",
        "string_type": "must be a string",
        "bool_type": "must be a boolean",
        "bool_parsing": "must be a boolean",
        "float_type": "must be a number",
        "float_parsing": "must be a number",
        "dict_type": "must be an object",
        "model_type": "must be an object",
        "model_attributes_type": "must be an object",
        "list_type": "must be a list",
    }
    return texts.get(kind, error["msg"])


# --- shared value types -------------------------------------------------------------------------


def _check_quantity(value: Any) -> int | str:
    # The kubeflow SDK sends {"cpu": 2.0} for cpu=2; the API server stores it as the integer 2.
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise ValueError(f"must be an integer or a quantity string such as '500m' or '4Gi', got {value!r}")
    parse_quantity(value)
    return value


Quantity = Annotated[
    int | str,
    PlainValidator(_check_quantity),
    WithJsonSchema(
        {
            "anyOf": [{"type": "integer"}, {"type": "string"}],
            "pattern": QUANTITY_PATTERN,
            "x-kubernetes-int-or-string": True,
        }
    ),
]
"""A Kubernetes quantity as written ("500m", "4Gi" or an integer); parse with parse_quantity."""

RESOURCE_QUANTITY_PATTERN = QUANTITY_PATTERN.replace(r"^(\+|-)?", r"^\+?", 1)
"""A container's requests and limits: no sign (the Pod API refuses a negative one)."""


MAX_RESOURCE_QUANTITY = Fraction(2**63 - 1, 1000)
"""The most a container resource may be: the scheduler counts in int64 milli-units, and a larger quantity
(valid to the API, e.g. "1e400") could never be placed: gangctl fails such a TrainJob (InvalidSpec)."""


def _check_resource_quantity(value: Any) -> int | str:
    value = _check_quantity(value)
    amount = parse_quantity(value)
    if amount < 0:
        raise ValueError(f"must be greater than or equal to 0, got {value!r}")
    if amount > MAX_RESOURCE_QUANTITY:
        raise ValueError(f"must be at most {float(MAX_RESOURCE_QUANTITY):.4g} (the scheduler counts in int64 "
                         f"milli-units), got {value!r}")
    return value


ResourceQuantity = Annotated[
    int | str,
    PlainValidator(_check_resource_quantity),
    WithJsonSchema(
        {
            "anyOf": [{"type": "integer"}, {"type": "string"}],
            "pattern": RESOURCE_QUANTITY_PATTERN,
            "minimum": 0,  # applies to the integer form
            "x-kubernetes-int-or-string": True,
        }
    ),
]
"""A container resource quantity: a Quantity that is not negative."""


def _check_num_proc(value: Any) -> int | str:
    if isinstance(value, int) and not isinstance(value, bool) and value >= 1:
        return value
    if isinstance(value, str) and value in NUM_PROC_VALUES:
        return value
    raise ValueError(f"{NUM_PROC_MESSAGE}, got {value!r}")


NumProcPerNode = Annotated[
    int | str,
    PlainValidator(_check_num_proc),
    WithJsonSchema(
        {
            "anyOf": [{"type": "integer"}, {"type": "string"}],
            "x-kubernetes-int-or-string": True,
            "x-kubernetes-validations": [
                {
                    "rule": "type(self) == string ? self in ['auto', 'cpu', 'gpu'] : self >= 1",
                    "message": NUM_PROC_MESSAGE,
                }
            ],
        }
    ),
]
"""Processes per node for torchrun: an integer >= 1, or "auto" / "cpu" / "gpu"."""

FreeForm = dict[str, Any]
"""An object kept as is (x-kubernetes-preserve-unknown-fields)."""


class ObjectMeta(OpenModel):
    """metav1.ObjectMeta, the fields gangctl reads; the rest is kept."""

    name: str | None = None
    namespace: str | None = None
    labels: dict[str, str] | None = None
    annotations: dict[str, str] | None = None
    uid: str | None = None
    generation: int | None = None
    resource_version: str | None = None
    creation_timestamp: str | None = None
    deletion_timestamp: str | None = None


class TemplateMetadata(OpenModel):
    """Labels and annotations for generated objects."""

    labels: dict[str, str] | None = None
    annotations: dict[str, str] | None = None


class EnvVar(OpenModel):
    """core/v1 EnvVar (valueFrom kept as is)."""

    name: str = Field(min_length=1)
    value: str | None = None
    value_from: FreeForm | None = None


class ResourceRequirements(OpenModel):
    """core/v1 ResourceRequirements; limits and requests are validated quantities."""

    limits: dict[str, ResourceQuantity] | None = Field(None, max_length=MAX_RESOURCES)
    requests: dict[str, ResourceQuantity] | None = Field(None, max_length=MAX_RESOURCES)

    def effective_requests(self) -> ResourceList:
        """Requests, with a limit standing in for a missing request (as the API server defaults)."""
        merged: dict[str, int | str] = dict(self.limits or {})
        merged.update(self.requests or {})
        return ResourceList(merged)


# --- runtime spec -------------------------------------------------------------------------------


class ElasticPolicy(OpenModel):
    """gangctl extension (removed from upstream Trainer): run with minNodes..maxNodes nodes."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                {
                    "rule": "!has(self.minNodes) || !has(self.maxNodes) || self.minNodes <= self.maxNodes",
                    "message": ELASTIC_RANGE_MESSAGE,
                }
            ]
        }
    )

    min_nodes: int | None = Field(None, ge=1, le=MAX_NODES)
    max_nodes: int | None = Field(None, ge=1, le=MAX_NODES)
    max_restarts: int | None = Field(None, ge=0, le=MAX_INT32)

    @model_validator(mode="after")
    def _min_le_max(self) -> ElasticPolicy:
        if self.min_nodes is not None and self.max_nodes is not None and self.min_nodes > self.max_nodes:
            raise ValueError(ELASTIC_RANGE_MESSAGE)
        return self


ENV_INJECTION_NODE_MESSAGE = ("mlPolicy.torch.envInjection.targets[].containerNames must not include 'node': "
                              "the PET_* variables always go to the node container")
ML_POLICY_ONE_MESSAGE = "mlPolicy: set at most one of torch, mpi, jax, xgboost, flux"


class EnvInjectionTarget(K8sModel):
    """Which containers of one replicated job also get the PET_* variables (Trainer v2.3)."""

    job_name: str = Field(min_length=1, max_length=253)
    container_names: list[Annotated[str, Field(min_length=1, max_length=DNS_LABEL_MAX)]] = Field(
        min_length=1,
        max_length=8,
        json_schema_extra={"x-kubernetes-list-type": "set", "x-kubernetes-validations": [
            {"rule": "!self.exists(c, c == 'node')", "message": ENV_INJECTION_NODE_MESSAGE}]},
    )

    @model_validator(mode="after")
    def _not_node(self) -> EnvInjectionTarget:
        if NODE_JOB in self.container_names:
            raise ValueError(ENV_INJECTION_NODE_MESSAGE)
        return self


class EnvInjection(K8sModel):
    """mlPolicy.torch.envInjection (Trainer v2.3)."""

    targets: list[EnvInjectionTarget] | None = Field(None, max_length=16)


class TorchPolicy(OpenModel):
    """mlPolicy.torch: torchrun settings."""

    num_proc_per_node: NumProcPerNode | None = None
    elastic_policy: ElasticPolicy | None = None
    env_injection: EnvInjection | None = None


class MPIPolicy(OpenModel):
    """mlPolicy.mpi (Trainer's MPI runtime; gangctl runs torch only)."""

    num_proc_per_node: int | None = Field(None, ge=1, le=MAX_INT32)
    mpi_implementation: Literal["OpenMPI", ""] | None = None
    ssh_auth_mount_path: str | None = Field(None, max_length=4096)
    run_launcher_as_node: bool | None = None


class FluxPolicy(K8sModel):
    """mlPolicy.flux (Trainer's Flux runtime; gangctl runs torch only)."""

    num_proc_per_node: int | None = Field(None, ge=1, le=MAX_INT32)


class MLPolicy(OpenModel):
    """mlPolicy: node count and framework (at most one)."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                {
                    "rule": "[has(self.torch), has(self.mpi), has(self.jax), has(self.xgboost), has(self.flux)]"
                    ".filter(x, x).size() <= 1",
                    "message": ML_POLICY_ONE_MESSAGE,
                }
            ]
        }
    )

    num_nodes: int | None = Field(None, ge=1, le=MAX_NODES)
    torch: TorchPolicy | None = None
    mpi: MPIPolicy | None = None
    jax: FreeForm | None = None
    xgboost: FreeForm | None = None
    flux: FluxPolicy | None = None

    @model_validator(mode="after")
    def _one_framework(self) -> MLPolicy:
        if sum(x is not None for x in (self.torch, self.mpi, self.jax, self.xgboost, self.flux)) > 1:
            raise ValueError(ML_POLICY_ONE_MESSAGE)
        return self


class CoschedulingPolicy(K8sModel):
    """scheduler-plugins coscheduling PodGroup."""

    schedule_timeout_seconds: int | None = Field(None, ge=0, le=MAX_INT32)


class VolcanoPolicy(OpenModel):
    """Volcano PodGroup."""

    network_topology: FreeForm | None = None
    queue: str | None = None
    priority_class_name: str | None = Field(
        None, description="PriorityClass of the PodGroup (default: the pod template's priorityClassName)")


class KueuePolicy(K8sModel):
    """Kueue admission (gangctl extension): the LocalQueue to submit to, and the priority."""

    queue_name: str | None = Field(None, description="LocalQueue in the TrainJob's namespace (default: default)")
    priority_class_name: str | None = Field(
        None, description="Kueue WorkloadPriorityClass (the kueue.x-k8s.io/priority-class label of the child Job)")


class NativePolicy(K8sModel):
    """Kubernetes' own gang scheduling (gangctl extension): a scheduling.k8s.io/v1alpha2 PodGroup with a
    gang policy, for kube-scheduler 1.36+ with the GenericWorkload and GangScheduling feature gates."""

    scheduler_name: str | None = Field(
        None, min_length=1, max_length=DNS_SUBDOMAIN_MAX,
        description="the scheduler (profile) that runs the GangScheduling plugin (default: the controller's "
                    "--scheduler-name, default-scheduler)")


class KaiPolicy(K8sModel):
    """NVIDIA KAI Scheduler (gangctl extension): a scheduling.run.ai/v2alpha2 PodGroup in a KAI Queue."""

    queue: str | None = Field(
        None, min_length=1, max_length=DNS_SUBDOMAIN_MAX,
        description="the KAI Queue (a leaf queue; default: the team's queue under a quota policy, else default-queue)")
    priority_class_name: str | None = Field(
        None, description="PriorityClass of the PodGroup (default: the pod template's priorityClassName)")
    preemptibility: Literal["preemptible", "non-preemptible"] | None = Field(
        None, description="whether a higher-priority gang may preempt this one (default: preemptible; KAI runs a "
                          "non-preemptible gang only within its queue's quota)")


class PodGroupPolicy(K8sModel):
    """The gang-scheduling backend: exactly one of coscheduling, volcano, kueue, native, kai."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                {
                    "rule": f"[{', '.join(f'has(self.{name})' for name in GANG_BACKENDS)}].filter(x, x).size() == 1",
                    "message": PODGROUP_ONE_BACKEND_MESSAGE,
                }
            ]
        }
    )

    coscheduling: CoschedulingPolicy | None = None
    volcano: VolcanoPolicy | None = None
    kueue: KueuePolicy | None = None
    native: NativePolicy | None = None
    kai: KaiPolicy | None = None

    @model_validator(mode="after")
    def _exactly_one(self) -> PodGroupPolicy:
        if sum(getattr(self, name) is not None for name in GANG_BACKENDS) != 1:
            raise ValueError(PODGROUP_ONE_BACKEND_MESSAGE)
        return self

    @property
    def backend(self) -> str:
        """Which backend is set (one of GANG_BACKENDS)."""
        return next(name for name in GANG_BACKENDS if getattr(self, name) is not None)


class ReplicatedJob(OpenModel):
    """A JobSet replicatedJob; its batch/v1 JobTemplateSpec is kept as is."""

    name: str = Field(min_length=1, max_length=REPLICATED_JOB_NAME_MAX)
    replicas: int | None = Field(None, ge=0, le=MAX_INT32)
    template: FreeForm = Field(default_factory=dict)

    @property
    def labels(self) -> dict[str, str]:
        """template.metadata.labels."""
        return dict((self.template.get("metadata") or {}).get("labels") or {})

    @property
    def pod_spec(self) -> dict[str, Any]:
        """template.spec.template.spec (the pod spec), {} when absent."""
        return dict(((self.template.get("spec") or {}).get("template") or {}).get("spec") or {})

    def container(self, name: str) -> dict[str, Any] | None:
        """The pod template's container with this name."""
        return next((c for c in self.pod_spec.get("containers") or [] if c.get("name") == name), None)


FAILURE_ACTIONS = ("FailJobSet", "RestartJobSet", "RestartJobSetAndIgnoreMaxRestarts")
JOB_FAILURE_REASONS = ("BackoffLimitExceeded", "DeadlineExceeded", "FailedIndexes", "MaxFailedIndexesExceeded",
                       "PodFailurePolicy")


RULE_NAMES_UNIQUE_MESSAGE = "failurePolicy.rules: rule names must be unique"
FAILURE_TARGETS_MESSAGE = ("failurePolicy.rules[].targetReplicatedJobs must name jobs in "
                           "spec.template.spec.replicatedJobs")
SUCCESS_TARGETS_MESSAGE = "successPolicy.targetReplicatedJobs must name jobs in spec.template.spec.replicatedJobs"
TargetJobNames = Annotated[
    list[Annotated[str, Field(min_length=1, max_length=DNS_LABEL_MAX)]] | None,
    Field(max_length=MAX_REPLICATED_JOBS),
]


class FailurePolicyRule(K8sModel):
    """JobSet failurePolicy rule: the first rule matching a failed child Job decides the action."""

    name: str | None = Field(None, min_length=1, max_length=DNS_LABEL_MAX)
    action: Literal["FailJobSet", "RestartJobSet", "RestartJobSetAndIgnoreMaxRestarts"]
    on_job_failure_reasons: list[Literal["BackoffLimitExceeded", "DeadlineExceeded", "FailedIndexes",
                                         "MaxFailedIndexesExceeded", "PodFailurePolicy"]] | None = None
    on_job_failure_message_patterns: list[Annotated[str, Field(min_length=1, max_length=1024)]] | None = Field(
        None, max_length=MAX_RULES, description="regular expressions; the rule matches when one of them is found in "
        "the child Job's failure message")
    target_replicated_jobs: TargetJobNames = None

    @field_validator("on_job_failure_message_patterns")
    @classmethod
    def _patterns_compile(cls, value: list[str] | None) -> list[str] | None:
        for pattern in value or []:
            try:
                re.compile(pattern)
            except re.error as err:
                raise ValueError(f"{pattern!r} is not a regular expression: {err}") from None
        return value


class FailurePolicy(K8sModel):
    """JobSet failurePolicy: restart the child jobs up to maxRestarts times (user failures only)."""

    max_restarts: int | None = Field(None, ge=0, le=MAX_INT32)
    restart_strategy: Literal["Recreate", "BlockingRecreate"] | None = None
    rules: list[FailurePolicyRule] | None = Field(
        None,
        max_length=MAX_RULES,
        json_schema_extra={
            "x-kubernetes-validations": [
                {
                    "rule": "self.all(r, !has(r.name) || self.filter(s, has(s.name) && s.name == r.name).size() == 1)",
                    "message": RULE_NAMES_UNIQUE_MESSAGE,
                }
            ]
        },
    )

    @model_validator(mode="after")
    def _unique_rule_names(self) -> FailurePolicy:
        names = [r.name for r in self.rules or [] if r.name is not None]
        if len(names) != len(set(names)):
            raise ValueError(RULE_NAMES_UNIQUE_MESSAGE)
        return self


class SuccessPolicy(K8sModel):
    """JobSet successPolicy: the TrainJob completes when All (or Any) of the target jobs complete."""

    operator: Literal["All", "Any"] = "All"
    target_replicated_jobs: TargetJobNames = None


class JobSetSpec(OpenModel):
    """A JobSet spec: replicatedJobs, failurePolicy and successPolicy are modelled, the rest is kept."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                {
                    "rule": "!has(self.failurePolicy) || !has(self.failurePolicy.rules) || "
                    "self.failurePolicy.rules.all(r, !has(r.targetReplicatedJobs) || r.targetReplicatedJobs.all("
                    "n, has(self.replicatedJobs) && self.replicatedJobs.exists(j, j.name == n)))",
                    "message": FAILURE_TARGETS_MESSAGE,
                },
                {
                    "rule": "!has(self.successPolicy) || !has(self.successPolicy.targetReplicatedJobs) || "
                    "self.successPolicy.targetReplicatedJobs.all("
                    "n, has(self.replicatedJobs) && self.replicatedJobs.exists(j, j.name == n))",
                    "message": SUCCESS_TARGETS_MESSAGE,
                },
            ]
        }
    )

    failure_policy: FailurePolicy | None = None
    success_policy: SuccessPolicy | None = None
    replicated_jobs: list[ReplicatedJob] | None = Field(
        None,
        max_length=MAX_REPLICATED_JOBS,
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["name"]},
    )

    @model_validator(mode="after")
    def _targets_exist(self) -> JobSetSpec:
        names = {j.name for j in self.replicated_jobs or []}
        for rule in (self.failure_policy.rules if self.failure_policy else None) or []:
            if any(n not in names for n in rule.target_replicated_jobs or []):
                raise ValueError(FAILURE_TARGETS_MESSAGE)
        if self.success_policy and any(n not in names for n in self.success_policy.target_replicated_jobs or []):
            raise ValueError(SUCCESS_TARGETS_MESSAGE)
        return self

    def replicated_job(self, name: str) -> ReplicatedJob | None:
        """The replicated job with this name."""
        return next((j for j in self.replicated_jobs or [] if j.name == name), None)


class JobSetTemplate(K8sModel):
    """The JobSet template a TrainJob is built from."""

    metadata: TemplateMetadata | None = None
    spec: JobSetSpec = Field(default_factory=JobSetSpec)


class TrainingRuntimeSpec(K8sModel):
    """Spec shared by TrainingRuntime and ClusterTrainingRuntime."""

    ml_policy: MLPolicy | None = None
    pod_group_policy: PodGroupPolicy | None = None
    template: JobSetTemplate

    @property
    def num_nodes(self) -> int:
        """mlPolicy.numNodes, default 1."""
        return (self.ml_policy.num_nodes if self.ml_policy else None) or 1

    @property
    def node_job(self) -> ReplicatedJob | None:
        """The replicated job named "node"."""
        return self.template.spec.replicated_job(NODE_JOB)


class TrainingRuntime(K8sModel):
    """A namespaced runtime (a TrainJob in the same namespace may reference it)."""

    api_version: str = API_VERSION
    kind: str = TRAINING_RUNTIME_KIND
    metadata: ObjectMeta = Field(default_factory=ObjectMeta)
    spec: TrainingRuntimeSpec

    @property
    def framework(self) -> str | None:
        """The trainer.kubeflow.org/framework label."""
        return (self.metadata.labels or {}).get(FRAMEWORK_LABEL)


class ClusterTrainingRuntime(TrainingRuntime):
    """A cluster-scoped runtime (any namespace may reference it)."""

    kind: str = CLUSTER_TRAINING_RUNTIME_KIND


def parse_runtime(obj: dict[str, Any]) -> TrainingRuntime:
    """A TrainingRuntime or ClusterTrainingRuntime by obj["kind"]; ValueError names the field path."""
    model = ClusterTrainingRuntime if obj.get("kind") == CLUSTER_TRAINING_RUNTIME_KIND else TrainingRuntime
    try:
        return model.model_validate(obj)
    except ValidationError as err:
        raise ValueError(validation_message(err)) from None
