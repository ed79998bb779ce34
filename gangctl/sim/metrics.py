"""What a run measured: per-job outcomes, time-weighted GPU use, and time series for the report."""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


@dataclass(frozen=True, slots=True)
class JobOutcome:
    id: str
    team: str
    gpus: int
    submit: float
    start: float | None        # first start
    end: float | None
    state: str                 # done | failed | rejected
    user_restarts: int = 0
    infra_restarts: int = 0
    preemptions: int = 0
    lost_gpu_seconds: float = 0.0
    reason: str = ""           # why a job was rejected
    placement: str = ""        # what it asked of the topology ("required rack"; "": nothing)

    @property
    def queue_delay(self) -> float | None:
        return None if self.start is None else self.start - self.submit

    @property
    def jct(self) -> float | None:
        return None if self.end is None or self.state != "done" else self.end - self.submit


@dataclass
class Series:
    t: list[float] = field(default_factory=list)
    busy_gpus: list[int] = field(default_factory=list)
    up_gpus: list[int] = field(default_factory=list)
    pending: list[int] = field(default_factory=list)            # waiting for quota
    waiting_for_nodes: list[int] = field(default_factory=list)  # admitted, not placed
    fragmented_gpus: list[int] = field(default_factory=list)
    stranded_gpus: list[int] = field(default_factory=list)      # with a topology (see Cluster.stranded_gpus)
    team_gpus: dict[str, list[float]] = field(default_factory=dict)


class Recorder:
    """Integrates busy and up GPU-seconds between events and keeps the sampled series."""

    def __init__(self, teams: list[str]) -> None:
        self.series = Series(team_gpus={t: [] for t in teams})
        self.outcomes: list[JobOutcome] = []
        self.busy_gpu_seconds = 0.0
        self.up_gpu_seconds = 0.0
        self.team_gpu_seconds = {t: 0.0 for t in teams}
        self.node_failures = 0
        self.spans: dict[str, list[int]] = {}   # kind of ask -> domains each multi-pod gang spanned at its start
        self.violations = 0                      # required gangs started over more than one domain
        self._last = 0.0

    def spread(self, kind: str, domains: int, required: bool) -> None:
        self.spans.setdefault(kind, []).append(domains)
        self.violations += required and domains > 1

    def advance(self, now: float, busy: int, up: int, team_gpus: dict[str, int]) -> None:
        dt = now - self._last
        if dt > 0:
            self.busy_gpu_seconds += busy * dt
            self.up_gpu_seconds += up * dt
            for team, gpus in team_gpus.items():
                self.team_gpu_seconds[team] += gpus * dt
            self._last = now

    def sample(self, now: float, busy: int, up: int, pending: int, waiting: int, fragmented: int,
               team_gpus: dict[str, int]) -> None:
        s = self.series
        s.t.append(now)
        s.busy_gpus.append(busy)
        s.up_gpus.append(up)
        s.pending.append(pending)
        s.waiting_for_nodes.append(waiting)
        s.fragmented_gpus.append(fragmented)
        for team, values in s.team_gpus.items():
            values.append(team_gpus.get(team, 0))


def _stats(values: list[float]) -> dict[str, float | None]:
    if not values:
        return {"mean": None, "p50": None, "p95": None, "p99": None}
    a = np.asarray(values, dtype=float)
    p50, p95, p99 = np.percentile(a, [50, 95, 99])
    return {"mean": float(a.mean()), "p50": float(p50), "p95": float(p95), "p99": float(p99)}


def summarize(rec: Recorder, *, end: float, team_nominal_gpus: dict[str, float]) -> dict:
    """The JSON summary of a run."""
    outcomes = rec.outcomes
    done = [o for o in outcomes if o.state == "done"]
    started = [o for o in outcomes if o.start is not None]
    teams = {}
    for team, nominal in team_nominal_gpus.items():
        mine = [o.queue_delay for o in started if o.team == team]
        teams[team] = {
            "jobs": sum(1 for o in outcomes if o.team == team),
            "nominal_gpus": nominal,
            "mean_gpus": rec.team_gpu_seconds[team] / end if end > 0 else 0.0,
            "peak_gpus": max(rec.series.team_gpus[team], default=0),
            "queue_delay_p95_seconds": _stats(mine)["p95"],
        }
    return {
        "jobs": {state: sum(1 for o in outcomes if o.state == state) for state in ("done", "failed", "rejected")}
        | {"total": len(outcomes)},
        "jct_seconds": _stats([o.jct for o in done]),
        "queue_delay_seconds": _stats([o.queue_delay for o in started]),
        "gpu_utilization": rec.busy_gpu_seconds / rec.up_gpu_seconds if rec.up_gpu_seconds else 0.0,
        "fragmented_gpus_mean": float(np.mean(rec.series.fragmented_gpus)) if rec.series.fragmented_gpus else 0.0,
        "teams": teams,
        "failures": {
            "node_failures": rec.node_failures,
            "user_restarts": sum(o.user_restarts for o in outcomes),
            "infra_restarts": sum(o.infra_restarts for o in outcomes),
            "preemptions": sum(o.preemptions for o in outcomes),
            "goodput_lost_gpu_hours": sum(o.lost_gpu_seconds for o in outcomes) / 3600,
        },
        "makespan_seconds": end,
    }


def topology_summary(rec: Recorder, levels: list[str]) -> dict:
    """Per kind of ask ("required rack", ..., "none": at the narrowest level): the multi-pod gang
    starts, the mean domains they spanned, the jobs and their queueing delay; the violations and
    the stranded GPUs (time-sampled mean)."""
    kinds = sorted({o.placement or "none" for o in rec.outcomes} | set(rec.spans))
    by_kind = {}
    for kind in kinds:
        spans = rec.spans.get(kind, [])
        delays = [o.queue_delay for o in rec.outcomes if (o.placement or "none") == kind and o.start is not None]
        by_kind[kind] = {"jobs": sum(1 for o in rec.outcomes if (o.placement or "none") == kind),
                         "gang_starts": len(spans),
                         "mean_domains": float(np.mean(spans)) if spans else None,
                         "queue_delay_seconds": _stats(delays)}
    stranded = rec.series.stranded_gpus
    return {"levels": levels, "required_violations": rec.violations, "by_ask": by_kind,
            "stranded_gpus_mean": float(np.mean(stranded)) if stranded else 0.0}
