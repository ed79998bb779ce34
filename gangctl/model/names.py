"""Names and labels of what gangctl creates for a TrainJob, in one place.

Names follow JobSet's so tools written for Kubeflow Trainer find the same things: the child Job of
the `node` replicated job is `<trainjob>-node-0`, its pods' hostnames `<trainjob>-node-0-<index>`,
all under the headless Service `<trainjob>`.
"""
from __future__ import annotations

# Labels the kubeflow SDK selects pods by (JobSet's own label keys).
JOBSET_NAME = "jobset.sigs.k8s.io/jobset-name"
REPLICATED_JOB = "jobset.sigs.k8s.io/replicatedjob-name"
JOB_INDEX = "jobset.sigs.k8s.io/job-index"
TRAINJOB_NAME = "trainer.kubeflow.org/trainjob-name"
ANCESTOR_STEP = "trainer.kubeflow.org/trainjob-ancestor-step"
# gangctl's own marker for every child it manages (informers select on it).
MANAGED_BY = "gangctl.io/managed-by"
MANAGER = "gangctl"
SPEC_HASH = "gangctl.io/spec-hash"
# Held on every child Job until its outcome is in the TrainJob's status, so a Job that finishes
# and is deleted (the runtime's ttlSecondsAfterFinished, by hand) while gangctl is down is still
# there to be read: finished training is never rerun, a failure never goes uncharged.
RESULT_FINALIZER = "gangctl.io/job-result"
COMPLETION_INDEX_ANNOTATION = "batch.kubernetes.io/job-completion-index"
MASTER_PORT = 29500
MAX_NAME = 63


def child_job_name(trainjob: str, replicated_job: str = "node", index: int = 0) -> str:
    return f"{trainjob}-{replicated_job}-{index}"


def pod_hostname(trainjob: str, rank: int, replicated_job: str = "node", job_index: int = 0) -> str:
    """The hostname the Job controller gives pod `rank` of an Indexed Job: `<job>-<completion index>`."""
    return f"{child_job_name(trainjob, replicated_job, job_index)}-{rank}"


def master_addr(trainjob: str) -> str:
    return f"{pod_hostname(trainjob, 0)}.{trainjob}"


def child_labels(trainjob: str, replicated_job: str = "node") -> dict[str, str]:
    return {
        MANAGED_BY: MANAGER,
        TRAINJOB_NAME: trainjob,
        JOBSET_NAME: trainjob,
        REPLICATED_JOB: replicated_job,
        JOB_INDEX: "0",
    }
