"""A PyTorchJob (kubeflow.org/v1) as gangctl's gang: replica groups, names, labels, env, failure
mapping and v1 status. Pure: callers pass the parsed job, observed pod counts and `now`.

How a PyTorchJob runs under gangctl (the facts are Training Operator v1.9.4's, see
gangctl.api.pytorchjob):

- **Pods named as v1 named them**: gangctl creates each replica's pod itself, `<job>-master-0` and
  `<job>-worker-<i>`, owned by the PyTorchJob, with v1's labels (operator-name, job-name,
  replica-type, replica-index, job-role=master on the Master or, with no Master, on worker 0) and
  RANK / PET_NODE_RANK set in the pod (a worker's index + 1 when there is a Master, v1's rule). So the
  tutorials' `kubectl logs <job>-master-0` and `kubectl exec <job>-master-0` work, and the pod's
  hostname is its name.
- **One headless Service per pod**, named `<job>-<type>-<i>` as v1 did, selecting the pod by its
  job-name, replica-type and replica-index labels (v1's selector). v1 tooling and user code reach the
  master as the bare name `MASTER_ADDR=<job>-master-0`. `publishNotReadyAddresses` lets workers
  resolve the master before it is ready.
- **An elastic Worker group** keeps its current size of live pods: a worker lost with its node is
  replaced under the lowest free index (its old pod may stay Terminating on the lost node, holding
  its name), and a shrink deletes unscheduled workers first, then the highest index.
- **Gang floor** (v1's bug #1571: minMember ignored elasticPolicy.minReplicas): minMember =
  schedulingPolicy.minAvailable when set, else the Master plus elasticPolicy.minReplicas workers
  (elastic), else every replica.
- **Elastic rendezvous**: with no `rdzvHost`, v1 pointed PET_RDZV_ENDPOINT at worker 0's torchrun
  agent, which dies with worker 0's node; gangctl points it at its rendezvous store pod
  `<job>-rdzv` (kept off the workers' nodes), so losing any worker node is a shrink, not the end.
  An explicit `rdzvHost` is honoured as written.
- **Restarts**: v1 restarted failed containers or pods and counted container restarts against
  `runPolicy.backoffLimit`. Under gangctl an `OnFailure` replica restarts in place as under v1 (the
  kubelet restarts the container in its pod, on its node: no gang wait); gangctl charges each
  episode once (the highest container restart count of the attempt's pods: one failing rank makes
  the others' collectives fail and restart too, which v1 counted as several) and, past the limit,
  fails the job and deletes its restarting pods. Other policies, and a pod that fails anyway, restart
  the gang (every pod deleted, then made again under the same names) against the same limit;
  infrastructure faults are never charged.
"""
from __future__ import annotations

import copy
import dataclasses
import functools
from dataclasses import dataclass, field
from datetime import datetime
from fractions import Fraction
from typing import Any

from gangctl.api.pytorchjob import (DEFAULT_CONTAINER, DEFAULT_PORT_NAME, KIND, MASTER, WORKER, PyTorchJob, ReplicaSpec,
                                    SchedulingPolicy, parse)
from gangctl.api.quantity import parse_quantity
from gangctl.plugins.kueue import QUEUE_LABEL as KUEUE_QUEUE_LABEL
from gangctl.plugins.registry import BACKENDS
from gangctl.plugins.torch import RDZV_PORT, STORE_ROLE, STORE_ROLE_VALUE
from gangctl.policy.failure import FAIL_JOBSET, FailurePolicy, FailureRule
from gangctl.model.gang import DEFAULT_SCHEDULE_TIMEOUT_SECONDS, Gang
from gangctl.model.resolve import ResolvedJob, pod_requests
from gangctl.model.topology import PlacementIntent, TopologyError, template_intent
from gangctl.policy.status import parse_time, timestamp

# v1's label keys (training-operator pkg/apis/kubeflow.org/v1/common_types.go).
OPERATOR_NAME = "training.kubeflow.org/operator-name"
JOB_NAME = "training.kubeflow.org/job-name"
REPLICA_TYPE = "training.kubeflow.org/replica-type"
REPLICA_INDEX = "training.kubeflow.org/replica-index"
JOB_ROLE = "training.kubeflow.org/job-role"
CONTROLLER_NAME = "pytorchjob-controller"   # the operator-name value v1's PyTorchJob controller wrote
# gangctl's per-pod stamp for RANK (see the module docstring), and the gate held until it is written.
# The rendezvous store pod gangctl runs for elastic jobs (gangctl.plugins.torch builds it).
RDZV_STORE_PORT = RDZV_PORT
UNLIMITED_RESTARTS = 2147483647
MAX_NAME = 63
# Exit codes v1's ExitCode policy treats as permanent (below 128: the program's own error; 128+ are
# signals, e.g. 137 OOM-kill / SIGKILL, 143 SIGTERM: retried).
PERMANENT_EXIT_CODES = tuple(range(1, 128))

# Condition types and reasons as v1.9 writes them (reason = Kind + event).
CREATED, RUNNING, RESTARTING, SUCCEEDED, SUSPENDED, FAILED = (
    "Created", "Running", "Restarting", "Succeeded", "Suspended", "Failed")


def reason(event: str) -> str:
    return f"{KIND}{event}"


class PyTorchJobMappingError(ValueError):
    """The PyTorchJob is valid for v1 but cannot run as asked; the message names the field."""


@dataclass(frozen=True)
class ReplicaGroup:
    """One replica type as the core's model: its pods `<job>-<type>-<i>`."""

    replica_type: str
    job: ResolvedJob
    rank_offset: int             # RANK of index 0: 1 for Workers when there is a Master, else 0
    ranked: bool = False         # v1 sets RANK (there is a Master): each pod gets index + rank_offset


@dataclass(frozen=True)
class PyTorchGang:
    """A PyTorchJob mapped onto the core: its groups, gang floor and policies."""

    name: str
    namespace: str
    uid: str
    groups: tuple[ReplicaGroup, ...]     # Master first
    min_member: int
    size: int
    min_resources: dict[str, Fraction]
    gang_backend: str | None
    gang_settings: dict[str, Any]
    failure_policy: FailurePolicy
    success_policy: dict
    suspend: bool
    rdzv_store: bool                     # run gangctl's rendezvous store pod `<job>-rdzv`
    services: tuple[dict, ...] = field(default=())   # the per-pod headless Services (no owner yet)

    def gang(self) -> Gang:
        """The core's Gang. Its per-pod requests are one number per resource, so with a Master and
        Workers of different sizes minResources is carried by `min_resources`, not by this."""
        per_pod = self.groups[-1].job.requests
        timeout = self.gang_settings.get("scheduleTimeoutSeconds", DEFAULT_SCHEDULE_TIMEOUT_SECONDS)
        return Gang(min_member=self.min_member, size=self.size, per_pod=dict(per_pod),
                    schedule_timeout_seconds=int(timeout))


# --- names and labels -----------------------------------------------------------------------------

def replica_name(job: str, replica_type: str, index: int) -> str:
    """v1's name of a replica: pod hostname, headless Service, and MASTER_ADDR for the Master."""
    return f"{job}-{replica_type.lower()}-{index}"


def template_labels(job: str, replica_type: str, has_master: bool) -> dict[str, str]:
    """The labels every pod of the group carries from creation (worker 0's job-role is stamped)."""
    labels = {OPERATOR_NAME: CONTROLLER_NAME, JOB_NAME: job, REPLICA_TYPE: replica_type.lower()}
    if has_master and replica_type == MASTER:
        labels[JOB_ROLE] = "master"
    return labels


def is_master_role(replica_type: str, index: int, has_master: bool) -> bool:
    """v1's rule: the Master, or worker 0 when there is no Master."""
    return replica_type == MASTER if has_master else replica_type == WORKER and index == 0


def pod_labels(job: str, replica_type: str, index: int, has_master: bool) -> dict[str, str]:
    """All v1 labels of one pod (what the SDK selects by)."""
    labels = {**template_labels(job, replica_type, has_master), REPLICA_INDEX: str(index)}
    if is_master_role(replica_type, index, has_master):
        labels[JOB_ROLE] = "master"
    return labels


def label_selector(job: str, replica_type: str) -> str:
    """status.replicaStatuses[type].selector, keys sorted as Kubernetes formats a selector."""
    labels = {OPERATOR_NAME: CONTROLLER_NAME, JOB_NAME: job, REPLICA_TYPE: replica_type.lower()}
    return ",".join(f"{k}={labels[k]}" for k in sorted(labels))


# --- env ------------------------------------------------------------------------------------------

def rank_env(rank: int) -> list[dict]:
    """RANK and PET_NODE_RANK of one pod (with a Master: 0 on it, a worker's index + 1)."""
    return [{"name": "RANK", "value": str(rank)}, {"name": "PET_NODE_RANK", "value": str(rank)}]


def nproc_int(job: PyTorchJob) -> int:
    """v1's WORLD_SIZE factor: nprocPerNode when it is a number, else 1 ("auto", "gpu", "cpu")."""
    value = job.nproc_per_node
    return int(value) if value is not None and value.isdigit() else 1


def procs_per_node(job: PyTorchJob) -> str:
    """PET_NPROC_PER_NODE as the pods get it: nprocPerNode, else the deprecated elasticPolicy.nProcPerNode."""
    if job.nproc_per_node is not None:
        return job.nproc_per_node
    return str(job.elastic.nproc_per_node) if job.elastic and job.elastic.nproc_per_node is not None else "auto"


def rdzv_endpoint(job: PyTorchJob) -> str:
    e = job.elastic
    assert e is not None
    if e.rdzv_host is None:
        return f"{store_name(job.name)}:{RDZV_STORE_PORT}"
    port = e.rdzv_port if e.rdzv_port is not None else job.worker.port if job.worker else 0
    return f"{e.rdzv_host}:{port}"


def group_name(job: str) -> str:
    """The gang's group (PodGroup): not the job's own name, which a TrainJob's group of the same
    name has (TrainJob children keep their names, so running gangs survive an upgrade)."""
    return f"{job}-pytorch"   # never longer than a replica name (`-worker-0`): no name refused for it


def store_name(job: str) -> str:
    """The store pod and its Service: not a TrainJob's `<job>-rdzv[-n]`, so a TrainJob and a
    PyTorchJob of one name keep separate stores."""
    return f"{job}-rdzv-pt"   # never longer than a replica name (`-worker-0`)


def store_labels(job: str) -> dict[str, str]:
    """What the store pod carries and its Service selects (the reconciler observes it by JOB_NAME)."""
    return {JOB_NAME: job, STORE_ROLE: STORE_ROLE_VALUE}


def store_service(job: PyTorchJob) -> dict:
    """The headless Service PET_RDZV_ENDPOINT names; it selects whichever store pod is alive."""
    return {
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": store_name(job.name), "namespace": job.namespace,
                     "labels": {OPERATOR_NAME: CONTROLLER_NAME, JOB_NAME: job.name}},
        "spec": {"clusterIP": "None", "publishNotReadyAddresses": True, "selector": store_labels(job.name),
                 "ports": [{"name": "rdzv", "port": RDZV_STORE_PORT}]},
    }


def uses_store(job: PyTorchJob) -> bool:
    """gangctl's store replaces worker 0's: elastic, c10d, no rdzvHost, not standalone."""
    e = job.elastic
    return bool(e and e.rdzv_host is None and (e.rdzv_backend or "c10d") == "c10d" and not e.standalone)


def env(job: PyTorchJob, replica_type: str) -> list[dict]:
    """The environment v1 gave every container of a pod of this replica type (in v1's order), but
    RANK and PET_NODE_RANK, which differ per pod (`rank_env`)."""
    out = [{"name": "PYTHONUNBUFFERED", "value": "1"}]
    master = job.master
    if master is not None:
        addr, port = replica_name(job.name, MASTER, 0), str(master.port)
        out += [{"name": "MASTER_PORT", "value": port}, {"name": "PET_MASTER_PORT", "value": port},
                {"name": "MASTER_ADDR", "value": addr}, {"name": "PET_MASTER_ADDR", "value": addr},
                {"name": "WORLD_SIZE", "value": str(job.total_replicas * nproc_int(job))}]
        # RANK and PET_NODE_RANK follow, per pod (`rank_env`)
    if job.nproc_per_node is not None:
        out.append({"name": "PET_NPROC_PER_NODE", "value": job.nproc_per_node})
    e = job.elastic
    if e is None:
        out.append({"name": "PET_NNODES", "value": str(job.total_replicas)})
        return out
    out += [{"name": "PET_RDZV_ENDPOINT", "value": rdzv_endpoint(job)},
            {"name": "PET_RDZV_BACKEND", "value": e.rdzv_backend or "c10d"},
            {"name": "PET_NNODES", "value": f"{e.min_replicas}:{e.max_replicas}"}]
    if e.max_restarts is not None:
        out.append({"name": "PET_MAX_RESTARTS", "value": str(e.max_restarts)})
    if e.nproc_per_node is not None:
        out.append({"name": "PET_NPROC_PER_NODE", "value": str(e.nproc_per_node)})
    if e.rdzv_id is not None:
        out.append({"name": "PET_RDZV_ID", "value": e.rdzv_id})
    if e.rdzv_conf:
        out.append({"name": "PET_RDZV_CONF", "value": ",".join(f"{k}={v}" for k, v in e.rdzv_conf)})
    if e.standalone:
        out.append({"name": "PET_STANDALONE", "value": ""})
    return out


def with_env(container: dict, extra: list[dict]) -> None:
    """v1 appended its variables after the user's; a user variable of the same name lost. Same
    outcome here, without the duplicate entry."""
    names = {e["name"] for e in extra}
    container["env"] = [e for e in container.get("env") or [] if e.get("name") not in names] + copy.deepcopy(extra)


# --- the mapping ----------------------------------------------------------------------------------

def to_gang(obj: dict | PyTorchJob, *, default_backend: str | None = None,
            scheduler_name: str | None = None) -> PyTorchGang:
    """The PyTorchJob as gangctl's gang. `default_backend` is the controller's gang scheduler for jobs
    that name none (v1's --gang-scheduler-name); a `kueue.x-k8s.io/queue-name` label means Kueue.
    `scheduler_name`: the pods' scheduler on the native backend (the profile with GangScheduling)."""
    job = obj if isinstance(obj, PyTorchJob) else parse(obj)
    _check_names(job)
    has_master = job.master is not None
    backend, settings = _backend(job, default_backend)
    if backend == "native" and scheduler_name:
        settings = {**settings, "schedulerName": scheduler_name}
    failure = failure_policy(job)
    groups = []
    for rtype, spec in job.replica_specs.items():
        offset = 1 if rtype == WORKER and has_master else 0
        template = _pod_template(job, spec)
        pod_spec = template["spec"]
        elastic = None
        num = spec.replicas
        min_nodes = None
        if rtype == WORKER and job.elastic is not None:
            e = job.elastic
            num = max(e.min_replicas, min(spec.replicas, e.max_replicas))
            min_nodes = e.min_replicas
            elastic = {"minNodes": e.min_replicas, "maxNodes": e.max_replicas}
            if e.max_restarts is not None:
                elastic["maxRestarts"] = e.max_restarts
        resolved = ResolvedJob(
            name=job.name, namespace=job.namespace, uid=job.uid, runtime_kind=KIND, runtime_name="",
            num_nodes=num, min_nodes=min_nodes, num_proc_per_node=procs_per_node(job),
            suspend=job.run_policy.suspend, gang_backend=backend, gang_settings=settings,
            pod_template=template, job_spec={}, requests=pod_requests(pod_spec),
            failure_policy=_jobset_failure_policy(failure), success_policy=success_policy(job), elastic=elastic,
            group_name=group_name(job.name), placement=_replica_intent(rtype, template),
            restart_in_place=restarts_in_place(spec),
        )
        groups.append(ReplicaGroup(rtype, resolved, offset, ranked=has_master))
    groups = _one_placement(groups)
    min_member, size = gang_floor(job)
    return PyTorchGang(
        name=job.name, namespace=job.namespace, uid=job.uid, groups=tuple(groups),
        min_member=min_member, size=size, min_resources=min_resources(job, groups, min_member),
        gang_backend=backend, gang_settings=settings, failure_policy=failure,
        success_policy=success_policy(job), suspend=job.run_policy.suspend, rdzv_store=uses_store(job),
        services=tuple(services(job)) + ((store_service(job),) if uses_store(job) else ()),
    )


def _replica_intent(rtype: str, template: dict) -> PlacementIntent | None:
    try:
        return template_intent(template)
    except TopologyError as err:
        raise PyTorchJobMappingError(f"spec.pytorchReplicaSpecs.{rtype}.template.metadata: {err}") from None


def _one_placement(groups: list[ReplicaGroup]) -> list[ReplicaGroup]:
    """The gang is placed as one: an intent on one replica type applies to all; two that differ are
    refused, naming both."""
    asked = [(g.replica_type, g.job.placement) for g in groups if g.job.placement is not None]
    if not asked:
        return groups
    if len({dataclasses.replace(intent, fields=()) for _, intent in asked}) > 1:
        names = " and ".join(f"spec.pytorchReplicaSpecs.{t}.template.metadata.annotations" for t, _ in asked)
        raise PyTorchJobMappingError(f"{names} ask for different topology placements; the gang is placed as "
                                     "one: give the same annotations on every replica type, or on one")
    intent = asked[0][1]
    return [dataclasses.replace(g, job=dataclasses.replace(g.job, placement=intent)) for g in groups]


def _check_names(job: PyTorchJob) -> None:
    longest = max((replica_name(job.name, t, max(s.replicas, job.elastic.max_replicas if job.elastic and t == WORKER
                                                 else 0) - 1)
                   for t, s in job.replica_specs.items()), key=len)
    longest = max([longest, store_name(job.name)] if uses_store(job) else [longest], key=len)
    if len(longest) > MAX_NAME:
        raise PyTorchJobMappingError(
            f"metadata.name: {job.name!r} is too long: its replica name {longest!r} has {len(longest)} characters "
            f"(Service names and hostnames allow {MAX_NAME}); shorten the name by {len(longest) - MAX_NAME}")


def restarts_in_place(spec: ReplicaSpec) -> bool:
    """v1's OnFailure: a replica whose container fails is restarted by the kubelet in the same pod on
    the same node; the other ranks' collectives then fail, and their containers restart as well. gangctl
    charges each such episode once to the restart budget (`decide_pytorchjob`); past it, the job fails."""
    return spec.restart_policy == "OnFailure"


def _pod_template(job: PyTorchJob, spec: ReplicaSpec) -> dict:
    template = copy.deepcopy(spec.template)
    meta = template.setdefault("metadata", {})
    meta["labels"] = {**(meta.get("labels") or {}),
                      **template_labels(job.name, spec.replica_type, job.master is not None)}
    pod_spec = template["spec"]
    # OnFailure: the kubelet restarts a failed container in its pod, as under v1 (gangctl charges the
    # restarts, `restarts_in_place`); otherwise gangctl restarts the gang and the pod never restarts.
    pod_spec["restartPolicy"] = "OnFailure" if restarts_in_place(spec) else "Never"
    extra = env(job, spec.replica_type)
    for container in pod_spec.get("containers") or []:
        with_env(container, extra)
    return template


def gang_floor(job: PyTorchJob) -> tuple[int, int]:
    """(minMember, size): size is every replica the job runs now; the floor is minAvailable when set,
    else the Master plus elasticPolicy.minReplicas workers, else every replica (fixes v1 #1571)."""
    masters = job.master.replicas if job.master else 0
    workers = job.worker.replicas if job.worker else 0
    e = job.elastic
    if e is not None:
        workers = max(e.min_replicas, min(workers, e.max_replicas))
    size = masters + workers
    floor = masters + e.min_replicas if e is not None else size
    sched = job.run_policy.scheduling
    if sched is not None and sched.min_available is not None:
        if sched.min_available > size:
            raise PyTorchJobMappingError(
                f"spec.runPolicy.schedulingPolicy.minAvailable: {sched.min_available} is more than the "
                f"{size} replicas the job runs")
        floor = sched.min_available
    return floor, size


def min_resources(job: PyTorchJob, groups: list[ReplicaGroup], min_member: int) -> dict[str, Fraction]:
    """What the gang must hold to start: schedulingPolicy.minResources when set (v1 passed it through);
    else the Master's requests plus the workers' up to the floor."""
    sched = job.run_policy.scheduling
    if sched is not None and sched.min_resources:
        return {k: parse_quantity(v) for k, v in sched.min_resources.items()}
    total: dict[str, Fraction] = {}
    left = min_member
    for group in groups:
        count = min(left, group.job.num_nodes)
        for name, qty in group.job.requests.items():
            total[name] = total.get(name, Fraction(0)) + qty * count
        left -= count
    return total


def _backend(job: PyTorchJob, default_backend: str | None) -> tuple[str | None, dict]:
    """The job's gang backend (a Kueue queue-name label means Kueue, else the controller's default)
    and its gang settings, which the backend translates from v1's `runPolicy.schedulingPolicy`.
    Kueue admits a PyTorchJob itself (its `kubeflow.org/pytorchjob` integration, as under v1), and
    only one that carries its queue-name label: under Kueue an unlabelled job would run unadmitted."""
    sched = job.run_policy.scheduling
    if job.labels.get(KUEUE_QUEUE_LABEL):
        return "kueue", {"queueName": job.labels[KUEUE_QUEUE_LABEL], **_settings("kueue", sched)}
    if default_backend == "kueue":
        raise PyTorchJobMappingError(
            f"metadata.labels[{KUEUE_QUEUE_LABEL}]: this cluster's gang scheduler is Kueue, which admits a "
            "PyTorchJob only when it names a LocalQueue; add the label (`gangctl policy apply --backend kueue` "
            "makes a LocalQueue named default in each team namespace)")
    if default_backend is None:
        return None, {}
    return default_backend, _settings(default_backend, sched)


def _settings(backend_name: str, sched: SchedulingPolicy | None) -> dict:
    """What the backend makes of the job's scheduling policy (an unknown backend is refused later,
    when the gang is built)."""
    backend = BACKENDS.get(backend_name)
    return backend.pytorchjob_settings(sched) if backend is not None and sched is not None else {}


def services(job: PyTorchJob) -> list[dict]:
    """v1's per-replica headless Services, each selecting its pod by v1's labels."""
    out = []
    for rtype, spec in job.replica_specs.items():
        count = max(spec.replicas, job.elastic.max_replicas) if job.elastic and rtype == WORKER else spec.replicas
        ports = _named_ports(spec)
        for i in range(count):
            name = replica_name(job.name, rtype, i)
            base = {OPERATOR_NAME: CONTROLLER_NAME, JOB_NAME: job.name, REPLICA_TYPE: rtype.lower()}
            out.append({
                "apiVersion": "v1", "kind": "Service",
                "metadata": {"name": name, "namespace": job.namespace, "labels": {**base, REPLICA_INDEX: str(i)}},
                "spec": {"clusterIP": "None", "publishNotReadyAddresses": True,
                         "selector": {**base, REPLICA_INDEX: str(i)},
                         "ports": [{"name": n, "port": p} for n, p in ports]},
            })
    return out


def _named_ports(spec: ReplicaSpec) -> list[tuple[str, int]]:
    for c in (spec.template.get("spec") or {}).get("containers") or []:
        if c.get("name") == DEFAULT_CONTAINER:
            return [(p["name"], int(p["containerPort"])) for p in c.get("ports") or [] if p.get("name")]
    return [(DEFAULT_PORT_NAME, spec.port)]


# --- failures and success -------------------------------------------------------------------------

def failure_policy(job: PyTorchJob) -> FailurePolicy:
    """v1's restart policies and backoffLimit on gangctl's restart budget.

    Never: a failed pod fails the job. ExitCode: exit codes 1-127 fail the job (the failure is judged
    with reason PodFailurePolicy, `exit_code_failure`), 128+ (signals) restart the gang.
    OnFailure: the kubelet restarts the failed containers in their pods (`restarts_in_place`); a pod
    that fails anyway (evicted, its node lost) restarts the gang. Always: restart the gang.
    Restarts charged to the user stop at backoffLimit
    (unlimited when unset, as v1); disruptions are never charged (gangctl's rule)."""
    rules = []
    for rtype, spec in job.replica_specs.items():
        if spec.restart_policy == "Never":
            rules.append(FailureRule(action=FAIL_JOBSET, name=f"{rtype.lower()}-never",
                                     target_replicated_jobs=(rtype.lower(),)))
        elif spec.restart_policy == "ExitCode":
            rules.append(FailureRule(action=FAIL_JOBSET, name=f"{rtype.lower()}-exit-code",
                                     on_job_failure_reasons=("PodFailurePolicy",),
                                     target_replicated_jobs=(rtype.lower(),)))
    limit = job.run_policy.backoff_limit
    return FailurePolicy(max_restarts=UNLIMITED_RESTARTS if limit is None else limit, rules=tuple(rules))


def _jobset_failure_policy(policy: FailurePolicy) -> dict:
    """The same policy in JobSet's spelling (ResolvedJob.failure_policy)."""
    rules = []
    for r in policy.rules:
        rule: dict = {"name": r.name, "action": r.action}
        if r.on_job_failure_reasons:
            rule["onJobFailureReasons"] = list(r.on_job_failure_reasons)
        if r.target_replicated_jobs:
            rule["targetReplicatedJobs"] = list(r.target_replicated_jobs)
        rules.append(rule)
    return {"maxRestarts": policy.max_restarts, "rules": rules}


def success_policy(job: PyTorchJob) -> dict:
    """v1's success rule in JobSet's words (`succeeded` decides it from the pods): the Master
    completes; with no Master, the Workers (an elastic one on its first success)."""
    return {"operator": "All", "targetReplicatedJobs": [MASTER.lower() if job.master else WORKER.lower()]}


@dataclass(frozen=True)
class ReplicaCounts:
    active: int = 0
    succeeded: int = 0
    failed: int = 0


def count_pods(job: PyTorchJob, pods: list[dict]) -> dict[str, ReplicaCounts]:
    """v1's replica counts from the pods of one attempt: Running pods are active (failed when being
    deleted: a pod on a lost node may never reach Failed), Succeeded and Failed as their phase."""
    counts = {t: [0, 0, 0] for t in job.replica_specs}
    for pod in pods:
        labels = (pod.get("metadata") or {}).get("labels") or {}
        rtype = next((t for t in job.replica_specs if t.lower() == labels.get(REPLICA_TYPE)), None)
        if rtype is None or labels.get(JOB_NAME) != job.name:
            continue
        phase = (pod.get("status") or {}).get("phase")
        if phase == "Running":
            counts[rtype][2 if (pod.get("metadata") or {}).get("deletionTimestamp") else 0] += 1
        elif phase == "Succeeded":
            counts[rtype][1] += 1
        elif phase == "Failed":
            counts[rtype][2] += 1
    return {t: ReplicaCounts(*c) for t, c in counts.items()}


def replica_statuses(job: PyTorchJob, counts: dict[str, ReplicaCounts]) -> dict:
    """status.replicaStatuses: v1 omits zero counts; the Worker selector feeds the scale subresource."""
    out = {}
    for rtype in job.replica_specs:
        c = counts.get(rtype, ReplicaCounts())
        entry: dict = {k: v for k, v in (("active", c.active), ("succeeded", c.succeeded), ("failed", c.failed)) if v}
        entry["selector"] = label_selector(job.name, rtype)
        out[rtype] = entry
    return out


def succeeded(job: PyTorchJob, counts: dict[str, ReplicaCounts]) -> bool:
    """v1's rule: the Master succeeded; with no Master, every worker, or any worker when elastic."""
    if job.master is not None:
        return counts.get(MASTER, ReplicaCounts()).succeeded >= job.master.replicas
    worker = counts.get(WORKER, ReplicaCounts())
    assert job.worker is not None
    return worker.succeeded >= job.worker.replicas or (job.elastic is not None and worker.succeeded > 0)


def running(job: PyTorchJob, counts: dict[str, ReplicaCounts]) -> bool:
    """v1 is Running when the Master runs (no Master: any worker)."""
    return counts.get(MASTER if job.master else WORKER, ReplicaCounts()).active > 0


def deadline_exceeded(job: PyTorchJob, status: dict | None, now: datetime) -> bool:
    """runPolicy.activeDeadlineSeconds, counted from status.startTime (v1's rule)."""
    limit, start = job.run_policy.active_deadline_seconds, (status or {}).get("startTime")
    return limit is not None and start is not None and (now - parse_time(start)).total_seconds() >= limit


def ttl_remaining(job: PyTorchJob, status: dict | None, now: datetime) -> float | None:
    """Seconds until the finished job is deleted (0: delete now); None when it is not to be deleted
    (no ttlSecondsAfterFinished, suspended, or not finished)."""
    ttl, done = job.run_policy.ttl_seconds_after_finished, (status or {}).get("completionTime")
    if ttl is None or job.run_policy.suspend or done is None:
        return None
    return max(0.0, ttl - (now - parse_time(done)).total_seconds())


def cleanup(job: PyTorchJob) -> str:
    """What cleanPodPolicy asks of a finished job's pods: "keep" (None), "running" (Running: delete
    the pods not finished, keep the finished ones), "delete" (All)."""
    return {"None": "keep", "Running": "running", "All": "delete"}[job.run_policy.clean_pod_policy]


# --- v1 status ------------------------------------------------------------------------------------

def next_status(previous: dict | None, job: PyTorchJob, counts: dict[str, ReplicaCounts], now: datetime, *,
                restarting: str | None = None, failed: str | None = None,
                held: tuple[str, str] | None = None) -> dict:
    """status as v1 would write it after this observation.

    `restarting`: gangctl restarts the gang (message); `failed`: gangctl failed the job (message:
    restart budget, deadline, a Never/ExitCode failure); `held`: gangctl's quota gate or Kueue holds the
    job, (reason, message): reported as Suspended with that reason. v1's transitions: Running and Restarting
    replace each other; Succeeded and Failed turn Running False; nothing changes once Failed;
    a condition keeps its lastTransitionTime while its status holds."""
    status = copy.deepcopy(previous or {})
    conditions: list[dict] = status.setdefault("conditions", [])
    at = timestamp(now)
    if _true(conditions, FAILED):
        return status

    put = functools.partial(_put, conditions, at)

    if not conditions:
        put(CREATED, True, "Created", f"PyTorchJob {job.namespace}/{job.name} was accepted by gangctl.")
    status["replicaStatuses"] = replica_statuses(job, counts)
    if failed is not None and (held is not None or job.run_policy.suspend):   # failed before it ever ran
        status.setdefault("completionTime", at)
        put(FAILED, True, "Failed", failed)
        return status
    if held is not None:   # the gate's words, or Kueue's for a job it suspended
        if _true(conditions, RUNNING):
            put(RUNNING, False, "Suspended", held[1], why=held[0])
        put(SUSPENDED, True, "Suspended", held[1], why=held[0])
        return status
    if job.run_policy.suspend:
        if _true(conditions, RUNNING):
            put(RUNNING, False, "Suspended", f"PyTorchJob {job.name} was suspended.")
        put(SUSPENDED, True, "Suspended", f"PyTorchJob {job.name} is suspended.")
        return status
    if _true(conditions, SUSPENDED):
        put(SUSPENDED, False, "Resumed", f"PyTorchJob {job.name} was resumed.")
    status.setdefault("startTime", at)
    if failed is not None or deadline_exceeded(job, status, now):
        message = failed or f"PyTorchJob {job.name} ran longer than activeDeadlineSeconds."
        status.setdefault("completionTime", at)
        put(FAILED, True, "Failed", message)
        return status
    if _true(conditions, SUCCEEDED):
        return status
    if succeeded(job, counts):
        status.setdefault("completionTime", at)
        put(SUCCEEDED, True, "Succeeded", f"PyTorchJob {job.name} completed successfully.")
        return status
    if restarting is not None:
        put(RESTARTING, True, "Restarting", restarting)
    elif running(job, counts):
        put(RUNNING, True, "Running", f"PyTorchJob {job.name} is running.")
    return status


def _put(conditions: list[dict], at: str, ctype: str, value: bool, event: str, message: str,
         why: str | None = None) -> None:
    """Set condition `ctype` in place, as v1 does (see next_status)."""
    old = next((c for c in conditions if c["type"] == ctype), None)
    flag = "True" if value else "False"
    why = why or reason(event)
    if old is not None and old["status"] == flag and old.get("reason") == why and (
            why == reason(event) or old.get("message") == message):
        return
    cond = {"type": ctype, "status": flag, "reason": why, "message": message,
            "lastUpdateTime": at,
            "lastTransitionTime": old["lastTransitionTime"] if old and old["status"] == flag else at}
    rest = []
    for c in conditions:
        if c["type"] == ctype or {ctype, c["type"]} == {RUNNING, RESTARTING}:
            continue
        if ctype in (SUCCEEDED, FAILED) and c["type"] == RUNNING and c["status"] == "True":
            c = {**c, "status": "False"}
        rest.append(c)
    conditions[:] = rest + [cond]


def _true(conditions: list[dict], ctype: str) -> bool:
    return any(c["type"] == ctype and c["status"] == "True" for c in conditions)
