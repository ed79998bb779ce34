"""The controller's own decision for simulated jobs: the simulator's observe → decide → apply.

Whenever the controller would decide something about a job — the gang it creates (and what it asks
the quota for), whether a failed run restarts or fails the job, how far an elastic job shrinks when
it loses nodes, whether it probes for one more node — the simulator builds the `Snapshot` the
reconciler would observe on the cluster, runs the decision of the job's kind on it
(`gangctl.policy.decide.decide`, `gangctl.policy.decide_pytorchjob.decide`) with the scenario's
backend, and reads the `Plan` back:

- observe: the TrainJob exactly as `gangctl.sim.replay` submits it to a real cluster, the shipped
  runtime it names with its podGroupPolicy naming the scenario's backend (with gangctl's
  elasticPolicy when the scenario makes the job elastic, and the scenario's restart budget as
  failurePolicy.maxRestarts), or a PyTorchJob of Worker replicas (`pytorchjob_manifest`) with that
  backend as the controller's gang scheduler; the restarts earlier decisions wrote; and the node Job
  and pods as the Job controller would show them at that moment (a PyTorchJob's pods, which gangctl
  makes itself, as they would show);
- apply: the engine takes from the plan the gang (its floor as the backend's own module reads it
  from the gang's object, `GangBackend.gang_floor`; one pod's requests and the Job's parallelism
  from the node Job, or the Worker pods a PyTorchJob's plan makes), Failed or Restarting (a
  PyTorchJob's judgement, from its annotation), and the new size; it keeps what the plans wrote
  (`Written`) for the next snapshots.

Nothing the controller decides is re-implemented here; the engine models only what Kubernetes and
the workload do (placement, run time, faults). `decide` is pure, so every answer is memoized on what
its snapshot is built from (the job's kind and shape, the restarts used, the sizes): jobs alike in those get
one call, which keeps the simulator at its speed. `memo=False` asks every time (the parity tests run
both ways and compare).
"""
from __future__ import annotations

import copy
import dataclasses
import json
import math
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Callable, TypeVar, cast

from gangctl.api.trainjob import TRAINJOB_KIND
from gangctl.model.gang import Gang
from gangctl.model.names import TRAINJOB_NAME
from gangctl.model.resolve import pod_requests as template_requests
from gangctl.plugins.registry import BACKENDS
from gangctl.plugins.kueue import DEFAULT_LOCAL_QUEUE, QUEUE_LABEL, Kueue
from gangctl.policy import decide_pytorchjob
from gangctl.policy import status as st
from gangctl.policy.decide import Apply, Create, Patch, Plan, Snapshot, decide
from gangctl.policy.decide_pytorchjob import ELASTIC_ANNOTATION, RESTARTS_ANNOTATION
from gangctl.policy.pytorchjob import REPLICA_TYPE
from gangctl.policy.failure import Restarts
from gangctl.sim import objects
from gangctl.sim.replay import RUNTIME, resource_requests, trainjob_manifest, trainjob_name
from gangctl.sim.scenario import ElasticSpec
from gangctl.sim.traces import TraceJob
from gangctl.sim.units import in_sim_units, pod_requests

T = TypeVar("T")
# The simulator's clock is seconds from 0; the controller's is a datetime.
EPOCH = datetime(2000, 1, 1, tzinfo=timezone.utc)


def at(seconds: float) -> datetime:
    return EPOCH + timedelta(seconds=seconds)


def elastic_floor(spec: TraceJob, elastic: ElasticSpec) -> int | None:
    """minNodes of a job when the scenario makes multi-node jobs elastic (None: a rigid gang). This is
    the workload's choice (what the user writes in the runtime, or in a PyTorchJob's elasticPolicy),
    not a decision of the controller."""
    if elastic.enabled and spec.num_nodes > 1:
        return max(1, math.ceil(spec.num_nodes * elastic.min_fraction))
    return None


def runtime_for(floor: int | None, num_nodes: int, restart_budget: int, backend: str) -> dict:
    """The shipped runtime as a scenario job runs on it: its podGroupPolicy names the scenario's
    `backend` (the shipped one's settings when it names that backend already, else none), gangctl's
    elasticPolicy extension when elastic, and the scenario's restart budget."""
    shipped = objects.runtime(RUNTIME)["spec"]["podGroupPolicy"]
    return objects.runtime(RUNTIME, gang=None if backend in shipped else {backend: {}},
                           failure_policy={"maxRestarts": restart_budget},
                           elastic=None if floor is None else {"minNodes": floor, "maxNodes": num_nodes})


@dataclass(frozen=True)
class Written:
    """What the controller's plans wrote to a job's status that its later snapshots show: the
    restarts (user, infrastructure) and status.elastic.lastShrinkTime (simulated seconds; None: it
    never shrank). The engine keeps this of a job, as the plans wrote it, and nothing beside it."""

    restarts: tuple[int, int] = (0, 0)
    last_shrink: float | None = None

    def on(self, obj: dict) -> dict:
        """`obj` showing these restarts where its kind keeps them: a TrainJob's status, a PyTorchJob's
        annotation (v1's status has no field for them)."""
        user, infrastructure = self.restarts
        restarts = Restarts(user=user, infrastructure=infrastructure).to_status()
        if obj["kind"] == TRAINJOB_KIND:
            return {**obj, "status": {"restarts": restarts, "restartCount": user}}
        return _annotated(obj, RESTARTS_ANNOTATION, restarts)


@dataclass(frozen=True)
class Observed:
    """One job as the reconciler would find it: what every snapshot of it starts from."""

    job: dict               # the TrainJob or PyTorchJob, as submitted
    runtime: dict | None    # a TrainJob's runtime (None: a PyTorchJob, which carries its own spec)
    node_job: dict          # the Job the controller creates for its pods (the gang plan's), before any status;
                            # a PyTorchJob's Worker pods as one Job-shaped view (`_pods_as_job`)
    backend: str            # the gang backend the job runs under (the cluster serves it, no group yet)

    def snapshot(self, now: float, *, obj: dict | None = None, job: dict | None = None,
                 pods: tuple[dict, ...] = ()) -> Snapshot:
        """What a pass would read at `now`: the job as earlier plans left it (`obj`; None: as
        submitted), `job` (its pods' Job, None: not created yet) and `pods`."""
        meta = self.job["metadata"]
        obj = self.job if obj is None else obj
        key = f"{meta['namespace']}/{meta['name']}"
        if self.runtime is None:   # v1's --gang-scheduler-name names the backend; its pods are its own
            return Snapshot(key, at(now), obj, pods=pods, groups={self.backend: None}, gang_scheduler=self.backend)
        return Snapshot(key, at(now), obj, runtime=self.runtime, node_job=job, pods=pods, groups={self.backend: None})

    def decide(self, snapshot: Snapshot) -> Plan:
        """The pass of the job's kind: the reconciler's `decide` for it."""
        return decide(snapshot) if self.runtime is not None else decide_pytorchjob.decide(snapshot)

    def elastic_range(self) -> tuple[int, int] | None:
        """(minNodes, maxNodes) of an elastic job as its author wrote them; None: rigid."""
        if self.runtime is None:
            policy = self.job["spec"].get("elasticPolicy")
            return None if policy is None else (policy["minReplicas"], policy["maxReplicas"])
        policy = self.runtime["spec"]["mlPolicy"].get("torch", {}).get("elasticPolicy")
        return None if policy is None else (policy["minNodes"], policy["maxNodes"])

    def sized(self, pods: int, last_shrink: float | None) -> dict:
        """The job showing the sizing memory earlier plans wrote (running `pods`, last shrunk at
        `last_shrink`): a TrainJob's status.elastic, a PyTorchJob's annotation."""
        floor, top = self.elastic_range() or (pods, pods)
        memo: dict = {"size": pods}
        if last_shrink is not None:
            memo["lastShrinkTime"] = st.timestamp(at(last_shrink))
        if self.runtime is not None:
            return {**self.job, "status": {"elastic": {"currentNodes": pods, "minNodes": floor, "maxNodes": top, **memo}}}
        return _annotated(self.job, ELASTIC_ANNOTATION, memo)

    def attempt(self, n: int, parallelism: int, failed: bool = False) -> dict | None:
        """The node Job of attempt `n` with `parallelism` pods, Failed when `failed` (None for a
        PyTorchJob: gangctl makes its pods, `pod` shows them)."""
        if self.runtime is None:
            return None
        job = copy.deepcopy(self.node_job)
        job["metadata"]["uid"] = f"{self.job['metadata']['uid']}-attempt-{n}"
        job["spec"]["parallelism"] = job["spec"]["completions"] = parallelism
        job["status"] = {"conditions": [{"type": "Failed", "status": "True", "reason": "BackoffLimitExceeded"}]
                         if failed else [], "failed": 1 if failed else 0}
        return job

    def pod(self, attempt: dict | None, index: int, **kw) -> dict:
        """Pod `index` of the attempt, bound to a node (`worker`'s keywords): a TrainJob's made by its node
        Job `attempt`, a PyTorchJob's Worker made by gangctl."""
        if attempt is not None:
            return worker(attempt, index, **kw)
        disrupted = kw.pop("disrupted", False)
        return objects.pytorchjob_pod(self.job, "Worker", index, node=f"node-{index}",
                                      disrupted="DeletionByPodGC" if disrupted else None, **kw)


def _pods_as_job(plan: Plan) -> dict:
    """The Worker pods a PyTorchJob's first plan makes, in the shape the engine reads a node Job:
    their number as its parallelism, one of them as its template."""
    pods = [c.obj for c in plan.of(Create) if c.obj.get("kind") == "Pod"
            and (c.obj["metadata"].get("labels") or {}).get(REPLICA_TYPE) == "worker"]
    if not pods:
        raise AssertionError(f"the controller's plan makes no Worker pod: {plan.steps}")
    return {"metadata": {"name": pods[0]["metadata"]["name"], "annotations": {}},
            "spec": {"parallelism": len(pods), "completions": len(pods),
                     "template": {"metadata": pods[0]["metadata"], "spec": pods[0]["spec"]}}}


def _annotated(obj: dict, key: str, value: dict) -> dict:
    """`obj` with `value` as JSON in its annotation `key`, as the PyTorchJob decision writes its memory
    there (v1's status schema prunes fields it does not know)."""
    meta = obj["metadata"]
    text = json.dumps(value, sort_keys=True, separators=(",", ":"))
    return {**obj, "metadata": {**meta, "annotations": {**meta.get("annotations", {}), key: text}}}


def unplaced(obs: Observed, job: dict | None, index: int, since: float) -> dict:
    """Pod `index` of the attempt waiting for a node: unschedulable since `since` (a lost worker's
    replacement, or a probe, that finds no room)."""
    pod = obs.pod(job, index, phase="Pending")
    del pod["spec"]["nodeName"]
    pod["status"]["conditions"] = [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                                    "lastTransitionTime": st.timestamp(at(since))}]
    return pod


def worker(job: dict, index: int, *, phase: str = "Running", disrupted: bool = False,
           exit_code: int | None = None) -> dict:
    """Pod `index` of `job`, bound to a node, as the Job controller and the kubelet show it: labelled
    with the job's name (a TrainJob's label, or a PyTorchJob's pod template labels)."""
    labels = job["metadata"]["labels"]
    named = ({TRAINJOB_NAME: labels[TRAINJOB_NAME]} if TRAINJOB_NAME in labels
             else job["spec"]["template"]["metadata"]["labels"])
    return objects.job_pod(job, index, labels=named, node=f"node-{index}", phase=phase,
                           disrupted="DeletionByPodGC" if disrupted else None, exit_code=exit_code)


class SimController:
    """Asks `decide` what the controller does with a simulated job (see the module docstring)."""

    def __init__(self, elastic: ElasticSpec, restart_budget: int, *, backend: str, memo: bool = True,
                 on_plan: Callable[[str, Snapshot, Plan], None] | None = None) -> None:
        self.backend = BACKENDS[backend]     # the scenario's: the runtime names it, its module reads the gang
        self.elastic = elastic
        self.restart_budget = restart_budget
        self.memo = memo
        self.on_plan = on_plan          # sees every decision (the parity tests)
        self.calls = 0
        self._observed: dict[tuple, Observed] = {}
        self._answers: dict[tuple, object] = {}

    # --- observe ---------------------------------------------------------------------------------
    def _shape(self, spec: TraceJob) -> tuple:
        """What a snapshot of `spec` depends on: jobs of one shape get the same plans."""
        return (spec.kind, spec.num_nodes, tuple(sorted(pod_requests(spec).items())), elastic_floor(spec, self.elastic))

    def observed(self, spec: TraceJob) -> Observed:
        shape = self._shape(spec)
        found = self._observed.get(shape) if self.memo else None
        if found is None:
            name, floor = self.backend.name, elastic_floor(spec, self.elastic)
            if spec.kind == TRAINJOB_KIND:
                obj = trainjob_manifest(spec, runtime=RUNTIME, namespace=spec.group)
                runtime: dict | None = runtime_for(floor, spec.num_nodes, self.restart_budget, name)
            else:
                obj, runtime = pytorchjob_manifest(spec, self.restart_budget, floor, name), None
            obj["metadata"].update(uid=f"uid-{spec.id}", creationTimestamp=st.timestamp(EPOCH), generation=1)
            unmade = Observed(obj, runtime, {}, name)
            first = self._decide("create", unmade, unmade.snapshot(0.0))
            node_job = _written(first, "Job") if runtime is not None else _pods_as_job(first)
            if runtime is not None:
                node_job["metadata"]["labels"] = {**node_job["metadata"].get("labels", {}),
                                                  TRAINJOB_NAME: obj["metadata"]["name"]}
            found = Observed(obj, runtime, node_job, name)
            self._answers[(shape, "create")] = first
            self._observed[shape] = found
        return found

    def _decide(self, what: str, obs: Observed, snapshot: Snapshot) -> Plan:
        self.calls += 1
        plan = obs.decide(snapshot)
        if self.on_plan is not None:
            self.on_plan(what, snapshot, plan)
        return plan

    def _ask(self, key: tuple, answer: Callable[[], T]) -> T:
        if not self.memo:
            return answer()
        if key not in self._answers:
            self._answers[key] = answer()
        return cast(T, self._answers[key])

    # --- decide, and read the plan ---------------------------------------------------------------
    def gang(self, spec: TraceJob) -> Gang:
        """The gang the controller creates for `spec`: its floor as the backend reads it from the
        gang's object (a PodGroup's minMember, Kueue's min-parallelism of the Job), its node Job's
        parallelism and one pod's requests (in the simulator's units)."""
        obs = self.observed(spec)

        def answer() -> Gang:
            plan = self._answers.get((self._shape(spec), "create")) if self.memo else None
            plan = plan or self._decide("create", obs, obs.snapshot(0.0))
            job = _written(plan, "Job") if obs.runtime is not None else _pods_as_job(plan)
            resource = self.backend.group_resource
            group = None if resource is None else _written(plan, resource.kind, resource.api_version)
            return Gang(min_member=self.backend.gang_floor(group, job), size=job["spec"]["parallelism"],
                        per_pod=in_sim_units(template_requests(job["spec"]["template"]["spec"])))
        return self._ask((self._shape(spec), "gang"), answer)

    def judge(self, spec: TraceJob, cause: str, pods: int, written: Written) -> tuple[bool, Written]:
        """The Job of `spec` (`pods` pods) failed: `cause` "exit" (a worker exited non-zero) or "loss"
        (a node of the gang was lost); `written`: what its status shows. Returns whether the controller
        restarts the job (False: it fails it, the restart budget spent) and what its status shows after
        this decision."""
        def answer() -> tuple[bool, tuple[int, int]]:
            obs = self.observed(spec)
            job = obs.attempt(sum(written.restarts), pods, failed=True)
            pod = (obs.pod(job, 0, phase="Failed", exit_code=1) if cause == "exit"
                   else obs.pod(job, 0, phase="Failed", disrupted=True))
            plan = self._decide(cause, obs, obs.snapshot(0.0, obj=Written(written.restarts).on(obs.job), job=job,
                                                         pods=(pod,)))
            return _judged(plan)
        restart, restarts = self._ask((self._shape(spec), cause, pods, written.restarts), answer)
        return restart, dataclasses.replace(written, restarts=restarts)

    def size_after_loss(self, spec: TraceJob, pods: int, lost: int, now: float,
                        written: Written) -> tuple[int | None, Written]:
        """An elastic job running `pods` pods lost `lost` of them at `now` (the engine does not track
        indexes: the highest ones), and their replacements find no node (the engine places a job's
        pods only when it grows). The size the controller shrinks its Job to, or None when it cannot
        keep running there (rigid, or it waits at minNodes for replacements: the engine restarts the
        gang); with what its status shows once the shrink is carried out."""
        def answer() -> tuple[int | None, float | None]:
            obs = self.observed(spec)
            if obs.elastic_range() is None:
                return None, None
            job = obs.attempt(1, pods)
            keep = pods - lost
            replacements = tuple(unplaced(obs, job, pods + i, -60.0) for i in range(lost))
            snapshot = obs.snapshot(0.0, obj=obs.sized(pods, None), job=job,
                                    pods=(*(obs.pod(job, i, disrupted=i >= keep) for i in range(pods)), *replacements))
            plan = self._decide("shrink", obs, snapshot)
            if _sizing(plan).get("size") != keep:
                return None, None
            stamp = _sizing(plan).get("lastShrinkTime")
            return keep, None if stamp is None else (st.parse_time(stamp) - snapshot.now).total_seconds()
        size, shrunk_after = self._ask((self._shape(spec), "shrink", pods, lost), answer)
        if size is None or shrunk_after is None:
            return size, written
        return size, dataclasses.replace(written, last_shrink=now + shrunk_after)

    def grows(self, spec: TraceJob, pods: int, now: float, written: Written) -> bool:
        """Whether the controller probes an elastic job running `pods` healthy pods for one more node
        at `now` (`written`: what its status shows, its last shrink). Asked every time: it depends on
        the clock."""
        obs = self.observed(spec)
        job = obs.attempt(1, pods)
        plan = self._decide("grow", obs, obs.snapshot(now, obj=obs.sized(pods, written.last_shrink), job=job,
                                                      pods=tuple(obs.pod(job, i) for i in range(pods))))
        return _sizing(plan).get("size") == pods + 1


def _written(plan: Plan, kind: str, api_version: str | None = None) -> dict:
    """The one object of `kind` (and `api_version`, when given) the plan applies or creates."""
    objs = [copy.deepcopy(s.obj) for s in (*plan.of(Apply), *plan.of(Create)) if s.obj.get("kind") == kind
            and api_version in (None, s.obj.get("apiVersion"))]
    if len(objs) != 1:
        raise AssertionError(f"the controller's plan writes {len(objs)} {kind}(s), expected one: {plan.steps}")
    return objs[0]


def _judged(plan: Plan) -> tuple[bool, tuple[int, int]]:
    """Whether the plan restarts a failed job (False: it fails it) and the restarts it records: a
    TrainJob's in its status, a PyTorchJob's judgement in its annotation (the next pass carries it out)."""
    patches = [s.patch for s in plan.of(Patch) if RESTARTS_ANNOTATION in s.patch.get("metadata", {}).get("annotations", {})]
    if patches:
        after = decide_pytorchjob.restarts_of(patches[0])
        return after.last_failure.get("action") == "Restart", (after.user, after.infrastructure)
    after = Restarts.from_status(plan.status)
    return not st.is_true(plan.status, st.FAILED), (after.user, after.infrastructure)


def pytorchjob_manifest(spec: TraceJob, restart_budget: int, floor: int | None, backend: str) -> dict:
    """The PyTorchJob that runs `spec`: `num_nodes` Worker replicas (Worker 0 is rank 0), elastic down
    to `floor` workers when given (elasticPolicy), restarted on failure up to the scenario's restart
    budget (runPolicy.backoffLimit), each pod requesting what the simulator charges. It names no
    backend: the controller's gang scheduler (the scenario's `backend`) takes it, as v1's
    --gang-scheduler-name; under Kueue it names its team's LocalQueue, as Kueue requires."""
    workers = objects.replica(spec.num_nodes, image="busybox", command=["sleep", f"{spec.duration:.3f}"],
                              requests=resource_requests(spec), restartPolicy="OnFailure")
    elastic = {} if floor is None else {"elasticPolicy": {"minReplicas": floor, "maxReplicas": spec.num_nodes}}
    obj = objects.pytorchjob(trainjob_name(spec.id), {"Worker": workers}, namespace=spec.group,
                             runPolicy={"backoffLimit": restart_budget}, **elastic)
    if backend == Kueue.name:
        obj["metadata"]["labels"] = {QUEUE_LABEL: DEFAULT_LOCAL_QUEUE}
    return obj


def _sizing(plan: Plan) -> dict:
    """The sizing memory the plan writes ({}: none): a TrainJob's status.elastic, or a PyTorchJob's
    annotation (a resize is written there alone; the next pass applies the Job at its size)."""
    for patch in plan.of(Patch):
        if ELASTIC_ANNOTATION in (text := patch.patch.get("metadata", {}).get("annotations", {})):
            return json.loads(text[ELASTIC_ANNOTATION])
    return (plan.status or {}).get("elastic") or {}
