"""PyTorchJob (kubeflow.org/v1) served by gangctl's controller on the session cluster: a v1 DDP
manifest runs real torchrun workers on process nodes to Succeeded with v1's env and v1's pod names
(`kubectl logs <job>-master-0`); an elastic gang on
KWOK GPU nodes gets one PodGroup whose minMember honours elasticPolicy.minReplicas; a failing
worker charges the restart budget (runPolicy.backoffLimit) and ends Failed with v1's reason; an OnFailure
rank that fails once restarts in place (same pods) and resumes from its checkpoint; an
invalid PyTorchJob is refused by the API naming the field; `gangctl explain pytorchjob/NS/NAME` gives a
waiting gang's reason and numbers; suspend lets go of the gang; an edit of a running job reaches only
pods made after it; an elastic Worker group shrinks on node loss and grows back."""
from __future__ import annotations

import copy
import json
import shutil
import signal
import time
from pathlib import Path

import pytest
import yaml

from gangctl.api.resources import JOBS, PODS, PYTORCHJOBS, TRAINJOBS
from gangctl.config import REPO_ROOT
from gangctl.kube.client import ApiError, Kube
from gangctl.policy import pytorchjob as pj
from gangctl.policy import decide_pytorchjob as dp
from gangctl.policy.decide_pytorchjob import RESTARTS_ANNOTATION
from tests.integration.conftest import GPU_NODES, wait_ready
from tests.integration.helpers import (KWOK_COMPLETE_DELAY, KWOK_COMPLETE_JITTER, bound, condition, eventually,
                                       gangctl_cli, is_true, node_not_ready, node_ready, on_kwok_nodes, pod_group,
                                       pods_of, submit, trainjob)
from tests.integration.test_process_nodes import kubectl

pytestmark = pytest.mark.integration

MANIFEST = REPO_ROOT / "examples" / "pytorchjob" / "ddp.yaml"
PROCESS_NODE_PLACEMENT = {
    "nodeSelector": {"gangctl.io/process-node": "true"},
    "tolerations": [{"key": "gangctl.io/process-node", "operator": "Exists", "effect": "NoSchedule"}],
}
# One DDP step over gloo: every rank all-reduces rank+1, so the sum is 1+2+...+WORLD_SIZE.
DDP_CHECK = """\
import os
import torch
import torch.distributed as dist
dist.init_process_group("gloo")
t = torch.tensor([float(dist.get_rank() + 1)])
dist.all_reduce(t)
print(f"rank={os.environ['RANK']} world={os.environ['WORLD_SIZE']} master={os.environ['MASTER_ADDR']} sum={int(t.item())}",
      flush=True)
dist.destroy_process_group()
"""


async def get(kube: Kube, namespace: str, name: str) -> dict:
    return await kube.get(PYTORCHJOBS.path(namespace, name))


async def pods(kube: Kube, namespace: str, name: str) -> list[dict]:
    return (await kube.get(PODS.path(namespace), labelSelector=f"{pj.JOB_NAME}={name}"))["items"]


def env_of(pod: dict) -> dict[str, dict]:
    return {e["name"]: e for e in pod["spec"]["containers"][0]["env"]}


async def finished(kube: Kube, namespace: str, name: str, want: str, timeout: float) -> dict:
    seen: dict = {}

    async def done() -> bool:
        seen["job"] = job = await get(kube, namespace, name)
        other = "Failed" if want == "Succeeded" else "Succeeded"
        assert not is_true(job, other), job.get("status")
        return is_true(job, want)
    await eventually(done, timeout, f"PyTorchJob {namespace}/{name} {want}", interval=0.5)
    return seen["job"]


def on_process_nodes(obj: dict, command: list[str], cpu: str) -> dict:
    """Only what a process node needs: its placement, a command it can run (the image is not pulled),
    and a CPU size that fits this machine's process nodes."""
    for spec in obj["spec"]["pytorchReplicaSpecs"].values():
        pod = spec["template"]["spec"]
        pod.update(copy.deepcopy(PROCESS_NODE_PLACEMENT))
        pod["terminationGracePeriodSeconds"] = 5
        container = pod["containers"][0]
        container["command"] = command
        container["resources"] = {"limits": {"cpu": cpu}}
    return obj


async def test_v1_ddp_manifest_runs_torchrun_to_succeeded_with_v1_env(kube, namespace, kubeconfig, controller,
                                                                      process_nodes):
    obj = yaml.safe_load(MANIFEST.read_text())
    name = obj["metadata"]["name"]
    obj["metadata"]["namespace"] = namespace
    script = Path("/tmp/gangctl-pytorchjob") / namespace / "ddp_check.py"
    script.parent.mkdir(parents=True, exist_ok=True)
    script.write_text(DDP_CHECK)
    # torchrun takes the rest from v1's PET_* variables (PET_NNODES, PET_NODE_RANK, PET_MASTER_ADDR/PORT);
    # v1's default nprocPerNode "auto" would start one process per CPU of the machine
    on_process_nodes(obj, ["torchrun", "--nproc-per-node=1", str(script)], cpu="500m")
    try:
        await kube.create(PYTORCHJOBS.path(namespace), obj)
        job = await finished(kube, namespace, name, "Succeeded", 150)
        conds = {c["type"]: c for c in job["status"]["conditions"]}
        assert conds["Succeeded"]["reason"] == "PyTorchJobSucceeded"
        assert conds["Created"]["reason"] == "PyTorchJobCreated"
        assert job["status"]["replicaStatuses"]["Master"]["succeeded"] == 1
        assert job["status"]["completionTime"]

        found = await pods(kube, namespace, name)
        assert len(found) == 4, [p["metadata"]["name"] for p in found]
        ranks = {}
        for pod in found:
            labels = pod["metadata"]["labels"]
            env = env_of(pod)
            assert env["MASTER_ADDR"]["value"] == f"{name}-master-0"
            assert env["MASTER_PORT"]["value"] == "23456" and env["WORLD_SIZE"]["value"] == "4"
            assert env["PET_NNODES"]["value"] == "4" and env["PYTHONUNBUFFERED"]["value"] == "1"
            assert labels[pj.OPERATOR_NAME] == "pytorchjob-controller" and labels[pj.JOB_NAME] == name
            rtype, index = labels[pj.REPLICA_TYPE], int(labels[pj.REPLICA_INDEX])
            assert pod["metadata"]["name"] == f"{name}-{rtype}-{index}", "v1's pod name (and so its hostname)"
            assert pod["metadata"]["ownerReferences"][0]["kind"] == "PyTorchJob"
            assert not pod["spec"].get("schedulingGates")
            out = kubectl(kubeconfig, "logs", "-n", namespace, f"{name}-{rtype}-{index}")   # the tutorials' command
            assert out.returncode == 0, out.stderr
            line = next((ln for ln in out.stdout.splitlines() if ln.startswith("rank=")), None)
            assert line is not None, out.stdout[-2000:]
            fields = dict(kv.split("=", 1) for kv in line.split())
            assert fields["world"] == "4" and fields["master"] == f"{name}-master-0" and fields["sum"] == "10"
            ranks[(rtype, index)] = int(fields["rank"])
        # v1's ranks: the Master is 0, worker i is i + 1
        assert ranks == {("master", 0): 0, ("worker", 0): 1, ("worker", 1): 2, ("worker", 2): 3}
        group = await pod_group(kube, namespace, pj.group_name(name))
        assert group is None, "the gang is released when the job finishes"
    finally:
        shutil.rmtree(script.parent, ignore_errors=True)


def kwok_elastic(name: str, namespace: str, *, long_running: bool = False, **elastic) -> dict:
    """4 Workers of 8 GPUs on KWOK nodes, elastic down to 2; `long_running`: KWOK keeps the pods Running
    for an hour (else it completes them within seconds)."""
    pod = on_kwok_nodes({"containers": [{"name": "pytorch", "image": "pytorch/pytorch:2.7.1", "command": ["torchrun", "t.py"],
                                         "resources": {"limits": {"nvidia.com/gpu": "8"}}}]})
    template: dict = {"spec": pod}
    if long_running:
        template["metadata"] = {"annotations": {KWOK_COMPLETE_DELAY: "3600s", KWOK_COMPLETE_JITTER: "3601s"}}
    return {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "metadata": {"name": name, "namespace": namespace},
            "spec": {"elasticPolicy": {"minReplicas": 2, "maxReplicas": 4, "rdzvBackend": "c10d", **elastic},
                     "pytorchReplicaSpecs": {"Worker": {"replicas": 4, "restartPolicy": "OnFailure",
                                                        "template": template}}}}


async def test_elastic_gang_on_kwok_gpu_nodes_gets_one_podgroup_floored_at_min_replicas(kube, namespace, controller):
    await kube.create(PYTORCHJOBS.path(namespace), kwok_elastic("elastic", namespace))

    async def running() -> bool:
        return is_true(await get(kube, namespace, "elastic"), "Running")
    await eventually(running, 90, "elastic PyTorchJob Running", interval=0.5)
    groups = (await kube.get(f"/apis/scheduling.x-k8s.io/v1alpha1/namespaces/{namespace}/podgroups"))["items"]
    assert [g["metadata"]["name"] for g in groups] == ["elastic-pytorch"]   # not a TrainJob's group name
    spec = groups[0]["spec"]
    assert spec["minMember"] == 2                     # elasticPolicy.minReplicas (v1 summed every replica: 4)
    assert spec["minResources"] == {"nvidia.com/gpu": "16"}
    every = await pods(kube, namespace, "elastic")
    found = [p for p in every if p["metadata"]["labels"].get(pj.REPLICA_TYPE) == "worker"]
    assert len(found) == 4 and all(p["spec"].get("nodeName") for p in found)
    # c10d without rdzvHost: gangctl's rendezvous store, which is no member of the gang
    assert [p["metadata"]["name"] for p in every if p not in found] == [pj.store_name("elastic")]
    assert {p["metadata"]["labels"]["scheduling.x-k8s.io/pod-group"] for p in found} == {"elastic-pytorch"}
    env = env_of(found[0])
    assert env["PET_NNODES"]["value"] == "2:4" and env["PET_RDZV_BACKEND"]["value"] == "c10d"


def failing(name: str, namespace: str, restart: str, backoff: int) -> dict:
    def spec(command: list[str]) -> dict:
        return {"replicas": 1, "restartPolicy": restart, "template": {"spec": {
            **copy.deepcopy(PROCESS_NODE_PLACEMENT), "terminationGracePeriodSeconds": 1,
            "containers": [{"name": "pytorch", "image": "python:3.11", "command": command,
                            "resources": {"requests": {"cpu": "100m"}}}]}}}
    return {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "metadata": {"name": name, "namespace": namespace},
            "spec": {"runPolicy": {"backoffLimit": backoff},
                     "pytorchReplicaSpecs": {"Master": spec(["python3", "-c", "import time; time.sleep(60)"]),
                                             "Worker": spec(["python3", "-c", "import sys; sys.exit(3)"])}}}


async def test_a_failing_worker_charges_the_restart_budget_then_fails_with_v1_reason(kube, namespace, controller,
                                                                                   process_nodes):
    await kube.create(PYTORCHJOBS.path(namespace), failing("onfailure", namespace, "OnFailure", 1))
    await kube.create(PYTORCHJOBS.path(namespace), failing("exitcode", namespace, "ExitCode", 3))
    job = await finished(kube, namespace, "onfailure", "Failed", 120)
    failed = condition(job, "Failed")
    assert failed["reason"] == "PyTorchJobFailed" and "budget" in failed["message"], failed
    counters = json.loads(job["metadata"]["annotations"][RESTARTS_ANNOTATION])
    assert counters["user"] == 1 and counters["lastFailure"]["exitCode"] == 3, counters
    # ExitCode: an exit code below 128 is permanent, so the job fails at once, charging nothing
    job = await finished(kube, namespace, "exitcode", "Failed", 120)
    assert condition(job, "Failed")["reason"] == "PyTorchJobFailed"
    counters = json.loads(job["metadata"]["annotations"][RESTARTS_ANNOTATION])
    assert counters["user"] == 0 and counters["lastFailure"]["action"] == "Fail", counters


async def test_an_on_failure_rank_that_fails_once_restarts_in_place_and_resumes(kube, namespace, kubeconfig, controller,
                                                                               process_nodes):
    """v1's OnFailure, real torchrun: worker 0 (rank 1) exits with code 3 once after step 60; the kubelet
    restarts containers in their pods, the run resumes from the step-50 checkpoint, one restart is charged."""
    name, ckpt = "in-place", Path("/tmp/gangctl-ddp") / namespace / "in-place"
    replica = {"restartPolicy": "OnFailure", "template": {"spec": {"containers": [{"name": "pytorch", "image": "x", "env": [
        {"name": "CHECKPOINT_DIR", "value": str(ckpt)}, {"name": "FAIL_ONCE", "value": "1:60:3"},
        {"name": "TARGET_LOSS", "value": "0.02"}, {"name": "MAX_STEPS", "value": "600"}]}]}}}
    obj = {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "metadata": {"name": name, "namespace": namespace},
           "spec": {"runPolicy": {"backoffLimit": 2},
                    "pytorchReplicaSpecs": {"Master": {"replicas": 1, **copy.deepcopy(replica)},
                                            "Worker": {"replicas": 2, **copy.deepcopy(replica)}}}}
    on_process_nodes(obj, ["torchrun", "--nproc-per-node=1", str(REPO_ROOT / "examples" / "ddp" / "train.py")], cpu="500m")
    try:
        await kube.create(PYTORCHJOBS.path(namespace), obj)

        async def all_running() -> bool:
            found = await pods(kube, namespace, name)
            return len(found) == 3 and all(p["status"].get("phase") == "Running" for p in found)
        await eventually(all_running, 90, "the three pods Running")
        before = {p["metadata"]["uid"]: p["spec"]["nodeName"] for p in await pods(kube, namespace, name)}
        job = await finished(kube, namespace, name, "Succeeded", 240)

        counters = json.loads(job["metadata"]["annotations"][RESTARTS_ANNOTATION])
        assert counters["user"] == 1 and counters["infrastructure"] == 0, counters
        last = counters["lastFailure"]
        assert (last["action"], last["reason"], last["attemptRestarts"]) == ("RestartInPlace", "RestartedInPlace", 1), last
        found = await pods(kube, namespace, name)
        assert {p["metadata"]["uid"]: p["spec"]["nodeName"] for p in found} == before, "same pods on the same nodes"
        assert not (await kube.get(JOBS.path(namespace)))["items"], "no Job: gangctl's own pods, as v1's"
        worker0 = next(p for p in found if p["metadata"]["labels"][pj.REPLICA_TYPE] == "worker"
                       and p["metadata"]["labels"][pj.REPLICA_INDEX] == "0")
        assert worker0["status"]["containerStatuses"][0]["restartCount"] >= 1
        out = kubectl(kubeconfig, "logs", "-n", namespace, worker0["metadata"]["name"]).stdout
        assert "resumed from checkpoint" in out and "(step 50)" in out, out[-2000:]
    finally:
        shutil.rmtree(ckpt, ignore_errors=True)


async def test_an_invalid_pytorchjob_is_refused_naming_the_field(kube, namespace, controller):
    obj = kwok_elastic("bad", namespace)
    obj["spec"]["elasticPolicy"]["minReplicas"] = 5   # above maxReplicas
    with pytest.raises(ApiError) as err:
        await kube.create(PYTORCHJOBS.path(namespace), obj)
    assert err.value.status == 422
    assert "elasticPolicy" in err.value.message and "minReplicas" in err.value.message, err.value.message
    obj = kwok_elastic("bad", namespace)
    obj["spec"]["pytorchReplicaSpecs"]["Worker"]["restartPolicy"] = "Sometimes"
    with pytest.raises(ApiError) as err:
        await kube.create(PYTORCHJOBS.path(namespace), obj)
    assert err.value.status == 422 and "restartPolicy" in err.value.message, err.value.message


async def test_a_controller_restart_keeps_the_budget_and_duplicates_nothing(kube, namespace, controller,
                                                                           process_nodes):
    steady = kwok_elastic("steady", namespace)
    del steady["spec"]["elasticPolicy"]
    # KWOK completes a pod after a few seconds unless told otherwise: this one runs for an hour
    steady["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["metadata"] = {
        "annotations": {KWOK_COMPLETE_DELAY: "3600s", KWOK_COMPLETE_JITTER: "3600s"}}
    await kube.create(PYTORCHJOBS.path(namespace), steady)
    slow = failing("slow", namespace, "OnFailure", 2)
    slow["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]["containers"][0]["command"] = [
        "python3", "-c", "import sys, time; time.sleep(3); sys.exit(3)"]
    await kube.create(PYTORCHJOBS.path(namespace), slow)

    async def first_restart_charged() -> bool:
        job = await get(kube, namespace, "slow")
        text = ((job["metadata"].get("annotations") or {}).get(RESTARTS_ANNOTATION))
        return bool(text) and json.loads(text)["user"] >= 1
    await eventually(first_restart_charged, 60, "the first restart of slow charged", interval=0.2)
    await eventually(lambda: _is_running(kube, namespace, "steady"), 60, "steady Running", interval=0.5)
    before = sorted(p["metadata"]["uid"] for p in await pods(kube, namespace, "steady"))

    controller.stop(signal.SIGKILL)
    controller.start()
    await wait_ready(controller)

    job = await finished(kube, namespace, "slow", "Failed", 90)
    counters = json.loads(job["metadata"]["annotations"][RESTARTS_ANNOTATION])
    assert counters["user"] == 2, counters            # the budget went on from where it was: 2 restarts, no more
    assert "2/2" in condition(job, "Failed")["message"], condition(job, "Failed")
    assert sorted(p["metadata"]["uid"] for p in await pods(kube, namespace, "steady")) == before
    assert is_true(await get(kube, namespace, "steady"), "Running")


async def _is_running(kube: Kube, namespace: str, name: str) -> bool:
    return is_true(await get(kube, namespace, name), "Running")


async def test_explain_says_why_a_pytorchjob_waits_and_that_a_running_one_runs(kube, namespace, kubeconfig, controller):
    too_big = GPU_NODES + 1                              # Workers of 8 GPUs: one more than the cluster has nodes
    job = kwok_elastic("toobig", namespace, long_running=True)
    job["spec"].pop("elasticPolicy")
    job["spec"]["pytorchReplicaSpecs"]["Worker"]["replicas"] = too_big
    await kube.create(PYTORCHJOBS.path(namespace), job)

    async def all_pods() -> bool:
        return len([p for p in await pods(kube, namespace, "toobig") if p["metadata"]["name"] != pj.store_name("toobig")]) == too_big
    await eventually(all_pods, 60, "the waiting PyTorchJob's pods created", interval=0.5)
    result = gangctl_cli("explain", f"pytorchjob/{namespace}/toobig", "-o", "json", kubeconfig=kubeconfig, timeout=60)
    assert result.returncode == 0, result.stderr
    d = json.loads(result.stdout)
    assert d["pytorchjob"] == f"{namespace}/toobig" and d["reason"] == "InsufficientCapacity"
    assert d["pods_missing"] == too_big
    gpus = next(r for r in d["rows"] if r["resource"] == "nvidia.com/gpu")
    assert gpus["needed"] == too_big * 8 and gpus["free"] < gpus["needed"]
    await kube.delete(PYTORCHJOBS.path(namespace, "toobig"))

    await kube.create(PYTORCHJOBS.path(namespace), kwok_elastic("fits", namespace, long_running=True))

    async def running() -> bool:
        return is_true(await get(kube, namespace, "fits"), "Running")
    await eventually(running, 90, "the fitting PyTorchJob Running", interval=0.5)
    text = gangctl_cli("explain", f"pytorchjob/{namespace}/fits", kubeconfig=kubeconfig, timeout=60)
    assert text.returncode == 0 and "GangScheduled" in text.stdout, text.stdout + text.stderr
    missing = gangctl_cli("explain", f"pytorchjob/{namespace}/no-such-job", kubeconfig=kubeconfig, timeout=60)
    assert missing.returncode == 1 and "PyTorchJob" in missing.stderr and "not found" in missing.stderr


async def test_a_gang_that_does_not_fit_binds_nothing_and_binds_whole_once_capacity_appears(kube, namespace,
                                                                                           controller):
    filler = GPU_NODES - 2   # 2 GPU nodes stay free
    await submit(kube, trainjob("filler", namespace, nodes=filler, run_for="3600s"))

    async def filler_bound() -> bool:
        return len(bound(await pods_of(kube, namespace, "filler"))) == filler
    await eventually(filler_bound, 120, "the filler gang bound")
    job = kwok_elastic("later", namespace, long_running=True, rdzvHost="rdzv.example", rdzvPort=2379)
    job["spec"].pop("elasticPolicy")   # 4 Workers of a whole node each: 2 more nodes than are free
    await kube.create(PYTORCHJOBS.path(namespace), job)

    async def refused_whole() -> bool:
        found = await pods(kube, namespace, "later")
        assert bound(found) == [], "a gang that does not fit binds no pod"
        refused = [p for p in found if any(c["type"] == "PodScheduled" and c["status"] == "False"
                                           for c in (p.get("status") or {}).get("conditions") or [])]
        return len(refused) == 4
    await eventually(refused_whole, 60, "every Worker of the gang refused by the scheduler, none bound")
    await kube.delete(TRAINJOBS.path(namespace, "filler"))
    # Its pods go now, not after KWOK's 30 s termination grace.
    await kube.request("DELETE", PODS.path(namespace), params={"labelSelector": "jobset.sigs.k8s.io/jobset-name=filler"},
                       body={"gracePeriodSeconds": 0})
    freed = time.monotonic()

    async def bound_whole() -> bool:
        return len(bound(await pods(kube, namespace, "later"))) == 4
    # Well inside the scheduler's own 5-minute flush of unschedulable pods: gangctl hands the gang
    # back to it when capacity is freed, as it does a TrainJob's.
    await eventually(bound_whole, 90, "the PyTorchJob's gang bound whole once capacity appeared")
    print(f"[gang] bound {time.monotonic() - freed:.1f} s after the filler's deletion")
    await eventually(lambda: _is_running(kube, namespace, "later"), 30, "the PyTorchJob Running")


async def _is_running(kube: Kube, namespace: str, name: str) -> bool:
    return is_true(await get(kube, namespace, name), "Running")


async def test_an_edit_leaves_the_running_pods_alone_and_a_pod_made_after_it_has_it(kube, namespace, controller):
    """As under v1: pods are made from the template as it is when they are made. An edit of a running
    job's template changes no running pod; a Worker deleted by hand comes back under its name, edited."""
    await kube.create(PYTORCHJOBS.path(namespace), kwok_elastic("edited", namespace, long_running=True))

    async def running() -> bool:
        return is_true(await get(kube, namespace, "edited"), "Running") and len(await pods(kube, namespace, "edited")) == 5
    await eventually(running, 90, "the PyTorchJob Running with its Master and 4 Workers", interval=0.5)
    before = {p["metadata"]["name"]: p["metadata"]["uid"] for p in await pods(kube, namespace, "edited")}
    path = PYTORCHJOBS.path(namespace, "edited")
    containers = (await kube.get(path))["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]["containers"]
    containers[0]["env"] = [{"name": "LR", "value": "0.1"}]
    await kube.json_patch(path, [{"op": "replace", "path": "/spec/pytorchReplicaSpecs/Worker/template/spec/containers",
                                  "value": containers}])
    victim = await kube.get(PODS.path(namespace, "edited-worker-1"))
    await kube.delete(PODS.path(namespace, "edited-worker-1"), uid=victim["metadata"]["uid"])

    async def back() -> bool:
        found = {p["metadata"]["name"]: p for p in await pods(kube, namespace, "edited")}
        again = found.get("edited-worker-1")
        return again is not None and again["metadata"]["uid"] != before["edited-worker-1"] and len(found) == 5
    await eventually(back, 90, "edited-worker-1 made again under its name")
    found = {p["metadata"]["name"]: p for p in await pods(kube, namespace, "edited")}
    assert env_of(found["edited-worker-1"])["LR"]["value"] == "0.1", "made after the edit: it has it"
    assert {n: p["metadata"]["uid"] for n, p in found.items() if n != "edited-worker-1"} == {
        n: u for n, u in before.items() if n != "edited-worker-1"}, "the running pods are left alone"
    assert "LR" not in env_of(found["edited-worker-0"])
    events = (await kube.get(f"/api/v1/namespaces/{namespace}/events", fieldSelector="reason=ReconcileError"))["items"]
    assert not [e for e in events if e["involvedObject"]["name"] == "edited"], "nothing is stuck"
    assert is_true(await get(kube, namespace, "edited"), "Running")


async def test_suspend_releases_the_gang_and_resume_runs_it_again(kube, namespace, controller):
    await kube.create(PYTORCHJOBS.path(namespace), kwok_elastic("pause", namespace, long_running=True))

    async def running() -> bool:
        return is_true(await get(kube, namespace, "pause"), "Running")
    await eventually(running, 90, "the PyTorchJob Running", interval=0.5)
    path = PYTORCHJOBS.path(namespace, "pause")
    await kube.merge_patch(path, {"spec": {"runPolicy": {"suspend": True}}})
    groups = f"/apis/scheduling.x-k8s.io/v1alpha1/namespaces/{namespace}/podgroups"

    async def released() -> bool:
        obj = await get(kube, namespace, "pause")
        return (is_true(obj, "Suspended") and not await pods(kube, namespace, "pause")
                and not (await kube.get(groups))["items"])
    await eventually(released, 60, "Suspended, with no pod (Workers and store) and no PodGroup left", interval=0.5)
    suspended = condition(await get(kube, namespace, "pause"), "Suspended")
    assert suspended["reason"] == "PyTorchJobSuspended" and not is_true(await get(kube, namespace, "pause"), "Running")

    await kube.merge_patch(path, {"spec": {"runPolicy": {"suspend": False}}})

    async def resumed() -> bool:
        obj = await get(kube, namespace, "pause")
        workers = [p for p in await pods(kube, namespace, "pause") if p["metadata"]["labels"].get(pj.REPLICA_TYPE) == "worker"]
        return is_true(obj, "Running") and not is_true(obj, "Suspended") and len(workers) == 4
    await eventually(resumed, 90, "Running again with its 4 Workers after resume", interval=0.5)
    assert [g["metadata"]["name"] for g in (await kube.get(groups))["items"]] == ["pause-pytorch"]


async def test_an_elastic_job_shrinks_on_node_loss_and_grows_back_to_its_replicas(kube, namespace, controller):
    filler = GPU_NODES - 4  # leaves 4 free GPU nodes
    await submit(kube, trainjob("filler", namespace, nodes=filler, run_for="3600s"))

    async def filler_bound() -> bool:
        return len(bound(await pods_of(kube, namespace, "filler"))) == filler
    await eventually(filler_bound, 120, "the filler gang bound")
    # rdzvHost given: no store pod of gangctl's takes a node, so the 4 Workers have exactly 4 nodes.
    await kube.create(PYTORCHJOBS.path(namespace), kwok_elastic("el", namespace, long_running=True,
                                                                rdzvHost="rdzv.example", rdzvPort=2379))

    async def healthy() -> list[dict]:
        return [p for p in await pods(kube, namespace, "el") if p["spec"].get("nodeName")
                and not p["metadata"].get("deletionTimestamp") and p["status"].get("phase") == "Running"]

    async def size_is(n: int) -> bool:
        memo = json.loads(((await get(kube, namespace, "el"))["metadata"].get("annotations") or {}).get(
            dp.ELASTIC_ANNOTATION) or "{}")
        live = [p for p in await pods(kube, namespace, "el") if p["metadata"]["labels"].get(pj.REPLICA_TYPE) == "worker"
                and not p["metadata"].get("deletionTimestamp") and p["status"].get("phase") in ("Pending", "Running")
                and not any(c["type"] == "DisruptionTarget" and c["status"] == "True"
                            for c in p["status"].get("conditions") or [])]
        return memo.get("size", 4) == n and len(live) == n and len(await healthy()) == n
    await eventually(lambda: size_is(4), 90, "the elastic PyTorchJob running its 4 Workers")
    workers = await healthy()
    victim = max(workers, key=lambda p: int(p["metadata"]["labels"][pj.REPLICA_INDEX]))
    node = victim["spec"]["nodeName"]
    survivors = {p["metadata"]["uid"] for p in workers} - {victim["metadata"]["uid"]}
    await node_not_ready(kube, node)
    try:
        await eventually(lambda: size_is(3), 90, "the Workers shrunk to 3 after the node loss")
        obj = await get(kube, namespace, "el")
        memo = json.loads(obj["metadata"]["annotations"][dp.ELASTIC_ANNOTATION])
        assert memo["lastResizeReason"] in ("NodeLost", "Unschedulable") and memo["resizes"] >= 1
        assert survivors <= {p["metadata"]["uid"] for p in await healthy()}, "no healthy worker was killed"
        assert is_true(obj, "Running") and not is_true(obj, "Failed") and RESTARTS_ANNOTATION not in obj["metadata"]["annotations"]

        await kube.delete(TRAINJOBS.path(namespace, "filler"))   # capacity returns
        await eventually(lambda: size_is(4), 120, "the Workers grown back to their 4 replicas")
        assert survivors <= {p["metadata"]["uid"] for p in await healthy()}, "growing kills no worker"
        assert json.loads((await get(kube, namespace, "el"))["metadata"]["annotations"][dp.ELASTIC_ANNOTATION])[
            "lastResizeReason"] == "CapacityProbe"
    finally:
        await node_ready(kube, node)
