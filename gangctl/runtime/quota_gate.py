"""gangctl's own quota admission for the backends without a quota system (coscheduling, native).

It admits TrainJobs and PyTorchJobs alike, under one policy: a team's quota is shared by both kinds.
A job's id here is its work-queue key as text (`gangctl.runtime.kinds.JobKey`: `ns/name` for a TrainJob,
`pytorchjob:ns/name` for a PyTorchJob), the name its messages give it.

The decisions are `gangctl.model.quota_plan.plan`, i.e. `admission.decide`, the code the
simulator runs; this module is the I/O around it:

- the policy is the ConfigMap `gangctl-system/gangctl-quota-policy` (key `policy.yaml`, written by
  `gangctl policy apply --backend coscheduling`), read through an informer. An invalid version is
  logged and counted (`gangctl_quota_policy_errors_total`, `gangctl_quota_policy_valid` 0) and the
  last valid policy stays in force; a deleted ConfigMap turns the gate off (no quota: jobs run).
- fail closed: an invalid ConfigMap with no valid policy before it (a controller started on a bad
  edit, or a bad policy stored where there was none) holds the coscheduling TrainJobs of every
  namespace the invalid text still names (`gangctl.policy.quota_gate.held_namespaces`: teams' namespaces,
  else their names), or of every namespace when it names none that can be read (not YAML, no list
  of teams), with `status.gang` state `Waiting`, reason `QuotaPolicyInvalid` and the validation error; jobs
  admitted before keep their admission. A valid version admits them normally; deleting the
  ConfigMap turns the gate off.
- the gate decides nothing before both informers have synced and every TrainJob of the policy's
  namespaces that needed admission then has been reconciled under the policy (`wants`, `forget`, or
  `reconciled`, which the controller calls after each reconcile): deciding from the jobs reconciled
  so far would pass over an earlier or higher-priority one. The same holds whenever a policy comes
  into force where none was. A job whose reconcile keeps failing delays the start by at most
  `start_timeout_seconds` (logged).
- a TrainJob is admitted when its `status.admission` is set, a PyTorchJob when its annotation
  `gangctl.io/admission` is (v1's status schema prunes unknown fields). Only this gate writes them,
  by server-side apply under its own field manager `gangctl-admission`, so the reconciler (manager
  `gangctl`) and the gate never clobber each other's fields. Admission state lives in the job, so
  a restarted gate counts exactly what was admitted before.
- the same policy serves other backends' enforcement, run at the end of each round
  (`enforcers`: the Volcano preemptor, gangctl.runtime.volcano_preemptor).
- the reconciler tells the gate which coscheduling TrainJobs want admission (`wants`) and which no
  longer do (`forget`); `run` decides in rounds (bursts coalesced) and writes the results.

Usage is the sum of `status.admission.requests` of admitted TrainJobs that are not finished, not
being deleted and not suspended by the user. A decision counts from the moment it is taken: what
the gate admitted or evicted and the cache does not show yet is kept in an overlay, so a round
never over-commits while writes are in flight. A finished job stops counting at once (its record
stays as history); a job the user suspends loses its admission (quota released) and queues again
when resumed, as Kueue does with a deactivated workload.
"""
from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Awaitable, Callable, Mapping, Sequence

from gangctl.api.resources import CONFIGMAPS, PYTORCHJOBS, TRAINJOBS
from gangctl.kube.client import ApiError, Kube
from gangctl.kube.events import EventRecorder
from gangctl.kube.informer import Informer
from gangctl.obs.metrics import Metrics
from gangctl.model.admission import GPU, Amount, Decision, Quotas, Verdict, Workload
from gangctl.model.quota import QUANTITY_UNITS, QuotaPolicy
from gangctl.policy.quota_check import check_policy
from gangctl.policy.quota_gate import ADMISSION_ANNOTATION, admission_record, admitted_workload, awaiting_start, grown_record, held_namespaces, invalid_policy_message, job_finished, needs_admission, POLICY_INVALID, recorded_admission, user_suspended, WAITING_FOR_QUOTA
from gangctl.plugins.quota_objects import POLICY_CONFIGMAP, POLICY_KEY, POLICY_NAMESPACE
from gangctl.model.quota_plan import grow, Growable, NodeRange, Pending, plan, priority_value, timestamp
from gangctl.runtime.kinds import JobKey

log = logging.getLogger(__name__)

FIELD_MANAGER = "gangctl-admission"


def policy_informer(kube: Kube) -> Informer:
    """The informer the gate reads its policy from (ConfigMaps of gangctl-system; the gate picks its own)."""
    return Informer(kube, CONFIGMAPS, namespace=POLICY_NAMESPACE)


@dataclass
class _Admit:
    uid: str
    record: dict


class QuotaGate:
    def __init__(self, kube: Kube, jobs: Sequence[Informer], policy_configmaps: Informer, metrics: Metrics,
                 events: EventRecorder, *,
                 clock: Callable[[], datetime] | None = None, on_change: Callable[[str], None] = lambda key: None,
                 coalesce_seconds: float = 0.2, retry_seconds: float = 1.0, start_timeout_seconds: float = 30.0):
        """`jobs`: the cache of each job kind the gate admits. `on_change` gets a job's id (see above)."""
        self.kube = kube
        # Each kind's cache, by its kind.
        self.sources: dict[str, Informer] = {informer.resource.kind: informer for informer in jobs}
        self.policy_configmaps = policy_configmaps
        self.metrics = metrics
        self.events = events
        self.clock = clock or (lambda: datetime.now(timezone.utc))
        self.on_change = on_change
        self.coalesce_seconds = coalesce_seconds
        self.retry_seconds = retry_seconds
        self.start_timeout_seconds = start_timeout_seconds
        self.policy: QuotaPolicy | None = None
        self.policy_error: str | None = None
        # An invalid policy and no valid one before it: (namespaces held, None = all; the message).
        self.hold: tuple[frozenset[str] | None, str] | None = None
        # Starting: no decision until every job expected at the start has been reconciled under the
        # policy (`epoch` counts the policies that came into force where none was).
        self.epoch = 0
        self.starting = True
        self._expected: set[str] | None = None
        self._seen: set[str] = set()
        self._start_deadline = 0.0
        self._quotas = None
        self._policy_rv: str | None = None
        self._pending: dict[str, tuple[str, Pending]] = {}   # key -> (uid, what it asks)
        self._admits: dict[str, _Admit] = {}                 # admitted by this gate; cache may lag
        self._growable: dict[str, tuple[str, NodeRange]] = {}  # key -> (uid, range): elastic, may take more
        self._evicts: dict[str, str] = {}                    # key -> uid: admission removed; cache may lag
        self._doubtful: set[str] = set()                     # writes whose outcome is unknown (re-read)
        self._released: set[str] = set()
        self._reasons: dict[str, str] = {}
        # Other backends' enforcement of the same policy, run at the end of each round with it
        # (gangctl.runtime.volcano_preemptor).
        self.enforcers: list[Callable[[QuotaPolicy, Quotas], Awaitable[None]]] = []
        self._wake = asyncio.Event()
        self._retry: asyncio.TimerHandle | None = None
        self.rounds = 0
        for informer in self.sources.values():
            informer.handlers.append(self._on_job)
        policy_configmaps.handlers.append(self._on_configmap)
        for cm in policy_configmaps.cache.values():
            self._on_configmap("ADDED", cm)

    # --- what the reconciler calls ---------------------------------------------------------------
    @property
    def enabled(self) -> bool:
        return self.policy is not None

    def governs(self, namespace: str) -> bool:
        """Whether TrainJobs of this namespace need admission: a policy is in force and names the
        namespace in a team (others are not gated, as Kueue leaves jobs without a queue alone), or
        an invalid policy, with no valid one before it, holds the namespace (fail closed)."""
        if self.policy is not None:
            return self.policy.team_of_namespace(namespace) is not None
        if self.hold is not None:
            return self.hold[0] is None or namespace in self.hold[0]
        return False

    def key(self, job: dict) -> str:
        """The gate's id of a job of any kind."""
        return str(JobKey.of(job))

    def jobs(self) -> dict[str, dict]:
        """Every job the gate may admit, by id (a view of the informers' caches)."""
        prefixes = {kind: JobKey.id_prefix(kind) for kind in self.sources}
        if len(self.sources) == 1 and not any(prefixes.values()):
            return next(iter(self.sources.values())).cache   # the ids are the cache's keys
        return {prefixes[kind] + key: obj for kind, informer in self.sources.items() for key, obj in informer.cache.items()}

    def admission(self, job: dict) -> dict | None:
        """The job's admission record as this gate knows it (its own decisions first, then the cache)."""
        key, uid = self.key(job), job["metadata"].get("uid", "")
        if self._evicts.get(key) == uid:
            return None
        mine = self._admits.get(key)
        if mine is not None and mine.uid == uid:
            return mine.record
        return recorded_admission(job)

    def priority(self, namespace: str, priority_class: str | None) -> int:
        """The priority to pass to `wants` (see `quota_plan.priority_value`)."""
        return priority_value(self.policy, namespace, priority_class) if self.policy else 0

    def wants(self, key: str, trainjob: dict, gang_requests: Mapping[str, Amount], priority: int,
              elastic: NodeRange | None = None) -> None:
        """`gang_requests`: the gang floor; `elastic`: an elastic gang's range (admitted with as many
        nodes above the floor as the quota has room for; `status.admission.nodes` caps it)."""
        self._saw(key)
        if self.policy is None or self.admission(trainjob) is not None:
            return
        meta = trainjob["metadata"]
        created = timestamp(meta["creationTimestamp"]) if meta.get("creationTimestamp") else self.clock().timestamp()
        entry = (meta.get("uid", ""), Pending(key, meta["namespace"], created, priority, dict(gang_requests), elastic))
        if self._pending.get(key) != entry:
            self._pending[key] = entry
            self.trigger()

    def may_grow(self, key: str, trainjob: dict, nodes: NodeRange) -> None:
        """An admitted elastic TrainJob: admit more of its nodes when its team's quota has room."""
        adm = self.admission(trainjob) or {}
        if adm.get("nodes") and int(adm["nodes"]) < nodes.max_nodes:
            entry = (trainjob["metadata"].get("uid", ""), nodes)
            if self._growable.get(key) != entry:
                self._growable[key] = entry
                self.trigger()
        else:
            self._growable.pop(key, None)

    def forget(self, key: str) -> None:
        self._saw(key)
        self._pending.pop(key, None)
        self._growable.pop(key, None)
        self._reasons.pop(key, None)
        self._released.add(key)
        self.trigger()

    def reconciled(self, key: str, epoch: int) -> None:
        """The controller reconciled `key`, having read `epoch` before it started: a starting gate
        has heard from it (a reconcile begun under an earlier policy does not count)."""
        if epoch == self.epoch:
            self._saw(key)

    def _saw(self, key: str) -> None:
        if self.starting and self.policy is not None:
            self._seen.add(key)
            if self._expected and key in self._expected:
                self.trigger()

    def pending_reason(self, key: str) -> str | None:
        if self.policy is None and self.hold is not None:
            return self.hold[1]
        if key in self._reasons:
            return self._reasons[key]
        return "waiting for quota admission" if key in self._pending else None

    def waiting(self, key: str) -> tuple[str, str]:
        """The waiting (reason, message) of a TrainJob this gate holds (status.gang)."""
        if self.policy is None and self.hold is not None:
            return POLICY_INVALID, self.hold[1]
        return WAITING_FOR_QUOTA, f"gangctl quota admission: {self.pending_reason(key) or 'waiting for admission'}"

    def hold_reason(self, key: str) -> tuple[str, str]:
        """What `waiting` answers once `wants(key, …)` has been told (the reconciler observes this
        before its plan tells the gate): the waiting (reason, message) of a held TrainJob (status.gang)."""
        if self.policy is None and self.hold is not None:
            return POLICY_INVALID, self.hold[1]
        return WAITING_FOR_QUOTA, f"gangctl quota admission: {self._reasons.get(key) or 'waiting for quota admission'}"

    def trigger(self) -> None:
        self._wake.set()

    # --- informer handlers -----------------------------------------------------------------------
    def _on_job(self, event: str, obj: dict) -> None:
        key = self.key(obj)
        if key in self._pending or key in self._admits or key in self._evicts:
            self.trigger()
            return
        if recorded_admission(obj) is None:
            return
        if event == "DELETED" or obj["metadata"].get("deletionTimestamp") or user_suspended(obj) or job_finished(obj):
            self.trigger()  # its quota is released

    def _on_configmap(self, event: str, obj: dict) -> None:
        meta = obj["metadata"]
        if meta.get("name") != POLICY_CONFIGMAP or meta.get("namespace") != POLICY_NAMESPACE:
            return
        if event == "DELETED":
            if self.policy is not None or self.hold is not None:
                log.warning("quota policy ConfigMap %s/%s deleted: coscheduling TrainJobs run without quota",
                            POLICY_NAMESPACE, POLICY_CONFIGMAP)
            self._policy_rv = None
            self.policy_error = None
            self.metrics.quota_policy_valid.set(1)
            self._set_policy(None, None)
            return
        if meta.get("resourceVersion") == self._policy_rv:
            return
        self._policy_rv = meta.get("resourceVersion")
        text = (obj.get("data") or {}).get(POLICY_KEY)
        policy, problems = check_policy(text) if text is not None else (None, [])
        if policy is None:
            where = f"{POLICY_NAMESPACE}/{POLICY_CONFIGMAP}[{POLICY_KEY}]"
            self.policy_error = "; ".join(p.format(where) for p in problems) or f"{where}: missing"
            self.metrics.quota_policy_errors.inc()
            self.metrics.quota_policy_valid.set(0)
            if self.policy is not None:
                log.warning("invalid quota policy (%s); keeping the last valid policy", self.policy_error)
                return
            held = held_namespaces(text)
            log.warning("invalid quota policy (%s) and no valid one before it: holding the coscheduling "
                        "TrainJobs of %s", self.policy_error,
                        ", ".join(sorted(held)) if held is not None else "every namespace")
            self._set_policy(None, None, (held, invalid_policy_message(self.policy_error, held)))
            return
        self.policy_error = None
        self.metrics.quota_policy_valid.set(1)
        log.info("quota policy loaded: %d teams", len(policy.teams))
        self._set_policy(policy, policy.to_quotas(QUANTITY_UNITS))

    def _set_policy(self, policy: QuotaPolicy | None, quotas,
                    hold: tuple[frozenset[str] | None, str] | None = None) -> None:
        toggled = (policy is None) != (self.policy is None) or hold != self.hold
        if policy is not None and self.policy is None:
            # A policy comes into force where none was: decide nothing until the jobs it gates have
            # been reconciled under it (they all are: `toggled` requeues every TrainJob).
            self.epoch += 1
            self.starting, self._expected = True, None
            self._seen.clear()
        self.policy, self._quotas, self.hold = policy, quotas, hold
        if policy is None:
            self._pending.clear()
            self._reasons.clear()
        self.trigger()
        if toggled:  # every job's gating changes: let the reconciler look at each again
            for key in list(self.jobs()):
                self.on_change(key)

    # --- the loop --------------------------------------------------------------------------------
    async def run(self) -> None:
        # Never decide on a partial view: usage comes from the jobs' caches.
        for informer in self.sources.values():
            await informer.synced.wait()
        await self.policy_configmaps.synced.wait()
        while True:
            await self._wake.wait()
            await asyncio.sleep(self.coalesce_seconds)
            self._wake.clear()
            try:
                await self.round()
            except asyncio.CancelledError:
                raise
            except Exception:  # a bug or an unreachable apiserver must not stop admission for good
                log.exception("quota admission round failed; retrying")
                self.retry_later()

    def retry_later(self) -> None:
        if self._retry is None:
            def fire() -> None:
                self._retry = None
                self.trigger()
            self._retry = asyncio.get_running_loop().call_later(self.retry_seconds, fire)

    async def round(self) -> None:
        """One admission round: look at the cache, decide, write."""
        self.rounds += 1
        await self._resolve_doubtful()
        policy, quotas = self.policy, self._quotas
        if policy is None:
            return
        cache = self.jobs()
        if self.starting and not self._may_start(cache):
            return
        self._reconcile_overlay(cache)
        released, self._released = self._released, set()
        admitted: list[Workload] = []
        strip: list[dict] = []
        for key, tj in cache.items():
            adm = self.admission(tj)
            if adm is None or job_finished(tj) or tj["metadata"].get("deletionTimestamp"):
                continue
            if user_suspended(tj) or key in released:
                strip.append(tj)   # suspended by the user, or the reconciler let go of it
                continue
            admitted.append(admitted_workload(policy, key, tj["metadata"]["namespace"], adm))
        pending = []
        for key, (uid, p) in list(self._pending.items()):
            tj = cache.get(key)
            if (tj is None or tj["metadata"].get("uid", "") != uid or tj["metadata"].get("deletionTimestamp")
                    or job_finished(tj) or user_suspended(tj) or self.admission(tj) is not None):
                del self._pending[key]
                self._reasons.pop(key, None)
                continue
            pending.append(p)

        for tj in strip:
            key = self.key(tj)
            if await self._evict(tj):
                log.info("quota of %s released (suspended or no longer gated)", key)
                self.on_change(key)

        result = plan(policy, quotas, pending, admitted)
        reasons_before = dict(self._reasons)
        self._reasons = dict(result.reasons)
        by_id = {w.id: w for w in admitted}
        for d in result.decisions:
            await self._carry_out(d, cache, by_id, result.nodes.get(d.workload.id))
        for key, reason in self._reasons.items():
            if reasons_before.get(key) != reason:
                self.on_change(key)   # the reconciler shows the reason in the Suspended condition
        await self._grow(policy, quotas, cache, by_id)
        self._export(policy, by_id.values())
        for enforce in self.enforcers:
            await enforce(policy, quotas)

    async def _carry_out(self, d: Decision, cache: Mapping[str, dict], by_id: dict[str, Workload],
                         nodes: int | None) -> None:
        """Evict a decision's victims, then admit its workload (`nodes`: an elastic one's grant); a
        victim not evicted yet leaves it waiting for the next round."""
        preemptor = d.workload
        for victim in d.victims:
            tj = cache.get(victim.id)
            if tj is None or not await self._evict(tj):
                self._reasons[preemptor.id] = "waiting for its preemption victims to be evicted"
                self.retry_later()
                return
            by_id.pop(victim.id, None)
            self.metrics.quota_preemptions.labels(victim.team).inc()
            await self.events.warning(tj, "Preempted",
                                      f"quota admission removed to admit {preemptor.id} (priority "
                                      f"{preemptor.priority}, team {preemptor.team}); waiting for quota again")
            self._reasons[victim.id] = f"preempted by {preemptor.id}"
            self.on_change(victim.id)
        tj = cache.get(preemptor.id)
        if tj is None:
            return
        if await self._admit(tj, preemptor, nodes):
            by_id[preemptor.id] = preemptor
            self._pending.pop(preemptor.id, None)
            self._reasons.pop(preemptor.id, None)
            self.metrics.quota_admissions.labels(preemptor.team).inc()
            reason = d.reason if d.verdict is Verdict.ADMIT else \
                f"admitted after preempting {', '.join(v.id for v in d.victims)}"
            await self.events.normal(tj, "QuotaAdmitted", f"team {preemptor.team}: {reason}")
            self.on_change(preemptor.id)
        else:
            self.retry_later()

    def _may_start(self, cache: Mapping[str, dict]) -> bool:
        """Whether a starting gate has the full view: both informers synced, and every TrainJob of the
        policy's namespaces that needed admission at the start reconciled under the policy since."""
        if not (all(i.synced.is_set() for i in self.sources.values()) and self.policy_configmaps.synced.is_set()):
            return False
        now = asyncio.get_running_loop().time()
        if self._expected is None:
            self._expected = {key for key, tj in cache.items()
                              if self.governs(tj["metadata"]["namespace"]) and needs_admission(tj, self.admission(tj))}
            self._start_deadline = now + self.start_timeout_seconds
            log.info("quota gate: %d TrainJobs may ask for admission; deciding once each has been reconciled",
                     len(self._expected))
        left = awaiting_start(self._expected, cache, self._seen, self.admission)
        if left and now < self._start_deadline:
            self.retry_later()
            return False
        if left:
            log.warning("quota gate: %d TrainJobs not reconciled after %.0fs (e.g. %s); deciding without them",
                        len(left), self.start_timeout_seconds, ", ".join(sorted(left)[:5]))
        self.starting, self._expected = False, None
        self._seen.clear()
        log.info("quota gate: deciding (%d TrainJobs asking for admission)", len(self._pending))
        return True

    async def _grow(self, policy: QuotaPolicy, quotas, cache: Mapping[str, dict], by_id: dict[str, Workload]) -> None:
        """Admitted elastic jobs below their maximum take the room their team has, when no job of the
        team waits (`quota_plan.grow`); the reconciler then grows them into it."""
        candidates = []
        for key, (uid, nodes) in list(self._growable.items()):
            tj, w = cache.get(key), by_id.get(key)
            adm = self.admission(tj) if tj is not None else None
            if tj is None or tj["metadata"].get("uid", "") != uid or w is None or not (adm or {}).get("nodes"):
                self._growable.pop(key, None)   # gone, finished, suspended or evicted: asks again if admitted
                continue
            candidates.append(Growable(w, int(adm["nodes"]), nodes))
        if not candidates:
            return
        waiting = {policy.team_of_namespace(p.namespace) for _, p in self._pending.values()}
        for key, n in grow(quotas, list(by_id.values()), candidates, {t for t in waiting if t}).items():
            tj, (_, nodes) = cache[key], self._growable[key]
            admission = self.admission(tj)
            before = int(admission["nodes"])
            record = grown_record(admission, nodes.per_node, n)
            if await self._record(tj, record):
                by_id[key] = dataclasses.replace(by_id[key], requests={r: a * n for r, a in nodes.per_node.items()})
                if n >= nodes.max_nodes:
                    self._growable.pop(key, None)
                await self.events.normal(tj, "QuotaGrown", f"team {by_id[key].team} has room: admitted with {n} "
                                                           f"nodes (was {before}, max {nodes.max_nodes})")
                self.on_change(key)
            else:
                self.retry_later()

    def _export(self, policy: QuotaPolicy, admitted) -> None:
        gpus = {t.name: 0.0 for t in policy.teams}
        for w in admitted:
            gpus[w.team] = gpus.get(w.team, 0.0) + float(w.requests.get(GPU, 0))
        for team, n in gpus.items():
            self.metrics.quota_admitted_gpus.labels(team).set(n)
        waiting = {t.name: 0 for t in policy.teams}
        for _, p in self._pending.values():
            team = policy.team_of_namespace(p.namespace)
            if team:
                waiting[team] += 1
        for team, n in waiting.items():
            self.metrics.quota_pending.labels(team).set(n)

    # --- overlay: decisions the cache does not show yet ------------------------------------------
    def _reconcile_overlay(self, cache: Mapping[str, dict]) -> None:
        for key, mine in list(self._admits.items()):
            tj = cache.get(key)
            if tj is None or tj["metadata"].get("uid", "") != mine.uid:
                del self._admits[key]
            elif recorded_admission(tj) == mine.record:
                del self._admits[key]   # the cache caught up
        for key, uid in list(self._evicts.items()):
            tj = cache.get(key)
            if tj is None or tj["metadata"].get("uid", "") != uid or not recorded_admission(tj):
                del self._evicts[key]

    async def _resolve_doubtful(self) -> None:
        """A write whose outcome is unknown (connection lost): read the truth before deciding again."""
        for key in list(self._doubtful):
            job_key = JobKey.parse(key)
            resource = self.sources[job_key.kind].resource
            try:
                tj = {**await self.kube.get(resource.path(job_key.namespace, job_key.name)), "kind": resource.kind}
            except ApiError as err:
                if err.not_found:
                    self._doubtful.discard(key)
                    self._admits.pop(key, None)
                    self._evicts.pop(key, None)
                    continue
                raise
            actual = recorded_admission(tj)
            mine = self._admits.get(key)
            if mine is not None and actual != mine.record:
                del self._admits[key]
            if key in self._evicts and actual:
                del self._evicts[key]
            self._doubtful.discard(key)

    # --- writes ------------------------------------------------------------------------------------
    async def _admit(self, tj: dict, w: Workload, nodes: int | None = None) -> bool:
        return await self._record(tj, admission_record(w.team, w.requests, w.priority, self.clock(), nodes))

    async def _record(self, tj: dict, record: dict) -> bool:
        """Write an admission (new, or grown); it counts from now on, before the write lands."""
        key, uid = self.key(tj), tj["metadata"].get("uid", "")
        self._admits[key] = _Admit(uid, record)
        self._evicts.pop(key, None)
        try:
            ok = await self._write(tj, record)
        except Exception:
            self._doubtful.add(key)   # keep counting it until a read says otherwise
            raise
        if not ok:
            self._admits.pop(key, None)
        return ok

    async def _evict(self, tj: dict) -> bool:
        key, uid = self.key(tj), tj["metadata"].get("uid", "")
        mine = self._admits.pop(key, None)
        self._evicts[key] = uid
        try:
            ok = await self._write(tj, None)
        except Exception:
            ok = False   # unknown: keep counting it (never over-commit); the next round looks again
            self._doubtful.add(key)
        if not ok:
            self._evicts.pop(key, None)
            if mine is not None:
                self._admits[key] = mine
        return ok

    async def _write(self, job: dict, record: dict | None) -> bool:
        """Record the admission (None: remove it) where the job's kind keeps it (gangctl.policy.quota_gate.
        GATED_KINDS reads it back). False when the write did not happen."""
        writers = {TRAINJOBS.kind: self._write_status, PYTORCHJOBS.kind: self._write_annotation}
        return await writers[job.get("kind") or TRAINJOBS.kind](job, record)

    async def _write_status(self, tj: dict, record: dict | None) -> bool:
        """A TrainJob's admission: status.admission, applied under the gate's own field manager."""
        meta = tj["metadata"]
        key = self.key(tj)
        path = TRAINJOBS.path(meta["namespace"], meta["name"], "status")
        body = {"apiVersion": tj.get("apiVersion", TRAINJOBS.api_version), "kind": tj.get("kind", TRAINJOBS.kind),
                "metadata": {k: meta[k] for k in ("name", "namespace", "uid") if meta.get(k)},
                # Applying a status without the field drops it, as long as no other manager owns it.
                "status": {"admission": record} if record is not None else {}}
        try:
            try:
                result = await self.kube.apply(path, body, FIELD_MANAGER)
            except ApiError as err:
                if record is not None or err.status != 422:
                    raise
                # The admission was the whole status: SSA would leave `status: null`, which the
                # schema rejects. Remove the field outright.
                await self._remove(path, meta, "/status/admission")
                return True
            if record is None and (result.get("status") or {}).get("admission") is not None:
                # Another field manager owns status.admission too (a writer that sent the whole status
                # back, including this field): SSA keeps the field for it, so remove it outright.
                log.warning("status.admission of %s is co-owned by another field manager; removing it "
                            "with a JSON patch", key)
                await self._remove(path, meta, "/status/admission")
            return True
        except ApiError as err:   # the server answered: the write did not happen
            if not err.not_found:
                log.warning("could not %s %s: %s", "admit" if record else "evict", key, err)
            return False

    async def _write_annotation(self, job: dict, record: dict | None) -> bool:
        """A PyTorchJob's admission: its annotation, set (or removed: null) by a merge patch whose uid is
        a precondition (a recreated job of the same name is not touched; a deleted one is not made
        again, as an apply could)."""
        meta = job["metadata"]
        text = json.dumps(record, sort_keys=True, separators=(",", ":")) if record is not None else None
        patch = {"metadata": {"annotations": {ADMISSION_ANNOTATION: text}}}
        if meta.get("uid"):
            patch["metadata"]["uid"] = meta["uid"]
        try:
            await self.kube.merge_patch(PYTORCHJOBS.path(meta["namespace"], meta["name"]), patch)
            return True
        except ApiError as err:   # the server answered: the write did not happen
            if not err.not_found:
                log.warning("could not %s %s: %s", "admit" if record else "evict", self.key(job), err)
            return False

    async def _remove(self, path: str, meta: dict, pointer: str) -> None:
        ops = [{"op": "test", "path": "/metadata/uid", "value": meta["uid"]}] if meta.get("uid") else []
        ops.append({"op": "remove", "path": pointer})
        try:
            await self.kube.request("PATCH", path, body=ops, content_type="application/json-patch+json")
        except ApiError as err:
            if err.status != 422:   # 422: nothing to remove any more
                raise
