"""The boundary to the real control plane: a scenario slice as TrainJob submissions.

Turns simulated jobs into TrainJob manifests with compressed run times (`sleep`), each with the
offset after which it must be submitted. Whatever submits them (the sim-versus-real command, not
part of the simulator) owns the cluster I/O; compare its measurements with a simulation of the same
slice, durations divided by the same `compression`.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, replace

from gangctl.sim.traces import TraceJob


@dataclass(frozen=True)
class Submission:
    at_seconds: float       # after the replay starts
    trainjob: dict


def compressed(jobs: list[TraceJob], compression: float) -> list[TraceJob]:
    """The same jobs with submit times and durations divided by `compression` (simulate these)."""
    if compression <= 0:
        raise ValueError("compression must be positive")
    return [replace(j, submit=j.submit / compression, duration=j.duration / compression) for j in jobs]


def trainjob_submissions(jobs: list[TraceJob], *, runtime: str, namespace_of_team: dict[str, str],
                         image: str = "busybox", compression: float = 1.0) -> list[Submission]:
    """One TrainJob per job (team in `TraceJob.group`), in submission order."""
    out = []
    for j in compressed(jobs, compression):
        name = _name(j.id)
        out.append(Submission(j.submit, {
            "apiVersion": "trainer.kubeflow.org/v1alpha1",
            "kind": "TrainJob",
            "metadata": {"name": name, "namespace": namespace_of_team[j.group],
                         "labels": {"gangctl.dev/sim-job": name}},
            "spec": {
                "runtimeRef": {"name": runtime},
                "trainer": {
                    "image": image,
                    "command": ["sleep", f"{j.duration:.3f}"],
                    "numNodes": j.num_nodes,
                    "resourcesPerNode": {"requests": {"nvidia.com/gpu": j.gpus_per_node},
                                         "limits": {"nvidia.com/gpu": j.gpus_per_node}},
                },
            },
        }))
    return out


def _name(job_id: str) -> str:
    """A DNS-1123 label of at most 40 characters, leaving room for generated child names."""
    name = re.sub(r"[^a-z0-9-]+", "-", job_id.lower()).strip("-")
    return ("sim-" + name)[:40].rstrip("-")
