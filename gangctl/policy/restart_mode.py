"""How a rigid TrainJob's gang restarts after a user failure when its runtime does not say
(`gangctl.io/restart` unset): in place where the nodes can and the runtime's failure rules would
not be bypassed, else recreated (docs/elastic-and-failures.md).

In place needs a container restart rule with the action `RestartAllContainers` on the trainer
(KEP-5532), which only a kubelet that declares `RestartAllContainersOnContainerExits` in
`node.status.declaredFeatures` carries out; kube-scheduler keeps a pod with such a rule off the nodes
that do not declare it. So gangctl restarts in place by default only when every node the pods may land
on declares it (and there is at least one): the rule then never costs the gang a node. And only when
the runtime allows restarts (`failurePolicy.maxRestarts` > 0) and has no rule that judges a failure
first (JobSet `failurePolicy.rules`, the node Job's `podFailurePolicy`): the kubelet restarts the
containers before any such rule could see a failed pod or Job. Decided when the node Job is made and
kept for that Job (its template is immutable); the next attempt decides again. Pure: the caller
passes the nodes (`gangctl.policy.cached.node_view`) and the observed node Job.
"""
from __future__ import annotations

from typing import Mapping, Sequence

from gangctl.model.resolve import ResolvedJob
from gangctl.plugins.workload import IN_PLACE_FEATURE, restarts_all_containers
from gangctl.policy.explain import excluded_by


def in_place(job: ResolvedJob, observed: Mapping | None, nodes: Sequence[Mapping] | None) -> bool:
    """Whether the gang of a runtime that leaves the mode to gangctl restarts in place: as its node
    Job was made (`observed`), else by the rules above. No nodes known (None, or none the pods may
    use): recreated."""
    if observed is not None:
        return restarts_all_containers(observed)
    policy = job.failure_policy or {}
    if job.elastic or not int(policy.get("maxRestarts") or 0) or policy.get("rules") or job.job_spec.get("podFailurePolicy"):
        return False
    spec = job.pod_template.get("spec") or {}
    # One pass, checking the cheap thing first: a node that declares the feature needs the (costlier)
    # check whether the pods may land there only until one such node is found, and the first usable
    # node that lacks it settles the answer. So a pass costs O(1) on a cluster where no node declares
    # it, and one dictionary lookup per node where all do (it runs on every pass of a TrainJob whose
    # node Job is not made yet, over every node of the cluster).
    usable = False
    for node in nodes or ():
        declares = IN_PLACE_FEATURE in ((node.get("status") or {}).get("declaredFeatures") or ())
        if (declares and usable) or excluded_by(node, spec) is not None:
            continue
        if not declares:
            return False
        usable = True
    return usable
