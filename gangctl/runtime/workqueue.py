"""A work queue of keys with client-go semantics, for asyncio.

- A key added many times before a worker takes it is processed once (dedupe).
- A key is never processed by two workers at once; if it is added while being processed it is
  processed again afterwards.
- Failed keys come back after the larger of an exponential per-key backoff (5 ms doubling to a
  1,000 s cap, as client-go's) and an overall token bucket (10 retries/s, burst 100), so one key
  failing forever costs almost nothing and many failing keys cannot flood the API; `forget` resets
  the key's backoff.
"""
from __future__ import annotations

import asyncio
from collections import deque
from typing import Generic, Hashable, TypeVar

from gangctl.policy.ratelimit import ItemBackoff, TokenBucket


K = TypeVar("K", bound=Hashable)


class WorkQueue(Generic[K]):
    """Keys of any hashable type (the controller's: gangctl.runtime.kinds.JobKey)."""

    def __init__(self, base_delay: float = 0.005, max_delay: float = 1000.0, qps: float = 10.0, burst: int = 100):
        self._queue: deque[K] = deque()
        self._dirty: set[K] = set()
        self._processing: set[K] = set()
        self._backoff = ItemBackoff(base_delay, max_delay)
        self._bucket = TokenBucket(qps, burst)
        self._timers: dict[K, asyncio.TimerHandle] = {}
        self._signal = asyncio.Event()
        self._closed = False

    def __len__(self) -> int:
        return len(self._queue)

    def add(self, key: K) -> None:
        if self._closed or key in self._dirty:
            return
        self._dirty.add(key)
        if key not in self._processing:
            self._queue.append(key)
            self._wake()

    def add_after(self, key: K, delay: float) -> None:
        """Add `key` after `delay` seconds (the earliest pending request wins)."""
        if delay <= 0:
            self.add(key)
            return
        loop = asyncio.get_running_loop()
        existing = self._timers.get(key)
        when = loop.time() + delay
        if existing is not None and existing.when() <= when:
            return
        if existing is not None:
            existing.cancel()
        self._timers[key] = loop.call_at(when, self._fire, key)

    def add_rate_limited(self, key: K) -> float:
        """Retry `key` after its backoff; returns the delay chosen."""
        delay = max(self._backoff.when(key), self._bucket.reserve(asyncio.get_running_loop().time()))
        self.add_after(key, delay)
        return delay

    def forget(self, key: K) -> None:
        self._backoff.forget(key)

    def failures(self, key: K) -> int:
        return self._backoff.failures(key)

    def tracked(self) -> int:
        """Keys with a failure count or a pending timer (bounded by the keys that exist)."""
        return len(self._backoff) + len(self._timers)

    async def get(self) -> K | None:
        """The next key to process, or None once the queue is shut down."""
        while not self._queue and not self._closed:
            self._signal.clear()
            await self._signal.wait()
        if not self._queue:
            return None
        key = self._queue.popleft()
        self._processing.add(key)
        self._dirty.discard(key)
        return key

    def done(self, key: K) -> None:
        self._processing.discard(key)
        if key in self._dirty:
            self._queue.append(key)
            self._wake()

    def shutdown(self) -> None:
        self._closed = True
        for timer in self._timers.values():
            timer.cancel()
        self._timers.clear()
        self._wake()

    def _fire(self, key: K) -> None:
        self._timers.pop(key, None)
        self.add(key)

    def _wake(self) -> None:
        self._signal.set()
