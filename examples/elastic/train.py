"""Elastic DDP training that survives node loss: run under torchrun with --nnodes=MIN:MAX (gangctl
sets PET_NNODES, PET_RDZV_* for elastic TrainJobs).

Every `--ckpt-every` steps rank 0's view of the model and optimizer is saved with
torch.distributed.checkpoint (DCP) to `--ckpt-dir` (shared storage: on process nodes, the host's
filesystem); after any membership change torchrun restarts all workers, which load the latest
checkpoint (DCP reshards to the new world size) and continue. The global batch stays fixed, so the
loss curve does not depend on the world size. Prints one line per step:
    step=<n> loss=<x> world=<w> restart=<torchrun restart count>
"""
from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.nn.parallel import DistributedDataParallel as DDP


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--ckpt-dir", default=os.environ.get("CKPT_DIR", "/tmp/elastic-ckpt"))
    p.add_argument("--ckpt-every", type=int, default=10)
    p.add_argument("--step-seconds", type=float, default=0.1)
    p.add_argument("--global-batch", type=int, default=64)
    p.add_argument("--lr", type=float, default=0.05)
    args = p.parse_args()

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model = DDP(torch.nn.Linear(16, 1))
    opt = torch.optim.SGD(model.parameters(), lr=args.lr)
    true_w = torch.arange(16, dtype=torch.float32).unsqueeze(1) / 16

    step = 0
    ckpt = Path(args.ckpt_dir)
    latest = ckpt / "latest"
    if latest.exists():
        target = ckpt / latest.read_text().strip()
        msd, osd = get_state_dict(model, opt)
        state = {"model": msd, "optim": osd, "step": torch.tensor(0)}
        dcp.load(state, checkpoint_id=str(target))
        set_state_dict(model, opt, model_state_dict=state["model"], optim_state_dict=state["optim"])
        step = int(state["step"])
        if rank == 0:
            print(f"resumed from {target} at step={step} world={world}", flush=True)

    per_rank = max(1, args.global_batch // world)
    restart = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    while step < args.steps:
        g = torch.Generator().manual_seed(step * 1000 + rank)
        x = torch.randn(per_rank, 16, generator=g)
        y = x @ true_w
        loss = torch.nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        step += 1
        avg = loss.detach().clone()
        dist.all_reduce(avg)
        if rank == 0:
            print(f"step={step} loss={avg.item() / world:.4e} world={world} restart={restart} t={time.time():.3f}",
                  flush=True)
        if step % args.ckpt_every == 0:
            msd, osd = get_state_dict(model, opt)
            name = f"step-{step}"
            dcp.save({"model": msd, "optim": osd, "step": torch.tensor(step)}, checkpoint_id=str(ckpt / name))
            dist.barrier()
            if rank == 0:
                tmp = ckpt / "latest.tmp"
                tmp.write_text(name)
                tmp.replace(latest)
        time.sleep(args.step_seconds)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
