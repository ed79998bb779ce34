"""The kubeflow SDK (`kubeflow` 0.5.0), unchanged, against gangctl on the session's process nodes (conftest.py):

- the Kubeflow Trainer documentation's first example (tests/integration/data/getting_started_sdk.py),
  run as written on the default runtime torch-distributed, while a KWOK GPU gang in the same cluster
  binds only to KWOK's fake nodes (they carry KWOK's taint, process nodes none);
- every public method of `TrainerClient`, on two TrainJobs that run side by side: a CustomTrainer
  function with every option the SDK offers for it (Name, Labels, Annotations, RuntimePatch) on the
  cluster runtime torch-distributed, and a CustomTrainerContainer with TrainerCommand/TrainerArgs on
  a namespaced TrainingRuntime (a copy of the shipped torch-process-nodes).
"""
from __future__ import annotations

import asyncio
import copy
import logging
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from gangctl.api.resources import NODES, TRAINING_RUNTIMES, TRAINJOBS
from gangctl.cluster.local import KWOK_NODE_TAINT, KWOK_RUNTIME
from gangctl.config import REPO_ROOT
from tests.integration.conftest import PROCESS_RUNTIME
from tests.integration.helpers import bound, eventually, pods_of, submit, trainjob

pytestmark = pytest.mark.integration

EXAMPLE = Path(__file__).parent / "data" / "getting_started_sdk.py"
SDK_MANAGER = "trainer.kubeflow.org/kubeflow-sdk"  # the manager the SDK writes in spec.runtimePatches


def client_for(kubeconfig: Path, namespace: str):
    from kubeflow.common.types import KubernetesBackendConfig
    from kubeflow.trainer import TrainerClient

    return TrainerClient(KubernetesBackendConfig(namespace=namespace, config_file=str(kubeconfig)))


def kubeconfig_in(admin: Path, namespace: str, path: Path) -> Path:
    """The admin kubeconfig with `namespace` as its context's namespace: where TrainerClient() works."""
    cfg = yaml.safe_load(admin.read_text())
    for ctx in cfg["contexts"]:
        if ctx["name"] == cfg["current-context"]:
            ctx["context"]["namespace"] = namespace
    path.write_text(yaml.safe_dump(cfg))
    return path


async def test_documentation_example_runs_unchanged_beside_a_kwok_gpu_gang(kube, kubeconfig, namespace, controller,
                                                                            process_nodes, tmp_path):
    nodes = (await kube.get(NODES.path()))["items"]
    kwok = {n["metadata"]["name"] for n in nodes if n["metadata"]["labels"].get("type") == "kwok"}
    process = {n["metadata"]["name"] for n in nodes if n["metadata"]["labels"].get("gangctl.io/process-node") == "true"}
    assert kwok and set(process_nodes) <= process
    for n in nodes:  # KWOK's convention: the fake nodes are the tainted ones; process nodes run anything
        taints = (n.get("spec") or {}).get("taints") or []
        if n["metadata"]["name"] in kwok:
            assert KWOK_NODE_TAINT in taints, n["metadata"]["name"]
        elif n["metadata"]["name"] in process:
            assert not [t for t in taints if t.get("effect") in ("NoSchedule", "NoExecute")], taints

    # A KWOK GPU gang (the shipped torch-kwok-gpu runtime), in the cluster at the same time.
    await submit(kube, trainjob("kwok-gang", namespace, nodes=2, runtime=KWOK_RUNTIME))

    started = time.monotonic()
    env = {**os.environ, "KUBECONFIG": str(kubeconfig_in(kubeconfig, namespace, tmp_path / "kubeconfig"))}
    run = await asyncio.to_thread(subprocess.run, [sys.executable, str(EXAMPLE)], env=env, capture_output=True,
                                  text=True, timeout=300)
    elapsed = time.monotonic() - started
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    print(f"[sdk] the documentation's example: submission to Complete and logs in {elapsed:.1f}s")
    # What the example prints: node-0's log, its two processes (2 CPUs: Kubeflow's nproc rule for CPU).
    assert "PyTorch Distributed Environment" in run.stdout and "WORLD_SIZE: 6" in run.stdout, run.stdout

    jobs = [j["metadata"]["name"] for j in (await kube.get(TRAINJOBS.path(namespace)))["items"]]
    (job_id,) = [j for j in jobs if j != "kwok-gang"]
    client = client_for(kubeconfig, namespace)
    ranks, sizes = [], []
    for step in ("node-0", "node-1", "node-2"):
        log = "\n".join(client.get_job_logs(job_id, step=step))
        ranks += [int(r) for r in re.findall(r"^RANK: (\d+)$", log, re.M)]
        sizes += re.findall(r"^WORLD_SIZE: (\d+)$", log, re.M)
    # Two processes per node print to one log, so a line may be interleaved with the other's: every
    # rank must appear once, and every WORLD_SIZE line read whole says 6.
    assert sorted(ranks) == [0, 1, 2, 3, 4, 5] and sizes and set(sizes) == {"6"}, (ranks, sizes)
    example_pods = await pods_of(kube, namespace, job_id)
    assert len(example_pods) == 3 and {p["spec"]["nodeName"] for p in example_pods} <= process, \
        "the default runtime's pods ran on process nodes"

    async def gang_bound() -> bool:
        return len(bound(await pods_of(kube, namespace, "kwok-gang"))) == 2
    await eventually(gang_bound, 60, "the KWOK GPU gang's 2 pods bound")
    gang_nodes = {p["spec"]["nodeName"] for p in await pods_of(kube, namespace, "kwok-gang")}
    assert gang_nodes <= kwok, f"the KWOK gang bound to {gang_nodes}, not only KWOK nodes"


def ticks(count: str):
    """Runs under torchrun on each node: numbered lines half a second apart (what get_job_logs follows)."""
    import os
    import time

    for i in range(int(count)):
        print(f"tick {i} of node {os.environ['PET_NODE_RANK']} TEAM_ENV={os.environ.get('TEAM_ENV')}", flush=True)
        time.sleep(0.5)


async def test_sdk_contract_every_trainer_client_method(kube, kubeconfig, namespace, controller, process_nodes, caplog,
                                                        capsys):
    from kubeflow.trainer import CustomTrainer, CustomTrainerContainer
    from kubeflow.trainer.options.common import Name
    from kubeflow.trainer.options.kubernetes import (Annotations, JobSetSpecPatch, JobSetTemplatePatch, JobSpecPatch,
                                                     JobTemplatePatch, Labels, PodSpecPatch, PodTemplatePatch,
                                                     ReplicatedJobPatch, RuntimePatch, TrainerArgs, TrainerCommand,
                                                     TrainingRuntimeSpecPatch)
    from kubeflow.trainer.types.types import RuntimeKind

    with caplog.at_level(logging.WARNING):
        client = client_for(kubeconfig, namespace)
    # The SDK reads the control plane's version from kubeflow-system/kubeflow-trainer-public.
    assert "version info is not available" not in caplog.text, caplog.text

    # A namespaced TrainingRuntime: a team's copy of the shipped process-node runtime.
    team_rt = copy.deepcopy(yaml.safe_load((REPO_ROOT / "deploy/runtimes" / f"{PROCESS_RUNTIME}.yaml").read_text()))
    team_rt.update(kind="TrainingRuntime", metadata={**team_rt["metadata"], "name": "team-process-nodes",
                                                     "namespace": namespace})
    await kube.create(TRAINING_RUNTIMES.path(namespace), team_rt)

    # list_runtimes / get_runtime: the cluster's and the namespace's.
    listed = {r.name: r for r in client.list_runtimes()}
    assert {"torch-distributed", PROCESS_RUNTIME, KWOK_RUNTIME, "team-process-nodes"} <= set(listed), set(listed)
    default = client.get_runtime("torch-distributed")
    assert (default.kind, default.trainer.framework, default.trainer.num_nodes) == (
        RuntimeKind.CLUSTER_TRAINING_RUNTIME, "torch", 1)
    team = client.get_runtime("team-process-nodes")
    assert team.kind == RuntimeKind.TRAINING_RUNTIME and listed["team-process-nodes"].kind == team.kind

    # train: a CustomTrainer with every option the SDK offers for it, and a CustomTrainerContainer.
    patch = RuntimePatch(training_runtime_spec=TrainingRuntimeSpecPatch(template=JobSetTemplatePatch(
        spec=JobSetSpecPatch(replicated_jobs=[ReplicatedJobPatch(name="node", template=JobTemplatePatch(
            spec=JobSpecPatch(template=PodTemplatePatch(
                metadata={"labels": {"sdk-patched": "yes"}},
                spec=PodSpecPatch(node_selector={"gangctl.io/process-node": "true"})))))]))))
    started = time.monotonic()
    func_job = client.train(
        runtime=default,
        trainer=CustomTrainer(func=ticks, func_args={"count": "10"}, num_nodes=2, resources_per_node={"cpu": 1},
                              env={"TEAM_ENV": "from-sdk"}),
        options=[Name("sdk-func"), Labels({"team": "a"}), Annotations({"purpose": "contract"}), patch])
    container_job = client.train(
        runtime=team,
        trainer=CustomTrainerContainer(image="python:3.11", num_nodes=1, resources_per_node={"cpu": 1},
                                       env={"GREETING": "hello"}),
        options=[Name("sdk-container"), TrainerCommand(["python", "-c"]),
                 TrainerArgs(["import os; print('container says', os.environ['GREETING'], 'nnodes',"
                              " os.environ['PET_NNODES'])"])])
    assert (func_job, container_job) == ("sdk-func", "sdk-container")

    stored = await kube.get(TRAINJOBS.path(namespace, func_job))
    assert stored["metadata"]["labels"]["team"] == "a" and stored["metadata"]["annotations"]["purpose"] == "contract"
    assert [p["manager"] for p in stored["spec"]["runtimePatches"]] == [SDK_MANAGER]
    assert stored["spec"]["trainer"]["env"] == [{"name": "TEAM_ENV", "value": "from-sdk"}]
    stored_c = await kube.get(TRAINJOBS.path(namespace, container_job))
    assert stored_c["spec"]["runtimeRef"]["kind"] == "TrainingRuntime"
    assert stored_c["spec"]["trainer"]["command"] == ["python", "-c"]

    # get_job while its pods run; get_job_logs with follow=True streams node-1 to its end.
    status_while_running = {}

    async def both_running() -> bool:
        job = client.get_job(func_job)
        steps = {s.name: s.status for s in job.steps}
        status_while_running["status"] = job.status
        return steps == {"node-0": "Running", "node-1": "Running"}
    await eventually(both_running, 120, f"{func_job}'s 2 pods Running (SDK steps)")
    # The SDK calls a TrainJob Running only while it has no condition at all (as Trainer leaves a running
    # job): gangctl keeps its own state in status.gang, so the SDK sees what it sees under Trainer.
    assert status_while_running["status"] == "Running", status_while_running
    running = await asyncio.to_thread(client.wait_for_job_status, func_job, status={"Running"}, timeout=30,
                                      polling_interval=1)
    assert running.status == "Running" and {s.status for s in running.steps} <= {"Running", "Succeeded"}
    followed = await asyncio.to_thread(lambda: list(client.get_job_logs(func_job, follow=True, step="node-1")))
    # (torchrun's own stderr lines may follow, e.g. c10d's warning when rank 0's store closes first)
    assert [ln for ln in followed if ln.startswith("tick")] == [
        f"tick {i} of node 1 TEAM_ENV=from-sdk" for i in range(10)], followed

    # wait_for_job_status: both Complete; the steps as the SDK shows them.
    done = await asyncio.to_thread(client.wait_for_job_status, func_job, timeout=180, polling_interval=1)
    done_c = await asyncio.to_thread(client.wait_for_job_status, container_job, timeout=180, polling_interval=1)
    print(f"[sdk] two TrainJobs side by side: submission to both Complete in {time.monotonic() - started:.1f}s")
    assert done.status == "Complete" and done.num_nodes == 2 and done.runtime.name == "torch-distributed"
    assert sorted((s.name, s.status, s.device, str(s.device_count)) for s in done.steps) == [
        ("node-0", "Succeeded", "cpu", "1"), ("node-1", "Succeeded", "cpu", "1")]
    assert done_c.status == "Complete" and done_c.runtime.name == "team-process-nodes"
    with pytest.raises(ValueError):
        client.wait_for_job_status(func_job, status={"Done"})
    assert list(client.get_job_logs(container_job)) == ["container says hello nnodes 1"]
    assert [ln for ln in client.get_job_logs(func_job) if ln.startswith("tick")] == [
        f"tick {i} of node 0 TEAM_ENV=from-sdk" for i in range(10)]
    pods = await pods_of(kube, namespace, func_job)
    assert len(pods) == 2 and all(p["metadata"]["labels"].get("sdk-patched") == "yes"
                                  and p["spec"]["nodeSelector"].get("gangctl.io/process-node") == "true"
                                  for p in pods), "the RuntimePatch reached the pods"

    # list_jobs, with and without a runtime filter; get_job.
    assert {func_job, container_job} <= {j.name for j in client.list_jobs()}
    assert {j.name for j in client.list_jobs(runtime=default)} == {func_job}
    assert client.get_job(container_job).steps[0].name == "node-0"

    # get_job_events: events of the TrainJob and its pods only, oldest first.
    events = client.get_job_events(func_job)
    pod_names = {p["metadata"]["name"] for p in pods}
    assert events and {e.involved_object_name for e in events} <= pod_names | {func_job}, events
    assert {e.involved_object_name for e in events if e.involved_object_kind == "Pod"} == pod_names, events
    assert [e.event_time for e in events] == sorted(e.event_time for e in events)

    # delete_job: the TrainJob and, through their owner references, its pods go.
    client.delete_job(func_job)

    async def gone() -> bool:
        return func_job not in {j.name for j in client.list_jobs()} and not await pods_of(kube, namespace, func_job)
    await eventually(gone, 60, f"{func_job} and its pods deleted")
    with pytest.raises(RuntimeError):
        client.get_job(func_job)

    # get_runtime_packages: runs a 1-node TrainJob (1 CPU) on the runtime, prints what it found, deletes it.
    capsys.readouterr()
    await asyncio.to_thread(client.get_runtime_packages, default)
    printed = capsys.readouterr().out
    assert printed.startswith("Python: 3.") and re.search(r"^torch +\d", printed, re.M), printed[:2000]

    async def packages_job_deleted() -> bool:  # it asked for the deletion; gangctl's finalizer goes first
        return {j.name for j in client.list_jobs()} == {container_job}
    await eventually(packages_job_deleted, 60, "get_runtime_packages' TrainJob deleted")

