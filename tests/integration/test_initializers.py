"""Initializers on the real cluster: the runtime's dataset and model initializer jobs run, in dependsOn
order, before the trainer's gang is made, sharing the PVC of the runtime's volumeClaimPolicies (as
Trainer's LLM runtimes declare it); ttlSecondsAfterFinished removes the children, not the TrainJob; a
failing initializer fails the TrainJob with its reason."""
from __future__ import annotations

import copy
from pathlib import Path

import pytest
import pytest_asyncio
import yaml

from gangctl.api.resources import JOBS, PERSISTENT_VOLUME_CLAIMS, SERVICES, TRAINING_RUNTIMES
from gangctl.cluster.local import LocalCluster
from gangctl.config import REPO_ROOT
from tests.integration.conftest import CONTROL_PLANE
from tests.integration.helpers import (KWOK_COMPLETE_DELAY, KWOK_COMPLETE_JITTER, condition, eventually, gang_state,
                                       get_trainjob, is_true, jobs_in, namespace_state, on_kwok_nodes, report_failed,
                                       reserved_volume, submit, trainjob)

pytestmark = pytest.mark.integration
RUNTIME = yaml.safe_load((REPO_ROOT / "deploy/runtimes/torch-kwok-gpu.yaml").read_text())
ANCESTOR = "trainer.kubeflow.org/trainjob-ancestor-step"


def step(name: str, after: list[str], run_for: str) -> dict:
    """An initializer job as Trainer's runtimes declare one (one attempt); KWOK ends its pod after `run_for`."""
    out: dict = {"name": name, "replicas": 1, "template": {
        "metadata": {"labels": {ANCESTOR: name}},
        "spec": {"backoffLimit": 0, "template": {
            "metadata": {"annotations": {KWOK_COMPLETE_DELAY: run_for, KWOK_COMPLETE_JITTER: run_for}},
            "spec": on_kwok_nodes({"restartPolicy": "Never",
                                   "containers": [{"name": name, "image": "ghcr.io/kubeflow/trainer/" + name,
                                                   "volumeMounts": [{"name": "initializer",
                                                                     "mountPath": "/workspace"}]}]})}}}}
    if after:
        out["dependsOn"] = [{"name": a, "status": "Complete"} for a in after]
    return out


async def make_runtime(kube, namespace: str, name: str, ttl: int | None = None) -> str:
    """The shape of Trainer's LLM runtimes: two initializers, then the trainer, all mounting the
    `initializer` volume that the runtime's volumeClaimPolicies declare."""
    rt = copy.deepcopy(RUNTIME)
    rt["kind"] = "TrainingRuntime"
    rt["metadata"] = {"name": name, "namespace": namespace}
    spec = rt["spec"]["template"]["spec"]
    spec["volumeClaimPolicies"] = [{"templates": [{
        "metadata": {"name": "initializer"},
        "spec": {"accessModes": ["ReadWriteOnce"], "storageClassName": "", "resources": {"requests": {"storage": "1Gi"}}}}]}]
    if ttl is not None:
        spec["ttlSecondsAfterFinished"] = ttl
    jobs = spec["replicatedJobs"]
    jobs[0]["template"]["spec"]["template"]["spec"]["containers"][0]["volumeMounts"] = [
        {"name": "initializer", "mountPath": "/workspace"}]
    jobs[0]["dependsOn"] = [{"name": "dataset-initializer", "status": "Complete"},
                            {"name": "model-initializer", "status": "Complete"}]
    rt["spec"]["template"]["spec"]["replicatedJobs"] = [
        step("dataset-initializer", [], "2s"), step("model-initializer", ["dataset-initializer"], "1s"), *jobs]
    await kube.create(TRAINING_RUNTIMES.path(namespace), rt)
    return name


@pytest_asyncio.fixture
async def volumes(kube):
    """Names of the PersistentVolumes a test reserved: cluster-scoped, so deleted when the test ends,
    whether it passed or not."""
    names: list[str] = []
    yield names
    for name in names:
        await kube.delete(f"/api/v1/persistentvolumes/{name}")


async def volume_for(kube, volumes: list[str], namespace: str, claim: str) -> str:
    """A PersistentVolume reserved for `claim`, deleted when the test ends (the `volumes` fixture)."""
    name = f"{namespace}-{claim}"
    volumes.append(name)
    await kube.create("/api/v1/persistentvolumes", reserved_volume(name, namespace, claim))
    return name


async def test_initializers_run_in_order_then_the_trainer(kube, controller, namespace, volumes, cluster_settings):
    rt = await make_runtime(kube, namespace, "with-init", ttl=8)
    pv = await volume_for(kube, volumes, namespace, "initializer-init")
    tj = trainjob("init", namespace, nodes=2, runtime=rt, runtime_kind="TrainingRuntime", run_for="2s")
    tj["spec"]["initializer"] = {"dataset": {"storageUri": "hf://tatsu-lab/alpaca"}}
    await submit(kube, tj)

    async def initializing() -> bool:
        return gang_state(await get_trainjob(kube, namespace, "init")).get("reason") == "Initializing"
    await eventually(initializing, 30, "the TrainJob initializing")
    names = {j["metadata"]["name"] for j in await jobs_in(kube, namespace)}
    assert "init-node-0" not in names, "the trainer waits for the initializers"
    dataset = await kube.get(JOBS.path(namespace, "init-dataset-initializer-0"))
    env = dataset["spec"]["template"]["spec"]["containers"][0]["env"]
    assert {"name": "STORAGE_URI", "value": "hf://tatsu-lab/alpaca"} in env
    assert dataset["spec"]["template"]["metadata"]["labels"][ANCESTOR] == "dataset-initializer"
    assert {"name": "initializer", "persistentVolumeClaim": {"claimName": "initializer-init"}} in \
        dataset["spec"]["template"]["spec"]["volumes"]
    claim = await kube.get(PERSISTENT_VOLUME_CLAIMS.path(namespace, "initializer-init"))
    assert claim["metadata"]["ownerReferences"][0]["name"] == "init", "deleted with the TrainJob"

    async def complete() -> bool:
        return is_true(await get_trainjob(kube, namespace, "init"), "Complete")
    # three steps in turn, each a Job whose pod waits for its volume, is scheduled, made Running by KWOK
    # (1-6 s) and completed; about 40 s on an idle machine, twice that beside the backends' clusters
    try:
        await eventually(complete, 180, "the TrainJob Complete after its initializers and its trainer")
    except AssertionError as err:
        logs = LocalCluster(cluster_settings, Path("/nonexistent")).logs_dir
        said = [f"{log.name}: {line[:400]}"   # the components' and the controller's logs (not the audit log)
                for log in [*(logs / f"{c}.log" for c in CONTROL_PLANE), controller.log_path] if log.exists()
                for line in log.read_text(errors="replace").splitlines() if namespace in line]
        tj = await get_trainjob(kube, namespace, "init")
        conditions = [(c.get("type"), c.get("status"), c.get("reason"))
                      for c in (tj.get("status") or {}).get("conditions") or []]
        raise AssertionError(f"{err} (conditions {conditions}, gang {gang_state(tj)}):\n"
                             f"{await namespace_state(kube, namespace)}\n"
                             + "\n".join(said[-40:])) from None
    jobs = {j["metadata"]["name"]: j for j in await jobs_in(kube, namespace)}
    done = {name: next(c["lastTransitionTime"] for c in j["status"]["conditions"] if c["type"] == "Complete")
            for name, j in jobs.items()}
    created = {name: j["metadata"]["creationTimestamp"] for name, j in jobs.items()}
    assert set(jobs) == {"init-dataset-initializer-0", "init-model-initializer-0", "init-node-0"}
    assert created["init-model-initializer-0"] >= done["init-dataset-initializer-0"], "model after dataset"
    assert created["init-node-0"] >= done["init-model-initializer-0"], "the trainer after both"
    trainer = jobs["init-node-0"]["spec"]["template"]["spec"]
    assert {"name": "initializer", "persistentVolumeClaim": {"claimName": "initializer-init"}} in trainer["volumes"]
    bound = await kube.get(f"/api/v1/persistentvolumes/{pv}")
    assert bound["status"]["phase"] in ("Bound", "Released"), "the pods ran on the runtime's claim"

    async def cleaned_up() -> bool:  # ttlSecondsAfterFinished: 8
        return (not await jobs_in(kube, namespace) and not await kube.exists(SERVICES.path(namespace, "init"))
                and not await kube.exists(PERSISTENT_VOLUME_CLAIMS.path(namespace, "initializer-init")))
    await eventually(cleaned_up, 60, "the children deleted ttlSecondsAfterFinished after the TrainJob finished")
    assert is_true(await get_trainjob(kube, namespace, "init"), "Complete"), "the TrainJob stays, Complete"


async def test_a_failing_initializer_fails_the_trainjob_and_the_trainer_never_starts(kube, controller, namespace):
    rt = await make_runtime(kube, namespace, "failing-init")
    tj = trainjob("bad-init", namespace, nodes=2, runtime=rt, runtime_kind="TrainingRuntime")
    await submit(kube, tj)
    name = "bad-init-dataset-initializer-0"
    await eventually(lambda: kube.exists(JOBS.path(namespace, name)), 30, "the dataset initializer Job")

    async def pod_failed() -> bool:  # its only attempt exits 1, as a kubelet would report it
        pods = (await kube.get(f"/api/v1/namespaces/{namespace}/pods", labelSelector=f"job-name={name}"))["items"]
        for pod in pods:
            if pod["status"].get("phase") != "Failed":
                await report_failed(kube, namespace, pod["metadata"]["name"], exit_code=1)
        return bool(pods) and all(p["status"].get("phase") == "Failed" for p in pods)
    await eventually(pod_failed, 30, "the initializer's pod Failed", interval=1)

    async def failed() -> bool:
        return is_true(await get_trainjob(kube, namespace, "bad-init"), "Failed")
    await eventually(failed, 60, "the TrainJob Failed")
    cond = condition(await get_trainjob(kube, namespace, "bad-init"), "Failed")
    assert cond["reason"] == "BackoffLimitExceeded" and "(dataset-initializer) failed" in cond["message"], cond
    assert "bad-init-node-0" not in {j["metadata"]["name"] for j in await jobs_in(kube, namespace)}
