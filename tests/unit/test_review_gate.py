"""Token reviews under abuse (gangctl.policy.review_gate), without a cluster: the cache, the caps per
source and in total, and the known identities that never wait behind unknown tokens. The endpoints
under a real flood are tests/integration/test_abusive_callers.py."""
from __future__ import annotations

import pytest

from gangctl.policy.ratelimit import TokenBuckets
from gangctl.policy.review_gate import SOURCE, TOTAL, Busy, Limits, ReviewGate, Verdicts, token_key


def test_token_buckets_allow_a_burst_then_the_rate_per_key():
    limits = TokenBuckets(rate=1.0, burst=3)
    assert [limits.take("a", 0.0) for _ in range(3)] == [0, 0, 0]
    assert limits.take("a", 0.0) == pytest.approx(1.0)
    assert limits.take("b", 0.0) == 0, "keys do not share a bucket"
    assert limits.take("a", 2.5) == 0
    assert limits.take("a", 2.5) == 0


def test_token_buckets_forget_the_least_recently_used_keys():
    limits = TokenBuckets(rate=1.0, burst=1, max_keys=2)
    for key in ("a", "b", "c"):
        assert limits.take(key, 0.0) == 0
    assert len(limits._buckets) == 2
    assert limits.take("a", 0.0) == 0, "a was forgotten: a full bucket again"


def test_verdicts_are_kept_by_hash_for_their_ttl_good_and_bad_alike():
    cache: Verdicts[str] = Verdicts(ttl=10.0, max_entries=2)
    good, bad = token_key("good-token"), token_key("invented")
    assert "good-token" not in good and len(good) == 64, "the token itself is never kept"
    assert token_key("t", "/metrics", "get") != token_key("t"), "a scope of its own"
    cache.put(good, "allowed", True, now=0.0)
    cache.put(bad, "refused", False, now=0.0)
    assert cache.fresh(good, 9.9) == (True, "allowed") and cache.fresh(bad, 9.9) == (True, "refused")
    assert cache.fresh(good, 10.0) == (False, None), "expired"
    assert cache.known(good) and not cache.known(bad), "expired, but remembered as authenticated"
    cache.put(token_key("third"), "x", False, now=0.0)
    assert len(cache) == 2 and not cache.known(good), "bounded: the least recently used went"


LIMITS = Limits(source_rate=1.0, source_burst=3, source_in_flight=2, total_rate=4.0, total_burst=5, total_in_flight=4)


def admit_all(gate: ReviewGate, source: str, count: int, now: float = 0.0) -> list[str]:
    """Admit `count` reviews one after another (each done before the next): 'ok' or the refusing limit."""
    out = []
    for _ in range(count):
        try:
            gate.admit(source, False, now)
        except Busy as busy:
            out.append(busy.limit)
            continue
        gate.done(source, False)
        out.append("ok")
    return out


def test_a_flooding_source_is_refused_after_its_burst_and_spends_no_one_elses_budget():
    gate = ReviewGate(LIMITS)
    assert admit_all(gate, "10.0.0.66", 100) == ["ok"] * 3 + [SOURCE] * 97
    assert admit_all(gate, "10.0.0.7", 2) == ["ok", "ok"], "another source still has its own burst"
    assert admit_all(gate, "10.0.0.66", 2, now=1.0) == ["ok", SOURCE], "refilled at the source's rate"


def test_many_sources_are_capped_in_total_and_a_refusal_costs_the_source_nothing():
    gate = ReviewGate(LIMITS)
    answers = [admit_all(gate, f"10.0.1.{i}", 1)[0] for i in range(8)]
    assert answers == ["ok"] * 5 + [TOTAL] * 3, "total burst 5"
    # 10.0.1.7 was refused by the total: its own bucket still holds its 3
    assert admit_all(gate, "10.0.1.7", 3, now=0.75) == ["ok", "ok", "ok"], "3 total tokens refilled in 0.75 s"


def test_in_flight_reviews_are_capped_per_source_and_in_total():
    gate = ReviewGate(Limits(source_rate=100, source_burst=100, source_in_flight=2, total_rate=100, total_burst=100,
                             total_in_flight=3))
    gate.admit("a", False, 0.0)
    gate.admit("a", False, 0.0)
    with pytest.raises(Busy) as busy:
        gate.admit("a", False, 0.0)
    assert busy.value.limit == SOURCE and busy.value.seconds >= 1
    gate.admit("b", False, 0.0)
    with pytest.raises(Busy, match="total"):
        gate.admit("c", False, 0.0)
    gate.done("a", False)
    gate.admit("c", False, 0.0)
    assert gate.in_flight() == 3


def test_a_known_identity_is_admitted_whatever_unknown_tokens_spent():
    gate = ReviewGate(LIMITS)
    for i in range(4):
        gate.admit(f"10.0.2.{i}", False, 0.0)  # every slot in flight
    assert admit_all(gate, "10.0.0.66", 100) == [TOTAL] * 100
    for _ in range(50):
        gate.admit("10.0.0.66", True, 0.0)      # even from the flooding source: the API server knew the token
        gate.done("10.0.0.66", True)
    assert gate.in_flight() == 4


def test_known_identities_have_a_budget_of_their_own():
    gate = ReviewGate(Limits(known_rate=1.0, known_burst=2, known_in_flight=1))
    gate.admit("a", True, 0.0)
    with pytest.raises(Busy, match="known"):
        gate.admit("b", True, 0.0)              # one in flight at most
    gate.done("a", True)
    gate.admit("b", True, 0.0)
    gate.done("b", True)
    with pytest.raises(Busy, match="known") as busy:
        gate.admit("c", True, 0.0)              # burst spent: tokens collected cost no more than the rate
    assert busy.value.seconds == pytest.approx(1.0)
    assert admit_all(gate, "c", 1) == ["ok"], "unknown tokens' budgets are untouched"
