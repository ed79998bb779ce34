"""What a node has room for, as `gangctl explain` and gangctl's own topology placement both weigh it:
one node's free (and allocatable) amounts and labels, and how many pods of given requests fit there."""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from fractions import Fraction


@dataclass(frozen=True)
class NodeRoom:
    """One node a pod may land on: per resource what is free on it now (allocatable minus what its
    pods request), and its labels and allocatable amounts where the caller needs them."""

    name: str
    free: Mapping[str, Fraction | int]
    labels: Mapping[str, str] = field(default_factory=dict)
    allocatable: Mapping[str, Fraction | int] = field(default_factory=dict)


def pods_fitting(amounts: Mapping[str, Fraction | int], requests: Mapping[str, Fraction | int]) -> int:
    """How many pods of `requests` fit in `amounts` (one node's); a pod that requests nothing counts one per node."""
    counts = [int(Fraction(amounts.get(r, 0)) // Fraction(q)) for r, q in requests.items() if q]
    return max(0, min(counts)) if counts else 1
