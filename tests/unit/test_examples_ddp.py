"""examples/ddp: the TrainJob manifest carries train.py verbatim and resolves to 1 process per node."""
from __future__ import annotations

import subprocess

import yaml

from gangctl.config import REPO_ROOT

DDP = REPO_ROOT / "examples" / "ddp"


def test_trainjob_heredoc_is_train_py():
    """Process nodes pull no image, so the manifest's heredoc is the program; it must be train.py."""
    script = yaml.safe_load((DDP / "trainjob.yaml").read_text())["spec"]["trainer"]["command"][2]
    body = script.split("<<'PY'\n", 1)[1].rsplit("\nPY\n", 1)[0] + "\n"
    assert body == (DDP / "train.py").read_text()
    assert "$" not in body  # kubelet's $(VAR) / $$ expansion must leave the program alone
    assert subprocess.run(["bash", "-n", "-c", script]).returncode == 0


def test_process_node_runtime_is_listed_by_the_sdk_and_runs_one_process_per_cpu_node():
    from gangctl.model.resolve import procs_per_node

    runtime = yaml.safe_load((REPO_ROOT / "deploy" / "runtimes" / "torch-process-nodes.yaml").read_text())
    assert runtime["metadata"]["labels"]["trainer.kubeflow.org/framework"] == "torch"
    assert runtime["spec"]["mlPolicy"] and [j["name"] for j in runtime["spec"]["template"]["spec"]["replicatedJobs"]] == ["node"]
    job = yaml.safe_load((DDP / "trainjob.yaml").read_text())
    assert job["spec"]["runtimeRef"]["name"] == runtime["metadata"]["name"]
    assert procs_per_node("auto", {"resources": job["spec"]["trainer"]["resourcesPerNode"]}) == "1"
