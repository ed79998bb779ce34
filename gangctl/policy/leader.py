"""Leader election on a `coordination.k8s.io/v1` Lease: the decisions only, with client-go's semantics.

`gangctl.kube.leader.LeaderElector` does the reads and writes and passes the clock in. Two clocks,
as in client-go's `leaderelection` package:

- validity is judged on the *local* monotonic clock (`now`, seconds): a Lease is held until
  `leaseDurationSeconds` have passed since this process first *observed* its current record. The
  holder's `renewTime` is written for people to read, never compared with our own clock, so clock
  skew between replicas cannot make two of them lead;
- the times written into the Lease (`acquireTime`, `renewTime`) are wall-clock (`wall_now`).

The write fence (`still_leading`) is stricter than validity: a leader stops writing `renew_deadline`
after its last successful renewal *started*, which is `lease_duration - renew_deadline` seconds before
any other replica may take the Lease over.
"""
from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timezone


@dataclass(frozen=True)
class LeaseTimings:
    """client-go's defaults (and controller-runtime's): 15 s lease, 10 s renew deadline, 2 s retry."""

    lease_duration: float = 15.0
    renew_deadline: float = 10.0
    retry_period: float = 2.0

    def __post_init__(self) -> None:
        # The checks of client-go's NewLeaderElector (its JitterFactor is 1.2).
        if not self.lease_duration > self.renew_deadline:
            raise ValueError("the lease duration must be longer than the renew deadline")
        if not self.renew_deadline > 1.2 * self.retry_period:
            raise ValueError("the renew deadline must be longer than 1.2 x the retry period")
        if self.retry_period <= 0:
            raise ValueError("the retry period must be positive")


@dataclass(frozen=True)
class LeaderRecord:
    """The spec of a Lease as leader election reads and writes it (client-go's LeaderElectionRecord)."""

    holder: str = ""
    lease_duration_seconds: int = 0
    acquire_time: str | None = None
    renew_time: str | None = None
    transitions: int = 0


@dataclass(frozen=True)
class Observation:
    """A record and when (local monotonic seconds) this process first saw it unchanged."""

    record: LeaderRecord
    at: float


def record_of(lease: dict | None) -> LeaderRecord:
    spec = (lease or {}).get("spec") or {}
    return LeaderRecord(holder=spec.get("holderIdentity") or "",
                        lease_duration_seconds=int(spec.get("leaseDurationSeconds") or 0),
                        acquire_time=spec.get("acquireTime"), renew_time=spec.get("renewTime"),
                        transitions=int(spec.get("leaseTransitions") or 0))


def observe(previous: Observation | None, record: LeaderRecord, now: float) -> Observation:
    """Keep the first time a record was seen; any change in it (a renewal, a new holder) restarts the clock."""
    if previous is not None and previous.record == record:
        return previous
    return Observation(record, now)


def lease_valid(observed: Observation, now: float) -> bool:
    """Whether the observed holder may still be leading, judged on our own clock."""
    return now < observed.at + observed.record.lease_duration_seconds


def may_take(observed: Observation, identity: str, now: float) -> bool:
    """Acquire when the Lease is empty (released) or expired; renew when it is ours."""
    holder = observed.record.holder
    return not holder or holder == identity or not lease_valid(observed, now)


def next_attempt_in(observed: Observation | None, identity: str, now: float, retry_period: float) -> float:
    """Seconds until a standby tries again: the retry period, or less when another holder's Lease
    expires sooner (so a dead leader is replaced when its Lease runs out, not up to a period later)."""
    if observed is None or not observed.record.holder or observed.record.holder == identity:
        return retry_period
    return max(0.0, min(retry_period, observed.at + observed.record.lease_duration_seconds - now))


def next_record(current: LeaderRecord, identity: str, wall_now: datetime, timings: LeaseTimings) -> LeaderRecord:
    """What to write to acquire or renew: a renewal keeps acquireTime and the transition count; a
    takeover (also of an empty Lease) counts one more transition, as client-go does."""
    stamp = micro_time(wall_now)
    duration = max(1, int(round(timings.lease_duration)))
    if current.holder == identity:
        return LeaderRecord(identity, duration, current.acquire_time or stamp, stamp, current.transitions)
    return LeaderRecord(identity, duration, stamp, stamp, current.transitions + 1)


def released_record(current: LeaderRecord, wall_now: datetime) -> LeaderRecord:
    """client-go's ReleaseOnCancel: no holder, a 1 s lease, the transition count kept."""
    stamp = micro_time(wall_now)
    return LeaderRecord("", 1, stamp, stamp, current.transitions)


def still_leading(last_renewal: float | None, now: float, timings: LeaseTimings) -> bool:
    """The write fence: True only while `now` is within the renew deadline of the start of the last
    successful acquire or renewal (None: never acquired, or released)."""
    return fence_left(last_renewal, now, timings) > 0


def fence_left(last_renewal: float | None, now: float, timings: LeaseTimings) -> float:
    """Seconds until the write fence closes (0: closed, or never open)."""
    if last_renewal is None:
        return 0.0
    return max(0.0, last_renewal + timings.renew_deadline - now)


def write_timeout(requested: float, left: float | None) -> float | None:
    """The timeout of a write that leaves now: the requested one, capped at the `left` seconds the
    fence stays open (None: no fence), so a write in flight never outlives leadership; None when
    the fence is closed (the write must not be sent)."""
    if left is None:
        return requested
    if left <= 0:
        return None
    return min(requested, left)


def throttled_retry_in(retry_after: float, left: float | None) -> float | None:
    """How long a write answered 429 waits before it is sent again: the server's Retry-After, unless
    the fence closes first (`left` seconds from now; None: no fence), when it is given up (None)."""
    if left is not None and retry_after >= left:
        return None
    return retry_after


def lease_object(namespace: str, name: str, record: LeaderRecord, resource_version: str | None = None) -> dict:
    """The whole Lease to create, or to PUT guarded by `resource_version` (a 409 means another replica won)."""
    meta: dict = {"name": name, "namespace": namespace}
    if resource_version:
        meta["resourceVersion"] = resource_version
    spec = {"holderIdentity": record.holder, "leaseDurationSeconds": record.lease_duration_seconds,
            "leaseTransitions": record.transitions}
    if record.acquire_time:
        spec["acquireTime"] = record.acquire_time
    if record.renew_time:
        spec["renewTime"] = record.renew_time
    return {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": meta, "spec": spec}


def micro_time(moment: datetime) -> str:
    """A metav1.MicroTime: RFC 3339 in UTC with microseconds."""
    return moment.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
