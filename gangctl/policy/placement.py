"""gangctl's own topology placement of a gang (for a scheduler without one: coscheduling, and native's
missing preferred mode). Pure: the caller passes the nodes as it sees them.

Given the nodes (`model.room.NodeRoom` with labels, allocatable and free amounts, as
`policy.explain.screen_nodes` reads them; taints are not looked at yet), the cluster's
topology, the job's placement intent (levels as node labels: `intent.on(topology)`) and the gang's
floor (its pods and one pod's requests), `choose` answers one of:
- `Placed`: the narrowest domain, at the intent's level or below it, that holds the floor now; among
  the domains of that level that do, the one that leaves the fewest GPUs stranded (free but unused),
  then the first by name. A preferred intent with no domain holding it now spans the fewest domains
  of its level (those with the most room first) inside the narrowest wider domain that holds it (a
  block, else the whole cluster), as Kueue's TAS does; only when its level's domains cannot hold it
  together is it placed on the whole cluster (no domain).
- `Waiting`: no domain holds the floor now; the message names the best one (the most pods it has
  room for now) and its numbers.
- `Unsatisfiable`: no domain of the required level could hold the floor even empty (allocatable, not
  free): waiting would be forever.

`pin` is what the decision asks: for a job whose backend cannot place its intent itself, the pod
template pinned to the chosen domain by node affinity (required for a required intent, preferred
for a preferred one) and marked with the domain (`PLACEMENT_ANNOTATION`), or why it cannot start.
A template already marked (the node Job exists) keeps its domain (`kept`): a Job's pod template cannot change
once it started, and its replacement pods must land where the gang is.
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from fractions import Fraction

from gangctl.model.resolve import pod_requests
from gangctl.model.room import NodeRoom, pods_fitting
from gangctl.model.topology import PlacementIntent, Topology
from gangctl.plugins import base

GPU = "nvidia.com/gpu"
UNSATISFIABLE = "TopologyUnsatisfiable"
WAITING = "WaitingForTopology"
# On the node Job's pod template (so on every pod): where gangctl placed the gang, `<label>=<value>`
# (`<label>=<v1>,<v2>` for a preferred gang over several domains; label values hold no comma), or `*`
# for a preferred intent placed on the whole cluster (its level's domains could not hold it).
PLACEMENT_ANNOTATION = "gangctl.io/placement"
ANYWHERE = "*"
PREFERRED_WEIGHT = 100   # the node affinity weight of a preferred domain (the most a term may have)


@dataclass(frozen=True)
class Floor:
    """The gang's floor: `pods` pods of `requests` each."""
    pods: int
    requests: Mapping[str, Fraction | int]


@dataclass(frozen=True)
class Placed:
    level: str | None          # the node label of the chosen domains' level (None: the whole cluster)
    domains: tuple[str, ...]   # the label's values: one, or several for a preferred gang no domain holds
    nodes: tuple[str, ...] = field(default=())   # the domains' nodes (what a node affinity would name)
    stranded_gpus: Fraction | int = 0

    @property
    def domain(self) -> str | None:
        """The domains as a mark's value (`r0`, `r0,r3`), None for the whole cluster."""
        return ",".join(self.domains) or None


@dataclass(frozen=True)
class Waiting:
    reason: str
    message: str


@dataclass(frozen=True)
class Unsatisfiable:
    reason: str
    message: str


@dataclass(frozen=True)
class _Domain:
    label: str
    value: str | None
    nodes: tuple[NodeRoom, ...]

    def room(self, floor: Floor, now: bool = True) -> int:
        return sum(pods_fitting(n.free if now else n.allocatable, floor.requests) for n in self.nodes)

    def hosts_with_room(self, floor: Floor) -> int:
        return sum(pods_fitting(n.free, floor.requests) > 0 for n in self.nodes)

    def gpus(self, now: bool = True) -> Fraction | int:
        return sum((Fraction(n.free.get(GPU, 0) if now else n.allocatable.get(GPU, 0)) for n in self.nodes), Fraction(0))

    def stranded(self, floor: Floor) -> Fraction | int:
        return self.gpus() - floor.pods * Fraction(floor.requests.get(GPU, 0))

    def placed(self, floor: Floor) -> Placed:
        return _placed([self], floor)


def _placed(chosen: list[_Domain], floor: Floor) -> Placed:
    values = tuple(d.value for d in chosen if d.value is not None)
    stranded = sum((d.gpus() for d in chosen), Fraction(0)) - floor.pods * Fraction(floor.requests.get(GPU, 0))
    return Placed(chosen[0].label if values else None, values,
                  tuple(sorted(n.name for d in chosen for n in d.nodes)), _plain(stranded))


def _plain(value: Fraction | int) -> Fraction | int:
    return int(value) if Fraction(value).denominator == 1 else value


def domains(nodes: list[NodeRoom], label: str) -> list[_Domain]:
    """The domains of one level (by the label's value), in name order; unlabelled nodes are in none."""
    by_value: dict[str, list[NodeRoom]] = {}
    for node in nodes:
        if label in node.labels:
            by_value.setdefault(node.labels[label], []).append(node)
    return [_Domain(label, value, tuple(members)) for value, members in sorted(by_value.items())]


def _best_fit(candidates: list[_Domain], floor: Floor) -> _Domain | None:
    fitting = [d for d in candidates if d.room(floor) >= floor.pods]
    return min(fitting, key=lambda d: (d.stranded(floor), d.value or "")) if fitting else None


def choose(nodes: list[NodeRoom], topology: Topology, intent: PlacementIntent,
           floor: Floor) -> Placed | Waiting | Unsatisfiable:
    """Where the gang's floor goes now under `intent` (see the module docstring)."""
    target = intent.required if intent.required is not None else intent.preferred
    labels = [lv.node_label for lv in topology.levels]
    if target is None or str(target) not in labels:
        raise ValueError(f"placement level {target!r} is not one of the topology's node labels {labels}")
    at = labels.index(str(target))
    for label in reversed(labels[at:]):          # the narrowest level first, up to the intent's
        found = _best_fit(domains(nodes, label), floor)
        if found is not None:
            return found.placed(floor)
    level_domains = domains(nodes, str(target))
    name = topology.levels[at].name
    if intent.required is None:
        spread = _fewest(nodes, labels[:at], level_domains, floor)
        if spread is not None:
            return _placed(spread, floor)
        whole = _Domain("", None, tuple(nodes))
        if whole.room(floor) >= floor.pods:
            return whole.placed(floor)
    elif (never := never_fits(nodes, topology, intent, floor)) is not None:
        return never
    return Waiting(WAITING, _waiting_message(level_domains, name, floor))


def _fewest(nodes: list[NodeRoom], wider: list[str], level_domains: list[_Domain],
            floor: Floor) -> list[_Domain] | None:
    """A preferred floor no domain of its level holds: the fewest of them that hold it together
    (the most room first), inside the narrowest wider domain where that works (ties: the fewest
    domains, then the fewest GPUs stranded, then by name), else over the whole cluster; None when
    its level's domains cannot hold it together."""
    rooms = {d.value: d.room(floor) for d in level_domains}
    ordered = sorted(level_domains, key=lambda d: (-rooms[d.value], d.stranded(floor), d.value or ""))
    scopes = [domains(nodes, label) for label in reversed(wider)] + [[_Domain("", None, tuple(nodes))]]
    for level in scopes:
        best: tuple[int, Fraction, str] | None = None
        chosen: list[_Domain] = []
        for scope in level:
            members = {n.name for n in scope.nodes}
            taken, room = [], 0
            for d in (d for d in ordered if d.nodes[0].name in members):
                if room >= floor.pods:
                    break
                taken.append(d)
                room += rooms[d.value]
            if room < floor.pods:
                continue
            stranded = sum((d.gpus() for d in taken), Fraction(0))
            key = (len(taken), stranded, scope.value or "")
            if best is None or key < best:
                best, chosen = key, taken
        if chosen:
            return sorted(chosen, key=lambda d: d.value or "")
    return None


def never_fits(nodes: list[NodeRoom], topology: Topology, intent: PlacementIntent,
               floor: Floor) -> Unsatisfiable | None:
    """For a required intent (levels as node labels): `Unsatisfiable` when no domain of its level could
    hold the floor even empty (allocatable, not free), whichever scheduler places it; else None."""
    if intent.required is None:
        return None
    label = str(intent.required)
    level_domains = domains(nodes, label)
    if any(d.room(floor, now=False) >= floor.pods for d in level_domains):
        return None
    name = next((lv.name for lv in topology.levels if lv.node_label == label), label)
    return Unsatisfiable(UNSATISFIABLE, _never_message(level_domains, name, floor))


def _floor_text(floor: Floor) -> str:
    each = ", ".join(f"{_plain(Fraction(q))} {r}" for r, q in sorted(floor.requests.items()))
    return f"{floor.pods} pods of {each}"


def _waiting_message(level_domains: list[_Domain], name: str, floor: Floor) -> str:
    if not level_domains:
        return f"no node carries the {name} label; the gang's floor ({_floor_text(floor)}) cannot be placed"
    best = max(level_domains, key=lambda d: (d.room(floor), -d.stranded(floor)))
    return (f"no {name} has room for the gang's floor ({_floor_text(floor)}) now; best {name} {best.value}: "
            f"{best.hosts_with_room(floor)} of {len(best.nodes)} hosts free, room for {best.room(floor)} of "
            f"{floor.pods} pods ({_plain(best.gpus())} GPUs free)")


def _never_message(level_domains: list[_Domain], name: str, floor: Floor) -> str:
    if not level_domains:
        return f"no node carries the {name} label; the gang's floor ({_floor_text(floor)}) can never be placed"
    best = max(level_domains, key=lambda d: d.room(floor, now=False))
    return (f"no {name} can ever hold the gang's floor ({_floor_text(floor)}): the largest, {name} {best.value}, "
            f"has {len(best.nodes)} hosts with room for {best.room(floor, now=False)} pods "
            f"({_plain(best.gpus(now=False))} GPUs allocatable)")


@dataclass(frozen=True)
class DomainRoom:
    """One domain at a gang's level, as `gangctl explain` shows it."""
    domain: str
    hosts: int
    hosts_with_room: int     # hosts with room for at least one pod of the gang
    room: int                # pods of the gang it has room for now
    gpus_free: Fraction | int


@dataclass(frozen=True)
class DomainRooms:
    """A gang's level as `gangctl explain` shows it."""
    level: str                      # the level's name
    rows: tuple[DomainRoom, ...]    # free room per domain at that level
    next_domain: str                # the domain `choose` would place the floor in now ("" when none would)
    verdict: Placed | Waiting | Unsatisfiable   # what `choose` answers


def domain_rooms(nodes: list[NodeRoom], topology: Topology, intent: PlacementIntent, floor: Floor) -> DomainRooms:
    """The free room per domain at the intent's level (levels as node labels), and `choose`'s answer."""
    target = str(intent.required if intent.required is not None else intent.preferred)
    level = topology.level(target)
    name = level.name if level is not None else target
    rows = tuple(DomainRoom(str(d.value), len(d.nodes), d.hosts_with_room(floor), d.room(floor), _plain(d.gpus()))
                 for d in domains(nodes, target))
    chosen = choose(nodes, topology, intent, floor)
    label_name = {lv.node_label: lv.name for lv in topology.levels}
    nxt = (f"{label_name.get(chosen.level or '', chosen.level)} {chosen.domain}" if isinstance(chosen, Placed)
           and chosen.domain is not None else "")
    return DomainRooms(name, rows, nxt, chosen)


@dataclass(frozen=True)
class Reserved:
    """A gang gangctl pinned whose pods are not all bound yet: `pods` more of `requests` will land in
    the domain `mark` (`<label>=<value>`). Listed nodes do not show them, so a choice made before they
    bind would count their room twice."""
    mark: str
    pods: int
    requests: Mapping[str, Fraction | int]


def reserve(rooms: list[NodeRoom], reserved: list[Reserved]) -> list[NodeRoom]:
    """The rooms with each reserved gang's unbound pods taken from its domain's nodes, filling the
    nodes in name order (as many of its pods as each holds): what the next choice may count on."""
    free = {room.name: dict(room.free) for room in rooms}
    for gang in reserved:
        label, _, value = gang.mark.partition("=")
        values = set(value.split(","))
        left = gang.pods
        for room in sorted(rooms, key=lambda r: r.name):
            if left <= 0:
                break
            if room.labels.get(label) not in values:
                continue
            taking = min(left, pods_fitting(free[room.name], gang.requests))
            for resource, amount in gang.requests.items():
                free[room.name][resource] = Fraction(free[room.name].get(resource, 0)) - taking * Fraction(amount)
            left -= taking
    return [NodeRoom(r.name, free[r.name], r.labels, r.allocatable) for r in rooms]


def pinned_gangs(jobs: Iterable[dict], pods: Iterable[dict]) -> list[Reserved]:
    """The gangs gangctl pinned (Jobs whose pod template carries a domain mark) that run, or are about
    to, with fewer bound pods in `pods` (the listing the choice weighs) than they ask for."""
    bound: dict[str, int] = {}
    for pod in pods:
        if (pod.get("spec") or {}).get("nodeName") and (pod.get("status") or {}).get("phase") not in ("Succeeded", "Failed"):
            for ref in pod["metadata"].get("ownerReferences") or []:
                bound[ref.get("uid", "")] = bound.get(ref.get("uid", ""), 0) + 1
    out = []
    for job in jobs:
        spec, meta = job.get("spec") or {}, job["metadata"]
        template = spec.get("template") or {}
        mark = mark_of(template)
        if (mark in (None, ANYWHERE) or spec.get("suspend") or meta.get("deletionTimestamp")
                or any(c.get("type") in ("Complete", "Failed") and c.get("status") == "True"
                       for c in (job.get("status") or {}).get("conditions") or [])):
            continue
        unbound = int(spec.get("parallelism") or 1) - bound.get(meta.get("uid", ""), 0)
        if unbound > 0:
            out.append(Reserved(mark, unbound, pod_requests(template.get("spec") or {})))
    return out


@dataclass(frozen=True)
class NeedNodes:
    """The decision needs the cluster's nodes and their pods to choose (the caller lists them)."""


def packing(topology: Topology) -> PlacementIntent:
    """Where gangctl puts a gang that asks for no level (where its scheduler would scatter it): as if
    it preferred the widest level, so `choose` takes the narrowest domain that holds its floor now,
    the fullest first (fewest GPUs stranded), and spreads only when no widest domain holds it."""
    return PlacementIntent(preferred=topology.levels[0].node_label)


def places_itself(backend, intent: PlacementIntent, topology: Topology) -> bool:
    """Whether the backend's scheduler takes this intent (levels as node labels) on its own objects."""
    return bool(base.placement_spec(backend, intent, topology) or base.placement_annotations(backend, intent))


def mark_of(template: dict | None) -> str | None:
    """The domain gangctl pinned a pod template to (`PLACEMENT_ANNOTATION`), None when it did not."""
    return (((template or {}).get("metadata") or {}).get("annotations") or {}).get(PLACEMENT_ANNOTATION)


def pin(template: dict, intent: PlacementIntent, topology: Topology, floor: Floor,
        rooms: list[NodeRoom] | None) -> dict | NeedNodes | Waiting | Unsatisfiable:
    """The node job's pod `template` pinned for `intent` (levels as node labels) to the domain
    `choose` picks from `rooms` (None: not listed yet, `NeedNodes`). A Job pinned before keeps its
    domain (`kept`)."""
    if rooms is None:
        return NeedNodes()
    chosen = choose(rooms, topology, intent, floor)
    if not isinstance(chosen, Placed):
        return chosen
    mark = ANYWHERE if chosen.domain is None else f"{chosen.level}={chosen.domain}"
    return pinned(template, mark, required=intent.required is not None)


def kept(template: dict, observed_template: dict | None) -> dict | None:
    """`template` pinned as the observed Job's template was (None: it was not pinned), whatever the
    topology and the intent say now: a Job's pod template cannot change once its pods started, so
    a topology removed or an intent changed later leaves a placed gang where it is."""
    mark = mark_of(observed_template)
    if mark is None:
        return None
    label = mark.partition("=")[0]
    need = ((((observed_template or {}).get("spec") or {}).get("affinity") or {}).get("nodeAffinity") or {}).get(
        "requiredDuringSchedulingIgnoredDuringExecution") or {}
    required = any(e.get("key") == label for t in need.get("nodeSelectorTerms") or [] for e in t.get("matchExpressions") or [])
    return pinned(template, mark, required=required)


def pinned(template: dict, mark: str, *, required: bool) -> dict:
    """A copy of `template` with the placement mark and, unless it is `ANYWHERE`, node affinity to the
    domain: added to every required term (terms are ORed, so each must name the domain), or as a
    preferred term."""
    meta = dict(template.get("metadata") or {})
    meta["annotations"] = {**(meta.get("annotations") or {}), PLACEMENT_ANNOTATION: mark}
    out = {**template, "metadata": meta}
    if mark == ANYWHERE:
        return out
    label, _, value = mark.partition("=")
    expression = {"key": label, "operator": "In", "values": value.split(",")}
    spec = dict(template.get("spec") or {})
    affinity = dict(spec.get("affinity") or {})
    node = dict(affinity.get("nodeAffinity") or {})
    if required:
        need = dict(node.get("requiredDuringSchedulingIgnoredDuringExecution") or {})
        terms = need.get("nodeSelectorTerms") or [{}]
        need["nodeSelectorTerms"] = [{**t, "matchExpressions": [*(t.get("matchExpressions") or []), expression]}
                                     for t in terms]
        node["requiredDuringSchedulingIgnoredDuringExecution"] = need
    else:
        node["preferredDuringSchedulingIgnoredDuringExecution"] = [
            *(node.get("preferredDuringSchedulingIgnoredDuringExecution") or []),
            {"weight": PREFERRED_WEIGHT, "preference": {"matchExpressions": [expression]}}]
    affinity["nodeAffinity"] = node
    spec["affinity"] = affinity
    out["spec"] = spec
    return out
