"""The work queue's contract: dedupe, one run per key, re-run if changed meanwhile, backoff."""
from __future__ import annotations

import asyncio

import pytest

from gangctl.runtime.workqueue import WorkQueue

pytestmark = pytest.mark.asyncio(loop_scope="session")


async def test_adds_before_processing_are_deduplicated():
    q = WorkQueue()
    for _ in range(5):
        q.add("ns/a")
    q.add("ns/b")
    assert len(q) == 2
    assert await q.get() == "ns/a"
    assert await q.get() == "ns/b"


async def test_key_added_while_processing_runs_again_after_done_not_concurrently():
    q = WorkQueue()
    q.add("ns/a")
    key = await q.get()
    q.add("ns/a")
    assert len(q) == 0, "never handed to a second worker while the first holds it"
    q.done(key)
    assert len(q) == 1
    assert await q.get() == "ns/a"


async def test_backoff_grows_per_key_and_forget_resets_it():
    q = WorkQueue(base_delay=0.01, max_delay=0.04)
    delays = [q.add_rate_limited("ns/a") for _ in range(4)]
    assert delays == [0.01, 0.02, 0.04, 0.04]
    q.forget("ns/a")
    assert q.add_rate_limited("ns/a") == 0.01
    assert await asyncio.wait_for(q.get(), 1) == "ns/a"


async def test_add_after_delivers_later_and_shutdown_releases_workers():
    q = WorkQueue()
    q.add_after("ns/late", 0.05)
    assert len(q) == 0
    assert await asyncio.wait_for(q.get(), 1) == "ns/late"
    waiter = asyncio.create_task(q.get())
    await asyncio.sleep(0)
    q.shutdown()
    assert await asyncio.wait_for(waiter, 1) is None


async def test_a_key_failing_forever_never_crashes_and_waits_at_most_the_cap():
    q = WorkQueue(base_delay=0.005, max_delay=1000.0, qps=0)
    delays = [q.add_rate_limited("ns/stuck") for _ in range(3000)]
    assert max(delays) == 1000.0
    assert q.failures("ns/stuck") == 3000
    q.shutdown()


async def test_overall_limit_spreads_retries_of_many_keys():
    q = WorkQueue(base_delay=0.001, max_delay=1.0, qps=100, burst=10)
    delays = [q.add_rate_limited(f"ns/{i}") for i in range(30)]
    assert delays[:10] == [0.001] * 10, "the burst goes at the per-key delay"
    assert delays[-1] >= 0.19, "then 100 retries a second at most"
    q.shutdown()
