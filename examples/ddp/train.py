"""A small DDP training run over gloo that stops at a loss target, checkpointing with torch.distributed.checkpoint.

Start it with torchrun; on gangctl every torchrun setting comes from the PET_* environment the
controller injects (PET_NNODES, PET_NPROC_PER_NODE, PET_NODE_RANK, PET_MASTER_ADDR, PET_MASTER_PORT):

    torchrun examples/ddp/train.py --checkpoint-dir /tmp/ddp-ckpt          # locally: add --nproc-per-node 3

The data is synthetic and deterministic: a fixed random "teacher" network labels inputs drawn from a
generator seeded by (seed, step, rank), so a resumed run sees exactly the batches it would have
seen. Every --checkpoint-every steps all ranks write one DCP checkpoint (model and optimizer,
sharded by DCP) to <checkpoint-dir>/step-<N>; at start the run resumes from the newest complete one.

Exit 0 when the all-reduced loss falls below --target, 1 if --max-steps pass first. To see a restart,
--fail-once RANK:STEP:CODE makes that rank exit with CODE after that step, once per checkpoint
directory (a marker file there remembers it), like a crash that a retry gets past; --hang-once
RANK:STEP makes that rank stop after that step without exiting, once, so the other ranks block in
their next all-reduce (a hung collective: what a runtime's stall timeout is for).
Every rank prints `step=<n> loss=<local> global_loss=<mean over ranks>` lines. Rank 0 also reports
progress to the TrainJob's `status.trainerStatus` (`kubectl get trainjob` shows PROGRESS %) through
the KUBEFLOW_TRAINER_STATUS_* variables gangctl, like Kubeflow Trainer v2.2+, gives trainer pods.
"""
from __future__ import annotations

import argparse
import json
import os
import ssl
import sys
import time
import urllib.request
from datetime import datetime, timezone
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.distributed.checkpoint.stateful import Stateful
from torch.nn.parallel import DistributedDataParallel


def parse_args() -> argparse.Namespace:
    env = os.environ.get
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--checkpoint-dir", default=env("CHECKPOINT_DIR", "/tmp/gangctl-ddp-checkpoints"))
    p.add_argument("--checkpoint-every", type=int, default=int(env("CHECKPOINT_EVERY", "50")))
    p.add_argument("--target", type=float, default=float(env("TARGET_LOSS", "0.02")))
    p.add_argument("--max-steps", type=int, default=int(env("MAX_STEPS", "600")))
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--lr", type=float, default=float(env("LR", "0.02")))
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--log-every", type=int, default=int(env("LOG_EVERY", "10")))
    p.add_argument("--fail-once", default=env("FAIL_ONCE", ""), help="RANK:STEP:CODE (see above)")
    p.add_argument("--hang-once", default=env("HANG_ONCE", ""), help="RANK:STEP (see above)")
    return p.parse_args()


def fail_once(spec: str, rank: int, step: int, root: Path) -> None:
    """Exit as --fail-once says, the first time this rank passes that step for this checkpoint directory."""
    if not spec:
        return
    fail_rank, fail_step, code = (int(part) for part in spec.split(":"))
    marker = root / f"failed-once-rank{fail_rank}"
    if rank == fail_rank and step == fail_step and not marker.exists():
        root.mkdir(parents=True, exist_ok=True)
        marker.touch()
        print(f"failing once on purpose at step {step} with exit code {code}", flush=True)
        sys.exit(code)


def hang_once(spec: str, rank: int, step: int, root: Path) -> None:
    """Stop for good as --hang-once says (until the pod is stopped), the first time this rank passes
    that step for this checkpoint directory."""
    if not spec:
        return
    hang_rank, hang_step = (int(part) for part in spec.split(":"))
    marker = root / f"hung-once-rank{hang_rank}"
    if rank == hang_rank and step == hang_step and not marker.exists():
        root.mkdir(parents=True, exist_ok=True)
        marker.touch()
        print(f"hanging once on purpose after step {step}", flush=True)
        while True:
            time.sleep(3600)


IN, HIDDEN = 16, 64


def model() -> nn.Module:
    return nn.Sequential(nn.Linear(IN, HIDDEN), nn.Tanh(), nn.Linear(HIDDEN, 1))


def teacher(seed: int) -> nn.Module:
    torch.manual_seed(seed + 1000)
    net = nn.Sequential(nn.Linear(IN, 8), nn.Tanh(), nn.Linear(8, 1))
    for param in net.parameters():
        param.requires_grad_(False)
        param.mul_(3)  # targets of order 1: the first loss is about 2.5
    return net


def batch(seed: int, step: int, rank: int, size: int, label: nn.Module) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed * 1_000_003 + step * 1_009 + rank)
    x = torch.randn(size, IN, generator=gen)
    return x, label(x)


class TrainState(Stateful):
    """Model and optimizer as DCP wants them (get_state_dict unwraps DDP and fills lazy optimizer state)."""

    def __init__(self, net: nn.Module, optim: torch.optim.Optimizer):
        self.net, self.optim = net, optim

    def state_dict(self) -> dict:
        model_sd, optim_sd = get_state_dict(self.net, self.optim)
        return {"model": model_sd, "optim": optim_sd}

    def load_state_dict(self, state: dict) -> None:
        set_state_dict(self.net, self.optim, model_state_dict=state["model"], optim_state_dict=state["optim"])


def latest_checkpoint(root: Path) -> tuple[int, Path] | None:
    """The newest step-<N> folder whose .metadata exists (DCP writes it last, so the checkpoint is whole)."""
    found = [(int(d.name.split("-", 1)[1]), d) for d in root.glob("step-*")
             if d.name.split("-", 1)[1].isdigit() and (d / ".metadata").exists()]
    return max(found) if found else None


class Progress:
    """status.trainerStatus reports (Kubeflow Trainer's contract), at most one per `every` seconds;
    off outside a TrainJob. A report that fails is printed once and never stops training."""

    def __init__(self, every: float = 2.0):
        self.url = os.environ.get("KUBEFLOW_TRAINER_STATUS_URL")
        self.every, self.last, self.warned = every, 0.0, False

    def report(self, percent: int, metrics: dict[str, object], force: bool = False) -> None:
        if not self.url or (not force and time.monotonic() - self.last < self.every):
            return
        self.last = time.monotonic()
        status = {"progressPercentage": max(0, min(100, percent)),
                  "metrics": [{"name": k, "value": str(v)} for k, v in metrics.items()],
                  "lastUpdatedTime": datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")}
        try:
            token = Path(os.environ["KUBEFLOW_TRAINER_STATUS_TOKEN"]).read_text()
            context = ssl.create_default_context(cafile=os.environ["KUBEFLOW_TRAINER_STATUS_CA_CERT"])
            request = urllib.request.Request(self.url, data=json.dumps({"trainerStatus": status}).encode(),
                                             headers={"Authorization": f"Bearer {token}",
                                                      "Content-Type": "application/json"}, method="POST")
            urllib.request.urlopen(request, context=context, timeout=5).close()
        except Exception as err:  # noqa: BLE001 - progress is best effort
            if not self.warned:
                print(f"progress report not sent: {err}", file=sys.stderr, flush=True)
                self.warned = True


def main() -> int:
    args = parse_args()
    torch.set_num_threads(1)  # one process per node; the nodes share a small machine
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    tag = f"[rank {rank}/{world} {os.environ.get('HOSTNAME', '')}]"

    def log(msg: str) -> None:
        print(f"{tag} {msg}", flush=True)

    torch.manual_seed(args.seed)  # the same initial weights on every rank (DDP also broadcasts rank 0's)
    net = DistributedDataParallel(model())
    optim = torch.optim.Adam(net.parameters(), lr=args.lr)
    label = teacher(args.seed)
    state = TrainState(net, optim)

    root = Path(args.checkpoint_dir)
    start = 0
    found = latest_checkpoint(root)
    if found:
        start, path = found
        dcp.load({"train": state}, checkpoint_id=str(path))
        log(f"resumed from checkpoint {path} (step {start})")
    else:
        log(f"no checkpoint in {root}; starting at step 0")
    log(f"training: world_size={world} target_loss={args.target} max_steps={args.max_steps} "
        f"checkpoint_every={args.checkpoint_every}")

    loss_fn = nn.MSELoss()
    progress = Progress() if rank == 0 else None
    began = time.monotonic()
    step, reached = start, False
    while step < args.max_steps:
        x, y = batch(args.seed, step, rank, args.batch_size, label)
        optim.zero_grad()
        loss = loss_fn(net(x), y)
        loss.backward()  # DDP all-reduces the gradients over gloo
        optim.step()
        step += 1
        mean = loss.detach().clone()
        dist.all_reduce(mean)
        mean /= world
        global_loss = mean.item()
        reached = global_loss < args.target
        if step == start + 1 or step % args.log_every == 0 or reached:
            log(f"step={step} loss={loss.item():.5f} global_loss={global_loss:.5f}")
        if progress is not None:
            progress.report(100 if reached else 100 * step // args.max_steps,
                            {"global_loss": f"{global_loss:.5f}", "step": step}, force=reached)
        if step % args.checkpoint_every == 0 or reached:
            path = root / f"step-{step:06d}"
            dcp.save({"train": state}, checkpoint_id=str(path))
            log(f"checkpoint saved: {path}")
        if reached:
            break
        fail_once(args.fail_once, rank, step, root)
        hang_once(args.hang_once, rank, step, root)
    took = time.monotonic() - began
    if reached:
        log(f"reached target: global_loss={global_loss:.5f} < {args.target} at step {step} ({took:.1f}s)")
    else:
        log(f"FAILED: global_loss={global_loss:.5f} still >= {args.target} after {step} steps ({took:.1f}s)")
    dist.barrier()
    dist.destroy_process_group()
    return 0 if reached else 1


if __name__ == "__main__":
    sys.exit(main())
