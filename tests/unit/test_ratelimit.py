"""Rate limits and backoffs of the client, the informers and the work queue (pure)."""
from __future__ import annotations

import random

from gangctl.kube.client import retry_after
from gangctl.kube.informer import BACKOFF_CAP, backoff_delay, strip
from gangctl.policy.ratelimit import ItemBackoff, TokenBucket


def test_token_bucket_allows_a_burst_then_paces_at_qps():
    bucket = TokenBucket(qps=10, burst=3)
    assert [bucket.reserve(0.0) for _ in range(3)] == [0.0, 0.0, 0.0]
    assert round(bucket.reserve(0.0), 3) == 0.1      # the 4th waits for one token
    assert round(bucket.reserve(0.0), 3) == 0.2      # the 5th for two
    assert bucket.reserve(10.0) == 0.0               # refilled (to the burst, not beyond)
    assert [bucket.reserve(10.0) for _ in range(2)] == [0.0, 0.0]
    assert bucket.reserve(10.0) > 0


def test_token_bucket_with_zero_qps_is_unlimited():
    bucket = TokenBucket(qps=0, burst=1)
    assert all(bucket.reserve(0.0) == 0.0 for _ in range(1000))


def test_item_backoff_doubles_from_5ms_to_a_1000s_cap_and_never_overflows():
    backoff = ItemBackoff()
    delays = [backoff.when("ns/a") for _ in range(5000)]
    assert delays[:3] == [0.005, 0.01, 0.02]
    assert delays[-1] == 1000.0 and max(delays) == 1000.0
    assert backoff.failures("ns/a") == 5000
    assert backoff.when("ns/b") == 0.005, "per key"
    backoff.forget("ns/a")
    assert backoff.when("ns/a") == 0.005


def test_watch_backoff_is_capped_and_jittered():
    rng = random.Random(1)
    first = [backoff_delay(0, rng) for _ in range(50)]
    assert all(0.8 <= d <= 1.6 for d in first) and len(set(first)) > 40
    assert all(backoff_delay(n, rng) <= BACKOFF_CAP for n in range(0, 200))


def test_retry_after_reads_seconds_and_caps_them():
    assert retry_after("3") == 3.0
    assert retry_after(None) == 1.0
    assert retry_after("soon") == 1.0
    assert retry_after("86400") == 30.0


def test_cached_objects_lose_managed_fields_and_last_applied():
    obj = {"metadata": {"name": "a", "managedFields": [{"manager": "x"}],
                        "annotations": {"kubectl.kubernetes.io/last-applied-configuration": "{...}", "keep": "1"}},
           "spec": {"x": 1}}
    assert strip(obj) == {"metadata": {"name": "a", "annotations": {"keep": "1"}}, "spec": {"x": 1}}


def test_an_unreachable_apiserver_is_retried_within_seconds():
    from gangctl.kube.informer import UNREACHABLE_CAP
    rng = random.Random(2)
    assert all(backoff_delay(n, rng, UNREACHABLE_CAP) <= UNREACHABLE_CAP for n in range(50))


def test_take_refuses_without_spending_a_future_token():
    bucket = TokenBucket(qps=1.0, burst=1)
    assert bucket.take(0.0) == 0
    assert bucket.take(0.0) == 1.0 and bucket.take(0.5) == 0.5, "a refusal takes nothing"
    assert bucket.take(1.0) == 0
