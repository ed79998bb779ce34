"""Why a TrainJob or a PyTorchJob waits, in words and numbers: what its gang requests against what the nodes have free.

Pure: the caller reads the cluster (nodes, the pods bound to them, the job's scheduler events) and
passes it in. `gangctl explain` prints the result; the numbers are the same ones the scheduler
weighs: a gang binds only when every missing pod finds a node with room for one pod's requests.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from fractions import Fraction
from typing import Mapping, Sequence

from gangctl.policy import pytorchjob as pj
from gangctl.model.gang import Gang
from gangctl.policy.quota_gate import WAITING_FOR_QUOTA
from gangctl.model.resolve import pod_requests
from gangctl.policy.status import COMPLETE, FAILED, PENDING, RUNNING, SUSPENDED, WAITING, gang_state

TERMINAL_PHASES = ("Succeeded", "Failed")


@dataclass(frozen=True)
class NodeRoom:
    """One node that could take a pod of the gang, and what is free on it."""

    name: str
    free: Mapping[str, Fraction]


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


def node_rooms(nodes: Sequence[Mapping], pods: Sequence[Mapping], tolerated: Sequence[Mapping] = ()) -> list[NodeRoom]:
    """Free resources of each Ready node a pod may land on (no NoSchedule/NoExecute taint it does not tolerate)."""
    used: dict[str, dict[str, Fraction]] = {}
    for pod in pods:
        node = (pod.get("spec") or {}).get("nodeName")
        if not node or (pod.get("status") or {}).get("phase") in TERMINAL_PHASES:
            continue
        acc = used.setdefault(node, {})
        for r, q in pod_requests(pod["spec"]).items():
            acc[r] = acc.get(r, Fraction(0)) + q
    rooms = []
    for node in nodes:
        meta, spec, status = node["metadata"], node.get("spec") or {}, node.get("status") or {}
        ready = any(c["type"] == "Ready" and c["status"] == "True" for c in status.get("conditions") or [])
        if not ready or spec.get("unschedulable") or not _tolerates(spec.get("taints") or [], tolerated):
            continue
        allocatable = pod_requests({"containers": [{"resources": {"requests": status.get("allocatable") or {}}}]})
        taken = used.get(meta["name"], {})
        rooms.append(NodeRoom(meta["name"], {r: q - taken.get(r, Fraction(0)) for r, q in allocatable.items()}))
    return rooms


def _tolerates(taints: Sequence[Mapping], tolerations: Sequence[Mapping]) -> bool:
    for taint in taints:
        if taint.get("effect") not in ("NoSchedule", "NoExecute"):
            continue
        if not any(_matches(t, taint) for t in tolerations):
            return False
    return True


def _matches(toleration: Mapping, taint: Mapping) -> bool:
    if toleration.get("effect") not in (None, "", taint.get("effect")):
        return False
    if toleration.get("operator") == "Exists":
        return toleration.get("key") in (None, "", taint.get("key"))
    return toleration.get("key") == taint.get("key") and toleration.get("value", "") == taint.get("value", "")


def slots_on(room: NodeRoom, per_pod: Mapping[str, Fraction]) -> int:
    """How many pods of `per_pod` fit on the node."""
    counts = [room.free.get(r, Fraction(0)) // q for r, q in per_pod.items() if q > 0]
    return max(0, int(min(counts))) if counts else 0


def diagnose(status: Mapping | None, gang: Gang, bound: int, rooms: Sequence[NodeRoom],
             scheduler_says: str = "", retry_seconds: float | None = None) -> Diagnosis:
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
    return _capacity(gang, bound, rooms, scheduler_says, retry_seconds)


def diagnose_pytorchjob(status: Mapping | None, gang: Gang, bound: int, rooms: Sequence[NodeRoom],
                        scheduler_says: str = "", retry_seconds: float | None = None) -> Diagnosis:
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
    return _capacity(gang, bound, rooms, scheduler_says, retry_seconds)


def _capacity(gang: Gang, bound: int, rooms: Sequence[NodeRoom], scheduler_says: str,
              retry_seconds: float | None) -> Diagnosis:
    """Why a gang not yet bound waits: its missing pods against the free room of the nodes."""
    missing = max(0, gang.min_member - bound)
    per_pod = {r: q for r, q in gang.per_pod.items() if q > 0}
    slots = sum(slots_on(room, per_pod) for room in rooms)
    rows = tuple(Row(r, q * missing, sum((room.free.get(r, Fraction(0)) for room in rooms), Fraction(0)))
                 for r, q in sorted(per_pod.items()))
    pod = ", ".join(f"{_fmt(q, r)} {r}" for r, q in sorted(per_pod.items()))
    if missing == 0:
        return Diagnosis("Binding", "every pod of the gang is bound; the status catches up on the next reconcile",
                         0, slots, rows, scheduler_says)
    if slots >= missing:
        retry = f" (gangctl hands waiting gangs back to the scheduler every {retry_seconds:g} s)" if retry_seconds else ""
        return Diagnosis("CapacityAvailable",
                         f"{missing} pod(s) of {pod} each wait to be bound and the nodes have room for {slots} now: "
                         f"the scheduler takes the gang on its next try{retry}", missing, slots, rows, scheduler_says)
    short = [row for row in rows if row.free < row.needed]
    if short:
        what = "; ".join(f"{row.resource}: {_fmt(row.needed, row.resource)} needed, {_fmt(row.free, row.resource)} free"
                         for row in short)
        return Diagnosis("InsufficientCapacity",
                         f"the gang needs {missing} more pod(s) of {pod} and the cluster lacks it ({what}); it binds "
                         f"whole, with no pod bound before, once other jobs finish or nodes are added",
                         missing, slots, rows, scheduler_says)
    return Diagnosis("Fragmented",
                     f"enough is free in total, but only {slots} node slot(s) can hold a pod of {pod} and {missing} "
                     f"are needed: the free resources are spread over nodes too small for one pod",
                     missing, slots, rows, scheduler_says)


def _fmt(q: Fraction, resource: str) -> str:
    if resource == "memory" and q >= 2**30:
        return f"{float(q / 2**30):g}Gi"
    return f"{float(q):g}"
