"""The longest name of each child a TrainJob makes, checked against its limit before anything is made.

The API refuses a TrainJob name longer than api.trainjob.MAX_NAME_LENGTH (the node Job's pods at the
largest numNodes) and a runtime's replicated job name longer than api.runtime.REPLICATED_JOB_NAME_MAX;
what depends on both (the runtime's other replicated jobs, their replicas and completions) is known
only once the TrainJob is resolved over its runtime. A child whose name would be too long fails the
TrainJob with a message naming it, instead of a create the API (or the Job controller, for a pod's
hostname) refuses again and again.

Limits: a hostname, a Service name and a label value are DNS labels (63); a Job's name is its pods'
`batch.kubernetes.io/job-name` label, so 63 too. An Indexed Job's pods get the hostname
`<job>-<index>`; their names (`<job>-<index>-<5 random>`) are cut to fit by the Job controller.
PVC and ConfigMap names are DNS subdomains (253).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from gangctl.model.names import MAX_NAME, child_job_name, pod_hostname
from gangctl.model.progress import config_map_name

if TYPE_CHECKING:
    from gangctl.model.resolve import ResolvedJob

DNS_SUBDOMAIN = 253
NAME_TOO_LONG = "NameTooLong"


@dataclass(frozen=True)
class ChildName:
    what: str          # e.g. "the node Job's pod hostname"
    name: str          # the longest name of this kind the job makes
    limit: int
    step: str | None = None  # the runtime's replicated job it comes from, when not the node job


def child_names(job: ResolvedJob) -> list[ChildName]:
    """The longest name of each kind of child `job` makes (the node job at its largest size)."""
    out = [ChildName("headless Service", job.name, MAX_NAME),
           ChildName("gang object", job.gang_name, MAX_NAME),
           ChildName("node Job", child_job_name(job.name), MAX_NAME),
           ChildName("node Job's pod hostname", pod_hostname(job.name, job.max_nodes - 1), MAX_NAME),
           ChildName("progress ConfigMap", config_map_name(job.name), DNS_SUBDOMAIN)]
    for step in job.steps:
        last = max(1, step.replicas) - 1
        out.append(ChildName(f"{step.name} Job", child_job_name(job.name, step.name, last), MAX_NAME, step.name))
        if step.job_spec.get("completionMode") == "Indexed":
            completions = int(step.job_spec.get("completions") or 1)
            out.append(ChildName(f"{step.name} Job's pod hostname",
                                 pod_hostname(job.name, completions - 1, step.name, last), MAX_NAME, step.name))
    out.extend(ChildName("PersistentVolumeClaim", claim.claim_name(job.name), DNS_SUBDOMAIN) for claim in job.claims)
    return out


def too_long(job: ResolvedJob) -> str | None:
    """The message for the first child whose name is over its limit (None: every name fits)."""
    for child in child_names(job):
        over = len(child.name) - child.limit
        if over > 0:
            also = f" or the runtime's replicated job {child.step!r} (its name, replicas or completions)" \
                if child.step else ""
            return (f"metadata.name: {job.name!r} is too long for this runtime: the {child.what} {child.name!r} "
                    f"would have {len(child.name)} characters (at most {child.limit}); shorten metadata.name "
                    f"by {over}{also}")
    return None
