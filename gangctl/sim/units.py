"""The simulator's integer units and a job's pod requests in them.

GPUs, millicores and MiB: per quota-file unit, 1 GPU, 1 core (1000 m), 1 GiB (1024 Mi). A replayed
TrainJob requests exactly these amounts (`gangctl.sim.replay`), so the controller's PodGroup and the
simulator's gang agree to the unit.
"""
from __future__ import annotations

from fractions import Fraction
from typing import Mapping

from gangctl.model.admission import CPU, GPU, MEMORY
from gangctl.sim.traces import TraceJob

SIM_UNITS = {GPU: 1, CPU: 1000, MEMORY: 1024}
# Kubernetes base units (GPUs, cores, bytes) -> the simulator's.
_FROM_KUBERNETES = {GPU: Fraction(1), CPU: Fraction(1000), MEMORY: Fraction(1, 2**20)}


def pod_requests(spec: TraceJob) -> dict[str, int]:
    """One pod's requests in SIM_UNITS (zero amounts left out, as a pod spec would leave them out)."""
    per_pod = {GPU: spec.gpus_per_node, CPU: round(spec.cpu_per_node * 1000), MEMORY: round(spec.memory_per_node * 1024)}
    return {r: a for r, a in per_pod.items() if a}


def in_sim_units(amounts: Mapping[str, Fraction]) -> dict[str, int]:
    """Amounts in Kubernetes base units (parsed quantities) as the simulator's integers; an amount
    that is not a whole number of them is an error (the replay writes whole ones)."""
    out = {}
    for resource, amount in amounts.items():
        value = amount * _FROM_KUBERNETES[resource]
        if value.denominator != 1:
            raise ValueError(f"{resource}: {amount} is not a whole number of the simulator's units")
        out[resource] = int(value)
    return out
