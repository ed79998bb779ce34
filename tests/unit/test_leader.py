"""The pure decisions of leader election (client-go's semantics), without a cluster."""
from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest

from gangctl.policy.leader import (LeaderRecord, LeaseTimings, Observation, fence_left, lease_object, lease_valid,
                                   may_take, micro_time, next_attempt_in, next_record, observe, record_of,
                                   released_record, still_leading, throttled_retry_in, write_timeout)

T = LeaseTimings()
WALL = datetime(2026, 11, 3, 12, 0, 0, 123456, tzinfo=timezone.utc)


def held_by(holder: str, duration: int = 15, transitions: int = 0) -> LeaderRecord:
    return LeaderRecord(holder, duration, "2026-11-03T11:00:00.000000Z", "2026-11-03T11:59:59.000000Z", transitions)


def test_defaults_are_client_gos():
    assert (T.lease_duration, T.renew_deadline, T.retry_period) == (15.0, 10.0, 2.0)


@pytest.mark.parametrize("duration,deadline,retry", [(10, 10, 2), (15, 2, 2), (15, 10, 0)])
def test_inconsistent_timings_are_refused(duration, deadline, retry):
    with pytest.raises(ValueError):
        LeaseTimings(duration, deadline, retry)


def test_record_of_a_lease_and_back():
    record = held_by("a_1", transitions=3)
    assert record_of(lease_object("ns", "lease", record, "42")) == record
    obj = lease_object("ns", "lease", record, "42")
    assert obj["metadata"] == {"name": "lease", "namespace": "ns", "resourceVersion": "42"}
    assert "resourceVersion" not in lease_object("ns", "lease", record)["metadata"]
    assert record_of(None) == LeaderRecord()
    assert record_of({"spec": {}}) == LeaderRecord()


def test_an_empty_or_released_lease_may_be_taken_at_once():
    assert may_take(observe(None, LeaderRecord(), 100.0), "b_2", 100.0)
    released = released_record(held_by("a_1"), WALL)
    assert may_take(observe(None, released, 100.0), "b_2", 100.0)


def test_a_held_lease_is_valid_for_its_duration_after_it_was_first_observed():
    seen = observe(None, held_by("a_1"), 100.0)
    assert lease_valid(seen, 114.9) and not may_take(seen, "b_2", 114.9)
    assert not lease_valid(seen, 115.0) and may_take(seen, "b_2", 115.0)


def test_validity_is_judged_on_the_local_clock_not_the_holders_renew_time():
    # renewTime says an hour ago (the holder's clock may be skewed): seen just now, it is still valid.
    stale_looking = LeaderRecord("a_1", 15, "2026-11-03T10:00:00.000000Z", "2026-11-03T10:00:00.000000Z", 0)
    assert not may_take(observe(None, stale_looking, 500.0), "b_2", 501.0)


def test_an_unchanged_record_keeps_its_first_observation_and_a_renewal_restarts_it():
    first = observe(None, held_by("a_1"), 100.0)
    assert observe(first, held_by("a_1"), 110.0) is first
    renewed = LeaderRecord("a_1", 15, first.record.acquire_time, "2026-11-03T12:00:10.000000Z", 0)
    again = observe(first, renewed, 110.0)
    assert again.at == 110.0 and lease_valid(again, 124.0) and not lease_valid(again, 125.0)


def test_the_holder_may_always_renew():
    seen = observe(None, held_by("a_1"), 100.0)
    assert may_take(seen, "a_1", 101.0)


def test_renewal_keeps_acquire_time_and_transitions():
    current = held_by("a_1", transitions=4)
    new = next_record(current, "a_1", WALL, T)
    assert new.holder == "a_1" and new.acquire_time == current.acquire_time and new.transitions == 4
    assert new.renew_time == "2026-11-03T12:00:00.123456Z" and new.lease_duration_seconds == 15


def test_takeover_counts_a_transition_and_starts_a_new_acquire_time():
    new = next_record(held_by("a_1", transitions=4), "b_2", WALL, T)
    assert (new.holder, new.transitions) == ("b_2", 5)
    assert new.acquire_time == new.renew_time == micro_time(WALL)
    # client-go counts a transition also when the Lease was empty (released).
    assert next_record(LeaderRecord(), "b_2", WALL, T).transitions == 1


def test_release_empties_the_holder_with_a_one_second_lease():
    released = released_record(held_by("a_1", transitions=4), WALL)
    assert released == LeaderRecord("", 1, micro_time(WALL), micro_time(WALL), 4)
    spec = lease_object("ns", "l", released)["spec"]
    assert spec["holderIdentity"] == "" and spec["leaseDurationSeconds"] == 1


def test_the_write_fence_closes_at_the_renew_deadline():
    assert not still_leading(None, 100.0, T)
    assert still_leading(100.0, 109.99, T)
    assert not still_leading(100.0, 110.0, T)
    # ...which is before any other replica may take the Lease (it saw the renewal after we sent it).
    seen_by_other = Observation(held_by("a_1"), 100.0)
    assert lease_valid(seen_by_other, 110.0)


def test_micro_time_is_utc_with_microseconds():
    plus_two = datetime(2026, 11, 3, 14, 0, 0, 5, tzinfo=timezone(timedelta(hours=2)))
    assert micro_time(plus_two) == "2026-11-03T12:00:00.000005Z"


def test_a_standby_retries_when_the_holders_lease_runs_out_not_a_period_later():
    seen = observe(None, held_by("a_1"), 100.0)
    assert next_attempt_in(seen, "b_2", 101.0, 2.0) == 2.0
    assert next_attempt_in(seen, "b_2", 113.5, 2.0) == pytest.approx(1.5)
    assert next_attempt_in(seen, "b_2", 116.0, 2.0) == 0.0
    assert next_attempt_in(None, "b_2", 116.0, 2.0) == 2.0
    assert next_attempt_in(observe(None, LeaderRecord(), 100.0), "b_2", 100.0, 2.0) == 2.0


def test_a_write_in_flight_never_outlives_the_fence():
    # renewed at 100 s: the fence is open until 110 s (the renew deadline), 5 s before anyone may take over
    assert fence_left(100.0, 104.0, T) == 6.0
    assert fence_left(100.0, 111.0, T) == 0.0 and fence_left(None, 100.0, T) == 0.0
    assert write_timeout(30.0, fence_left(100.0, 104.0, T)) == 6.0   # 30 s asked, capped at the 6 s left
    assert write_timeout(30.0, fence_left(100.0, 100.5, T)) == 9.5
    assert write_timeout(5.0, 9.5) == 5.0                             # a shorter timeout is kept
    assert write_timeout(30.0, None) == 30.0                          # no fence (a reader, the elector)
    assert write_timeout(30.0, 0.0) is None                           # closed: not sent at all


def test_a_throttled_write_is_given_up_when_the_fence_would_close_first():
    assert throttled_retry_in(1.0, 6.0) == 1.0
    assert throttled_retry_in(6.0, 6.0) is None and throttled_retry_in(30.0, 6.0) is None
    assert throttled_retry_in(30.0, None) == 30.0  # no fence: client-go's Retry-After loop
