"""Rate limits as client-go has them, pure: the caller passes `now` (monotonic seconds).

- `TokenBucket`: `qps` tokens a second, at most `burst` saved up; `reserve(now)` takes one and
  says how long to wait before using it (0 when one is there). Shared by every request of the
  client, and by the work queue as its overall limit; `take(now)` only when one is there (the
  endpoints' limits: a refused request spends nothing).
- `TokenBuckets`: one `TokenBucket` per key (a ServiceAccount, a source address), the least recently
  used keys forgotten past `max_keys`, so a flood of keys costs bounded memory.
- `ItemBackoff`: per-key exponential backoff, `base * 2**failures` capped at `cap`; the exponent
  is capped too, so a key that fails forever never overflows a float.
"""
from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Hashable


@dataclass
class TokenBucket:
    qps: float
    burst: int
    _tokens: float | None = None
    _last: float | None = None

    def reserve(self, now: float) -> float:
        """Take a token; the delay (seconds from `now`) before the caller may go."""
        if self.qps <= 0:  # unlimited
            return 0.0
        if self._last is None:
            self._tokens, self._last = float(self.burst), now
        elapsed = max(0.0, now - self._last)
        self._tokens = min(float(self.burst), self._tokens + elapsed * self.qps)
        self._last = now
        self._tokens -= 1.0
        return 0.0 if self._tokens >= 0 else -self._tokens / self.qps

    def take(self, now: float) -> float:
        """Take a token if one is there (0); else take nothing and say how long until one is (a
        server refusing a request with 429 must not spend the caller's future tokens)."""
        wait = self.reserve(now)
        if wait > 0:
            self.refund()  # give back the reservation
        return wait

    def refund(self) -> None:
        """Give back a token taken (the request it was taken for was not sent after all)."""
        if self._tokens is not None:
            self._tokens = min(float(self.burst), self._tokens + 1.0)


class TokenBuckets:
    """`take(key, now)`: 0 when the key's bucket had a token (taken), else the seconds until it has one."""

    def __init__(self, rate: float, burst: int, max_keys: int = 4096):
        self.rate, self.burst, self.max_keys = rate, burst, max_keys
        self._buckets: OrderedDict[str, TokenBucket] = OrderedDict()

    def take(self, key: str, now: float) -> float:
        bucket = self._buckets.pop(key, None) or TokenBucket(self.rate, self.burst)
        self._buckets[key] = bucket
        while len(self._buckets) > self.max_keys:
            self._buckets.popitem(last=False)
        return bucket.take(now)

    def refund(self, key: str) -> None:
        if (bucket := self._buckets.get(key)) is not None:
            bucket.refund()


@dataclass
class ItemBackoff:
    base: float = 0.005
    cap: float = 1000.0
    _failures: dict[Hashable, int] = field(default_factory=dict)

    def when(self, key: Hashable) -> float:
        """Count one more failure of `key`; its next delay."""
        n = self._failures.get(key, 0)
        self._failures[key] = n + 1
        return min(self.cap, self.base * 2.0 ** min(n, 62))

    def failures(self, key: Hashable) -> int:
        return self._failures.get(key, 0)

    def forget(self, key: Hashable) -> None:
        self._failures.pop(key, None)

    def __len__(self) -> int:
        return len(self._failures)
