"""A quota policy for the coscheduling backend, which has no quota system: gangctl admits the jobs.

Pure: policy in, Kubernetes objects and admission decisions out. The I/O around it (reading the
policy ConfigMap, writing `status.admission`) is `gangctl.runtime.quota_gate`.

- `coscheduling_objects`: what `gangctl policy apply --backend coscheduling` applies: the policy
  itself in the ConfigMap `gangctl-system/gangctl-quota-policy` (key `policy.yaml`), the teams'
  namespaces labelled with their team (as for Kueue and Volcano), and one `scheduling.k8s.io/v1`
  PriorityClass per policy priority (the same objects as for Volcano), so pods may name them.
  Volcano stores the policy too (`stored_policy`): gangctl preempts for priority there
  (gangctl.policy.volcano_preemption).
- `admission_record` / `admitted_workload`: a job's admission record and back. The record keeps
  what was charged (team, gang floor, priority), so usage is the same after a restart or a policy
  edit. A TrainJob keeps it in `status.admission`; a PyTorchJob, whose v1 status schema prunes
  unknown fields, in the annotation `gangctl.io/admission` (`recorded_admission` reads either).
- `plan`: one round of `admission.decide` (the code the simulator runs) over the pending and the
  admitted TrainJobs, with a reason for every job that waits.
  An elastic gang is decided on its floor; once admitted it also gets the nodes up to its maximum
  that the quota still has room for, and never runs more than it was admitted with.

The controller gates only TrainJobs in the policy's namespaces, as Kueue (with its default
`manageJobsWithoutQueueName: false`) leaves jobs without a queue alone. A job that reaches `plan`
from a namespace in no team waits with the reason "namespace X is in no team of the quota policy",
as a Kueue job whose LocalQueue does not exist stays pending.

Two rules for when the gate may decide at all (the I/O side, `quota_gate`, applies them):
- `needs_admission` / `awaiting_start`: a gate that starts deciding (controller start, or a policy
  in force again after none) first waits until every TrainJob of the policy's namespaces that was
  in its cache and may ask for admission has been reconciled under that policy; deciding from the
  jobs reconciled so far would pass over an earlier or higher-priority job not looked at yet.
- `held_namespaces` / `invalid_policy_message`: an invalid policy with no valid one before it
  (fail closed) holds the jobs of every namespace the invalid text still names, or of every
  namespace when it names none that can be read, with the reason `QuotaPolicyInvalid`.
"""
from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from datetime import datetime
from typing import Callable, Iterable, Mapping

import yaml

from gangctl.api.quantity import format_quantity, parse_quantity
from gangctl.model.admission import (Amount, Decision, Quotas, Verdict, Workload, decide, headroom, queue_key,
                                      usage_of)
from gangctl.model.quota import QuotaPolicy
from gangctl.policy.quota_kueue import MANAGED, team_namespaces
from gangctl.policy.quota_volcano import priority_classes
from gangctl.policy import pytorchjob as pj
from gangctl.policy.status import finished

POLICY_NAMESPACE = "gangctl-system"
POLICY_CONFIGMAP = "gangctl-quota-policy"
POLICY_KEY = "policy.yaml"


def policy_configmap(text: str) -> dict:
    return {"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": POLICY_CONFIGMAP, "namespace": POLICY_NAMESPACE, "labels": dict(MANAGED)},
            "data": {POLICY_KEY: text}}


def stored_policy(text: str) -> list[dict]:
    """The policy YAML `text` where the controller reads it: gangctl-system, then the ConfigMap."""
    system = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": POLICY_NAMESPACE}}
    return [system, policy_configmap(text)]


def coscheduling_objects(policy: QuotaPolicy, text: str) -> list[dict]:
    """Everything `policy apply` writes for coscheduling; `text` is the policy YAML to store."""
    return [*team_namespaces(policy), *priority_classes(policy), *stored_policy(text)]


# The Running=False reasons of a TrainJob the gate holds.
WAITING_FOR_QUOTA = "WaitingForQuota"
POLICY_INVALID = "QuotaPolicyInvalid"


def held_namespaces(text: str | None) -> frozenset[str] | None:
    """The namespaces an invalid policy text still names: each team's `namespaces` (a string counts
    as one), else its `name` (a team's namespace by default). None when it names none that can be
    read (not YAML, no list of teams, no key at all): the gate then holds every namespace."""
    try:
        data = yaml.safe_load(text) if text is not None else None
    except yaml.YAMLError:
        return None
    teams = data.get("teams") if isinstance(data, dict) else None
    out: set[str] = set()
    for team in teams if isinstance(teams, list) else []:
        if not isinstance(team, dict):
            continue
        names = team.get("namespaces")
        if isinstance(names, str):
            names = [names]
        if not isinstance(names, list) or not names:
            names = [team.get("name")]
        out.update(n for n in names if isinstance(n, str) and n)
    return frozenset(out) or None


def invalid_policy_message(error: str, namespaces: frozenset[str] | None) -> str:
    """Why a held job waits while the stored policy is invalid and no valid one was ever loaded."""
    scope = (f"namespace{'s' if len(namespaces) > 1 else ''} {', '.join(sorted(namespaces))}"
             if namespaces is not None else "any namespace (it names none that can be read)")
    return (f"the quota policy in ConfigMap {POLICY_NAMESPACE}/{POLICY_CONFIGMAP} is invalid and no valid policy "
            f"was loaded before, so gangctl admits no job of {scope}: {error}. Check the file with "
            f"`gangctl policy validate FILE` and store it again with `gangctl policy apply FILE --backend "
            f"coscheduling` (or delete the ConfigMap to run without quota)")


# Where a PyTorchJob's admission record is kept, as JSON (written only by the gate, under its own
# field manager): v1's status schema has no field for it and prunes unknown ones.
ADMISSION_ANNOTATION = "gangctl.io/admission"


def recorded_admission(job: Mapping) -> dict | None:
    """The admission record stored on a TrainJob (status.admission) or a PyTorchJob (annotation)."""
    if job.get("kind") != pj.KIND:
        return (job.get("status") or {}).get("admission")
    text = ((job.get("metadata") or {}).get("annotations") or {}).get(ADMISSION_ANNOTATION)
    try:
        record = json.loads(text) if text else None
    except ValueError:
        return None
    return record if isinstance(record, dict) and record.get("admittedAt") else None


def user_suspended(job: Mapping) -> bool:
    """spec.suspend of a TrainJob, spec.runPolicy.suspend of a PyTorchJob."""
    spec = job.get("spec") or {}
    return bool((spec.get("runPolicy") or {}).get("suspend") if job.get("kind") == pj.KIND else spec.get("suspend"))


def job_finished(job: Mapping) -> bool:
    """Complete/Failed (TrainJob) or Succeeded/Failed (PyTorchJob): a finished job holds no quota."""
    if job.get("kind") != pj.KIND:
        return finished(job.get("status"))
    return any(c.get("type") in (pj.SUCCEEDED, pj.FAILED) and c.get("status") == "True"
               for c in (job.get("status") or {}).get("conditions") or [])


def needs_admission(job: Mapping, admission: Mapping | None) -> bool:
    """Whether a job may ask for admission: none recorded, not finished, not being deleted and not
    suspended by the user."""
    return (admission is None and not job_finished(job)
            and not (job.get("metadata") or {}).get("deletionTimestamp") and not user_suspended(job))


def awaiting_start(expected: Iterable[str], trainjobs: Mapping[str, Mapping], seen: set[str],
                   admission_of: Callable[[Mapping], Mapping | None]) -> set[str]:
    """Of the TrainJobs a starting gate expects to hear about (`expected`: those of its namespaces
    that needed admission when it started), the ones still to be reconciled: not `seen` (reconciled
    since), still there and still needing admission (`admission_of`: the gate's view of
    status.admission). The gate decides nothing while this is not empty."""
    out = set()
    for key in expected:
        tj = trainjobs.get(key)
        if key not in seen and tj is not None and needs_admission(tj, admission_of(tj)):
            out.add(key)
    return out


def no_team_reason(namespace: str) -> str:
    return f"namespace {namespace} is in no team of the quota policy"


def priority_value(policy: QuotaPolicy, namespace: str, priority_class: str | None) -> int:
    """A job's priority: its pods' priorityClassName if the policy names that class, else its team's
    default priority, else the policy's default (a class the policy does not know counts as none)."""
    if priority_class and priority_class in policy.priorities:
        return policy.priorities[priority_class]
    team = policy.team_of_namespace(namespace)
    return policy.priority_of(team) if team else policy.priorities[policy.default_priority]


def timestamp(value: str) -> float:
    """An RFC 3339 time (metadata.creationTimestamp, admittedAt) as epoch seconds."""
    return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()


def rfc3339(now: datetime) -> str:
    return now.strftime("%Y-%m-%dT%H:%M:%S.%fZ") if now.microsecond else now.strftime("%Y-%m-%dT%H:%M:%SZ")


def admission_record(team: str, requests: Mapping[str, Amount], priority: int, now: datetime,
                     nodes: int | None = None) -> dict:
    """The `status.admission` of a TrainJob admitted now (requests as Kubernetes quantities;
    `nodes`: how many nodes an elastic gang is admitted with, the most it may run)."""
    record = {"team": team, "admittedAt": rfc3339(now), "priority": priority,
              "requests": {r: format_quantity(a) for r, a in sorted(requests.items())}}
    if nodes is not None:
        record["nodes"] = nodes
    return record


def admitted_workload(policy: QuotaPolicy, key: str, namespace: str, admission: Mapping) -> Workload:
    """An admitted TrainJob as `decide` sees it: the team owning its namespace now (the recorded
    team if the namespace left the policy), what was charged, created = admission time."""
    team = policy.team_of_namespace(namespace) or admission["team"]
    requests = {r: parse_quantity(q) for r, q in (admission.get("requests") or {}).items()}
    return Workload(key, team, int(admission.get("priority") or 0), timestamp(admission["admittedAt"]), requests)


@dataclass(frozen=True, slots=True)
class NodeRange:
    """An elastic gang's range: admitted with its floor, plus as many nodes up to `max_nodes` as the
    quota has room for then (Kueue's partial admission, the other way round)."""

    min_nodes: int
    max_nodes: int
    per_node: Mapping[str, Amount]


@dataclass(frozen=True, slots=True)
class Pending:
    """A TrainJob that asks to be admitted: `requests` is its gang floor in QUANTITY_UNITS."""

    key: str
    namespace: str
    created: float
    priority: int
    requests: Mapping[str, Amount]
    elastic: NodeRange | None = None


@dataclass(frozen=True, slots=True)
class Plan:
    decisions: list[Decision]   # ADMIT and PREEMPT, in the order to carry them out; an elastic
                                # gang's workload carries what it is admitted with (floor + surplus)
    reasons: dict[str, str]     # key -> why it waits (every pending job that is not admitted)
    nodes: dict[str, int] = field(default_factory=dict)   # key -> nodes admitted (elastic gangs)


def plan(policy: QuotaPolicy, quotas: Quotas, pending: Iterable[Pending], admitted: Iterable[Workload]) -> Plan:
    """One admission round. `quotas` is `policy.to_quotas(QUANTITY_UNITS)`."""
    admitted = list(admitted)
    queues: dict[str, list[Workload]] = {}
    reasons: dict[str, str] = {}
    for p in pending:
        team = policy.team_of_namespace(p.namespace)
        if team is None:
            reasons[p.key] = no_team_reason(p.namespace)
            continue
        queues.setdefault(team, []).append(Workload(p.key, team, p.priority, p.created, p.requests))
    for queue in queues.values():
        queue.sort(key=queue_key)
    by_team: dict[str, list[Workload]] = {}
    for w in admitted:
        by_team.setdefault(w.team, []).append(w)
    decisions = decide(quotas, usage_of(admitted), queues, by_team if quotas.preemption_enabled else None)
    heads: dict[str, str] = {}
    out: list[Decision] = []
    for d in decisions:
        if d.verdict is Verdict.WAIT:
            reasons[d.workload.id] = d.reason
            heads.setdefault(d.workload.team, d.workload.id)
        else:
            out.append(d)
    decided = {d.workload.id for d in decisions}
    for team, queue in queues.items():
        for w in queue:
            if w.id not in decided:  # StrictFIFO: behind its team's first blocked job, not examined
                reasons[w.id] = f"queued behind {heads.get(team, 'an earlier job')} in team {team}'s StrictFIFO queue"
    out, nodes = _grow_elastic(quotas, out, admitted, {p.key: p.elastic for p in pending if p.elastic})
    return Plan(out, reasons, nodes)


def _grow_elastic(quotas: Quotas, decisions: list[Decision], admitted: list[Workload],
                  elastic: Mapping[str, NodeRange]) -> tuple[list[Decision], dict[str, int]]:
    """Give each admitted elastic gang, in decision order, the nodes above its floor that the quota
    still has room for once every decision of the round is charged. What it is admitted with is
    what it may run: the controller never grows it past that (no quota is taken unseen)."""
    if not elastic:
        return decisions, {}
    evicted = {v.id for d in decisions for v in d.victims}
    usage = usage_of([*(w for w in admitted if w.id not in evicted), *(d.workload for d in decisions)])
    out: list[Decision] = []
    nodes: dict[str, int] = {}
    for d in decisions:
        e = elastic.get(d.workload.id)
        if e is None:
            out.append(d)
            continue
        n = nodes[d.workload.id] = _take_room(quotas, usage, d.workload.team, e, e.min_nodes)
        requests = {r: amount * n for r, amount in e.per_node.items()}
        out.append(dataclasses.replace(d, workload=dataclasses.replace(d.workload, requests=requests)))
    return out, nodes


@dataclass(frozen=True, slots=True)
class Growable:
    """An admitted elastic gang below its maximum: `workload` as charged now, `nodes` admitted."""

    workload: Workload
    nodes: int
    range: NodeRange


def grow(quotas: Quotas, admitted: Iterable[Workload], growable: Iterable[Growable],
         waiting_teams: set[str]) -> dict[str, int]:
    """Admitted elastic gangs take the room their team's quota has now (as the simulator's elastic
    jobs do), highest priority then earliest admitted first, only in teams where no job waits for
    admission (a waiting job comes first). key -> the nodes it is admitted with from now on."""
    usage = usage_of(admitted)
    out: dict[str, int] = {}
    for g in sorted(growable, key=lambda g: queue_key(g.workload)):
        if g.workload.team in waiting_teams:
            continue
        n = _take_room(quotas, usage, g.workload.team, g.range, g.nodes)
        if n > g.nodes:
            out[g.workload.id] = n
    return out


def grown_record(admission: Mapping, per_node: Mapping[str, Amount], nodes: int) -> dict:
    """`status.admission` of a gang grown to `nodes`: charged for them, its admission time kept
    (it orders preemption victims)."""
    return {**admission, "nodes": nodes,
            "requests": {r: format_quantity(a * nodes) for r, a in sorted(per_node.items())}}


def _take_room(quotas: Quotas, usage: dict[str, dict[str, Amount]], team: str, e: NodeRange, nodes: int) -> int:
    """The most nodes (from `nodes` up to `e.max_nodes`) the team's room allows; charges the extra."""
    room = headroom(quotas, usage, team)
    extra = e.max_nodes - nodes
    for r, amount in e.per_node.items():
        if amount and r in room:
            extra = min(extra, int(room[r] // amount))
    extra = max(0, extra)
    team_usage = usage.setdefault(team, {})
    for r, amount in e.per_node.items():
        team_usage[r] = team_usage.get(r, 0) + amount * extra
    return nodes + extra
