"""Elastic PyTorchJobs on the session cluster: an elastic c10d PyTorchJob without rdzvHost gets
gangctl's rendezvous store (`<job>-rdzv-pt`, a pod behind a Service of that name), real torchrun
workers rendezvous on it on process nodes, and the job reaches Succeeded; the store goes with the
gang."""
from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from gangctl.api.resources import PODS, PYTORCHJOBS, SERVICES
from gangctl.kube.client import Kube
from gangctl.policy import pytorchjob as pj
from tests.integration.helpers import eventually
from tests.integration.test_process_nodes import kubectl
from tests.integration.test_pytorchjob_serving import DDP_CHECK, finished, on_process_nodes

pytestmark = pytest.mark.integration


def elastic(name: str, namespace: str, command: list[str]) -> dict:
    worker = {"replicas": 3, "restartPolicy": "OnFailure",
              "template": {"spec": {"containers": [{"name": "pytorch", "image": "pytorch/pytorch:2.7.1"}]}}}
    obj = {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "metadata": {"name": name, "namespace": namespace},
           "spec": {"elasticPolicy": {"minReplicas": 2, "maxReplicas": 3, "rdzvBackend": "c10d"},
                    "pytorchReplicaSpecs": {"Worker": worker}}}
    return on_process_nodes(obj, command, cpu="200m")


async def store_pods(kube: Kube, namespace: str, name: str) -> list[dict]:
    return (await kube.get(PODS.path(namespace), labelSelector=f"{pj.JOB_NAME}={name},gangctl.io/role"))["items"]


async def test_elastic_c10d_pytorchjob_rendezvous_on_gangctl_store_and_succeeds(kube, namespace, kubeconfig,
                                                                                controller, process_nodes):
    name = "elastic-c10d"
    script = Path("/tmp/gangctl-pytorchjob") / namespace / "ddp_check.py"
    script.parent.mkdir(parents=True, exist_ok=True)
    script.write_text(DDP_CHECK)
    try:
        await kube.create(PYTORCHJOBS.path(namespace),
                          elastic(name, namespace, ["torchrun", "--nproc-per-node=1", str(script)]))
        seen: dict = {}

        async def store_running() -> bool:
            found = [p for p in await store_pods(kube, namespace, name) if p["status"].get("phase") == "Running"]
            seen["store"] = found[0] if found else None
            return bool(found)
        await eventually(store_running, 90, "the rendezvous store pod Running", interval=0.5)
        store = seen["store"]
        assert store["metadata"]["name"] == f"{name}-rdzv-pt"
        assert store["metadata"]["ownerReferences"][0]["kind"] == "PyTorchJob"
        svc = await kube.get(SERVICES.path(namespace, f"{name}-rdzv-pt"))
        assert svc["spec"]["selector"] == pj.store_labels(name)

        job = await finished(kube, namespace, name, "Succeeded", 180)
        assert job["status"]["conditions"][-1]["reason"] == "PyTorchJobSucceeded"
        workers = [p for p in (await kube.get(PODS.path(namespace), labelSelector=f"{pj.JOB_NAME}={name},"
                                              f"{pj.REPLICA_TYPE}=worker"))["items"]]
        reported = 0
        for pod in workers:
            assert {e["name"]: e.get("value") for e in pod["spec"]["containers"][0]["env"]}["PET_RDZV_ENDPOINT"] \
                == f"{name}-rdzv-pt:29400"
            out = kubectl(kubeconfig, "logs", "-n", namespace, pod["metadata"]["name"])
            lines = [ln for ln in out.stdout.splitlines() if ln.startswith("rank=")]
            if not lines:
                continue  # a worker that joined no round (the rendezvous closed at minReplicas without it)
            fields = dict(kv.split("=", 1) for kv in lines[-1].split())
            world = int(fields["world"])
            assert 2 <= world <= 3 and int(fields["sum"]) == world * (world + 1) // 2, lines
            reported += 1
        assert reported >= 2, "at least minReplicas workers trained together"

        async def store_gone() -> bool:
            return not [p for p in await store_pods(kube, namespace, name)
                        if not p["metadata"].get("deletionTimestamp")]
        await eventually(store_gone, 60, "the rendezvous store released with the gang", interval=0.5)
    finally:
        shutil.rmtree(script.parent, ignore_errors=True)
