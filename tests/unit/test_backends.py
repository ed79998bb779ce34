"""Volcano, Kueue, KAI and native backend builders: what a resolved TrainJob becomes for each (pure, no cluster)."""
from __future__ import annotations

from gangctl.plugins import base
from gangctl.plugins.coscheduling import Coscheduling
from gangctl.plugins.kai import Kai
from gangctl.plugins.kai import why_waiting as kai_waiting
from gangctl.plugins.kueue import Kueue, workload_state
from gangctl.plugins.registry import BACKENDS
from gangctl.plugins.volcano import Volcano, podgroup_phase
from gangctl.plugins.workload import node_job, owner_reference
from gangctl.model.gang import size_gang
from gangctl.model.resolve import resolve
from gangctl.sim.objects import runtime, trainjob

RUNTIME = runtime()
TJ = trainjob(namespace="ml-a", uid="u-9",
              trainer={"numNodes": 4, "resourcesPerNode": {"limits": {"nvidia.com/gpu": "8", "cpu": "16"}}})


def test_volcano_podgroup_queue_priority_and_members():
    job = resolve(TJ, runtime(gang={"volcano": {"queue": "ml-a"}}))
    job.pod_template.setdefault("spec", {})["priorityClassName"] = "high"
    gang = size_gang(job.num_nodes, job.requests)
    group = Volcano().group(job, gang, owner_reference(TJ))
    assert group["apiVersion"] == "scheduling.volcano.sh/v1beta1" and group["kind"] == "PodGroup"
    assert group["metadata"]["name"] == "llm" and group["metadata"]["namespace"] == "ml-a"
    assert group["metadata"]["ownerReferences"][0]["uid"] == "u-9"
    assert group["spec"] == {"minMember": 4, "minTaskMember": {"node": 4},
                             "minResources": {"cpu": "64", "nvidia.com/gpu": "32"},
                             "queue": "ml-a", "priorityClassName": "high"}


def test_kai_podgroup_queue_priority_preemptibility_and_pods():
    job = resolve(TJ, runtime(gang={"kai": {"queue": "ml-a"}}))
    job.pod_template.setdefault("spec", {})["priorityClassName"] = "high"
    group = Kai().group(job, size_gang(job.num_nodes, job.requests), owner_reference(TJ))
    assert group["apiVersion"] == "scheduling.run.ai/v2alpha2" and group["kind"] == "PodGroup"
    assert group["metadata"]["ownerReferences"][0]["uid"] == "u-9"
    assert group["spec"] == {"minMember": 4, "queue": "ml-a", "priorityClassName": "high",
                             "preemptibility": "preemptible"}
    pod = node_job(job, owner_reference(TJ), Kai(), "scheduler-plugins-scheduler")["spec"]["template"]
    assert pod["spec"]["schedulerName"] == "kai-scheduler"
    assert pod["metadata"]["annotations"]["pod-group-name"] == "llm"
    plain = resolve(TJ, runtime(gang={"kai": {"preemptibility": "non-preemptible"}}))
    spec = Kai().group(plain, size_gang(plain.num_nodes, plain.requests), owner_reference(TJ))["spec"]
    assert spec["queue"] == "default-queue" and spec["preemptibility"] == "non-preemptible"


def test_kai_says_why_a_gang_waits_in_its_own_words():
    def pg(*reasons: str, message: str = "m") -> dict:
        return {"metadata": {"name": "llm"}, "spec": {"queue": "ml-a"}, "status": {"schedulingConditions": [
            {"type": "UnschedulableOnNodePool", "lastTransitionTime": "2026-11-25T10:00:00Z", "message": "old"},
            {"type": "UnschedulableOnNodePool", "lastTransitionTime": "2026-11-25T10:00:05Z", "message": message,
             "reasons": [{"reason": r} for r in reasons]}]}}
    assert kai_waiting(None) is None and kai_waiting({"metadata": {"name": "x"}, "status": {}}) is None
    reason, message = kai_waiting(pg("OverLimit", message="queue ml-a\n  is over its limit"))
    assert reason == "WaitingForQuota" and message == "KAI queue ml-a has no room for PodGroup llm: queue ml-a is over its limit"
    reason, message = kai_waiting(pg("PodSchedulingErrors", message="5 node(s) didn't have enough resources: GPUs"))
    assert reason == "WaitingForGang" and "GPUs" in message and "queue ml-a" in message


def test_volcano_defaults_to_the_default_queue_and_no_priority():
    job = resolve(TJ, runtime(gang={"volcano": {}}))
    group = Volcano().group(job, size_gang(job.num_nodes, job.requests), owner_reference(TJ))
    assert group["spec"]["queue"] == "default" and "priorityClassName" not in group["spec"]


def test_volcano_pods_join_by_annotation_and_use_the_volcano_scheduler():
    job = resolve(TJ, runtime(gang={"volcano": {"queue": "q"}}))
    pod = node_job(job, owner_reference(TJ), Volcano(), "scheduler-plugins-scheduler")["spec"]["template"]
    assert pod["spec"]["schedulerName"] == "volcano"
    assert pod["metadata"]["annotations"]["scheduling.k8s.io/group-name"] == "llm"
    assert pod["metadata"]["annotations"]["volcano.sh/task-spec"] == "node", "minTaskMember counts this task"
    assert "scheduling.x-k8s.io/pod-group" not in pod["metadata"]["labels"]


def test_volcano_elastic_floor_is_min_member():
    job = resolve(TJ, runtime(gang={"volcano": {}}))
    gang = size_gang(4, job.requests, min_nodes=2)
    spec = Volcano().group(job, gang, owner_reference(TJ))["spec"]
    assert spec["minMember"] == 2 and spec["minTaskMember"] == {"node": 2}
    assert spec["minResources"]["nvidia.com/gpu"] == "16"


def test_kueue_labels_the_job_not_the_pods_and_makes_no_group():
    job = resolve(TJ, runtime(gang={"kueue": {"queueName": "research"}}))
    gang = size_gang(job.num_nodes, job.requests)
    k = Kueue()
    assert k.group(job, gang, owner_reference(TJ)) is None
    assert not base.wants_group(k) and base.controls_suspend(k)
    assert base.job_labels(k, job, gang) == {"kueue.x-k8s.io/queue-name": "research"}
    assert base.job_annotations(k, job, gang) == {}
    pod = node_job(job, owner_reference(TJ), k, "scheduler-plugins-scheduler")["spec"]["template"]
    assert "schedulerName" not in pod["spec"], "Kueue admits; the default scheduler binds"
    assert not any(key.startswith("kueue.x-k8s.io/") for key in pod["metadata"]["labels"])


def test_kueue_defaults_priority_and_partial_admission():
    job = resolve(TJ, runtime(gang={"kueue": {}}))
    job.gang_settings["priorityClassName"] = "high"
    gang = size_gang(4, job.requests, min_nodes=2)
    assert Kueue().job_labels(job, gang) == {"kueue.x-k8s.io/queue-name": "default",
                                             "kueue.x-k8s.io/priority-class": "high"}
    assert Kueue().job_annotations(job, gang) == {"kueue.x-k8s.io/job-min-parallelism": "2"}


def test_coscheduling_keeps_the_defaults_of_the_optional_hooks():
    job = resolve(TJ, RUNTIME)
    gang = size_gang(job.num_nodes, job.requests)
    c = Coscheduling()
    assert base.wants_group(c) and not base.controls_suspend(c)
    assert base.job_labels(c, job, gang) == {} and base.job_annotations(c, job, gang) == {}
    assert not base.wants_group(None)


def test_registry_serves_every_backend_a_runtime_may_name():
    from gangctl.api.runtime import GANG_BACKENDS

    assert set(BACKENDS) == set(GANG_BACKENDS) == {"coscheduling", "volcano", "kueue", "native", "kai"}
    assert all(BACKENDS[name].name == name for name in BACKENDS)


def test_observed_state_helpers():
    assert podgroup_phase(None) is None and podgroup_phase({"status": {"phase": "Inqueue"}}) == "Inqueue"
    assert workload_state(None) == "Pending"
    wl = {"status": {"conditions": [{"type": "QuotaReserved", "status": "True"}, {"type": "Admitted", "status": "True"},
                                    {"type": "PodsReady", "status": "False"}]}}
    assert workload_state(wl) == "Admitted"
    wl["status"]["conditions"].append({"type": "Evicted", "status": "True"})
    assert workload_state(wl) == "Evicted"


def test_the_child_job_carries_the_backends_labels_and_kueue_creates_it_suspended():
    job = resolve(TJ, runtime(gang={"kueue": {"queueName": "research", "priorityClassName": "high"}}))
    gang = size_gang(job.num_nodes, job.requests)
    child = node_job(job, owner_reference(TJ), Kueue(), "s", gang=gang)
    assert child["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "research"
    assert child["metadata"]["labels"]["kueue.x-k8s.io/priority-class"] == "high"
    assert child["spec"]["suspend"] is True, "Kueue's admission, not gangctl, unsuspends it"
    plain = node_job(job, owner_reference(TJ), Coscheduling(), "s", gang=gang)
    assert plain["spec"]["suspend"] is False
    assert not any(k.startswith("kueue.x-k8s.io/") for k in plain["metadata"]["labels"])


def test_why_a_gang_waits_in_each_backends_words():
    pending = {"metadata": {"name": "llm"}, "spec": {"queue": "team-a", "minResources": {"nvidia.com/gpu": "16"}},
               "status": {"phase": "Pending"}}
    reason, message = base.waiting(Volcano(), pending)
    assert reason == "WaitingForQuota" and "queue team-a" in message and "16 nvidia.com/gpu" in message
    inqueue = {"metadata": {"name": "llm"}, "spec": {"queue": "team-a"}, "status": {"phase": "Inqueue", "conditions": [
        {"type": "Unschedulable", "status": "True", "message": "2/2 tasks in gang unschedulable"}]}}
    assert base.waiting(Volcano(), inqueue) == (
        "WaitingForGang", "admitted by Volcano queue team-a; the gang is not placed yet: 2/2 tasks in gang unschedulable")
    assert base.waiting(Volcano(), {"metadata": {"name": "llm"}, "status": {"phase": "Running"}}) is None

    refused = {"spec": {"queueName": "default"}, "status": {"conditions": [
        {"type": "QuotaReserved", "status": "False", "message": "insufficient unused quota for nvidia.com/gpu"}]}}
    reason, message = base.waiting(Kueue(), refused)
    assert reason == "WaitingForQuota" and "insufficient unused quota" in message
    evicted = {"spec": {}, "status": {"conditions": [
        {"type": "Evicted", "status": "True", "reason": "Preempted", "message": "Preempted to accommodate a higher priority Workload"}]}}
    assert base.waiting(Kueue(), evicted)[0] == "Evicted"
    admitted = {"spec": {}, "status": {"conditions": [{"type": "Admitted", "status": "True"}]}}
    assert base.waiting(Kueue(), admitted) is None
    assert base.waiting(Coscheduling(), {"status": {}}) is None


# --- native: Kubernetes' own gang scheduling (scheduling.k8s.io/v1alpha2) ----------------------------
def test_native_podgroup_is_a_gang_of_the_floor():
    from gangctl.plugins.native import Native

    job = resolve(TJ, runtime(gang={"native": {}}))
    gang = size_gang(job.num_nodes, job.requests, min_nodes=3)
    group = Native().group(job, gang, owner_reference(TJ))
    assert group["apiVersion"] == "scheduling.k8s.io/v1alpha2" and group["kind"] == "PodGroup"
    assert group["metadata"]["name"] == "llm" and group["metadata"]["namespace"] == "ml-a"
    assert group["metadata"]["ownerReferences"][0]["uid"] == "u-9"
    assert group["spec"] == {"schedulingPolicy": {"gang": {"minCount": 3}}}


def test_native_pods_name_their_group_and_the_gang_scheduler():
    from gangctl.plugins.native import Native

    job = resolve(TJ, runtime(gang={"native": {}}))
    pod = node_job(job, owner_reference(TJ), Native(), "default-scheduler")["spec"]["template"]
    assert pod["spec"]["schedulingGroup"] == {"podGroupName": "llm"}
    assert pod["spec"]["schedulerName"] == "default-scheduler", "the cluster's scheduler, gates on"
    job = resolve(TJ, runtime(gang={"native": {"schedulerName": "gang-scheduler"}}))
    pod = node_job(job, owner_reference(TJ), Native(), "default-scheduler")["spec"]["template"]
    assert pod["spec"]["schedulerName"] == "gang-scheduler"
    assert base.gated_by_gangctl(Native()) and not base.needs_nudge(Native()) and BACKENDS["native"].name == "native"


def test_native_says_why_the_gang_waits_in_the_schedulers_words():
    from gangctl.plugins.native import why_waiting

    pg = {"metadata": {"name": "llm"}, "status": {"conditions": [
        {"type": "PodGroupScheduled", "status": "False", "reason": "Unschedulable",
         "message": "0/5 nodes are available: 5 Insufficient nvidia.com/gpu."}]}}
    reason, message = why_waiting(pg)
    assert reason == "WaitingForGang" and "Unschedulable" in message and "Insufficient nvidia.com/gpu" in message
    pg["status"]["conditions"][0]["status"] = "True"
    assert why_waiting(pg) is None and why_waiting(None) is None
