"""The kubeflow SDK, unchanged, against gangctl and process nodes: a function trained on 3 nodes by
real torchrun workers on the session's process nodes (conftest.py), read back through the SDK (get_job, get_job_logs, wait_for_job_status)."""
from __future__ import annotations

import logging
import time

import pytest

pytestmark = pytest.mark.integration


def report_rank():
    import os

    print(f"WORLD_SIZE={os.environ['WORLD_SIZE']} RANK={os.environ['RANK']} LOCAL_RANK={os.environ['LOCAL_RANK']}",
          flush=True)


def test_sdk_trains_a_function_on_three_process_nodes(kubeconfig, namespace, controller, process_runtime, caplog):
    from kubeflow.common.types import KubernetesBackendConfig
    from kubeflow.trainer import CustomTrainer, TrainerClient

    with caplog.at_level(logging.WARNING):
        client = TrainerClient(KubernetesBackendConfig(namespace=namespace, config_file=str(kubeconfig)))
    # The SDK reads the control plane's version from kubeflow-system/kubeflow-trainer-public.
    assert "version info is not available" not in caplog.text, caplog.text
    assert process_runtime in {r.name for r in client.list_runtimes()}
    runtime = client.get_runtime(process_runtime)
    started = time.monotonic()
    name = client.train(runtime=runtime, trainer=CustomTrainer(func=report_rank, num_nodes=3,
                                                               resources_per_node={"cpu": 1}))
    client.wait_for_job_status(name, status={"Complete"}, timeout=180)
    print(f"[sdk] 3-node TrainJob {name}: submission to Complete in {time.monotonic() - started:.1f}s")
    job = client.get_job(name)
    assert name in {j.name for j in client.list_jobs()}
    steps = sorted((s for s in job.steps if s.name.startswith("node-")), key=lambda s: s.name)
    assert [(s.name, s.status, s.device, str(s.device_count)) for s in steps] == [
        (f"node-{i}", "Succeeded", "cpu", "1") for i in range(3)]
    for rank in range(3):
        logs = list(client.get_job_logs(name, step=f"node-{rank}"))
        # No GPU requested: one process per node (Kubeflow's rule: the CPU count, here 1).
        assert f"WORLD_SIZE=3 RANK={rank} LOCAL_RANK=0" in logs, logs
    client.delete_job(name)
