"""The torchrun environment of a node pod (Kubeflow Trainer's PET_* contract).

torchrun reads PET_<FLAG> for each flag it is not given, so the user's `torchrun train.py` (or the
kubeflow SDK's generated script) gets the gang's topology without any command-line changes.
"""
from __future__ import annotations

from gangctl.plugins.names import COMPLETION_INDEX_ANNOTATION, MASTER_PORT, master_addr
from gangctl.policy.resolve import ResolvedJob


def torch_env(job: ResolvedJob) -> list[dict]:
    return [
        {"name": "PET_NNODES", "value": str(job.num_nodes)},
        {"name": "PET_NPROC_PER_NODE", "value": job.num_proc_per_node},
        {"name": "PET_NODE_RANK", "valueFrom": {"fieldRef": {
            "fieldPath": f"metadata.annotations['{COMPLETION_INDEX_ANNOTATION}']"}}},
        {"name": "PET_MASTER_ADDR", "value": master_addr(job.name)},
        {"name": "PET_MASTER_PORT", "value": str(MASTER_PORT)},
    ]
