"""Kueue on the real local cluster: the quota policy applied and read back; Jobs admitted by quota."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from gangctl.api.resources import JOBS, PODS
from gangctl.kube.client import Kube
from gangctl.plugins.kueue import WORKLOADS, Kueue
from gangctl.policy_apply import apply_policy
from gangctl.policy.quota import QuotaPolicy
from tests.integration.helpers import eventually
from tests.integration.schedulers_common import EXAMPLE_POLICY, gang_objects, start, stop

import yaml

pytestmark = pytest.mark.integration
CLUSTER = "gangctl-it-kueue"


@pytest.fixture(scope="module")
def kueue_cluster():
    settings, kubeconfig = start(CLUSTER, "kueue")
    yield settings, kubeconfig
    stop(settings)


@pytest.fixture
async def kube(kueue_cluster):
    k = await Kube.connect(kueue_cluster[1])
    yield k
    await k.close()


def gangctl(*args: str, cluster) -> subprocess.CompletedProcess:
    import os
    env = dict(os.environ, GANGCTL_CLUSTER_NAME=CLUSTER, KUBECONFIG=str(cluster[1]))
    return subprocess.run([sys.executable, "-m", "gangctl.cli", *args], env=env, capture_output=True, text=True, timeout=120)


async def test_policy_applied_and_read_back(kueue_cluster, kube):
    dry = gangctl("policy", "apply", str(EXAMPLE_POLICY), "--dry-run", "-o", "json", cluster=kueue_cluster)
    assert dry.returncode == 0, dry.stderr
    assert {o["action"] for o in json.loads(dry.stdout)["objects"]} == {"create"}
    assert (await kube.get("/apis/kueue.x-k8s.io/v1beta1/clusterqueues"))["items"] == [], "dry run changed nothing"

    done = gangctl("policy", "apply", str(EXAMPLE_POLICY), cluster=kueue_cluster)
    assert done.returncode == 0, done.stderr
    cqs = {c["metadata"]["name"]: c for c in (await kube.get("/apis/kueue.x-k8s.io/v1beta1/clusterqueues"))["items"]}
    assert set(cqs) == {"ml-a", "ml-b", "prod", "eval"}
    gpu = cqs["ml-a"]["spec"]["resourceGroups"][0]["flavors"][0]["resources"][0]
    assert gpu == {"name": "nvidia.com/gpu", "nominalQuota": "64", "borrowingLimit": "32"}
    assert cqs["ml-b"]["spec"]["cohort"] == "research" and cqs["ml-b"]["spec"]["queueingStrategy"] == "BestEffortFIFO"
    lqs = (await kube.get("/apis/kueue.x-k8s.io/v1beta1/localqueues"))["items"]
    assert {(q["metadata"]["namespace"], q["spec"]["clusterQueue"]) for q in lqs} == {
        ("ml-a", "ml-a"), ("ml-a-dev", "ml-a"), ("ml-b", "ml-b"), ("prod", "prod"), ("eval", "eval")}
    cohorts = (await kube.get("/apis/kueue.x-k8s.io/v1alpha1/cohorts"))["items"]
    assert {c["metadata"]["name"] for c in cohorts} == {"research", "product"}
    wpcs = (await kube.get("/apis/kueue.x-k8s.io/v1beta1/workloadpriorityclasses"))["items"]
    assert {w["metadata"]["name"]: w["value"] for w in wpcs} == {"low": 10, "normal": 100, "high": 1000}

    async def active() -> bool:  # Kueue marks a ClusterQueue Active once its flavor and cohort resolve
        cq = await kube.get("/apis/kueue.x-k8s.io/v1beta1/clusterqueues/ml-b")
        return any(c["type"] == "Active" and c["status"] == "True" for c in cq.get("status", {}).get("conditions", []))
    await eventually(active, 30, "ClusterQueue ml-b Active")

    # Applying the same policy again changes nothing, through the Python API too.
    policy = QuotaPolicy.model_validate(yaml.safe_load(EXAMPLE_POLICY.read_text()))
    assert {c.action for c in await apply_policy(kube, policy, "kueue", dry_run=True)} == {"unchanged"}


def workload_of(workloads: list[dict], job: dict) -> dict | None:
    return next((w for w in workloads if any(o.get("uid") == job["metadata"]["uid"]
                                             for o in w["metadata"].get("ownerReferences", []))), None)


async def test_jobs_are_admitted_within_quota_and_wait_beyond_it(kueue_cluster, kube):
    # ml-b: 64 GPUs nominal, may borrow ml-a's 64: at most 128. 3 x 8 fits; 20 x 8 = 160 never does.
    _, small = gang_objects(Kueue(), "fits", "ml-b", 3, {"kueue": {}})
    _, big = gang_objects(Kueue(), "too-big", "ml-b", 20, {"kueue": {}})
    assert small["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "default"
    small = await kube.create(JOBS.path("ml-b"), small)
    big = await kube.create(JOBS.path("ml-b"), big)
    assert big["spec"]["suspend"] is True, "Kueue's webhook suspends a queued Job at creation"

    async def small_admitted() -> bool:
        wl = workload_of((await kube.get(WORKLOADS.path("ml-b")))["items"], small)
        job = await kube.get(JOBS.path("ml-b", "fits-node-0"))
        conds = {c["type"]: c["status"] for c in (wl or {}).get("status", {}).get("conditions", [])}
        return conds.get("Admitted") == "True" and job["spec"]["suspend"] is False
    await eventually(small_admitted, 30, "the 3 x 8 GPU Job admitted and unsuspended")

    async def all_bound() -> bool:
        pods = (await kube.get(PODS.path("ml-b"), labelSelector="jobset.sigs.k8s.io/jobset-name=fits"))["items"]
        return len([p for p in pods if p["spec"].get("nodeName")]) == 3
    await eventually(all_bound, 30, "its 3 pods bound")

    async def big_refused() -> bool:
        wl = workload_of((await kube.get(WORKLOADS.path("ml-b")))["items"], big)
        conds = {c["type"]: c for c in (wl or {}).get("status", {}).get("conditions", [])}
        reserved = conds.get("QuotaReserved")
        return bool(reserved) and reserved["status"] == "False" and "insufficient quota" in reserved["message"]
    await eventually(big_refused, 30, "the 20 x 8 GPU Job refused for quota")
    job = await kube.get(JOBS.path("ml-b", "too-big-node-0"))
    assert job["spec"]["suspend"] is True and not job.get("status", {}).get("active")


async def test_jobs_without_a_queue_name_are_not_kueues(kueue_cluster, kube):
    _, plain = gang_objects(Kueue(), "plain", "ml-a", 1, {"kueue": {}})
    del plain["metadata"]["labels"]["kueue.x-k8s.io/queue-name"]
    created = await kube.create(JOBS.path("ml-a"), plain)
    assert created["spec"].get("suspend") is False
    jobs_workloads = (await kube.get(WORKLOADS.path("ml-a")))["items"]
    assert workload_of(jobs_workloads, created) is None


def test_status_and_down_leave_nothing_behind(kueue_cluster):
    status = gangctl("cluster", "status", "-o", "json", cluster=kueue_cluster)
    info = json.loads(status.stdout)
    assert info["scheduler"] == "kueue" and info["running"]
    assert any(c["name"] == "kueue" and c["running"] for c in info["components"])
    assert stop(kueue_cluster[0]) == [], "kueue still running after cluster down"
