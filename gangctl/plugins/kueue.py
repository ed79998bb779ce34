"""Kueue: the child Job carries `kueue.x-k8s.io/queue-name` and is created suspended; no PodGroup.

Kueue's batch/job integration makes a Workload of the Job (one pod set, `parallelism` pods, the pod
template's requests), admits it against the LocalQueue's ClusterQueue and unsuspends the Job. With
`waitForPodsReady` enabled (gangctl's local cluster does) a Job whose pods do not all become ready
in time is suspended again and requeued: all-or-nothing at pod level. An elastic gang sets
`kueue.x-k8s.io/job-min-parallelism` so Kueue may admit it partially, down to `minNodes`.

Because Kueue flips `spec.suspend`, gangctl sets it only when it creates the Job
(`controls_suspend`); after that the field is Kueue's. The LocalQueue is the runtime's
`podGroupPolicy.kueue.queueName`, else `default` (the LocalQueue `gangctl policy apply` creates in
each team namespace). Priority: the `kueue.x-k8s.io/priority-class` label, from
`podGroupPolicy.kueue.priorityClassName` when set.
"""
from __future__ import annotations

from gangctl.api.resources import Resource
from gangctl.model.gang import Gang
from gangctl.model.resolve import ResolvedJob

GROUP = "kueue.x-k8s.io"
QUEUE_LABEL = f"{GROUP}/queue-name"
PRIORITY_LABEL = f"{GROUP}/priority-class"
MIN_PARALLELISM_ANNOTATION = f"{GROUP}/job-min-parallelism"
JOB_UID_LABEL = f"{GROUP}/job-uid"  # on the Workload Kueue makes for a Job: that Job's uid
DEFAULT_LOCAL_QUEUE = "default"
WORKLOADS = Resource(GROUP, "v1beta1", "workloads", "Workload")
# Workload conditions, in the order a Workload goes through them.
QUOTA_RESERVED, ADMITTED, PODS_READY, EVICTED, FINISHED = "QuotaReserved", "Admitted", "PodsReady", "Evicted", "Finished"


class Kueue:
    name = "kueue"
    group_resource: Resource | None = None  # the Workload is Kueue's, made from the Job
    watch: Resource = WORKLOADS
    controls_suspend = True
    gated_by_gangctl = False   # Kueue admits against its ClusterQueues
    needs_nudge = False        # Kueue retries on quota changes; no group object to touch

    def queue_name(self, job: ResolvedJob) -> str:
        return str(job.gang_settings.get("queueName") or DEFAULT_LOCAL_QUEUE)

    def pod_labels(self, job: ResolvedJob) -> dict[str, str]:
        return {}

    def pod_annotations(self, job: ResolvedJob) -> dict[str, str]:
        return {}

    def scheduler_name(self, job: ResolvedJob, default: str) -> str | None:
        # Kueue admits; any scheduler binds. The default one places the admitted pods.
        return None

    def group(self, job: ResolvedJob, gang: Gang, owner: dict) -> None:
        return None

    def waiting(self, observed: dict | None) -> tuple[str, str] | None:
        return why_waiting(observed)  # observed: the gang's Workload

    def watched_selector(self, job_uid: str) -> dict[str, str]:
        return {JOB_UID_LABEL: job_uid}  # the Workload Kueue made of the Job

    def job_labels(self, job: ResolvedJob, gang: Gang) -> dict[str, str]:
        labels = {QUEUE_LABEL: self.queue_name(job)}
        if (pc := job.gang_settings.get("priorityClassName")):
            labels[PRIORITY_LABEL] = str(pc)
        return labels

    def job_annotations(self, job: ResolvedJob, gang: Gang) -> dict[str, str]:
        if gang.min_member < gang.size:
            return {MIN_PARALLELISM_ANNOTATION: str(gang.min_member)}
        return {}


def workload_state(workload: dict | None) -> str:
    """One word for a Workload: Pending, QuotaReserved, Admitted, Running (PodsReady), Evicted, Finished."""
    if not workload:
        return "Pending"
    conds = {c["type"]: c.get("status") == "True" for c in (workload.get("status") or {}).get("conditions") or []}
    for name, word in ((FINISHED, "Finished"), (EVICTED, "Evicted"), (PODS_READY, "Running"),
                       (ADMITTED, "Admitted"), (QUOTA_RESERVED, "QuotaReserved")):
        if conds.get(name):
            return word
    return "Pending"


def _condition(workload: dict, ctype: str) -> dict:
    return next((c for c in (workload.get("status") or {}).get("conditions") or [] if c.get("type") == ctype), {})


def why_waiting(workload: dict | None) -> tuple[str, str] | None:
    """Why a gang under Kueue waits, from its Workload (None: nothing beyond "not all pods bound")."""
    state = workload_state(workload)
    if workload is None:
        return "WaitingForQuota", "Kueue has not made a Workload for the Job yet"
    queue = (workload.get("spec") or {}).get("queueName") or DEFAULT_LOCAL_QUEUE
    if state == "Evicted":
        c = _condition(workload, EVICTED)
        return ("Evicted", f"Kueue evicted the workload ({c.get('reason', 'Evicted')}: {c.get('message', '')}); "
                           f"it is requeued in LocalQueue {queue} and starts again when admitted")
    if state == "Pending":
        c = _condition(workload, QUOTA_RESERVED)
        said = c.get("message") or "not evaluated yet"
        return "WaitingForQuota", f"Kueue has not admitted it in LocalQueue {queue}: {said}"
    return None
