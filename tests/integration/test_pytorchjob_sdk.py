"""Training Operator's own Python SDK (`kubeflow-training` 1.9.4) drives PyTorchJobs on gangctl:
create_job(train_func=..., num_workers=N) runs real torchrun workers on process nodes to Succeeded,
and get_job, wait_for_job_conditions, get_job_logs and delete_job work unchanged.

The SDK pins an older `kubernetes` client and ships a top-level `test` package, so it gets a venv of
its own, made by this test on first use and cached under ~/.cache/gangctl/venvs."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from gangctl.api.resources import PYTORCHJOBS
from gangctl.config import ClusterSettings
from gangctl.kube.client import ApiError
from tests.integration.helpers import eventually

pytestmark = pytest.mark.integration

SDK = "kubeflow-training==1.9.4"

# Run by the SDK's venv: argv = kubeconfig, namespace. Prints one JSON line with what it saw.
DRIVER = r'''
import json, sys
from kubeflow.training import TrainingClient

def train_func():
    import torch
    import torch.distributed as dist
    dist.init_process_group("gloo")
    t = torch.tensor([1.0])
    dist.all_reduce(t)
    print(f"sdk-ddp world={dist.get_world_size()} sum={int(t.item())}", flush=True)
    dist.destroy_process_group()

kubeconfig, namespace = sys.argv[1], sys.argv[2]
client = TrainingClient(config_file=kubeconfig, namespace=namespace)
client.create_job(name="sdk-ddp", train_func=train_func, num_workers=2)
job = client.wait_for_job_conditions("sdk-ddp", timeout=240)
succeeded = client.is_job_succeeded("sdk-ddp")
got = client.get_job("sdk-ddp")
logs = client.get_job_logs("sdk-ddp", is_master=False)
logs = logs[0] if isinstance(logs, tuple) else logs
print(json.dumps({"succeeded": succeeded, "conditions": [c.type for c in got.status.conditions if c.status == "True"],
                  "logs": logs}), flush=True)
client.delete_job("sdk-ddp")
'''


@pytest.fixture(scope="session")
def sdk_python() -> Path:
    """The venv's python with the SDK (created once, then reused)."""
    venv = ClusterSettings().cache_dir / "venvs" / SDK.replace("==", "-")
    python = venv / "bin" / "python"
    if not (venv / ".installed").exists():
        subprocess.run([sys.executable, "-m", "venv", "--clear", str(venv)], check=True)
        done = subprocess.run([str(python), "-m", "pip", "install", "--quiet", SDK], capture_output=True, text=True)
        assert done.returncode == 0, done.stderr[-3000:]
        (venv / ".installed").write_text(SDK)
    return python


async def test_the_v1_sdk_runs_a_train_func_to_succeeded_and_reads_its_logs(kube, namespace, kubeconfig, controller,
                                                                           process_nodes, sdk_python, tmp_path):
    driver = tmp_path / "driver.py"
    driver.write_text(DRIVER)
    done = subprocess.run([str(sdk_python), str(driver), str(kubeconfig), namespace], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, (done.stdout[-3000:], done.stderr[-3000:])
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen["succeeded"] is True and "Succeeded" in seen["conditions"], seen
    assert set(seen["logs"]) and all("sdk-ddp world=" in text for text in seen["logs"].values()), seen["logs"]
    worlds = {line.split()[1] for text in seen["logs"].values() for line in text.splitlines() if line.startswith("sdk-ddp")}
    assert len(worlds) == 1, worlds   # every rank of the gang joined one process group

    async def deleted() -> bool:
        try:
            await kube.get(PYTORCHJOBS.path(namespace, "sdk-ddp"))
        except ApiError as err:
            return err.not_found
        return False
    await eventually(deleted, 30, "delete_job removed the PyTorchJob")
