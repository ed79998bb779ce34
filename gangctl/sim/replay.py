"""The boundary to the real control plane: a scenario slice as TrainJob submissions.

Turns simulated jobs into TrainJob manifests, each with the offset after which it must be
submitted, and durations divided by `compression`. Whatever submits them (`gangctl sim-check`, in
`gangctl.validate`, not part of the simulator) owns the cluster I/O; it compares its measurements
with a simulation of the same compressed slice (`compressed`).

On KWOK nodes no container runs: a pod owned by a Job succeeds `pod-complete.stage.kwok.x-k8s.io/delay`
after it is Ready. KWOK draws every stage delay between `delay` and `jitter-delay`, and when
`jitter-delay` is not above `delay` it uses `jitter-delay` (default 5 s) instead, so both are set
to the job's run time. The pod-create and pod-ready stages (default 1–5 s each) are set to 0, so a
pod runs for exactly its job's duration once bound. The container command (`sleep`) is what a real
node would run; KWOK ignores it.

The pods request exactly what the simulator charges (`gangctl.sim.units.pod_requests`): whole
GPUs, CPU in millicores, memory in MiB, so the controller's PodGroup and the simulator's gang agree
to the unit (the parity test checks this).
"""
from __future__ import annotations

import re
from dataclasses import dataclass, replace
from typing import Callable

from gangctl.api.trainjob import TRAINJOB_KIND
from gangctl.model.admission import CPU, GPU, MEMORY
from gangctl.sim import objects
from gangctl.sim.traces import TraceJob
from gangctl.sim.units import pod_requests

KWOK_STAGE_ANNOTATION = "{stage}.stage.kwok.x-k8s.io/{what}"
SIM_JOB_LABEL = "gangctl.io/sim-job"
SIM_RUN_LABEL = "gangctl.io/sim-run"
# The shipped runtime replayed jobs run on (deploy/runtimes: gangs meant for KWOK GPU nodes); the
# simulator asks the controller's decisions of the same runtime.
RUNTIME = "torch-kwok-gpu"


@dataclass(frozen=True)
class Submission:
    at_seconds: float       # after the replay starts
    job_id: str             # the simulated job's id
    trainjob: dict


def compressed(jobs: list[TraceJob], compression: float) -> list[TraceJob]:
    """The same jobs with submit times and durations divided by `compression` (simulate these)."""
    if compression <= 0:
        raise ValueError("compression must be positive")
    return [replace(j, submit=j.submit / compression, duration=j.duration / compression) for j in jobs]


def kwok_annotations(run_seconds: float) -> dict[str, str]:
    """Pod annotations that make a KWOK pod start at once and succeed after `run_seconds`."""
    ms = f"{max(0, round(run_seconds * 1000))}ms"
    out = {}
    for stage, delay in (("pod-create", "0ms"), ("pod-ready", "0ms"), ("pod-complete", ms)):
        out[KWOK_STAGE_ANNOTATION.format(stage=stage, what="delay")] = delay
        out[KWOK_STAGE_ANNOTATION.format(stage=stage, what="jitter-delay")] = delay
    return out


def resource_requests(job: TraceJob) -> dict[str, str]:
    """One pod's requests as Kubernetes quantities, exactly the simulator's amounts."""
    per_pod = pod_requests(job)
    out = {}
    if GPU in per_pod:
        out[GPU] = str(per_pod[GPU])
    if CPU in per_pod:
        out[CPU] = f"{per_pod[CPU]}m"
    if MEMORY in per_pod:
        out[MEMORY] = f"{per_pod[MEMORY]}Mi"
    return out


def trainjob_submissions(jobs: list[TraceJob], *, runtime: str, namespace_of_team: dict[str, str],
                         image: str = "busybox", compression: float = 1.0, run_id: str = "",
                         annotations: Callable[[str], dict[str, str]] = lambda job_id: {}) -> list[Submission]:
    """One TrainJob per job (team in `TraceJob.group`), in submission order; `annotations(job id)`
    adds pod template annotations (a placement intent). Jobs a scenario made PyTorchJobs are
    refused: the replay submits TrainJobs only."""
    if (other := next((j for j in jobs if j.kind != TRAINJOB_KIND), None)) is not None:
        raise ValueError(f"job {other.id} is a {other.kind}: the replay submits TrainJobs only "
                         "(set the scenario's workload.pytorchjobShare to 0)")
    return [Submission(j.submit, j.id, trainjob_manifest(j, runtime=runtime, namespace=namespace_of_team[j.group],
                                                        image=image, run_id=run_id, annotations=annotations(j.id)))
            for j in sorted(compressed(jobs, compression), key=lambda j: (j.submit, j.id))]


def trainjob_manifest(j: TraceJob, *, runtime: str, namespace: str, image: str = "busybox", run_id: str = "",
                      annotations: dict[str, str] | None = None) -> dict:
    """The TrainJob that runs `j` (its duration as given: compress first)."""
    name = trainjob_name(j.id)
    requests = resource_requests(j)
    labels = {SIM_JOB_LABEL: name}
    if run_id:
        labels[SIM_RUN_LABEL] = run_id
    override: dict = {"targetJobs": [{"name": "node"}],
                      "metadata": {"annotations": kwok_annotations(j.duration) | (annotations or {})}}
    if j.priority_class:
        override["spec"] = {"priorityClassName": j.priority_class}
    trainer = {"image": image, "command": ["sleep", f"{j.duration:.3f}"], "numNodes": j.num_nodes,
               "resourcesPerNode": {"requests": requests, "limits": {GPU: requests[GPU]} if GPU in requests else {}}}
    return objects.trainjob(name, namespace=namespace, runtime=runtime, submitted=True, metadata={"labels": labels},
                            trainer=trainer, podTemplateOverrides=[override])


def trainjob_name(job_id: str) -> str:
    """A DNS-1035 label of at most 40 characters, leaving room for generated child names."""
    name = re.sub(r"[^a-z0-9-]+", "-", job_id.lower()).strip("-")
    return ("sim-" + name)[:40].rstrip("-")
