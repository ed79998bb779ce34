"""Evicts lower-priority Volcano gangs where the quota policy allows it (Volcano v1.10 will not).

The decisions are `gangctl.plugins.volcano.preemptions` over the Volcano PodGroups
gangctl made; this module is the I/O around them. It runs in the quota gate's rounds (same policy
ConfigMap, which `gangctl policy apply --backend volcano` stores, same coalescing and retries).

To evict a victim, gangctl deletes its child Job (foreground, so the pods go first) and then its
PodGroup, both with a uid precondition so only that attempt goes. The reconciler recreates both
once the pods are gone; the new PodGroup is Pending in the team's Volcano queue again, where
Volcano's enqueue takes the higher-priority job first. A preemption is not a failure: it is
charged to no restart budget (the Job is deleted, it never fails), as Kueue's preemption is not.
"""
from __future__ import annotations

import logging

from gangctl.api.resources import JOBS
from gangctl.kube.client import ApiError, Kube
from gangctl.kube.events import EventRecorder
from gangctl.kube.informer import Informer
from gangctl.obs.metrics import Metrics
from gangctl.model.names import child_job_name
from gangctl.plugins.volcano import VOLCANO_POD_GROUPS
from gangctl.policy import ownership
from gangctl.model.admission import Quotas
from gangctl.model.quota import QuotaPolicy
from gangctl.model.resolve import NODE_JOB
from gangctl.plugins.volcano import Group, preemptions

log = logging.getLogger(__name__)


class VolcanoPreemptor:
    def __init__(self, kube: Kube, podgroups: Informer, jobs: Informer, trainjobs: Informer, gate,
                 metrics: Metrics, events: EventRecorder):
        self.kube = kube
        self.podgroups = podgroups
        self.jobs = jobs
        self.trainjobs = trainjobs
        self.gate = gate
        self.metrics = metrics
        self.events = events
        self._evicted: dict[str, str] = {}   # key -> uid of the PodGroup evicted; the cache may lag
        podgroups.handlers.append(self._on_podgroup)
        gate.enforcers.append(self.round)

    def _on_podgroup(self, event: str, obj: dict) -> None:
        if self.gate.governs(obj["metadata"]["namespace"]):
            self.gate.trigger()

    async def round(self, policy: QuotaPolicy, quotas: Quotas) -> None:
        cache = self.podgroups.cache
        # An evicted PodGroup still in the cache is on its way out: it holds nothing, waits for nothing.
        self._evicted = {key: uid for key, uid in self._evicted.items()
                         if key in cache and cache[key]["metadata"].get("uid", "") == uid}
        groups = [Group.from_podgroup(pg) for key, pg in cache.items() if key not in self._evicted]
        for decision in preemptions(policy, quotas, groups):
            preemptor = decision.workload
            for victim in decision.victims:
                if not await self._evict(victim.id):
                    break
                self.metrics.quota_preemptions.labels(victim.team).inc()
                tj = self.trainjobs.get(victim.id)
                if tj is not None:
                    await self.events.warning(
                        tj, "Preempted", f"evicted from Volcano queue {victim.team} to admit {preemptor.id} "
                        f"(priority {preemptor.priority} over {victim.priority}); queued again")
                log.info("preempted %s for %s in team %s", victim.id, preemptor.id, preemptor.team)

    async def _evict(self, key: str) -> bool:
        """Delete the victim's Job (pods first), then its PodGroup, each by uid and only when the job
        that controls the PodGroup owns it; False when that did not happen."""
        pg = self.podgroups.get(key)
        uid = ownership.controller_uid(pg) if pg is not None else None
        if pg is None or uid is None:
            return False
        ns, name = key.split("/", 1)
        self._evicted[key] = pg["metadata"].get("uid", "")
        job = self.jobs.get(f"{ns}/{child_job_name(name, NODE_JOB)}")
        try:
            if job is not None and ownership.owned(job, uid) and not job["metadata"].get("deletionTimestamp"):
                await self.kube.delete(JOBS.path(ns, job["metadata"]["name"]), "Foreground",
                                       uid=job["metadata"].get("uid"))
            await self.kube.delete(VOLCANO_POD_GROUPS.path(ns, name), uid=pg["metadata"].get("uid"))
        except ApiError as err:
            log.warning("could not evict %s: %s", key, err)
            del self._evicted[key]
            self.gate.retry_later()
            return False
        return True
