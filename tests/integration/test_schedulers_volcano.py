"""Volcano on the real local cluster: the quota policy as Queues, and gangs bound whole or not at all."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from gangctl.api.resources import JOBS, PODS
from gangctl.kube.client import Kube
from gangctl.plugins.volcano import VOLCANO_POD_GROUPS, VOLCANO_QUEUES, Volcano
from tests.integration.helpers import eventually
from tests.integration.schedulers_common import EXAMPLE_POLICY, gang_objects, start, stop

pytestmark = pytest.mark.integration
CLUSTER = "gangctl-it-volcano"
# The example policy is sized for 256 GPUs; this cluster has 32, all of them ml-b's guarantee, so
# Volcano's capacity plugin leaves no GPU to ml-a's queue here (its capability minus the others'
# guarantees) and the gangs go to ml-b.
NS = "ml-b"


@pytest.fixture(scope="module")
def volcano_cluster():
    settings, kubeconfig = start(CLUSTER, "volcano")
    yield settings, kubeconfig
    stop(settings)


@pytest.fixture
async def kube(volcano_cluster):
    k = await Kube.connect(volcano_cluster[1])
    yield k
    await k.close()


def gangctl(*args: str, cluster) -> subprocess.CompletedProcess:
    env = dict(os.environ, GANGCTL_CLUSTER_NAME=CLUSTER, KUBECONFIG=str(cluster[1]))
    return subprocess.run([sys.executable, "-m", "gangctl.cli", *args], env=env, capture_output=True, text=True, timeout=120)


async def test_policy_applied_as_queues_and_read_back(volcano_cluster, kube):
    done = gangctl("policy", "apply", str(EXAMPLE_POLICY), "-o", "json", cluster=volcano_cluster)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["backend"] == "volcano", "the backend defaults to the cluster's scheduler"
    queues = {q["metadata"]["name"]: q["spec"] for q in (await kube.get(VOLCANO_QUEUES.path()))["items"]}
    assert {"default", "ml-a", "ml-b", "prod", "eval"} <= set(queues)
    assert queues["ml-a"]["deserved"] == {"nvidia.com/gpu": "64", "cpu": "512", "memory": "4Ti"}
    assert queues["ml-a"]["capability"]["nvidia.com/gpu"] == "96"
    assert queues["ml-b"]["guarantee"] == {"resource": {"nvidia.com/gpu": "32"}}
    again = gangctl("policy", "apply", str(EXAMPLE_POLICY), "--dry-run", "-o", "json", cluster=volcano_cluster)
    assert {o["action"] for o in json.loads(again.stdout)["objects"]} == {"unchanged"}


async def bound_pods(kube: Kube, name: str) -> int:
    pods = (await kube.get(PODS.path(NS), labelSelector=f"jobset.sigs.k8s.io/jobset-name={name}"))["items"]
    return len([p for p in pods if p["spec"].get("nodeName") and not p["metadata"].get("deletionTimestamp")])


async def create_gang(kube: Kube, name: str, nodes: int) -> None:
    group, job = gang_objects(Volcano(), name, NS, nodes, {"volcano": {"queue": NS}})
    assert group is not None
    await kube.create(VOLCANO_POD_GROUPS.path(NS), group)
    await kube.create(JOBS.path(NS), job)


async def test_gangs_bind_whole_or_wait_whole(volcano_cluster, kube):
    # 32 GPUs in the cluster: a 3 x 8 gang binds; a 2 x 8 gang then finds 8 free and binds no pod.
    await create_gang(kube, "first", 3)

    async def first_bound() -> bool:
        return await bound_pods(kube, "first") == 3
    await eventually(first_bound, 60, "the 3-node gang bound whole")
    pg = await kube.get(VOLCANO_POD_GROUPS.path(NS, "first"))
    assert pg["spec"]["minTaskMember"] == {"node": 3} and pg["spec"]["queue"] == NS

    await create_gang(kube, "second", 2)

    async def second_refused() -> bool:
        pg = await kube.get(VOLCANO_POD_GROUPS.path(NS, "second"))
        return any(c["type"] == "Unschedulable" for c in pg.get("status", {}).get("conditions", []))
    await eventually(second_refused, 60, "the 2-node gang reported Unschedulable")
    assert await bound_pods(kube, "second") == 0, "no pod of a gang that does not fit is bound"

    await kube.delete(JOBS.path(NS, "first-node-0"), propagation="Foreground")

    async def second_bound() -> bool:
        return await bound_pods(kube, "second") == 2
    await eventually(second_bound, 90, "the 2-node gang bound whole once the first gang's pods went away")


def test_status_and_down_leave_nothing_behind(volcano_cluster):
    info = json.loads(gangctl("cluster", "status", "-o", "json", cluster=volcano_cluster).stdout)
    assert info["scheduler"] == "volcano" and info["running"]
    assert {c["name"] for c in info["components"]} >= {"vc-scheduler", "vc-controller-manager"}
    assert stop(volcano_cluster[0]) == [], "a Volcano process still runs after cluster down"
