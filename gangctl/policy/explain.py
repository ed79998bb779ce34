"""Why a TrainJob or a PyTorchJob waits, in words and numbers: what its gang requests against what the nodes have free.

Pure: the caller reads the cluster (nodes, the pods bound to them, the job's scheduler events) and
passes it in. `gangctl explain` prints the result; the numbers are the same ones the scheduler
weighs: a gang binds only when every missing pod finds a node with room for one pod's requests.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from datetime import datetime
from fractions import Fraction
from typing import Mapping, Sequence

from gangctl.api.quantity import format_amount
from gangctl.policy import pytorchjob as pj
from gangctl.model.gang import Gang
from gangctl.model.room import NodeRoom, pods_fitting
from gangctl.policy.placement import DomainRoom
from gangctl.policy.quota_gate import WAITING_FOR_QUOTA
from gangctl.model.resolve import pod_requests
from gangctl.policy.status import COMPLETE, FAILED, PENDING, RUNNING, SUSPENDED, WAITING, gang_state

TERMINAL_PHASES = ("Succeeded", "Failed")
# A waiting gang the nodes have room for now: the scheduler takes it on its next try.
CAPACITY_AVAILABLE = "CapacityAvailable"


@dataclass(frozen=True)
class Row:
    """One resource: what the missing pods need, what is free in all, on the nodes that can host a pod."""

    resource: str
    needed: Fraction
    free: Fraction


@dataclass(frozen=True)
class Diagnosis:
    reason: str            # a CamelCase word, like a condition reason
    message: str           # a sentence for a person, with what to do next where there is something
    pods_missing: int = 0  # pods of the gang not bound yet
    slots: int = 0         # pods of one pod's size the schedulable nodes can still take
    rows: tuple[Row, ...] = field(default_factory=tuple)
    scheduler_says: str = ""
    excluded: tuple[Exclusion, ...] = ()   # nodes the gang's pods may not use, by reason
    level: str = ""                        # a gang with a placement intent: its topology level's name,
    domains: tuple[DomainRoom, ...] = ()   # the free room of each domain at that level,
    next_domain: str = ""                  # and the domain that would hold its floor now ("" none)


@dataclass(frozen=True)
class Excluded:
    """A node a pod of the gang may not use (with what is free on it), why (`what` names the taint,
    label or rule) and what to do about it."""

    room: NodeRoom
    what: str
    fix: str


@dataclass(frozen=True)
class Exclusion:
    """Nodes left out for one reason, and how many more pods of the gang they would hold."""

    what: str
    fix: str
    nodes: int
    slots: int


def screen_nodes(nodes: Sequence[Mapping], pods: Sequence[Mapping],
                 pod_spec: Mapping | None = None) -> tuple[list[NodeRoom], list[Excluded]]:
    """Free resources of each node, split into those a pod of `pod_spec` may land on (Ready, not
    cordoned, every NoSchedule/NoExecute taint tolerated, its nodeSelector and required node affinity
    met) and those it may not, each with the first reason found."""
    used: dict[str, dict[str, Fraction]] = {}
    for pod in pods:
        node = (pod.get("spec") or {}).get("nodeName")
        if not node or (pod.get("status") or {}).get("phase") in TERMINAL_PHASES:
            continue
        acc = used.setdefault(node, {})
        for r, q in pod_requests(pod["spec"]).items():
            acc[r] = acc.get(r, Fraction(0)) + q
    rooms: list[NodeRoom] = []
    excluded: list[Excluded] = []
    for node in nodes:
        allocatable = pod_requests({"containers": [{"resources": {"requests": (node.get("status") or {}).get(
            "allocatable") or {}}}]})
        taken = used.get(node["metadata"]["name"], {})
        free = {r: q - taken.get(r, Fraction(0)) for r, q in allocatable.items()}
        room = NodeRoom(node["metadata"]["name"], free, node["metadata"].get("labels") or {}, allocatable)
        why = excluded_by(node, pod_spec or {})
        if why is None:
            rooms.append(room)
        else:
            excluded.append(Excluded(room, *why))
    return rooms, excluded


def node_rooms(nodes: Sequence[Mapping], pods: Sequence[Mapping], pod_spec: Mapping | None = None) -> list[NodeRoom]:
    """The nodes a pod of `pod_spec` may land on, with what is free on each (`screen_nodes`' first half)."""
    return screen_nodes(nodes, pods, pod_spec)[0]


def excluded_by(node: Mapping, pod_spec: Mapping) -> tuple[str, str] | None:
    """(what excludes the node, what to do) or None when a pod of `pod_spec` may land on it."""
    labels = node["metadata"].get("labels") or {}
    spec, status = node.get("spec") or {}, node.get("status") or {}
    if not any(c["type"] == "Ready" and c["status"] == "True" for c in status.get("conditions") or []):
        return "node not Ready", "wait for the node, or drain and replace it"
    if spec.get("unschedulable"):
        return "node cordoned (spec.unschedulable)", "uncordon it (kubectl uncordon) if it should take work"
    for taint in spec.get("taints") or []:
        if taint.get("effect") in ("NoSchedule", "NoExecute") and not any(
                _matches(t, taint) for t in pod_spec.get("tolerations") or []):
            value = f"={taint['value']}" if taint.get("value") else ""
            return (f"taint {taint.get('key')}{value}:{taint.get('effect')}",
                    f"add a toleration for it to the pod template (key {taint.get('key')}, effect {taint.get('effect')})")
    for key, want in (pod_spec.get("nodeSelector") or {}).items():
        if labels.get(key) != want:
            return f"nodeSelector {key}={want}", "label the nodes meant for it, or change the pod template's nodeSelector"
    terms = (((pod_spec.get("affinity") or {}).get("nodeAffinity") or {})
             .get("requiredDuringSchedulingIgnoredDuringExecution") or {}).get("nodeSelectorTerms")
    if terms and not any(_term_matches(term, labels, node["metadata"]["name"]) for term in terms):
        return ("required node affinity (no nodeSelectorTerm matches)",
                "label the nodes meant for it, or loosen the pod template's nodeAffinity")
    return None


def _term_matches(term: Mapping, labels: Mapping[str, str], name: str) -> bool:
    """One nodeSelectorTerm: all its matchExpressions (on labels) and matchFields (metadata.name) hold."""
    checks = [(e, labels) for e in term.get("matchExpressions") or []]
    checks += [(f, {"metadata.name": name}) for f in term.get("matchFields") or []]
    return all(_requirement_holds(req, values) for req, values in checks)


def _requirement_holds(req: Mapping, labels: Mapping[str, str]) -> bool:
    key, op, values = req.get("key"), req.get("operator"), req.get("values") or []
    have = labels.get(key)
    if op == "In":
        return have in values
    if op == "NotIn":
        return have not in values
    if op == "Exists":
        return have is not None
    if op == "DoesNotExist":
        return have is None
    if op in ("Gt", "Lt") and have is not None and values:
        try:
            return int(have) > int(values[0]) if op == "Gt" else int(have) < int(values[0])
        except ValueError:
            return False
    return False


def _matches(toleration: Mapping, taint: Mapping) -> bool:
    if toleration.get("effect") not in (None, "", taint.get("effect")):
        return False
    if toleration.get("operator") == "Exists":
        return toleration.get("key") in (None, "", taint.get("key"))
    return toleration.get("key") == taint.get("key") and toleration.get("value", "") == taint.get("value", "")


def exclusions(excluded: Sequence[Excluded], per_pod: Mapping[str, Fraction]) -> tuple[Exclusion, ...]:
    """The excluded nodes grouped by reason, those that would hold pods of `per_pod` first (most slots)."""
    groups: dict[tuple[str, str], list[int]] = {}
    for node in excluded:
        acc = groups.setdefault((node.what, node.fix), [0, 0])
        acc[0] += 1
        acc[1] += slots_on(node.room, per_pod)
    return tuple(sorted((Exclusion(what, fix, n, slots) for (what, fix), (n, slots) in groups.items()),
                        key=lambda e: (-e.slots, e.what)))


def slots_on(room: NodeRoom, per_pod: Mapping[str, Fraction]) -> int:
    """How many pods of `per_pod` fit on the node now."""
    return pods_fitting(room.free, per_pod)


def diagnose(status: Mapping | None, gang: Gang, bound: int, rooms: Sequence[NodeRoom],
             scheduler_says: str = "", retry_seconds: float | None = None,
             excluded: Sequence[Excluded] = ()) -> Diagnosis:
    """The reason a TrainJob with this status and gang is where it is."""
    conds = {c["type"]: c for c in (status or {}).get("conditions") or []}

    def true(t: str) -> bool:
        return conds.get(t, {}).get("status") == "True"
    for final in (COMPLETE, FAILED):
        if true(final):
            c = conds[final]
            return Diagnosis(c.get("reason", final), f"{final}: {c.get('message', '')}".rstrip(": "))
    if true(SUSPENDED):
        return Diagnosis("Suspended", "suspended by spec.suspend: it holds no gang and no node; "
                                      "set spec.suspend=false to run it")
    state = gang_state(status)
    if state.get("state") == RUNNING:
        return Diagnosis("GangScheduled", f"running: all {gang.min_member} pods of the gang are bound")
    if state.get("state") == PENDING and state.get("reason") != "Creating":
        return Diagnosis(state.get("reason", "NotCreated"), state.get("message", ""))
    if state.get("state") == WAITING and state.get("reason") == WAITING_FOR_QUOTA and bound == 0:
        # The backend's own quota system (Kueue, Volcano, KAI) holds the gang: its words, not the nodes'.
        return Diagnosis(WAITING_FOR_QUOTA, f"{state.get('message', '')}: it holds no node until its queue has "
                                            "room (when the team's other jobs finish, or the policy grants more)",
                         gang.min_member, 0, (), scheduler_says)
    return _capacity(gang, bound, rooms, scheduler_says, retry_seconds, excluded)


def diagnose_pytorchjob(status: Mapping | None, gang: Gang, bound: int, rooms: Sequence[NodeRoom],
                        scheduler_says: str = "", retry_seconds: float | None = None,
                        excluded: Sequence[Excluded] = ()) -> Diagnosis:
    """The same for a PyTorchJob, whose status carries Training Operator v1's conditions."""
    conds = {c["type"]: c for c in (status or {}).get("conditions") or []}

    def true(t: str) -> bool:
        return conds.get(t, {}).get("status") == "True"
    for final in (pj.SUCCEEDED, pj.FAILED):
        if true(final):
            c = conds[final]
            return Diagnosis(c.get("reason", final), f"{final}: {c.get('message', '')}".rstrip(": "))
    if true(pj.SUSPENDED):
        c = conds[pj.SUSPENDED]
        if c.get("reason") != pj.reason("Suspended"):   # held by gangctl's quota gate, not by the user
            return Diagnosis(c.get("reason", "WaitingForQuota"), f"{c.get('message', '')}: it holds no gang and no "
                                                                 "node until its team's quota admits it")
        return Diagnosis("Suspended", "suspended by spec.runPolicy.suspend: it holds no gang and no node; "
                                      "set spec.runPolicy.suspend=false to run it")
    if true(pj.RUNNING):
        return Diagnosis("GangScheduled", f"running: at least {gang.min_member} pods of the gang are bound")
    return _capacity(gang, bound, rooms, scheduler_says, retry_seconds, excluded)


def _capacity(gang: Gang, bound: int, rooms: Sequence[NodeRoom], scheduler_says: str,
              retry_seconds: float | None, excluded: Sequence[Excluded] = ()) -> Diagnosis:
    """Why a gang not yet bound waits: its missing pods against the free room of the nodes."""
    missing = max(0, gang.min_member - bound)
    per_pod = {r: q for r, q in gang.per_pod.items() if q > 0}
    slots = sum(slots_on(room, per_pod) for room in rooms)
    rows = tuple(Row(r, q * missing, sum((room.free.get(r, Fraction(0)) for room in rooms), Fraction(0)))
                 for r, q in sorted(per_pod.items()))
    left_out = exclusions(excluded, per_pod)
    pod = ", ".join(f"{format_amount(r, q)} {r}" for r, q in sorted(per_pod.items()))
    if missing == 0:
        return Diagnosis("Binding", "every pod of the gang is bound; the status catches up on the next reconcile",
                         0, slots, rows, scheduler_says, left_out)
    if slots >= missing:
        retry = f" (gangctl hands waiting gangs back to the scheduler every {retry_seconds:g} s)" if retry_seconds else ""
        return Diagnosis(CAPACITY_AVAILABLE,
                         f"{missing} pod(s) of {pod} each wait to be bound and the nodes have room for {slots} now: "
                         f"the scheduler takes the gang on its next try{retry}", missing, slots, rows, scheduler_says,
                         left_out)
    short = [row for row in rows if row.free < row.needed]
    if short:
        what = "; ".join(f"{row.resource}: {format_amount(row.resource, row.needed)} needed, "
                         f"{format_amount(row.resource, row.free)} free" for row in short)
        return Diagnosis("InsufficientCapacity",
                         f"the gang needs {missing} more pod(s) of {pod} and the nodes it may use lack it ({what}); "
                         f"it binds whole, with no pod bound before, once other jobs finish or nodes are added"
                         f"{_left_out(left_out)}", missing, slots, rows, scheduler_says, left_out)
    return Diagnosis("Fragmented",
                     f"enough is free in total, but only {slots} node slot(s) can hold a pod of {pod} and {missing} "
                     f"are needed: the free resources are spread over nodes too small for one pod{_left_out(left_out)}",
                     missing, slots, rows, scheduler_says, left_out)


def _left_out(groups: Sequence[Exclusion]) -> str:
    """The sentence naming the excluded nodes that would hold pods of the gang, and what to do."""
    useful = [g for g in groups if g.slots > 0]
    if not useful:
        return ""
    return ". Nodes it may not use have room for more: " + "; ".join(
        f"{g.nodes} node(s) with room for {g.slots} pod(s) are excluded by {g.what} ({g.fix})" for g in useful)


def with_progress(d: Diagnosis, report: Mapping | None, stall_timeout: int | None, now: datetime) -> Diagnosis:
    """A running job with a stall timeout: how long it has been silent (since its last progress `report`,
    `gangctl.model.progress.reported`), against the timeout."""
    if stall_timeout is None or d.reason != "GangScheduled":
        return d
    when = (report or {}).get("lastUpdatedTime")
    if not when:
        return replace(d, message=f"{d.message}; it has not reported progress yet (never judged stalled until it does)")
    silent = (now - datetime.fromisoformat(str(when).replace("Z", "+00:00"))).total_seconds()
    return replace(d, message=f"{d.message}; last progress report {silent:.0f}s ago (stalled after "
                              f"{stall_timeout}s without one)")
