"""gangctl's own quota gate, for the backends without a quota system (coscheduling, native): gangctl admits the jobs.

Pure: policy in, Kubernetes objects and admission decisions out. The I/O around it (reading the
policy ConfigMap, writing `status.admission`) is `gangctl.runtime.quota_gate`.

- What `gangctl policy apply` writes for these backends (the policy stored in the ConfigMap
  `gangctl-system/gangctl-quota-policy`, where this gate reads it) is each backend's own
  (gangctl.plugins.coscheduling, gangctl.plugins.quota_objects).
- `admission_record` / `admitted_workload`: a job's admission record and back. The record keeps
  what was charged (team, gang floor, priority), so usage is the same after a restart or a policy
  edit. A TrainJob keeps it in `status.admission`; a PyTorchJob, whose v1 status schema prunes
  unknown fields, in the annotation `gangctl.io/admission` (`recorded_admission` reads either).
- The decisions themselves are `gangctl.model.quota_plan.plan`: one round of `admission.decide`
  (the code the simulator runs) over the pending and the admitted TrainJobs.

The controller gates only TrainJobs in the policy's namespaces, as Kueue (with its default
`manageJobsWithoutQueueName: false`) leaves jobs without a queue alone. A job that reaches `plan`
from a namespace in no team waits with the reason "namespace X is in no team of the quota policy",
as a Kueue job whose LocalQueue does not exist stays pending.

Two rules for when the gate may decide at all (the I/O side, `gangctl.runtime.quota_gate`, applies them):
- `needs_admission` / `awaiting_start`: a gate that starts deciding (controller start, or a policy
  in force again after none) first waits until every TrainJob of the policy's namespaces that was
  in its cache and may ask for admission has been reconciled under that policy; deciding from the
  jobs reconciled so far would pass over an earlier or higher-priority job not looked at yet.
- `held_namespaces` / `invalid_policy_message`: an invalid policy with no valid one before it
  (fail closed) holds the jobs of every namespace the invalid text still names, or of every
  namespace when it names none that can be read, with the reason `QuotaPolicyInvalid`.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime
from typing import Callable, Iterable, Mapping

import yaml

from gangctl.api.quantity import format_quantity, parse_quantity
from gangctl.api.resources import TRAINJOBS
from gangctl.model.admission import Amount, Workload
from gangctl.model.quota import QuotaPolicy
from gangctl.model.quota_plan import timestamp
from gangctl.plugins.quota_objects import POLICY_CONFIGMAP, POLICY_NAMESPACE
from gangctl.policy import pytorchjob as pj
from gangctl.policy.status import finished


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


@dataclass(frozen=True)
class GatedKind:
    """What the gate reads of one job kind: where its admission record is, whether its user suspended
    it, whether it finished (a finished job holds no quota)."""

    admission: Callable[[Mapping], dict | None]
    suspended: Callable[[Mapping], bool]
    finished: Callable[[Mapping], bool]


def _annotated_admission(job: Mapping) -> dict | None:
    text = ((job.get("metadata") or {}).get("annotations") or {}).get(ADMISSION_ANNOTATION)
    try:
        record = json.loads(text) if text else None
    except ValueError:
        return None
    return record if isinstance(record, dict) and record.get("admittedAt") else None


def _spec(job: Mapping) -> Mapping:
    return job.get("spec") or {}


GATED_KINDS: dict[str, GatedKind] = {
    TRAINJOBS.kind: GatedKind(admission=lambda job: (job.get("status") or {}).get("admission"),
                              suspended=lambda job: bool(_spec(job).get("suspend")),
                              finished=lambda job: finished(job.get("status"))),
    pj.KIND: GatedKind(admission=_annotated_admission,
                       suspended=lambda job: bool((_spec(job).get("runPolicy") or {}).get("suspend")),
                       finished=lambda job: any(c.get("type") in (pj.SUCCEEDED, pj.FAILED) and c.get("status") == "True"
                                                for c in (job.get("status") or {}).get("conditions") or [])),
}


def _kind(job: Mapping) -> GatedKind:
    return GATED_KINDS.get(job.get("kind") or TRAINJOBS.kind, GATED_KINDS[TRAINJOBS.kind])


def recorded_admission(job: Mapping) -> dict | None:
    """The admission record stored on a TrainJob (status.admission) or a PyTorchJob (annotation)."""
    return _kind(job).admission(job)


def user_suspended(job: Mapping) -> bool:
    """spec.suspend of a TrainJob, spec.runPolicy.suspend of a PyTorchJob."""
    return _kind(job).suspended(job)


def job_finished(job: Mapping) -> bool:
    """Complete/Failed (TrainJob) or Succeeded/Failed (PyTorchJob): a finished job holds no quota."""
    return _kind(job).finished(job)


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


def grown_record(admission: Mapping, per_node: Mapping[str, Amount], nodes: int) -> dict:
    """`status.admission` of a gang grown to `nodes`: charged for them, its admission time kept
    (it orders preemption victims)."""
    return {**admission, "nodes": nodes,
            "requests": {r: format_quantity(a * nodes) for r, a in sorted(per_node.items())}}
