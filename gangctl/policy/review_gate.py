"""Bearer tokens under abuse: which token checks go to the API server, and which are answered from
memory or refused (pure: the caller passes `now`, monotonic seconds).

Every bearer token sent to /metrics (with --metrics-auth) or to the progress endpoint is checked by
the API server: a TokenReview, and for /metrics a SubjectAccessReview. Unchecked, anyone who can
reach a port turns requests with invented tokens into API requests, without limit, on the
controller's own connections and API Priority and Fairness flow. So:

- `Verdicts`: an endpoint's answers are cached by the token's SHA-256, accepted and refused alike,
  for a short ttl, the least recently used dropped past `max_entries` (bounded memory). A token seen
  again within the ttl costs no review.
- `ReviewGate`: a token not in the cache needs a review. A token the API server authenticated before
  (its verdict expired but is still remembered) is *known*: a real identity, reviewed again on a
  budget of its own (`Limits.known_*`), never behind unknown tokens. An unknown token is admitted
  only while its source address has a token in its bucket (`source_rate`/s, `source_burst` deep)
  and fewer than `source_in_flight` of its reviews are in flight, and the process as a whole has a
  token (`total_rate`/s, `total_burst`) and fewer than `total_in_flight` in flight. Otherwise
  `Busy`: the endpoint answers 429 with Retry-After at once, nothing is queued. A flooding source
  is refused from its first second while every other source keeps its own budget; invented tokens
  from many sources at once can spend the total budget, which then holds new tokens back (never
  known ones) and never sends more than `total_rate` reviews a second.
"""
from __future__ import annotations

import hashlib
from collections import OrderedDict
from dataclasses import dataclass
from typing import Generic, TypeVar

from gangctl.policy.ratelimit import TokenBucket, TokenBuckets

V = TypeVar("V")
SOURCE, TOTAL, KNOWN = "source", "total", "known"  # which limit refused a review (Busy.limit)


def token_key(token: str, *scope: str) -> str:
    """What a verdict is cached under: the token is never kept."""
    return hashlib.sha256("\0".join((token, *scope)).encode()).hexdigest()


class Verdicts(Generic[V]):
    """One endpoint's verdicts by `token_key`, each good for `ttl` seconds; an expired one is kept (until
    evicted) only to tell whether its token was authenticated (`known`)."""

    def __init__(self, ttl: float, max_entries: int = 4096):
        self.ttl, self.max_entries = ttl, max_entries
        self._entries: OrderedDict[str, tuple[float, V, bool]] = OrderedDict()

    def fresh(self, key: str, now: float) -> tuple[bool, V | None]:
        """(True, verdict) when one is cached and still good; (False, None) otherwise."""
        entry = self._entries.get(key)
        if entry is None or entry[0] <= now:
            return False, None
        self._entries.move_to_end(key)
        return True, entry[1]

    def known(self, key: str) -> bool:
        entry = self._entries.get(key)
        return entry is not None and entry[2]

    def put(self, key: str, verdict: V, authenticated: bool, now: float) -> None:
        self._entries[key] = (now + self.ttl, verdict, authenticated)
        self._entries.move_to_end(key)
        while len(self._entries) > self.max_entries:
            self._entries.popitem(last=False)

    def __len__(self) -> int:
        return len(self._entries)


@dataclass(frozen=True)
class Limits:
    """Reviews of unknown tokens, per source address and for the whole process (every endpoint); and,
    apart, re-reviews of known ones (tokens someone may have collected cost no more than this)."""

    source_rate: float = 1.0
    source_burst: int = 10
    source_in_flight: int = 5
    # ten sources' bursts, a dozen sources' reviews in flight: a few flooding sources never spend it
    total_rate: float = 20.0
    total_burst: int = 100
    total_in_flight: int = 64
    known_rate: float = 50.0
    known_burst: int = 200
    known_in_flight: int = 32


class Busy(Exception):
    """No review now: answer 429, Retry-After `seconds`."""

    def __init__(self, seconds: float, limit: str):
        super().__init__(f"token reviews over the {limit} limit; retry in {seconds:.1f}s")
        self.seconds, self.limit = seconds, limit


class _Budget:
    """A token bucket and a cap on reviews in flight."""

    def __init__(self, rate: float, burst: int, in_flight: int, limit: str):
        self.bucket, self.cap, self.limit, self.in_flight = TokenBucket(rate, burst), in_flight, limit, 0

    def check(self) -> None:
        if self.in_flight >= self.cap:
            raise Busy(1.0, self.limit)

    def take(self, now: float) -> None:
        if (wait := self.bucket.take(now)) > 0:
            raise Busy(wait, self.limit)
        self.in_flight += 1


class ReviewGate:
    """Admission of token reviews, shared by every endpoint of a process. `admit` raises `Busy` or
    admits; every admitted review must be followed by `done` with the same arguments."""

    def __init__(self, limits: Limits = Limits(), max_sources: int = 4096):
        self.limits = limits
        self._sources = TokenBuckets(limits.source_rate, limits.source_burst, max_keys=max_sources)
        self._source_in_flight: dict[str, int] = {}
        self._total = _Budget(limits.total_rate, limits.total_burst, limits.total_in_flight, TOTAL)
        self._known = _Budget(limits.known_rate, limits.known_burst, limits.known_in_flight, KNOWN)

    def admit(self, source: str, known: bool, now: float) -> None:
        if known:  # never behind unknown tokens: a budget of its own
            self._known.check()
            self._known.take(now)
            return
        if self._source_in_flight.get(source, 0) >= self.limits.source_in_flight:
            raise Busy(1.0, SOURCE)
        self._total.check()
        if (wait := self._sources.take(source, now)) > 0:
            raise Busy(wait, SOURCE)
        try:
            self._total.take(now)
        except Busy:
            self._sources.refund(source)  # the source did not get its review: it keeps its token
            raise
        self._source_in_flight[source] = self._source_in_flight.get(source, 0) + 1

    def done(self, source: str, known: bool) -> None:
        if known:
            self._known.in_flight -= 1
            return
        self._total.in_flight -= 1
        left = self._source_in_flight.get(source, 0) - 1
        if left > 0:
            self._source_in_flight[source] = left
        else:
            self._source_in_flight.pop(source, None)

    def in_flight(self) -> int:
        return self._total.in_flight + self._known.in_flight
