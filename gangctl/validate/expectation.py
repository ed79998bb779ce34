"""Pure: what the model expects of a replay, over the scheduler's random choices.

kube-scheduler breaks ties between equally scored nodes at random, and with spread packing
(LeastAllocated) small pods keep landing on the emptiest nodes: where they land decides when whole
nodes drain for the gangs that need them. One real replay is one draw of those ties (and of the
scheduler's races the model draws, `ControlPlane.permit_hold_race`). Measured on the 300-job replay
slices (model at 931c65c), the model's own mean queueing delay varies by up to 13 % (one standard
deviation) from one draw to the next, and its p95 by up to 23 %: compared with a single draw, a
replay would pass or fail by luck. So a replay is compared with the mean over `DRAWS` draws, and
the spread of the draws is reported beside it (how far one real run may fall from the mean). The
mean is uncertain by the spread over the square root of the draws: with 32 draws about 4 % on the
p95 queueing delay, a third of the 10 % tolerance (replay-check's pooled p95s moved by 1.3 to 1.7
points between 32 and 128 draws of one model); 128 draws halve that, at about 7 s of CPU for a
300-job slice.
"""
from __future__ import annotations

import dataclasses
import statistics
from dataclasses import dataclass

from gangctl.model.quota import QuotaPolicy
from gangctl.sim.engine import simulate
from gangctl.sim.metrics import JobOutcome
from gangctl.sim.scenario import Scenario
from gangctl.sim.traces import TraceJob
from gangctl.validate.measure import COMPARED
from gangctl.validate.topology import mean_topology

DRAWS = 128


@dataclass(frozen=True)
class Expectation:
    summary: dict                  # the first draw's summary, its JCT and queueing stats the draws' means
    outcomes: list[JobOutcome]     # each job's start and end, averaged over the draws
    draws: int
    draw_outcomes: list[list[JobOutcome]]   # each draw's own outcomes (which gang went first is lost in means)
    draw_values: dict[str, dict[str, list[float]]]   # metric -> stat -> each draw's figure (where a real run ranks)

    @property
    def bands(self) -> dict[str, dict[str, list[float]]]:
        """Metric -> stat -> [5th, 95th percentile] over the draws."""
        return {key: {stat: _band(v) for stat, v in stats.items()} for key, stats in self.draw_values.items()}

    def result_fields(self) -> dict:
        """The model's part of a sim-check result (the JSON `sim-check -o json` prints)."""
        fields = {"model": {k: self.summary[k] for k in ("jobs", *COMPARED)}, "model_draws": self.draws,
                  "model_band": self.bands, "model_draw_values": self.draw_values}
        if "topology" in self.summary:
            fields["model_topology"] = self.summary["topology"]
        return fields


def expected(scenario: Scenario, policy: QuotaPolicy, jobs: list[TraceJob], draws: int = DRAWS) -> Expectation:
    if draws < 1:
        raise ValueError("draws must be at least 1")
    runs = [simulate(scenario, policy, jobs, placement_seed=scenario.seed + i) for i in range(draws)]
    summary = dict(runs[0].summary)
    values: dict[str, dict[str, list[float]]] = {}
    for key in COMPARED:
        summary[key], values[key] = {}, {}
        for stat in runs[0].summary[key]:
            v = values[key][stat] = [r.summary[key][stat] for r in runs if r.summary[key][stat] is not None]
            summary[key][stat] = statistics.fmean(v) if v else None
    if "topology" in summary:
        summary["topology"] = mean_topology([r.summary["topology"] for r in runs])
    per_draw = [r.outcomes for r in runs]
    return Expectation(summary, _mean_outcomes(per_draw), draws, per_draw, values)


def _band(values: list[float]) -> list[float]:
    if len(values) < 2:
        return values * 2 if values else []
    q = statistics.quantiles(values, n=20, method="inclusive")
    return [q[0], q[-1]]


def _mean_outcomes(draws: list[list[JobOutcome]]) -> list[JobOutcome]:
    by_id: dict[str, list[JobOutcome]] = {}
    for outcomes in draws:
        for o in outcomes:
            by_id.setdefault(o.id, []).append(o)
    return [dataclasses.replace(os[0], start=_mean(o.start for o in os), end=_mean(o.end for o in os))
            for os in by_id.values()]


def _mean(values) -> float | None:
    known = [v for v in values if v is not None]
    return statistics.fmean(known) if known else None
