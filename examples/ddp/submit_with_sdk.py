"""Submit examples/ddp/train.py with the kubeflow SDK (unchanged) to 3 process nodes and print rank 0's log.

    gangctl cluster up --process-nodes 3 && gangctl controller &
    eval "$(gangctl cluster env)"
    python examples/ddp/submit_with_sdk.py [--namespace default] [--checkpoint-dir DIR]

The SDK's CustomTrainer ships a function (its source) and runs it with `torchrun` in every node
pod; torchrun takes its topology from gangctl's PET_* environment. The function below receives
train.py (base64) as an argument and runs it as __main__, so the SDK run and the TrainJob manifest
(examples/ddp/trainjob.yaml) train the same program. No GPU and 1 CPU per node: 1 process per node.
Exit status: 0 when the TrainJob completes (train.py reached its loss target on every rank).
"""
from __future__ import annotations

import argparse
import base64
import sys
import uuid
from pathlib import Path

RUNTIME = "torch-process-nodes"  # deploy/runtimes/torch-process-nodes.yaml, installed by `gangctl cluster up`


def train_ddp(program_b64: str) -> None:
    """Runs in every node pod under torchrun: train.py as __main__ (it exits 0 at the loss target).

    The SDK pastes this function and its arguments into an unquoted bash heredoc, where backslashes,
    backticks and $ would be rewritten, so the program travels base64-encoded."""
    import base64
    import sys

    sys.argv = ["train.py"]
    exec(compile(base64.b64decode(program_b64).decode(), "train.py", "exec"), {"__name__": "__main__"})


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--namespace", default="default")
    parser.add_argument("--nodes", type=int, default=3)
    parser.add_argument("--checkpoint-dir", default=f"/tmp/gangctl-ddp/sdk-{uuid.uuid4().hex[:8]}",
                        help="shared by all process nodes (they run on this machine)")
    parser.add_argument("--timeout", type=int, default=300)
    args = parser.parse_args()

    from kubeflow.common.types import KubernetesBackendConfig  # KUBECONFIG from the environment
    from kubeflow.trainer import CustomTrainer, TrainerClient

    client = TrainerClient(KubernetesBackendConfig(namespace=args.namespace))
    runtime = client.get_runtime(RUNTIME)
    program = base64.b64encode((Path(__file__).parent / "train.py").read_bytes()).decode()
    name = client.train(runtime=runtime, trainer=CustomTrainer(
        func=train_ddp, func_args={"program_b64": program}, num_nodes=args.nodes,
        resources_per_node={"cpu": 1}, env={"CHECKPOINT_DIR": args.checkpoint_dir}))
    print(f"submitted TrainJob {args.namespace}/{name} on runtime {RUNTIME} ({args.nodes} nodes); "
          f"checkpoints in {args.checkpoint_dir}", flush=True)
    job = client.wait_for_job_status(name, status={"Complete", "Failed"}, timeout=args.timeout, polling_interval=1)
    for step in sorted((s for s in job.steps if s.name.startswith("node-")), key=lambda s: s.name):
        print(f"  {step.name}: {step.status} on {step.device} x {step.device_count}")
    print(f"--- logs of node-0 (client.get_job_logs({name!r}, step='node-0')) ---")
    for line in client.get_job_logs(name, step="node-0"):
        print(line)
    print(f"TrainJob {name}: {job.status}")
    return 0 if job.status == "Complete" else 1


if __name__ == "__main__":
    sys.exit(main())
