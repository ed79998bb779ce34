"""Leader election on a `coordination.k8s.io/v1` Lease, as client-go's `leaderelection` does it.

The decisions (is the Lease free? what to write?) are in `gangctl.policy.leader`; this module reads
and writes the Lease. Give the elector its own `Kube` client (its own session and connection pool), not the controller's:
its writes must not pass the controller's write fence (which is this elector's `fence_left`), and a
busy controller client must not delay a renewal (client-go's leader election uses its own client too).
A transport fault (refused, reset, a response cut mid-body, a timeout) is a failed attempt like a
conflict: the elector tries again, and only the renew deadline passing ends `run`.

Beyond client-go: a standby also watches the Lease, so it tries again as soon as the Lease changes
(a release is taken over in one round trip, and each renewal is observed when it is written, so a
dead leader's lease is judged expired 15 s after its last renewal rather than up to a retry period
later), and it wakes exactly when the observed lease runs out. Without RBAC `watch` on leases it
polls every retry period, as client-go.

    elector = LeaderElector(lease_kube, "gangctl-system", "gangctl-controller", identity())
    kube.write_fence = elector.fence_left       # no write outlives the renew deadline
    task = asyncio.create_task(elector.run())   # returns when leadership is lost (elector.lost is set)
    await elector.acquired()
    ...
    await elector.release()                     # on graceful stop: the next replica takes over at once
"""
from __future__ import annotations

import asyncio
import logging
import os
import random
import secrets
import socket
import time
from datetime import datetime, timezone
from typing import Callable

from gangctl.kube.client import UNREACHABLE, ApiError, Kube
from gangctl.policy.leader import (LeaseTimings, Observation, fence_left, lease_object, may_take, next_attempt_in,
                                   next_record, observe, record_of, released_record, still_leading)

log = logging.getLogger(__name__)

JITTER = 0.2  # acquire retries wait retry_period x [1, 1 + JITTER]


def identity(environ: dict[str, str] | None = None) -> str:
    """This replica's holderIdentity: the pod's name (POD_NAME, from the downward API) or the host name,
    plus a random suffix so a restarted process never mistakes its predecessor's Lease for its own."""
    env = os.environ if environ is None else environ
    return f"{env.get('POD_NAME') or socket.gethostname()}_{secrets.token_hex(4)}"


class LeaderElector:
    def __init__(self, kube: Kube, namespace: str, name: str, identity: str,
                 timings: LeaseTimings = LeaseTimings(),
                 clock: Callable[[], float] = time.monotonic,
                 wall_clock: Callable[[], datetime] = lambda: datetime.now(timezone.utc)):
        self.kube = kube
        self.namespace = namespace
        self.name = name
        self.identity = identity
        self.timings = timings
        self.clock = clock
        self.wall_clock = wall_clock
        self.leading = asyncio.Event()   # set once the Lease is ours
        self.lost = asyncio.Event()      # set when a leader failed to renew within the renew deadline
        self._observed: Observation | None = None
        self._last_renewal: float | None = None
        self._changed = asyncio.Event()  # the Lease changed (seen by the watch): look again at once
        self._path = f"/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases/{name}"

    async def acquired(self) -> None:
        await self.leading.wait()

    def still_leading(self) -> bool:
        """The write fence: True only while now < the start of the last successful renewal + renew deadline."""
        return still_leading(self._last_renewal, self.clock(), self.timings)

    def fence_left(self) -> float:
        """Seconds until the write fence closes (0: closed): a guarded client caps each write's timeout at it."""
        return fence_left(self._last_renewal, self.clock(), self.timings)

    async def run(self) -> None:
        """Acquire, then renew every retry period; return when a renewal did not succeed within the
        renew deadline (leadership lost: `lost` is set).

        A standby tries again every retry period (client-go's polling), and also as soon as a watch
        on the Lease shows a change (a release is taken over in one round trip, and a renewal is
        observed when it happens, not up to a period later) or the holder's Lease runs out."""
        watch = asyncio.create_task(self._watch_lease(), name="leader-lease-watch")
        try:
            while True:
                self._changed.clear()
                if await self._try_acquire_or_renew(self.timings.retry_period * 2):
                    break
                retry = self.timings.retry_period * (1 + JITTER * random.random())
                try:
                    await asyncio.wait_for(self._changed.wait(),
                                           next_attempt_in(self._observed, self.identity, self.clock(), retry))
                except asyncio.TimeoutError:
                    pass
        finally:
            watch.cancel()
        self.leading.set()
        log.info("leader election: %s acquired lease %s/%s", self.identity, self.namespace, self.name)
        while True:
            await asyncio.sleep(self.timings.retry_period)
            while True:
                left = self._last_renewal + self.timings.renew_deadline - self.clock()  # type: ignore[operator]
                if left <= 0:
                    self._lose()
                    return
                if await self._try_acquire_or_renew(left):
                    break
                await asyncio.sleep(min(self.timings.retry_period, max(0.0, left)))

    async def _watch_lease(self) -> None:
        collection = self._path.rsplit("/", 1)[0]
        while True:
            try:
                async for event in self.kube.watch(collection, "", timeout_seconds=300):
                    if ((event.get("object") or {}).get("metadata") or {}).get("name") == self.name:
                        self._changed.set()
            except asyncio.CancelledError:
                raise
            except ApiError as err:
                if err.status == 403:  # RBAC without `watch` on leases: polling alone, as client-go
                    log.info("leader election: cannot watch leases in %s (%s); polling only", self.namespace, err)
                    return
                log.debug("leader election: lease watch ended: %r", err)
            except Exception as err:  # polling goes on meanwhile
                log.debug("leader election: lease watch ended: %r", err)
            await asyncio.sleep(self.timings.retry_period)

    def _lose(self) -> None:
        self._last_renewal = None
        self.lost.set()
        log.error("leader election: %s lost lease %s/%s (no renewal within %.0fs)",
                  self.identity, self.namespace, self.name, self.timings.renew_deadline)

    async def _try_acquire_or_renew(self, timeout: float) -> bool:
        started = self.clock()
        try:
            try:
                lease = await self.kube.request("GET", self._path, timeout=timeout)
            except ApiError as err:
                if not err.not_found:
                    raise
                return await self._create(started, timeout)
            record = record_of(lease)
            self._observed = observe(self._observed, record, started)
            if not may_take(self._observed, self.identity, self.clock()):
                return False
            new = next_record(record, self.identity, self.wall_clock(), self.timings)
            body = lease_object(self.namespace, self.name, new, lease["metadata"]["resourceVersion"])
            await self.kube.request("PUT", self._path, body=body, timeout=max(0.1, timeout - (self.clock() - started)))
        except ApiError as err:
            if not err.conflict:
                log.warning("leader election: %s/%s: %s", self.namespace, self.name, err)
            return False
        except UNREACHABLE as err:  # no answer: a failed attempt; the renew deadline alone ends leadership
            log.warning("leader election: %s/%s: %r", self.namespace, self.name, err)
            return False
        self._observed = Observation(new, started)
        self._last_renewal = started
        return True

    async def _create(self, started: float, timeout: float) -> bool:
        new = next_record(record_of(None), self.identity, self.wall_clock(), self.timings)
        body = lease_object(self.namespace, self.name, new)
        await self.kube.request("POST", self._path.rsplit("/", 1)[0], body=body, timeout=timeout)
        self._observed = Observation(new, started)
        self._last_renewal = started
        return True

    async def release(self, timeout: float = 2.0) -> bool:
        """Give the Lease up (holder empty, 1 s duration) if it is still ours, so a standby takes it at once.
        Stop calling `run` first. Writes stop here: `still_leading` is False from now on."""
        was_leading = self.still_leading()
        self._last_renewal = None
        if not was_leading:
            return False
        try:
            lease = await self.kube.request("GET", self._path, timeout=timeout)
            record = record_of(lease)
            if record.holder != self.identity:
                return False
            body = lease_object(self.namespace, self.name, released_record(record, self.wall_clock()),
                                lease["metadata"]["resourceVersion"])
            await self.kube.request("PUT", self._path, body=body, timeout=timeout)
        except (ApiError, *UNREACHABLE) as err:
            log.warning("leader election: could not release %s/%s: %r", self.namespace, self.name, err)
            return False
        log.info("leader election: %s released lease %s/%s", self.identity, self.namespace, self.name)
        return True
