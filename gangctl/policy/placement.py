"""gangctl's own topology placement of a gang (for a scheduler without one: coscheduling, and native's
missing preferred mode). Pure: the caller passes the nodes as it sees them.

Given the nodes (`model.room.NodeRoom` with labels, allocatable and free amounts, as
`policy.explain.screen_nodes` reads them; taints are not looked at yet), the cluster's
topology, the job's placement intent (levels as node labels: `intent.on(topology)`) and the gang's
floor (its pods and one pod's requests), `choose` answers one of:
- `Placed`: the narrowest domain, at the intent's level or below it, that holds the floor now; among
  the domains of that level that do, the one that leaves the fewest GPUs stranded (free but unused),
  then the first by name. A preferred intent with no domain holding it now is placed on the whole
  cluster (domain None) if the cluster holds it.
- `Waiting`: no domain holds the floor now; the message names the best one (the most pods it has
  room for now) and its numbers.
- `Unsatisfiable`: no domain of the required level could hold the floor even empty (allocatable, not
  free): waiting would be forever.

`pin` is what the decision asks: for a job whose backend cannot place its intent itself, the pod
template pinned to the chosen domain by node affinity (required for a required intent, preferred
for a preferred one) and marked with the domain (`PLACEMENT_ANNOTATION`), or why it cannot start.
A template already marked (the node Job exists) keeps its domain: a Job's pod template cannot change
once it started, and its replacement pods must land where the gang is.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from fractions import Fraction

from gangctl.model.room import NodeRoom, pods_fitting
from gangctl.model.topology import PlacementIntent, Topology
from gangctl.plugins import base

GPU = "nvidia.com/gpu"
UNSATISFIABLE = "TopologyUnsatisfiable"
WAITING = "WaitingForTopology"
# On the node Job's pod template (so on every pod): where gangctl placed the gang, `<label>=<value>`,
# or `*` for a preferred intent placed on the whole cluster (no domain held it).
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
    level: str | None          # the node label of the chosen domain's level (None: the whole cluster)
    domain: str | None         # the label's value
    nodes: tuple[str, ...] = field(default=())   # the domain's nodes (what a node affinity would name)
    stranded_gpus: Fraction | int = 0


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
        stranded = self.stranded(floor)
        return Placed(self.label if self.value is not None else None, self.value,
                      tuple(sorted(n.name for n in self.nodes)), _plain(stranded))


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
        whole = _Domain("", None, tuple(nodes))
        if whole.room(floor) >= floor.pods:
            return whole.placed(floor)
    elif not any(d.room(floor, now=False) >= floor.pods for d in level_domains):
        return Unsatisfiable(UNSATISFIABLE, _never_message(level_domains, name, floor))
    return Waiting(WAITING, _waiting_message(level_domains, name, floor))


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
class NeedNodes:
    """The decision needs the cluster's nodes and their pods to choose (the caller lists them)."""


def places_itself(backend, intent: PlacementIntent, topology: Topology) -> bool:
    """Whether the backend's scheduler takes this intent (levels as node labels) on its own objects."""
    return bool(base.placement_spec(backend, intent, topology) or base.placement_annotations(backend, intent))


def pin(template: dict, observed_template: dict | None, intent: PlacementIntent, topology: Topology,
        floor: Floor, rooms: list[NodeRoom] | None) -> dict | NeedNodes | Waiting | Unsatisfiable:
    """The node job's pod `template` pinned for `intent` (levels as node labels): to the domain the
    observed Job's template was pinned to, when there is one; else to the one `choose` picks from
    `rooms` (None: not listed yet, `NeedNodes`)."""
    marked = ((observed_template or {}).get("metadata") or {}).get("annotations", {}).get(PLACEMENT_ANNOTATION)
    if marked is not None:
        return pinned(template, marked, required=intent.required is not None)
    if rooms is None:
        return NeedNodes()
    chosen = choose(rooms, topology, intent, floor)
    if not isinstance(chosen, Placed):
        return chosen
    mark = ANYWHERE if chosen.domain is None else f"{chosen.level}={chosen.domain}"
    return pinned(template, mark, required=intent.required is not None)


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
    expression = {"key": label, "operator": "In", "values": [value]}
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
