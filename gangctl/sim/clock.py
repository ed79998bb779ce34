"""Simulated time: seconds since the start of a run. Only the engine moves it; nothing reads the wall."""
from __future__ import annotations


class SimClock:
    __slots__ = ("now",)

    def __init__(self, start: float = 0.0) -> None:
        self.now = start

    def advance_to(self, t: float) -> None:
        if t < self.now:
            raise ValueError(f"simulated time cannot go back from {self.now} to {t}")
        self.now = t
