"""Quota admission: which pending gangs may start now, in what order, and why the others wait.

Pure: the caller passes the quotas, the current usage per team, the pending gangs and (for
preemption) the admitted ones. Nothing here reads a clock or does I/O. The controller calls
`decide` for the coscheduling backend (which has no quota system of its own); the simulator
calls it after every event.

Semantics follow Kueue's ClusterQueue/cohort model:

- A team may use its nominal quota. A team in a cohort may also borrow what the other members of
  the cohort leave unused, up to its `borrowing_limit` (no entry = unlimited). A team lends only
  `lending_limit` of its nominal quota to the cohort (no entry = all of it); the rest is guaranteed.
- Only the resources a team lists in `nominal` are limited for it; other requests pass unchecked.
- Pending gangs are taken in strict priority order, FIFO within a priority (`queue_key`), across
  all teams. Under StrictFIFO a team's queue stops at its first gang that does not fit (later gangs
  of that team are not examined and get no decision); under BestEffortFIFO the scan goes on.
- Preemption when the policy allows it: `preempt_within_team` evicts lower-priority gangs of the
  same team (Kueue `withinClusterQueue: LowerPriority`); `reclaim` evicts gangs of cohort members
  that borrow, when the gang fits within its own team's nominal quota (`reclaimWithinCohort`).
  Victims are chosen lowest priority first, most recently admitted first, then any victim not
  needed after all is spared.

Amounts are plain numbers in whatever integer units the caller chose (the simulator uses GPUs,
millicores and MiB); `Quotas.scale` says how many of those make one unit of the quota file, and is
used only to print reasons in the file's units.
"""
from __future__ import annotations

import heapq
from dataclasses import dataclass, field
from enum import Enum
from fractions import Fraction
from typing import Callable, Iterable, Mapping, Sequence, Union

Amount = Union[int, float, Fraction]

GPU = "nvidia.com/gpu"
CPU = "cpu"
MEMORY = "memory"
_LABELS = {GPU: "GPUs", CPU: "CPU cores", MEMORY: "GiB memory"}


class Reclaim(str, Enum):
    """Whom a team below its nominal quota may evict from cohort members that borrow."""

    NEVER = "Never"
    LOWER_PRIORITY = "LowerPriority"
    ANY = "Any"


@dataclass(frozen=True, slots=True)
class TeamQuota:
    name: str
    nominal: Mapping[str, Amount]
    cohort: str | None = None
    borrowing_limit: Mapping[str, Amount] = field(default_factory=dict)
    lending_limit: Mapping[str, Amount] = field(default_factory=dict)
    best_effort: bool = False
    preempt_within_team: bool = False
    reclaim: Reclaim = Reclaim.NEVER


@dataclass(frozen=True, slots=True)
class Quotas:
    teams: Mapping[str, TeamQuota]
    scale: Mapping[str, int] = field(default_factory=dict)

    @property
    def preemption_enabled(self) -> bool:
        return any(t.preempt_within_team or t.reclaim is not Reclaim.NEVER for t in self.teams.values())


@dataclass(frozen=True, slots=True)
class Workload:
    """A gang as admission sees it: `requests` is the gang's floor (`Gang.min_resources`).

    For admitted workloads, `created` is the admission time (it orders preemption victims)."""

    id: str
    team: str
    priority: int
    created: float
    requests: Mapping[str, Amount]


def queue_key(w: Workload) -> tuple:
    """The order of a team's pending queue: higher priority first, then FIFO."""
    return (-w.priority, w.created, w.id)


class Verdict(str, Enum):
    ADMIT = "admit"
    PREEMPT = "preempt"   # admit once the victims are evicted
    WAIT = "wait"


@dataclass(frozen=True, slots=True)
class Shortfall:
    """The first resource a workload lacks, with the numbers that explain it."""

    resource: str
    requested: Amount
    team: str
    used: Amount
    nominal: Amount
    available: Amount
    cohort: str | None = None
    cohort_free: Amount | None = None
    borrow_left: Amount | None = None  # None: no borrowing limit
    scale: Mapping[str, int] = field(default_factory=dict)  # caller units per quota-file unit


@dataclass(frozen=True, slots=True)
class Decision:
    workload: Workload
    verdict: Verdict
    victims: tuple[Workload, ...] = ()
    shortfall: Shortfall | None = None
    gate_reason: str = ""
    borrows: bool = False

    @property
    def reason(self) -> str:
        """One line for people: `kubectl describe`, the simulator's report."""
        if self.verdict is Verdict.PREEMPT:
            return f"admitted after evicting {len(self.victims)} workload(s): " + ", ".join(v.id for v in self.victims)
        if self.verdict is Verdict.ADMIT:
            return "admitted, borrowing from the cohort" if self.borrows else "admitted within nominal quota"
        if self.gate_reason:
            return self.gate_reason
        return explain(self.shortfall, self.workload.team)


def _fmt(amount: Amount, resource: str, scale: Mapping[str, int]) -> str:
    return f"{float(amount) / scale.get(resource, 1):g}"


def explain(s: Shortfall | None, team: str) -> str:
    """E.g. "requests 32 GPUs, team ml-a uses 48 of 64 nominal, cohort research has 8 free"."""
    if s is None:
        return f"team {team} has no quota"
    sc = s.scale
    label = _LABELS.get(s.resource, s.resource)
    text = (f"requests {_fmt(s.requested, s.resource, sc)} {label}, team {s.team} uses "
            f"{_fmt(s.used, s.resource, sc)} of {_fmt(s.nominal, s.resource, sc)} nominal")
    if s.cohort is not None:
        text += f", cohort {s.cohort} has {_fmt(s.cohort_free, s.resource, sc)} free"
        if s.borrow_left is not None:
            text += f", borrowing limit leaves {_fmt(s.borrow_left, s.resource, sc)} {label}"
    return text


class _Ledger:
    """Usage per team and free lendable quota per cohort, updated as decisions are taken."""

    __slots__ = ("quotas", "used", "cohort_free", "guaranteed", "epoch")

    def __init__(self, quotas: Quotas, usage: Mapping[str, Mapping[str, Amount]]):
        self.quotas = quotas
        self.epoch = 0   # bumped on every change, so cached victim lists know they are stale
        rows, self.guaranteed = _static(quotas)
        self.used: dict[str, dict[str, Amount]] = {}
        self.cohort_free: dict[str, dict[str, Amount]] = {}
        cohort_free = self.cohort_free
        # Same arithmetic, in the same order, as summing each team's lendable quota minus what it
        # uses beyond its guaranteed part, team by team (so float amounts round the same way).
        for name, cohort, lend in rows:
            team_usage = usage.get(name)
            used = self.used[name] = dict(team_usage) if team_usage else {}
            if cohort is not None:
                pool = cohort_free.get(cohort)
                if pool is None:
                    pool = cohort_free[cohort] = {}
                for r, lendable, g in lend:
                    excess = used.get(r, 0) - g
                    pool[r] = pool.get(r, 0) + lendable - (excess if excess > 0 else 0)   # max(0, excess)

    def available(self, team: TeamQuota, r: str) -> Amount:
        used = self.used[team.name].get(r, 0)
        nominal = team.nominal[r]
        if team.cohort is None:
            return nominal - used
        own = max(0, self.guaranteed[team.name][r] - used)
        avail = own + self.cohort_free[team.cohort][r]
        limit = team.borrowing_limit.get(r)
        if limit is not None:
            avail = min(avail, nominal + limit - used)
        return avail

    def lacking(self, team: TeamQuota, requests: Mapping[str, Amount]) -> str | None:
        """The first limited resource the team cannot grant now, or None if the requests fit.

        Resources are checked in the order of the team's quota (gpu, cpu, memory), never in the
        order the requests happen to list them: the answer picks preemption victims and the reason
        shown, and a PodGroup's minResources (sorted by name) must get the same answer as the
        simulator's requests."""
        # `available` inlined (this runs for every gang examined on every event).
        used = self.used[team.name]
        cohort = team.cohort
        for r, nominal in team.nominal.items():
            amount = requests.get(r)
            if not amount:
                continue
            u = used.get(r, 0)
            if cohort is None:
                avail = nominal - u
            else:
                own = self.guaranteed[team.name][r] - u
                avail = (own if own > 0 else 0) + self.cohort_free[cohort][r]   # max(0, own) + ...
                limit = team.borrowing_limit.get(r)
                if limit is not None:
                    avail = min(avail, nominal + limit - u)
            if amount > avail:
                return r
        return None

    def shortfall(self, team: TeamQuota, requests: Mapping[str, Amount]) -> Shortfall | None:
        r = self.lacking(team, requests)
        if r is None:
            return None
        used = self.used[team.name].get(r, 0)
        nominal = team.nominal[r]
        limit = team.borrowing_limit.get(r)
        return Shortfall(r, requests[r], team.name, used, nominal, max(0, self.available(team, r)), team.cohort,
                         self.cohort_free[team.cohort][r] if team.cohort else None,
                         None if limit is None or team.cohort is None else max(0, nominal + limit - used),
                         self.quotas.scale)

    def borrows(self, team: TeamQuota, requests: Mapping[str, Amount]) -> bool:
        used = self.used[team.name]
        return any(used.get(r, 0) + a > team.nominal[r] for r, a in requests.items() if r in team.nominal)

    def charge(self, team_name: str, requests: Mapping[str, Amount], sign: int = 1) -> None:
        self.epoch += 1
        team = self.quotas.teams[team_name]
        used = self.used[team_name]
        guaranteed = self.guaranteed[team_name]
        pool = self.cohort_free.get(team.cohort) if team.cohort else None
        for r, amount in requests.items():
            before = used.get(r, 0)
            after = before + sign * amount
            used[r] = after
            if pool is not None and r in guaranteed:
                g = guaranteed[r]
                pool[r] -= max(0, after - g) - max(0, before - g)


_STATIC: tuple = (None, None)   # (quotas, its table): the last Quotas seen, by identity


def _static(quotas: Quotas) -> tuple[tuple, dict[str, dict[str, Amount]]]:
    """Per team of `quotas` (frozen): (name, cohort, ((resource, lendable, guaranteed), ...)), and
    the guaranteed amounts per team. Computed once per Quotas object, not on every `decide`."""
    global _STATIC
    seen, table = _STATIC
    if seen is quotas:
        return table
    rows = []
    guaranteed: dict[str, dict[str, Amount]] = {}
    for name, team in quotas.teams.items():
        g = guaranteed[name] = {}
        lend = []
        for r, nominal in team.nominal.items():
            lendable = team.lending_limit.get(r, nominal) if team.cohort else 0
            g[r] = nominal - lendable
            lend.append((r, lendable, g[r]))
        rows.append((name, team.cohort or None, tuple(lend)))
    table = (tuple(rows), guaranteed)
    _STATIC = (quotas, table)
    return table


def usage_of(workloads: Iterable[Workload]) -> dict[str, dict[str, Amount]]:
    """Sum the requests of admitted workloads per team (the `usage` argument of `decide`)."""
    usage: dict[str, dict[str, Amount]] = {}
    for w in workloads:
        team = usage.setdefault(w.team, {})
        for r, amount in w.requests.items():
            team[r] = team.get(r, 0) + amount
    return usage


def headroom(quotas: Quotas, usage: Mapping[str, Mapping[str, Amount]], team: str) -> dict[str, Amount]:
    """What the team could still take now, per limited resource (e.g. for an elastic job to grow)."""
    ledger = _Ledger(quotas, usage)
    tq = quotas.teams[team]
    return {r: max(0, ledger.available(tq, r)) for r in tq.nominal}


def never_fits(quotas: Quotas, w: Workload) -> Shortfall | None:
    """The shortfall that remains even with the whole cohort idle (such a gang can never start)."""
    team = quotas.teams.get(w.team)
    if team is None:
        return None
    return _Ledger(quotas, {}).shortfall(team, w.requests)


def decide(
    quotas: Quotas,
    usage: Mapping[str, Mapping[str, Amount]],
    pending: Mapping[str, Sequence[Workload]],
    admitted: Mapping[str, Iterable[Workload]] | None = None,
    gate: Callable[[Workload], str | None] | None = None,
    *,
    waits: bool = True,
    first: bool = False,
) -> list[Decision]:
    """Decide, in queue order, which pending workloads to admit now.

    `pending` maps each team to its queue, already sorted by `queue_key`. `admitted` (per team) is
    only read when the policy allows preemption. `gate`, if given, is asked after quota fits and may
    veto with a reason (e.g. the simulator's Volcano model admits only gangs the nodes can hold); it
    is not asked for preemptors, whose room only appears once the victims are gone.
    With `waits=False` only ADMIT and PREEMPT decisions are returned (the simulator's fast path); with
    `first`, the call ends at the first of them (a scheduler that admits one gang at a time: the later
    decisions of the call would be dropped anyway, and cost most of it).

    Cost: StrictFIFO teams stop at their first blocked gang. BestEffortFIFO teams go on, but a gang
    that requests at least as much of everything as a gang of its team already blocked in this call
    is blocked without a full check (availability only shrinks as the call admits, and the later
    gang has no higher priority); this is reset when a preemption frees quota.
    """
    ledger = _Ledger(quotas, usage)
    decisions: list[Decision] = []
    evicted: set[str] = set()
    blocked: dict[str, list[Mapping[str, Amount]]] = {}
    victims_cache: dict[tuple, tuple[list[Workload], dict[str, Amount]]] = {}
    heads: list[tuple[tuple, str, int]] = [(queue_key(q[0]), t, 0) for t, q in pending.items() if q]
    heapq.heapify(heads)
    while heads:
        _, team_name, index = heapq.heappop(heads)
        queue = pending[team_name]
        team = quotas.teams.get(team_name)
        if team is None:
            if waits:
                decisions.append(Decision(queue[index], Verdict.WAIT))
            continue
        # Walk this team's queue while its next gang still comes before every other team's head
        # (the order a heap push and pop would give, without them).
        while True:
            w = queue[index]
            seen = blocked.get(team_name)
            decision = None
            if seen is None or not _blocked_by(w.requests, seen):
                decision = _decide_one(ledger, team, w, admitted, evicted, gate, victims_cache)
                if decision is None and team.best_effort:
                    blocked.setdefault(team_name, []).append(w.requests)
                elif decision is not None and decision.victims:
                    blocked.clear()
            if decision is None:
                if waits:
                    decisions.append(Decision(w, Verdict.WAIT, shortfall=ledger.shortfall(team, w.requests)))
            elif waits or decision.verdict is not Verdict.WAIT:
                decisions.append(decision)
                if first and decision.verdict is not Verdict.WAIT:
                    return decisions
            if (decision is None or decision.verdict is Verdict.WAIT) and not team.best_effort:
                break
            index += 1
            if index == len(queue):
                break
            if heads:
                key = queue_key(queue[index])
                if key > heads[0][0]:
                    heapq.heappush(heads, (key, team_name, index))
                    break
    return decisions


def _blocked_by(requests: Mapping[str, Amount], seen: list[Mapping[str, Amount]]) -> bool:
    """Whether `requests` asks at least as much of everything as a gang already blocked."""
    for b in seen:
        if requests is b or _covers(requests, b):
            return True
    return False


def _covers(requests: Mapping[str, Amount], other: Mapping[str, Amount]) -> bool:
    for r, amount in other.items():
        if not requests.get(r, 0) >= amount:
            return False
    return True


def _decide_one(ledger: _Ledger, team: TeamQuota, w: Workload,
                admitted: Mapping[str, Iterable[Workload]] | None, evicted: set[str],
                gate: Callable[[Workload], str | None] | None,
                victims_cache: dict[tuple, tuple[list[Workload], dict[str, Amount]]]) -> Decision | None:
    """ADMIT, PREEMPT, a WAIT vetoed by the gate, or None: no quota."""
    lacking = ledger.lacking(team, w.requests)
    if lacking is None:
        if gate is not None:
            veto = gate(w)
            if veto:
                return Decision(w, Verdict.WAIT, gate_reason=veto)
        borrows = ledger.borrows(team, w.requests)
        ledger.charge(team.name, w.requests)
        return Decision(w, Verdict.ADMIT, borrows=borrows)
    if admitted is None or not (team.preempt_within_team or team.reclaim is not Reclaim.NEVER):
        return None
    key = (team.name, w.priority, ledger.epoch, _within_nominal(ledger, team, w))
    cached = victims_cache.get(key)
    if cached is None:
        cached = victims_cache[key] = (_candidates(ledger, team, w, admitted, evicted), {})
    victims = _find_victims(ledger, team, w, cached[0], lacking, cached[1])
    if not victims:
        return None
    evicted.update(v.id for v in victims)
    borrows = ledger.borrows(team, w.requests)
    ledger.charge(team.name, w.requests)
    return Decision(w, Verdict.PREEMPT, victims=tuple(victims), borrows=borrows)


def _find_victims(ledger: _Ledger, team: TeamQuota, w: Workload, candidates: list[Workload],
                  lacking: str, totals: dict[str, Amount]) -> list[Workload]:
    """`totals`: the candidates' summed requests per resource, filled in as needed (the list is
    cached while the ledger does not change, and so are its sums)."""
    need = w.requests[lacking] - ledger.available(team, lacking)
    total = totals.get(lacking)
    if total is None:
        total = totals[lacking] = sum(v.requests.get(lacking, 0) for v in candidates)
    if total < need:
        return []
    epoch = ledger.epoch
    taken: list[Workload] = []
    for victim in candidates:
        if victim.team != team.name and not _over_nominal(ledger, victim.team):
            continue  # that team stopped borrowing: reclaim only takes back lent quota
        ledger.charge(victim.team, victim.requests, -1)
        taken.append(victim)
        if ledger.lacking(team, w.requests) is None:
            break
    else:
        for victim in taken:
            ledger.charge(victim.team, victim.requests)
        ledger.epoch = epoch  # nothing changed: cached candidate lists stay valid
        return []
    for victim in reversed(taken[:-1]):  # spare victims not needed after all
        ledger.charge(victim.team, victim.requests)
        if ledger.lacking(team, w.requests) is None:
            taken.remove(victim)
        else:
            ledger.charge(victim.team, victim.requests, -1)
    return taken


def _over_nominal(ledger: _Ledger, team_name: str) -> bool:
    nominal = ledger.quotas.teams[team_name].nominal
    for r, amount in ledger.used[team_name].items():
        if r in nominal and amount > nominal[r]:
            return True
    return False


def _candidates(ledger: _Ledger, team: TeamQuota, w: Workload,
                admitted: Mapping[str, Iterable[Workload]], evicted: set[str]) -> list[Workload]:
    """Possible victims, cheapest first: reclaimed borrowers, then lower priority of the same team."""
    reclaimed: list[Workload] = []
    if team.reclaim is not Reclaim.NEVER and team.cohort and _within_nominal(ledger, team, w):
        for other in ledger.quotas.teams.values():
            if other.cohort != team.cohort or other.name == team.name or not _over_nominal(ledger, other.name):
                continue
            reclaimed += [v for v in admitted.get(other.name, ()) if v.id not in evicted
                          and (team.reclaim is Reclaim.ANY or v.priority < w.priority)]
    own: list[Workload] = []
    if team.preempt_within_team:
        own = [v for v in admitted.get(team.name, ()) if v.priority < w.priority and v.id not in evicted]
    order = lambda v: (v.priority, -v.created, v.id)  # noqa: E731
    return sorted(reclaimed, key=order) + sorted(own, key=order)


def _within_nominal(ledger: _Ledger, team: TeamQuota, w: Workload) -> bool:
    used = ledger.used[team.name]
    nominal = team.nominal
    for r, a in w.requests.items():
        if r in nominal and not used.get(r, 0) + a <= nominal[r]:
            return False
    return True
