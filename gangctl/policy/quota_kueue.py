"""A quota policy (`policies/*.yaml`) as Kueue objects: pure, policy in, Kubernetes objects out.

One team = one ClusterQueue (kueue.x-k8s.io/v1beta1) with one resource group over one
ResourceFlavor, a LocalQueue named `default` in each of the team's namespaces, one Cohort
(v1alpha1) per cohort name, one WorkloadPriorityClass per priority. Names are the policy's own.

How the policy's fields map:

| policy | Kueue |
|---|---|
| `nominal.{gpu,cpu,memory}` | `resourceGroups[0].flavors[0].resources[].nominalQuota` |
| `borrowingLimit` / `lendingLimit` | `borrowingLimit` / `lendingLimit` of the same resource |
| `cohort` | `spec.cohort` (and a `Cohort` object) |
| `queueing` | `spec.queueingStrategy` |
| `preemption.withinTeam` / `reclaimWithinCohort` | `spec.preemption.withinClusterQueue` / `reclaimWithinCohort` |
| `namespaces` | `spec.namespaceSelector` on `kubernetes.io/metadata.name`, and the LocalQueues |
| `priorities` | `WorkloadPriorityClass` objects |

A resource a team leaves out is "not limited" in the policy, but Kueue refuses a workload that
requests a resource its ClusterQueue does not cover. Such a resource is covered with
`UNLIMITED` nominal quota and `lendingLimit: 0`, so the team is not limited and lends no phantom
capacity to its cohort.

Team `defaultPriority` has no Kueue field (Kueue takes the priority from the job's
`kueue.x-k8s.io/priority-class` label): the backend builder sets that label, from `priority_label`.
"""
from __future__ import annotations

from gangctl.model.quota import QuotaPolicy, Resources, Team

GROUP = "kueue.x-k8s.io"
V1BETA1 = f"{GROUP}/v1beta1"
V1ALPHA1 = f"{GROUP}/v1alpha1"
FLAVOR = "default-flavor"
LOCAL_QUEUE = "default"
QUEUE_LABEL = f"{GROUP}/queue-name"
PRIORITY_LABEL = f"{GROUP}/priority-class"
MANAGED = {"gangctl.io/managed-by": "gangctl-policy"}
TEAM_LABEL = "gangctl.io/quota-team"

# Policy field -> Kubernetes resource name, and how a policy amount is written as a quantity.
RESOURCES = (("gpu", "nvidia.com/gpu"), ("cpu", "cpu"), ("memory", "memory"))
UNLIMITED = {"gpu": "1M", "cpu": "1M", "memory": "1Ei"}


_BINARY = (("Ei", 2**60), ("Pi", 2**50), ("Ti", 2**40), ("Gi", 2**30), ("Mi", 2**20), ("Ki", 2**10))


def quantity(field: str, amount: float) -> str:
    """A policy amount (GPUs, cores, GiB) as a Kubernetes quantity in the API server's canonical form
    (4096 GiB is "4Ti"), so what is applied reads back unchanged and diffs show only real changes."""
    if field == "memory":
        n = int(round(amount * 2**30))
        if n == 0:
            return "0"
        return next((f"{n // size}{suffix}" for suffix, size in _BINARY if n % size == 0), str(n))
    if float(amount).is_integer():
        return str(int(amount))
    return f"{int(round(amount * 1000))}m"


def covered_resources(policy: QuotaPolicy) -> list[tuple[str, str]]:
    """Every resource some team limits (in a fixed order): each ClusterQueue covers all of them."""
    return [(f, r) for f, r in RESOURCES
            if any(getattr(t.nominal, f) is not None for t in policy.teams)]


def _limit(limits: Resources | None, field: str) -> float | None:
    return getattr(limits, field) if limits is not None else None


def _resource_quota(team: Team, field: str, name: str) -> dict:
    nominal = getattr(team.nominal, field)
    if nominal is None:
        return {"name": name, "nominalQuota": UNLIMITED[field],
                **({"lendingLimit": "0"} if team.cohort else {})}
    out: dict = {"name": name, "nominalQuota": quantity(field, nominal)}
    borrow, lend = _limit(team.borrowing_limit, field), _limit(team.lending_limit, field)
    if borrow is not None:
        out["borrowingLimit"] = quantity(field, borrow)
    if lend is not None:
        out["lendingLimit"] = quantity(field, lend)
    return out


def _meta(name: str, namespace: str | None = None, team: str | None = None) -> dict:
    labels = dict(MANAGED)
    if team:
        labels[TEAM_LABEL] = team
    meta: dict = {"name": name, "labels": labels}
    if namespace:
        meta["namespace"] = namespace
    return meta


def resource_flavor() -> dict:
    return {"apiVersion": V1BETA1, "kind": "ResourceFlavor", "metadata": _meta(FLAVOR), "spec": {}}


def cluster_queue(policy: QuotaPolicy, team: Team) -> dict:
    covered = covered_resources(policy)
    spec: dict = {
        "namespaceSelector": {"matchExpressions": [
            {"key": "kubernetes.io/metadata.name", "operator": "In", "values": list(team.namespaces or [team.name])}]},
        "queueingStrategy": team.queueing,
        "resourceGroups": [{
            "coveredResources": [r for _, r in covered],
            "flavors": [{"name": FLAVOR, "resources": [_resource_quota(team, f, r) for f, r in covered]}],
        }],
        "preemption": {
            "withinClusterQueue": team.preemption.within_team,
            "reclaimWithinCohort": team.preemption.reclaim_within_cohort.value,
        },
    }
    if team.cohort:
        spec["cohort"] = team.cohort
    return {"apiVersion": V1BETA1, "kind": "ClusterQueue", "metadata": _meta(team.name, team=team.name), "spec": spec}


def local_queues(team: Team) -> list[dict]:
    return [{"apiVersion": V1BETA1, "kind": "LocalQueue", "metadata": _meta(LOCAL_QUEUE, ns, team.name),
             "spec": {"clusterQueue": team.name}} for ns in team.namespaces or [team.name]]


def cohorts(policy: QuotaPolicy) -> list[dict]:
    names = sorted({t.cohort for t in policy.teams if t.cohort})
    return [{"apiVersion": V1ALPHA1, "kind": "Cohort", "metadata": _meta(n), "spec": {}} for n in names]


def priority_classes(policy: QuotaPolicy) -> list[dict]:
    return [{"apiVersion": V1BETA1, "kind": "WorkloadPriorityClass", "metadata": _meta(name),
             "value": value, "description": f"gangctl quota policy priority {name!r}"}
            for name, value in sorted(policy.priorities.items(), key=lambda kv: (-kv[1], kv[0]))]


def team_namespaces(policy: QuotaPolicy) -> list[dict]:
    """The teams' namespaces (a LocalQueue needs its namespace), labelled with their team."""
    return [{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns, "labels": {TEAM_LABEL: t.name}}}
            for t in policy.teams for ns in t.namespaces or [t.name]]


def kueue_objects(policy: QuotaPolicy) -> list[dict]:
    """Everything the policy needs in Kueue, in an order that applies cleanly (referenced first)."""
    return [*team_namespaces(policy), resource_flavor(), *priority_classes(policy), *cohorts(policy),
            *(cluster_queue(policy, t) for t in policy.teams),
            *(q for t in policy.teams for q in local_queues(t))]


def priority_label(policy: QuotaPolicy, namespace: str, priority_class: str | None = None) -> str | None:
    """The WorkloadPriorityClass a job in `namespace` gets: its own class, else its team's default."""
    if priority_class:
        return priority_class
    team = next((t for t in policy.teams if namespace in (t.namespaces or [t.name])), None)
    if team is None:
        return None
    return team.default_priority or policy.default_priority
