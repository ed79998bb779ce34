"""Side-by-side benchmarks run in rounds, alternating which side goes first, and report medians.

One run per side, always gangctl first, measures the machine's drift as much as the controllers: on the
2-core project machine a side varies by 7-15 % from run to run, and the second run of a pair starts on a
machine the first one warmed. So each side runs `rounds` times (at least 3 to publish), in alternating
order (`order`), and the published figure is the median with the range over the rounds (`summary`,
which `gangctl.harness.results` prints as "median (min–max, n runs)").
"""
from __future__ import annotations

import statistics
from pathlib import Path
from collections.abc import Callable, Iterable, Sequence

MIN_ROUNDS = 3


def order(sides: Sequence[str], rounds: int) -> list[tuple[int, str]]:
    """(round, side) in the order to run them: the sides as given in even rounds, reversed in odd ones."""
    if rounds < 1:
        raise ValueError(f"rounds must be at least 1, not {rounds}")
    return [(r, side) for r in range(rounds) for side in (sides if r % 2 == 0 else list(reversed(sides)))]


def parse_args(parser, benchmark: str, side: str = "backend"):
    """`parser`'s arguments with the side-by-side ones every such benchmark has: `--json` (every
    round's figures), `--rounds` (runs per side, alternating) and `--record` (the medians to
    benchmarks/results/BENCHMARK.json, which needs `MIN_ROUNDS`)."""
    parser.add_argument("--json", type=Path, help="write every round's figures here")
    parser.add_argument("--rounds", type=int, default=MIN_ROUNDS,
                        help=f"runs per {side}, the order reversed every other round")
    parser.add_argument("--record", action="store_true",
                        help=f"write the medians to benchmarks/results/{benchmark}.json")
    args = parser.parse_args()
    if args.rounds < 1 or (problem := check_rounds(args.rounds, args.record)):
        parser.error(problem if args.rounds >= 1 else "--rounds must be at least 1")
    return args


def run_sides(sides: Sequence[str], rounds: int, run: Callable[[str], dict],
              say: Callable[[str], None]) -> dict[str, list[dict]]:
    """Every side `rounds` times in `order`, saying which round runs: each side's figures, run by run."""
    runs: dict[str, list[dict]] = {side: [] for side in sides}
    for n, side in order(list(sides), rounds):
        say(f"round {n + 1} of {rounds}: {side}")
        runs[side].append(run(side))
    return runs


def summary(samples: Iterable[float | None]) -> dict | None:
    """The median, range and count of one figure over rounds (rounds where it is missing left out), with
    the samples in round order; None when no round has it."""
    values = [v for v in samples if v is not None]
    if not values:
        return None
    return {"median": round(statistics.median(values), 4), "min": min(values), "max": max(values),
            "n": len(values), "samples": values}


def aggregate(runs: Sequence[dict], keys: Iterable[str]) -> dict[str, dict | None]:
    """Per key, the `summary` over the runs of one side (each run a dict of figures)."""
    return {k: summary(run.get(k) for run in runs) for k in keys}


def ratio(a: dict | None, b: dict | None) -> float | None:
    """gangctl's median over the peer's (None when either is missing or the peer's is 0)."""
    if not a or not b or not b["median"]:
        return None
    return round(a["median"] / b["median"], 2)


def check_rounds(rounds: int, publish: bool) -> str | None:
    """An error message when a run meant to publish (`--record`) has fewer than `MIN_ROUNDS` rounds."""
    if publish and rounds < MIN_ROUNDS:
        return f"--record publishes a median: it needs --rounds {MIN_ROUNDS} or more (got {rounds})"
    return None
