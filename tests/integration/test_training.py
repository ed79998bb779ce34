"""Real distributed training on process nodes: examples/ddp/trainjob.yaml (DDP over gloo, 3 nodes,
torch.distributed.checkpoint) trains to its loss target; read back through `kubectl logs`."""
from __future__ import annotations

import re
import shutil
import time
from datetime import datetime
from pathlib import Path

import pytest
import yaml

from gangctl.config import REPO_ROOT
from tests.integration.helpers import eventually, get_trainjob, is_true, pods_of, submit
from tests.integration.test_process_nodes import kubectl

pytestmark = pytest.mark.integration

MANIFEST = REPO_ROOT / "examples" / "ddp" / "trainjob.yaml"
STEP = re.compile(r"^(\S+) \[rank (\d)/3 [^\]]*\] step=(\d+) loss=\S+ global_loss=([0-9.]+)$")


def _env(obj: dict, name: str) -> str:
    return next(e["value"] for e in obj["spec"]["trainer"]["env"] if e["name"] == name)


def _ts(text: str) -> float:
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


async def test_ddp_example_trains_to_its_loss_target_on_three_process_nodes(kube, namespace, kubeconfig, controller,
                                                                           process_runtime):
    obj = yaml.safe_load(MANIFEST.read_text())
    assert obj["spec"]["runtimeRef"]["name"] == process_runtime
    obj["metadata"]["namespace"] = namespace
    name, target = obj["metadata"]["name"], float(_env(obj, "TARGET_LOSS"))
    ckpt_root = Path("/tmp/gangctl-ddp") / namespace
    try:
        submitted = time.time()
        created = await submit(kube, obj)

        async def complete() -> bool:
            tj = await get_trainjob(kube, namespace, name)
            assert not is_true(tj, "Failed"), tj.get("status")
            return is_true(tj, "Complete")
        took = await eventually(complete, 90, f"TrainJob {name} Complete", interval=0.5)

        pods = sorted(await pods_of(kube, namespace, name),
                      key=lambda p: int(p["metadata"]["annotations"]["batch.kubernetes.io/job-completion-index"]))
        assert len(pods) == 3 and len({p["spec"]["nodeName"] for p in pods}) == 3
        final: dict[int, float] = {}
        first_step_at = []
        for rank, pod in enumerate(pods):
            env = {e["name"]: e.get("value") for e in pod["spec"]["containers"][0]["env"]}
            assert env["PET_NNODES"] == "3" and env["PET_NPROC_PER_NODE"] == "1"
            out = kubectl(kubeconfig, "logs", "--timestamps", "-n", namespace, pod["metadata"]["name"])
            assert out.returncode == 0, out.stderr
            lines = out.stdout.splitlines()
            steps = [(m.group(1), int(m.group(3)), float(m.group(4))) for m in map(STEP.match, lines) if m
                     and int(m.group(2)) == rank]
            assert steps, out.stdout[-3000:]
            assert steps[0][1] == 1, "a fresh run starts at step 1 (no checkpoint in a new namespace)"
            first_step_at.append(_ts(steps[0][0]))
            losses = [loss for _, _, loss in steps]
            assert losses[0] > 10 * target and losses[-1] < target, losses
            assert min(losses[:-1]) >= target, "the run stops at the first step below the target"
            assert losses[len(losses) // 2] < losses[0], losses
            final[rank] = losses[-1]
            text = out.stdout
            assert f"reached target: global_loss={losses[-1]:.5f} < {target}" in text, text[-2000:]
            assert f"checkpoint saved: {ckpt_root / name}/step-" in text, text[-2000:]
        assert len(set(final.values())) == 1, f"every rank all-reduces the same loss: {final}"
        saved = sorted(d.name for d in (ckpt_root / name).glob("step-*") if (d / ".metadata").exists())
        assert saved and saved[0] == "step-000050", saved
        # Rank 0 reported its progress (status.trainerStatus) up to the end, before its pod exited.
        progress = (await get_trainjob(kube, namespace, name))["status"]["trainerStatus"]
        assert progress["progressPercentage"] == 100, progress
        assert {m["name"]: m["value"] for m in progress["metrics"]}["global_loss"] == f"{final[0]:.5f}", progress
        since_creation = max(first_step_at) - _ts(created["metadata"]["creationTimestamp"])
        print(f"[training] 3-node DDP TrainJob: submission -> first step on every rank {max(first_step_at) - submitted:.1f}s "
              f"(creationTimestamp -> first step {since_creation:.1f}s, whole-second stamp), Complete after "
              f"{took:.1f}s; global loss {max(final.values()):.4f} < {target}; checkpoints {saved}")
    finally:
        shutil.rmtree(ckpt_root, ignore_errors=True)

