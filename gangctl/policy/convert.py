"""`gangctl convert`: a PyTorchJob (kubeflow.org/v1) as the equivalent TrainJob, plus a TrainingRuntime
when the shipped one cannot carry it, and the list of what has no equivalent.

Pure: manifest in, manifests and notes out; the command prints them. What decides the shape:

- Trainer v2 nodes are identical (rank 0 is the master), so Master + N Workers become N+1 nodes.
  One template serves all: the Worker's (the Master's when there are no Workers); a different Master
  template is reported.
- A TrainJob's `trainer` carries only image, command, args, env, resources, nodes and processes. A
  pod template with more (volumes, node selection, sidecars, service account...), or restart
  behaviour other than "fail on the first failure", needs a TrainingRuntime of the job's own: it is
  named after the job and holds the pod template and the failure policy.
- v1's restart policies map as in gangctl.policy.pytorchjob: OnFailure / Always restart the gang up
  to runPolicy.backoffLimit (unlimited when unset); Never fails at once; ExitCode fails on exit
  codes 1-127 (a podFailurePolicy rule) and restarts on signals.
"""
from __future__ import annotations

import copy
from dataclasses import dataclass, field

from gangctl.api.pytorchjob import DEFAULT_CONTAINER, DEFAULT_PORT, DEFAULT_PORT_NAME, PyTorchJob, parse
from gangctl.plugins.kueue import QUEUE_LABEL as KUEUE_QUEUE_LABEL
from gangctl.policy.pytorchjob import PERMANENT_EXIT_CODES, UNLIMITED_RESTARTS

TRAINER_API = "trainer.kubeflow.org/v1alpha1"
DEFAULT_RUNTIME = "torch-distributed"   # the ClusterTrainingRuntime gangctl ships (deploy/runtimes)
NODE = "node"
_TRAINER_FIELDS = {"name", "image", "command", "args", "env", "resources", "ports"}
DEFAULT_SCHEDULE_TIMEOUT_SECONDS = 120   # the shipped runtime's


@dataclass
class Conversion:
    trainjob: dict
    runtime: dict | None = None
    gaps: list[str] = field(default_factory=list)    # what has no equivalent, one line each

    def manifests(self) -> list[dict]:
        return [m for m in (self.runtime, self.trainjob) if m is not None]


def convert(manifest: dict, *, runtime: str = DEFAULT_RUNTIME) -> Conversion:
    """The TrainJob (and TrainingRuntime) for a PyTorchJob manifest. Raises PyTorchJobError for a
    manifest Training Operator v1.9 would refuse."""
    job = parse(manifest)
    gaps: list[str] = []
    base = job.worker or job.master
    assert base is not None
    if job.master is not None and job.worker is not None and job.master.template != job.worker.template:
        gaps.append("spec.pytorchReplicaSpecs: the Master's pod template differs from the Worker's; TrainJob "
                    "nodes are identical, so every node uses the Worker's")
    template = copy.deepcopy(base.template)
    pod_spec = template["spec"]
    main = next(c for c in pod_spec["containers"] if c.get("name") == DEFAULT_CONTAINER)
    trainer: dict = {"numNodes": job.total_replicas}
    if job.nproc_per_node is not None:
        trainer["numProcPerNode"] = int(job.nproc_per_node) if job.nproc_per_node.isdigit() else job.nproc_per_node
    _elastic(job, trainer, gaps)
    _command(main, gaps)
    _ports(main, gaps)

    failure_policy, pod_failure_policy = _failure(job, gaps)
    needs_runtime = bool(_extra(template, main) or failure_policy is not None or _scheduling_settings(job))
    meta = {"name": job.name, "namespace": job.namespace}
    if KUEUE_QUEUE_LABEL in job.labels:
        meta["labels"] = {KUEUE_QUEUE_LABEL: job.labels[KUEUE_QUEUE_LABEL]}
    spec: dict = {}
    out_runtime = None
    if needs_runtime:
        out_runtime = _runtime(job, template, main, failure_policy, pod_failure_policy)
        spec["runtimeRef"] = {"apiGroup": "trainer.kubeflow.org", "kind": "TrainingRuntime", "name": job.name}
    else:
        spec["runtimeRef"] = {"apiGroup": "trainer.kubeflow.org", "kind": "ClusterTrainingRuntime", "name": runtime}
        for key in ("image", "command", "args", "env"):
            if main.get(key):
                trainer[key] = copy.deepcopy(main[key])
        if main.get("resources"):
            trainer["resourcesPerNode"] = copy.deepcopy(main["resources"])
    spec["trainer"] = trainer
    rp = job.run_policy
    if rp.suspend:
        spec["suspend"] = True
    if rp.active_deadline_seconds is not None:
        spec["activeDeadlineSeconds"] = rp.active_deadline_seconds
    _run_policy_gaps(job, gaps)
    gaps += [
        "pods get PET_NNODES, PET_NPROC_PER_NODE, PET_NODE_RANK, PET_MASTER_ADDR, PET_MASTER_PORT (for torchrun), "
        "not MASTER_ADDR, MASTER_PORT, WORLD_SIZE, RANK",
        "pods are labelled jobset.sigs.k8s.io/* and trainer.kubeflow.org/trainjob-name, not training.kubeflow.org/*; "
        "their hostnames are <job>-node-0-<i>, not <job>-master-0 / <job>-worker-<i>",
        "status: conditions Complete / Failed (not Succeeded) and jobsStatus (not replicaStatuses); no scale subresource",
    ]
    return Conversion({"apiVersion": TRAINER_API, "kind": "TrainJob", "metadata": meta, "spec": spec}, out_runtime, gaps)


def _extra(template: dict, main: dict) -> list[str]:
    """What the pod template holds beyond what `trainer` can carry."""
    extra = [f"containers[{DEFAULT_CONTAINER}].{k}" for k in main if k not in _TRAINER_FIELDS]
    extra += [f"spec.{k}" for k in template["spec"] if k not in ("containers",)]
    extra += ["containers (sidecars)"] if len(template["spec"]["containers"]) > 1 else []
    extra += [f"metadata.{k}" for k in template.get("metadata") or {}]
    return extra


def _command(main: dict, gaps: list[str]) -> None:
    words = list(main.get("command") or []) + list(main.get("args") or [])
    if words and not any("torchrun" in w or "torch.distributed.run" in w for w in words):
        gaps.append(f"containers[{DEFAULT_CONTAINER}].command: {' '.join(words)[:80]!r} does not start torchrun; a "
                    "TrainJob sets only torchrun's PET_* variables, so a program reading RANK / WORLD_SIZE / "
                    "MASTER_ADDR itself must be started with torchrun")


def _ports(main: dict, gaps: list[str]) -> None:
    """The pytorchjob-port goes (TrainJob's master port is 29500); a user's own choice of it is reported."""
    ports = [p for p in main.get("ports") or [] if p.get("name") != DEFAULT_PORT_NAME]
    if any(p.get("name") == DEFAULT_PORT_NAME and p.get("containerPort") != DEFAULT_PORT for p in main.get("ports") or []):
        gaps.append(f"containers[{DEFAULT_CONTAINER}].ports[{DEFAULT_PORT_NAME}]: the master port is 29500 "
                    "(PET_MASTER_PORT), not the port chosen here")
    if ports:
        main["ports"] = ports
    else:
        main.pop("ports", None)


def _elastic(job: PyTorchJob, trainer: dict, gaps: list[str]) -> None:
    e = job.elastic
    if e is None:
        return
    trainer["numNodes"] = (job.master.replicas if job.master else 0) + e.max_replicas
    policy: dict = {"minNodes": e.min_replicas, "maxNodes": e.max_replicas}
    if e.max_restarts is not None:
        policy["maxRestarts"] = e.max_restarts
    if job.master is not None:
        gaps.append("spec.elasticPolicy with a Master: the TrainJob's elastic range counts every node, the Master too")
        policy = {"minNodes": e.min_replicas + 1, "maxNodes": e.max_replicas + 1, **(
            {"maxRestarts": e.max_restarts} if e.max_restarts is not None else {})}
    trainer["elasticPolicy"] = policy
    if e.nproc_per_node is not None:
        trainer["numProcPerNode"] = e.nproc_per_node
    named = [n for n, v in (("rdzvBackend", e.rdzv_backend not in (None, "c10d")), ("rdzvHost", e.rdzv_host),
                            ("rdzvPort", e.rdzv_port), ("rdzvId", e.rdzv_id), ("rdzvConf", e.rdzv_conf),
                            ("standalone", e.standalone)) if v]
    if named:
        gaps.append(f"spec.elasticPolicy.{{{', '.join(named)}}}: gangctl runs the c10d rendezvous on its own store "
                    "pod; these settings are dropped")
    if e.metrics:
        gaps.append("spec.elasticPolicy.metrics: no autoscaler is made; the job runs maxNodes nodes and shrinks "
                    "to minNodes on node loss")


def _failure(job: PyTorchJob, gaps: list[str]) -> tuple[dict | None, dict | None]:
    """JobSet failurePolicy and batch podFailurePolicy for v1's restart policies (None: the TrainJob
    default, fail on the first failure, is already v1's behaviour)."""
    policies = {s.restart_policy for s in job.replica_specs.values()}
    limit = job.run_policy.backoff_limit
    if len(policies) > 1:
        # One node template: the strictest policy of the job wins.
        policies = {next(p for p in ("Never", "ExitCode", "OnFailure", "Always") if p in policies)}
        gaps.append(f"spec.pytorchReplicaSpecs[*].restartPolicy: the replicas differ; every node gets the "
                    f"strictest, {next(iter(policies))}")
    (policy,) = policies
    if policy == "Never":
        return None, None
    failure = {"maxRestarts": UNLIMITED_RESTARTS if limit is None else limit}
    if policy != "ExitCode":
        return failure, None
    failure["rules"] = [{"name": "exit-code", "action": "FailJobSet", "onJobFailureReasons": ["PodFailurePolicy"]}]
    pod_failure = {"rules": [{"action": "FailJob", "onExitCodes": {
        "containerName": NODE, "operator": "In", "values": list(PERMANENT_EXIT_CODES)}}]}
    return failure, pod_failure


def _scheduling_settings(job: PyTorchJob) -> dict:
    s = job.run_policy.scheduling
    out: dict = {}
    if s is not None and s.schedule_timeout_seconds is not None:
        out["scheduleTimeoutSeconds"] = s.schedule_timeout_seconds
    if s is not None and s.priority_class:
        out["priorityClassName"] = s.priority_class
    return out


def _runtime(job: PyTorchJob, template: dict, main: dict, failure: dict | None, pod_failure: dict | None) -> dict:
    main["name"] = NODE
    meta = template.setdefault("metadata", {})
    meta["labels"] = {**(meta.get("labels") or {}), "trainer.kubeflow.org/trainjob-ancestor-step": "trainer"}
    template["spec"]["restartPolicy"] = "Never"
    sched = _scheduling_settings(job)
    if sched.get("priorityClassName"):
        template["spec"]["priorityClassName"] = sched["priorityClassName"]
    job_spec: dict = {"template": template}
    if pod_failure is not None:
        job_spec["podFailurePolicy"] = pod_failure
        job_spec["backoffLimit"] = 0
    jobset: dict = {"replicatedJobs": [{"name": NODE, "replicas": 1, "template": {"spec": job_spec}}]}
    if failure is not None:
        jobset["failurePolicy"] = failure
    torch: dict = {}
    if job.nproc_per_node is not None:
        torch["numProcPerNode"] = int(job.nproc_per_node) if job.nproc_per_node.isdigit() else job.nproc_per_node
    return {
        "apiVersion": TRAINER_API, "kind": "TrainingRuntime",
        "metadata": {"name": job.name, "namespace": job.namespace, "labels": {"trainer.kubeflow.org/framework": "torch"}},
        "spec": {
            "mlPolicy": {"numNodes": job.total_replicas, "torch": torch},
            "podGroupPolicy": {"coscheduling": {"scheduleTimeoutSeconds": sched.get(
                "scheduleTimeoutSeconds", DEFAULT_SCHEDULE_TIMEOUT_SECONDS)}},
            "template": {"spec": jobset},
        },
    }


def _run_policy_gaps(job: PyTorchJob, gaps: list[str]) -> None:
    rp = job.run_policy
    if rp.clean_pod_policy != "None":
        gaps.append(f"spec.runPolicy.cleanPodPolicy {rp.clean_pod_policy}: no TrainJob field; finished pods are kept "
                    "until the TrainJob is deleted")
    if rp.ttl_seconds_after_finished is not None:
        gaps.append("spec.runPolicy.ttlSecondsAfterFinished: no TrainJob field; delete finished TrainJobs yourself")
    if rp.managed_by is not None:
        gaps.append(f"spec.runPolicy.managedBy {rp.managed_by!r}: not carried (TrainJob's managedBy names other "
                    "controllers)")
    s = rp.scheduling
    if s is None:
        return
    if s.min_available is not None:
        gaps.append("spec.runPolicy.schedulingPolicy.minAvailable: no TrainJob field; the gang floor is numNodes "
                    "(or elasticPolicy.minNodes)")
    if s.queue:
        gaps.append(f"spec.runPolicy.schedulingPolicy.queue {s.queue!r}: not carried; with Kueue label the TrainJob "
                    f"{KUEUE_QUEUE_LABEL}=<local queue>, with Volcano set the queue in the runtime")
    if s.min_resources:
        gaps.append("spec.runPolicy.schedulingPolicy.minResources: not carried; gangctl computes the gang's "
                    "minResources from the pods' requests")

