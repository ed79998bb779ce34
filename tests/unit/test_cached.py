"""The cached forms of Pods and Nodes keep every field a decision reads: the decisions give the same
answers on the full objects and on the cached ones, and the cached ones are a fraction of the bytes."""
from __future__ import annotations

import copy
import json
from datetime import datetime, timedelta, timezone

import pytest

from gangctl.plugins.coscheduling import Coscheduling
from gangctl.plugins.workload import node_job, owner_reference
from gangctl.policy.cached import node_view, pod_view
from gangctl.policy.failure import PodFailure
from gangctl.model.gang import size_gang
from gangctl.policy.lost_pods import lost_pods
from gangctl.model.resolve import resolve
from gangctl.sim import objects

RUNTIME = objects.runtime()
NOW = datetime(2026, 1, 1, 12, 0, 0, tzinfo=timezone.utc)


def stamp(seconds_ago: float) -> str:
    return (NOW - timedelta(seconds=seconds_ago)).strftime("%Y-%m-%dT%H:%M:%SZ")


def full_pod(index: int, phase: str = "Running", exit_code: int | None = None, disrupted: bool = False,
             deleting: bool = False) -> dict:
    """A pod as the API serves it for one of gangctl's Job indexes: the Job's whole template, managed
    fields, the status kubelet writes."""
    tj = objects.trainjob("mnist", trainer={"numNodes": 4, "resourcesPerNode": {"limits": {"nvidia.com/gpu": "8"}}})
    job = resolve(tj, RUNTIME)
    gang = size_gang(job.num_nodes, job.requests)
    template = node_job(job, owner_reference(tj), Coscheduling(), "default-scheduler", gang=gang)["spec"]["template"]
    meta = copy.deepcopy(template["metadata"])
    meta.update({"name": f"mnist-node-0-{index}-abcde", "namespace": "team-a", "uid": f"pod-{index}",
                 "resourceVersion": "1234", "creationTimestamp": stamp(100),
                 "ownerReferences": [{"apiVersion": "batch/v1", "kind": "Job", "name": "mnist-node-0", "uid": "job-1",
                                      "controller": True, "blockOwnerDeletion": True}],
                 "finalizers": ["batch.kubernetes.io/job-tracking"],
                 "managedFields": [{"manager": "kube-controller-manager", "operation": "Update",
                                    "fieldsV1": {"f:spec": {f"f:field{i}": {} for i in range(60)}}},
                                   {"manager": "kubelet", "operation": "Update", "subresource": "status",
                                    "fieldsV1": {"f:status": {f"f:field{i}": {} for i in range(40)}}}]})
    meta.setdefault("annotations", {})["batch.kubernetes.io/job-completion-index"] = str(index)
    if deleting:
        meta["deletionTimestamp"] = stamp(10)
        meta["deletionGracePeriodSeconds"] = 30
    spec = copy.deepcopy(template["spec"])
    spec.update({"nodeName": f"node-{index}", "hostname": f"mnist-node-0-{index}", "subdomain": "mnist",
                 "schedulerName": "default-scheduler", "enableServiceLinks": True, "preemptionPolicy": "PreemptLowerPriority",
                 "volumes": [{"name": "kube-api-access", "projected": {"sources": [
                     {"serviceAccountToken": {"expirationSeconds": 3607, "path": "token"}},
                     {"configMap": {"name": "kube-root-ca.crt", "items": [{"key": "ca.crt", "path": "ca.crt"}]}}]}}]})
    conditions = [{"type": t, "status": "True", "lastProbeTime": None, "lastTransitionTime": stamp(90)}
                  for t in ("PodReadyToStartContainers", "Initialized", "Ready", "ContainersReady", "PodScheduled")]
    if disrupted:
        conditions.append({"type": "DisruptionTarget", "status": "True", "reason": "DeletionByTaintManager",
                           "message": "Taint manager: deleting due to NoExecute taint", "lastTransitionTime": stamp(10)})
    state = ({"terminated": {"exitCode": exit_code, "reason": "Error", "startedAt": stamp(80), "finishedAt": stamp(5),
                             "containerID": "containerd://" + "f" * 64}}
             if exit_code is not None else {"running": {"startedAt": stamp(80)}})
    status = {"phase": phase, "conditions": conditions, "hostIP": "10.0.0.1", "podIP": "10.244.0.9",
              "podIPs": [{"ip": "10.244.0.9"}], "hostIPs": [{"ip": "10.0.0.1"}], "qosClass": "Burstable",
              "startTime": stamp(95),
              "containerStatuses": [{"name": "node", "ready": phase == "Running", "restartCount": 0, "started": True,
                                     "image": "pytorch/pytorch:2.7.1", "imageID": "docker.io/pytorch@sha256:" + "a" * 64,
                                     "containerID": "containerd://" + "f" * 64, "state": state, "lastState": {}}]}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec, "status": status}


PODS = [full_pod(0), full_pod(1, "Failed", exit_code=3), full_pod(2, "Running", disrupted=True, deleting=True),
        full_pod(3, "Failed", exit_code=137, disrupted=True), full_pod(4, "Succeeded", exit_code=0)]


@pytest.mark.parametrize("pod", PODS, ids=lambda p: p["metadata"]["name"])
def test_failure_classification_reads_the_same_from_the_cached_pod(pod):
    assert PodFailure.from_pod(pod_view(pod)) == PodFailure.from_pod(pod)


@pytest.mark.parametrize("pod", PODS, ids=lambda p: p["metadata"]["name"])
def test_identity_placement_and_progress_survive(pod):
    view = pod_view(pod)
    for field in ("name", "namespace", "uid", "resourceVersion", "labels", "annotations", "ownerReferences",
                  "deletionTimestamp", "finalizers"):
        assert view["metadata"].get(field) == pod["metadata"].get(field) or field == "ownerReferences"
    assert [r["uid"] for r in view["metadata"]["ownerReferences"]] == ["job-1"]
    assert view["spec"]["nodeName"] == pod["spec"]["nodeName"]
    assert view["status"]["phase"] == pod["status"]["phase"]
    assert [c["type"] for c in view["status"]["conditions"]] == [c["type"] for c in pod["status"]["conditions"]]


def test_in_place_restart_counts_survive():
    from gangctl.policy.failure import InPlace, most_restarted

    pod = {"metadata": {"name": "p"}, "spec": {}, "status": {"phase": "Running", "containerStatuses": [
        {"name": "node", "restartCount": 2, "image": "x", "lastState": {"terminated": {"exitCode": 3}}}]}}
    assert most_restarted([pod_view(pod)], "node") == InPlace(2, "p", 3)


def test_the_lost_pod_reaper_picks_the_same_pods():
    nodes = {f"node-{i}": {"metadata": {"name": f"node-{i}", "managedFields": [{"manager": "kubelet"}]},
                           "status": {"conditions": [{"type": "Ready", "status": "Unknown",
                                                      "lastTransitionTime": stamp(120)}],
                                      "images": [{"names": ["x" * 80]}] * 20}} for i in range(5)}
    pods = [copy.deepcopy(p) for p in PODS]
    for p in pods:
        p["metadata"].setdefault("labels", {})["gangctl.io/managed-by"] = "gangctl"
        p["metadata"]["deletionTimestamp"] = stamp(0)  # deleted 30 s ago with a 30 s grace period
    after = timedelta(seconds=20)
    full = lost_pods(pods, nodes, NOW, after)
    cached = lost_pods([pod_view(p) for p in pods], {k: node_view(n) for k, n in nodes.items()}, NOW, after)
    assert full and cached == full


def test_a_cached_pod_is_a_fraction_of_the_served_one():
    full = sum(len(json.dumps(p)) for p in PODS)
    cached = sum(len(json.dumps(pod_view(p))) for p in PODS)
    assert cached < full / 3, (cached, full)


def test_a_running_containers_start_survives_and_the_stall_reads_it_from_the_cached_pod():
    from gangctl.policy.decide_pytorchjob import _started
    pod = full_pod(0)
    assert pod_view(pod)["status"]["containerStatuses"][0]["state"] == {"running": {"startedAt": stamp(80)}}
    assert _started(pod_view(pod)) == _started(pod) == stamp(80)

