"""Gang sizing: how many pods a TrainJob's gang needs and what they reserve together.

Pure: callers pass everything in. The controller and the simulator both call `size_gang`.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from fractions import Fraction
from typing import Mapping

# scheduler-plugins' own default when a PodGroup leaves scheduleTimeoutSeconds unset.
DEFAULT_SCHEDULE_TIMEOUT_SECONDS = 60


@dataclass(frozen=True)
class Gang:
    """What the scheduler must place all at once (minMember pods, minResources in total)."""

    min_member: int
    size: int
    per_pod: Mapping[str, Fraction] = field(default_factory=dict)
    schedule_timeout_seconds: int = DEFAULT_SCHEDULE_TIMEOUT_SECONDS

    @property
    def min_resources(self) -> dict[str, Fraction]:
        """Requests of one pod times the gang floor: the quota the gang must hold to start."""
        return {name: qty * self.min_member for name, qty in self.per_pod.items()}

    @property
    def surplus(self) -> int:
        """Pods above the floor (elastic jobs): started when capacity is free, first to go."""
        return self.size - self.min_member


def size_gang(
    num_nodes: int,
    per_pod_requests: Mapping[str, Fraction],
    *,
    min_nodes: int | None = None,
    schedule_timeout_seconds: int | None = None,
) -> Gang:
    """Size the gang of a job with `num_nodes` pods; an elastic job's floor is `min_nodes`."""
    if num_nodes < 1:
        raise ValueError(f"numNodes must be at least 1, got {num_nodes}")
    floor = num_nodes if min_nodes is None else min_nodes
    if not 1 <= floor <= num_nodes:
        raise ValueError(f"minNodes must be between 1 and numNodes ({num_nodes}), got {floor}")
    timeout = DEFAULT_SCHEDULE_TIMEOUT_SECONDS if schedule_timeout_seconds is None else schedule_timeout_seconds
    return Gang(min_member=floor, size=num_nodes, per_pod=dict(per_pod_requests),
                schedule_timeout_seconds=timeout)
