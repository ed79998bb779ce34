"""Pure: what a replay measured, from TrainJob objects, and how it compares with the simulator.

A job's real queueing delay is the first `status.gang.boundAt` the replay saw (set by the controller
when every pod of the gang has a node; a gang restarted after a preemption is stamped again, and the
simulator's start is the first one too) minus the moment the replay created the TrainJob; its completion time is when the
replay first saw the TrainJob `Complete` (the condition's lastTransitionTime, whole seconds, is the
fallback). These are the simulator's definitions: start = the gang placed, end = the job done.
"""
from __future__ import annotations

import random
import statistics
from dataclasses import dataclass
from typing import Iterable, Mapping

from gangctl.policy.status import parse_time

COMPLETE, FAILED = "Complete", "Failed"
DEFAULT_TOLERANCE = 0.05
COMPARED = ("jct_seconds", "queue_delay_seconds")   # the summary metrics both sides have


@dataclass(frozen=True)
class RealOutcome:
    job_id: str
    submitted: float              # epoch seconds, when the replay created the TrainJob
    bound: float | None           # gang.boundAt
    finished: float | None        # first seen Complete/Failed (or the condition's time)
    state: str                    # done | failed | unfinished

    @property
    def queue_delay(self) -> float | None:
        return None if self.bound is None else max(0.0, self.bound - self.submitted)

    @property
    def jct(self) -> float | None:
        return None if self.finished is None or self.state != "done" else self.finished - self.submitted


def finished_condition(trainjob: Mapping) -> dict | None:
    """The true Complete or Failed condition of a TrainJob, if it has one."""
    for c in (trainjob.get("status") or {}).get("conditions") or []:
        if c.get("type") in (COMPLETE, FAILED) and c.get("status") == "True":
            return c
    return None


def outcome_of(job_id: str, trainjob: Mapping, submitted: float, seen_finished: float | None,
               first_bound: float | None = None) -> RealOutcome:
    """`first_bound`: the first gang.boundAt seen while it ran (else the one `trainjob` shows)."""
    status = trainjob.get("status") or {}
    gang = status.get("gang") or {}
    bound = first_bound if first_bound is not None else (
        parse_time(gang["boundAt"]).timestamp() if gang.get("boundAt") else None)
    cond = finished_condition(trainjob)
    if cond is None:
        return RealOutcome(job_id, submitted, bound, None, "unfinished")
    finished = seen_finished
    if finished is None and cond.get("lastTransitionTime"):
        finished = parse_time(cond["lastTransitionTime"]).timestamp()
    return RealOutcome(job_id, submitted, bound, finished, "done" if cond["type"] == COMPLETE else "failed")


def stats(values: list[float]) -> dict[str, float | None]:
    if not values:
        return {"mean": None, "p50": None, "p95": None}
    ordered = sorted(values)
    q = statistics.quantiles(ordered, n=100, method="inclusive") if len(ordered) > 1 else ordered * 99
    return {"mean": statistics.fmean(ordered), "p50": q[49], "p95": q[94]}


def summarize(outcomes: Iterable[RealOutcome]) -> dict:
    """The same keys as the simulator's summary, for the metrics both have."""
    outcomes = list(outcomes)
    return {
        "jobs": {state: sum(1 for o in outcomes if o.state == state) for state in ("done", "failed", "unfinished")}
        | {"total": len(outcomes)},
        "jct_seconds": stats([o.jct for o in outcomes if o.jct is not None]),
        "queue_delay_seconds": stats([o.queue_delay for o in outcomes if o.queue_delay is not None]),
    }


@dataclass(frozen=True)
class Row:
    metric: str
    real: float | None
    sim: float | None
    checked: bool                 # part of the pass/fail verdict (the means)

    @property
    def relative_difference(self) -> float | None:
        if self.real is None or self.sim is None:
            return None
        if self.real == 0:
            return 0.0 if self.sim == 0 else float("inf")
        return (self.sim - self.real) / self.real

    def ok(self, tolerance: float = DEFAULT_TOLERANCE) -> bool:
        d = self.relative_difference
        return d is not None and abs(d) <= tolerance


def compare(real: Mapping, sim: Mapping) -> list[Row]:
    """Real beside simulated: mean JCT and mean queueing delay decide; the rest is shown."""
    rows = []
    for key, label in (("jct_seconds", "JCT"), ("queue_delay_seconds", "queueing delay")):
        for stat in ("mean", "p50", "p95"):
            rows.append(Row(f"{stat} {label} (s)", real[key][stat], sim[key][stat], stat == "mean"))
    return rows


def verdict(rows: list[Row], tolerance: float = DEFAULT_TOLERANCE) -> bool:
    return all(r.ok(tolerance) for r in rows if r.checked)


def oldest_first(shapes: Mapping[str, tuple[int, int]], submits: Mapping[str, float],
                 starts: Mapping[str, float | None], min_wait: float = 2.0) -> dict[tuple[int, int], tuple[int, int]]:
    """Per gang shape (pods, GPUs per pod): of the gangs that waited `min_wait` seconds or more, how many
    started while no older gang of their shape still waited, out of how many.

    Equal gangs served in the order they came score every start. On the cluster, which of them gets a
    node that drains is also decided by races inside kube-scheduler, so this is where a model that keeps
    the queue's order parts from it. A gang started within half a second of another counts as not
    waiting then; a gang that never started waits to the end."""
    counts: dict[tuple[int, int], list[int]] = {}
    by_shape: dict[tuple[int, int], list[str]] = {}
    for job, shape in shapes.items():
        by_shape.setdefault(shape, []).append(job)
    for shape, jobs in by_shape.items():
        for job in jobs:
            start = starts.get(job)
            if start is None or start - submits[job] < min_wait:
                continue
            older = any(submits[q] < submits[job] and (starts.get(q) is None or starts[q] > start + 0.5)
                        for q in jobs)   # submitted before `job`: at least `min_wait` before `start`
            c = counts.setdefault(shape, [0, 0])
            c[0] += not older
            c[1] += 1
    return {shape: (c[0], c[1]) for shape, c in sorted(counts.items())}


def in_arrival_order(shapes: Mapping[str, tuple[int, int]], submits: Mapping[str, float],
                     starts: Mapping[str, float]) -> dict[str, float]:
    """The same start times, with each gang shape's starts handed out in submission order: what the
    run would have looked like had equal gangs been served first come, first served, with no other
    change (every node drained when it did). Queueing that only the order among equal gangs decided
    is the difference to the real starts; gangs that never started are left out. No gang gets a start
    before its submission: the k-th earliest start of a shape came after k of its gangs were submitted."""
    out: dict[str, float] = {}
    by_shape: dict[tuple[int, int], list[str]] = {}
    for job, shape in shapes.items():
        if starts.get(job) is not None:
            by_shape.setdefault(shape, []).append(job)
    for jobs in by_shape.values():
        for job, start in zip(sorted(jobs, key=lambda j: (submits[j], j)), sorted(starts[j] for j in jobs)):
            out[job] = start
    return out


def rank(real: float, draws: list[float]) -> float:
    """Where a real figure falls among the model's draws: the share of draws below it, ties counting
    half. If the model is right, a real run is one more draw, and its rank is uniform on [0, 1]."""
    if not draws:
        raise ValueError("no draws to rank against")
    return (sum(d < real for d in draws) + 0.5 * sum(d == real for d in draws)) / len(draws)


def rank_bias(ranks: list[float]) -> tuple[float, float]:
    """The mean rank of several runs and how many standard deviations it lies from 0.5, the mean a
    right model gives (n uniform ranks: standard deviation 1/sqrt(12 n)). Far above 0: the real runs
    sit high in the model's spread more often than chance explains."""
    if not ranks:
        raise ValueError("no ranks")
    mean = statistics.fmean(ranks)
    return mean, (mean - 0.5) / (1 / (12 * len(ranks))) ** 0.5


# Issue 17's goal for the model against the mean of real runs: means within 5 %, p95s within 10 %.
GOAL_TOLERANCE = {"mean": 0.05, "p95": 0.10}
BOOTSTRAP_RESAMPLES = 10_000
# Below this many runs a percentile bootstrap's interval is too narrow to trust (two runs give three
# distinct resamples, so it is little more than the two runs' own errors): no verdict is given.
MIN_RUNS_FOR_VERDICT = 5


def pooled_error(real: list[float], model: list[float]) -> float:
    """The model's relative error against several real runs: (mean of the models - mean of the runs) /
    mean of the runs (each run's model from that run's measured latencies)."""
    return (statistics.fmean(model) - statistics.fmean(real)) / statistics.fmean(real)


def bootstrap_interval(real: list[float], model: list[float], resamples: int = BOOTSTRAP_RESAMPLES,
                       seed: int = 17) -> tuple[float, float] | None:
    """The 95 % interval of `pooled_error` from a seeded bootstrap over the runs: the runs drawn with
    replacement (a run's real and model figures together), the error of each resample, its 2.5th and
    97.5th percentiles. None with fewer than two runs: one run says nothing of the spread. With few runs
    the interval is too narrow if anything (two runs give only three distinct resamples)."""
    if len(real) != len(model):
        raise ValueError("one model figure per real run")
    if len(real) < 2:
        return None
    rng = random.Random(seed)
    n = len(real)
    errors = []
    for _ in range(resamples):
        picks = [rng.randrange(n) for _ in range(n)]
        errors.append(pooled_error([real[i] for i in picks], [model[i] for i in picks]))
    q = statistics.quantiles(errors, n=40, method="inclusive")
    return q[0], q[-1]


def interval_verdict(interval: tuple[float, float] | None, tolerance: float, runs: int) -> str:
    """"within tolerance" only when the whole 95 % interval is within ±tolerance; "outside tolerance" when
    all of it is beyond; otherwise "not shown within" (the runs cannot tell); "too few runs" under
    `MIN_RUNS_FOR_VERDICT`."""
    if interval is None or runs < MIN_RUNS_FOR_VERDICT:
        return "too few runs"
    lo, hi = interval
    if -tolerance <= lo and hi <= tolerance:
        return "within tolerance"
    if lo > tolerance or hi < -tolerance:
        return "outside tolerance"
    return "not shown within"
