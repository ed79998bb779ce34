"""The cluster's topology and a job's placement intent (pure: no I/O).

The topology is the quota policy file's `topology:` section: levels from the widest to the narrowest
(e.g. block, rack, host), each a node label whose value names the node's domain at that level.
`check_nodes` says whether the nodes carry it: every node labelled at every level, and every domain
inside exactly one domain of the level above (a rack in one block).

A placement intent is what one job asks for, read from the vocabularies users already write
(`read_intent`): Kueue's podset topology annotations and KAI's topology annotations on the pod
template, and Trainer's `podGroupPolicy.volcano.networkTopology`. The annotations name levels by node
label; Volcano names them by HyperNode tier (tier 1 the narrowest level above the hosts, counting up
towards the widest),
so a Volcano intent is a tier number until `PlacementIntent.on(topology)` turns every level into the
topology's node label, refusing a level the topology does not have.
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace

from pydantic import BaseModel, ConfigDict, Field, model_validator
from pydantic.alias_generators import to_camel

# Kueue Topology Aware Scheduling: the pod template annotations of a pod set.
KUEUE_REQUIRED = "kueue.x-k8s.io/podset-required-topology"
KUEUE_PREFERRED = "kueue.x-k8s.io/podset-preferred-topology"
KUEUE_SLICE_REQUIRED = "kueue.x-k8s.io/podset-slice-required-topology"
KUEUE_SLICE_SIZE = "kueue.x-k8s.io/podset-slice-size"
# KAI Scheduler: the topology to use and the required (upper bound) and preferred levels.
KAI_TOPOLOGY = "kai.scheduler/topology"
KAI_REQUIRED = "kai.scheduler/topology-required-placement"
KAI_PREFERRED = "kai.scheduler/topology-preferred-placement"
VOLCANO_FIELD = "podGroupPolicy.volcano.networkTopology"
HOSTNAME = "kubernetes.io/hostname"


def level_label(name: str) -> str:
    """The node label naming a node's domain at the level `name` on gangctl's local and simulated
    clusters (`gangctl cluster up --topology`, simulator scenarios): `topology.gangctl.io/<name>`."""
    return f"topology.gangctl.io/{name}"


class TopologyError(ValueError):
    """A job's placement intent cannot be read or does not fit the cluster's topology; the message
    names the field(s) and the value."""


class TopologyLevel(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True, alias_generator=to_camel, frozen=True)

    name: str = Field(min_length=1, description="the level's name in gangctl's messages, e.g. rack")
    node_label: str = Field(min_length=1, description="the node label whose value names a node's domain at this level")


class Topology(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True, alias_generator=to_camel, frozen=True)

    name: str = Field("default", min_length=1,
                      description="the name of the backends' topology objects (Kueue and KAI Topology)")
    levels: list[TopologyLevel] = Field(min_length=1, description="from the widest (e.g. block) to the narrowest (e.g. host)")
    node_labels: dict[str, str] = Field(
        default_factory=dict, description="labels every node of the topology carries (Kueue: the ResourceFlavor's "
                                          "nodeLabels, which a flavor with a topology must have)")

    @model_validator(mode="after")
    def _unique(self) -> Topology:
        for attribute, field_name in (("name", "name"), ("node_label", "nodeLabel")):
            values = [getattr(level, attribute) for level in self.levels]
            twice = sorted({v for v in values if values.count(v) > 1})
            if twice:
                raise ValueError(f"topology levels: {field_name} {twice[0]!r} appears twice")
        return self

    def level(self, ref: str) -> TopologyLevel | None:
        """The level named `ref` by its name or its node label."""
        return next((lv for lv in self.levels if ref in (lv.name, lv.node_label)), None)

    @property
    def tiered(self) -> list[TopologyLevel]:
        """The levels that are Volcano HyperNode tiers: all but a host level (a node is not a HyperNode)."""
        return [lv for lv in self.levels if lv.node_label != HOSTNAME]

    def tier_level(self, tier: int) -> TopologyLevel | None:
        """Volcano's HyperNode tier `tier` (1 = the narrowest level above the hosts)."""
        index = len(self.tiered) - tier
        return self.tiered[index] if 0 <= index < len(self.tiered) else None

    def tier_of(self, level: TopologyLevel) -> int | None:
        return len(self.tiered) - self.tiered.index(level) if level in self.tiered else None


def _node_name(node: Mapping) -> str:
    return (node.get("metadata") or {}).get("name", "?")


def _node_labels(node: Mapping) -> Mapping[str, str]:
    return (node.get("metadata") or {}).get("labels") or {}


def check_nodes(topology: Topology, nodes: Iterable[Mapping]) -> list[str]:
    """What is wrong with the nodes (Node objects) for `topology`, one message each: a node without a
    level's label, a domain split over two domains of the level above. Empty: they carry it."""
    problems: list[str] = []
    parent_of: dict[tuple[int, str], tuple[str, str]] = {}  # (level index, domain) -> (parent, first node)
    for node in nodes:
        name, labels = _node_name(node), _node_labels(node)
        missing = [lv.node_label for lv in topology.levels if lv.node_label not in labels]
        if missing:
            problems.append(f"node {name}: no label {', '.join(missing)} (topology levels "
                            f"{', '.join(lv.name for lv in topology.levels)})")
            continue
        for i in range(1, len(topology.levels)):
            level, above = topology.levels[i], topology.levels[i - 1]
            domain, parent = labels[level.node_label], labels[above.node_label]
            seen = parent_of.setdefault((i, domain), (parent, name))
            if seen[0] != parent:
                problems.append(f"node {name}: {level.node_label}={domain} is in {above.node_label}={parent}, "
                                f"but node {seen[1]} puts it in {above.node_label}={seen[0]} (a {level.name} "
                                f"must lie inside one {above.name})")
    return problems


@dataclass(frozen=True)
class PlacementIntent:
    """One job's placement: the level all its pods must share (`required`), the level they should
    share if they can (`preferred`), and optionally slices of `slice_size` pods each inside one domain
    of `slice_level`. A level is a node label, or a Volcano tier number until `on(topology)`.
    `fields` maps each set attribute to the field it was read from (for messages)."""
    required: str | int | None = None
    preferred: str | int | None = None
    slice_level: str | None = None
    slice_size: int | None = None
    fields: tuple[tuple[str, str], ...] = ()

    def field_of(self, attribute: str) -> str:
        return dict(self.fields).get(attribute, attribute)

    def on(self, topology: Topology) -> PlacementIntent:
        """The intent with every level the topology's node label; TopologyError naming a level the
        topology does not have."""
        changes = {}
        for attribute in ("required", "preferred", "slice_level"):
            ref = getattr(self, attribute)
            if ref is None:
                continue
            level = topology.tier_level(ref) if isinstance(ref, int) else topology.level(ref)
            if level is None:
                known = ", ".join(f"{lv.name} ({lv.node_label}" + (f", tier {topology.tier_of(lv)})" if topology.tier_of(lv)
                                                                   else ")") for lv in topology.levels)
                shown = f"tier {ref}" if isinstance(ref, int) else repr(ref)
                raise TopologyError(f"{self.field_of(attribute)}: {shown} is not a level of the cluster's "
                                    f"topology {topology.name} (levels: {known})")
            changes[attribute] = level.node_label
        intent = replace(self, **changes)
        _check_nesting(intent, topology)
        return intent


def _check_nesting(intent: PlacementIntent, topology: Topology) -> None:
    labels = [lv.node_label for lv in topology.levels]
    widest = intent.required if intent.required is not None else intent.preferred
    for narrower in ("preferred", "slice_level"):
        ref = getattr(intent, narrower)
        if widest is None or ref is None or ref == widest:
            continue
        if labels.index(str(ref)) < labels.index(str(widest)):
            raise TopologyError(f"{intent.field_of(narrower)}: {ref} is wider than "
                                f"{intent.field_of('required' if intent.required is not None else 'preferred')}: "
                                f"{widest}")


def _slice_size(annotations: Mapping[str, str]) -> int:
    raw = annotations[KUEUE_SLICE_SIZE]
    try:
        size = int(raw)
    except ValueError:
        size = 0
    if size < 1:
        raise TopologyError(f"annotation {KUEUE_SLICE_SIZE}: {raw!r} is not a positive number of pods")
    return size


def _kueue(annotations: Mapping[str, str]) -> PlacementIntent | None:
    present = [key for key in (KUEUE_REQUIRED, KUEUE_PREFERRED, KUEUE_SLICE_REQUIRED, KUEUE_SLICE_SIZE)
               if key in annotations]
    if not present:
        return None
    if KUEUE_REQUIRED in annotations and KUEUE_PREFERRED in annotations:
        raise TopologyError(f"annotations {KUEUE_REQUIRED} and {KUEUE_PREFERRED}: give one of them")
    if (KUEUE_SLICE_REQUIRED in annotations) != (KUEUE_SLICE_SIZE in annotations):
        given, lacking = ((KUEUE_SLICE_REQUIRED, KUEUE_SLICE_SIZE) if KUEUE_SLICE_REQUIRED in annotations
                          else (KUEUE_SLICE_SIZE, KUEUE_SLICE_REQUIRED))
        raise TopologyError(f"annotation {given} needs {lacking} too")
    fields = [(attr, f"annotation {key}") for attr, key in
              (("required", KUEUE_REQUIRED), ("preferred", KUEUE_PREFERRED), ("slice_level", KUEUE_SLICE_REQUIRED),
               ("slice_size", KUEUE_SLICE_SIZE)) if key in annotations]
    return PlacementIntent(
        required=annotations.get(KUEUE_REQUIRED), preferred=annotations.get(KUEUE_PREFERRED),
        slice_level=annotations.get(KUEUE_SLICE_REQUIRED),
        slice_size=_slice_size(annotations) if KUEUE_SLICE_SIZE in annotations else None, fields=tuple(fields))


def _kai(annotations: Mapping[str, str]) -> PlacementIntent | None:
    if KAI_REQUIRED not in annotations and KAI_PREFERRED not in annotations:
        return None
    fields = [(attr, f"annotation {key}") for attr, key in (("required", KAI_REQUIRED), ("preferred", KAI_PREFERRED))
              if key in annotations]
    return PlacementIntent(required=annotations.get(KAI_REQUIRED), preferred=annotations.get(KAI_PREFERRED),
                           fields=tuple(fields))


def _volcano(network_topology: Mapping | None) -> PlacementIntent | None:
    if not network_topology:
        return None
    mode = network_topology.get("mode", "hard")
    tier = network_topology.get("highestTierAllowed", 1)
    if mode not in ("hard", "soft"):
        raise TopologyError(f"{VOLCANO_FIELD}.mode: {mode!r} is not hard or soft")
    if not isinstance(tier, int) or isinstance(tier, bool) or tier < 1:
        raise TopologyError(f"{VOLCANO_FIELD}.highestTierAllowed: {tier!r} is not a tier (1 or more)")
    attribute = "required" if mode == "hard" else "preferred"
    return PlacementIntent(**{attribute: tier}, fields=((attribute, f"{VOLCANO_FIELD} (mode {mode})"),))


def _agree(a: PlacementIntent, b: PlacementIntent) -> PlacementIntent:
    """One intent from two vocabularies; TopologyError naming both fields where they differ."""
    merged = {}
    for attribute in ("required", "preferred", "slice_level", "slice_size"):
        x, y = getattr(a, attribute), getattr(b, attribute)
        if x is not None and y is not None and x != y:
            raise TopologyError(f"{a.field_of(attribute)}: {x} and {b.field_of(attribute)}: {y} disagree; "
                                f"give the placement once")
        merged[attribute] = x if x is not None else y
    named = {attr for attr, _ in a.fields}
    return PlacementIntent(**merged, fields=a.fields + tuple(f for f in b.fields if f[0] not in named))


def read_intent(annotations: Mapping[str, str] | None, network_topology: Mapping | None = None) -> PlacementIntent | None:
    """The placement intent of a job whose pod template carries `annotations` and whose Volcano
    settings carry `network_topology` (None: the job asks for no placement). Vocabularies that
    disagree on one job raise TopologyError naming both fields. A Volcano tier and an annotation's
    level cannot be compared without the topology, so giving both is refused too."""
    annotations = annotations or {}
    found = [intent for intent in (_kueue(annotations), _kai(annotations)) if intent is not None]
    volcano = _volcano(network_topology)
    if volcano is not None and found:
        other = found[0]
        raise TopologyError(f"{volcano.fields[0][1]} and {other.fields[0][1]} both give the job's placement; "
                            f"give it once")
    if volcano is not None:
        return volcano
    if not found:
        return None
    return found[0] if len(found) == 1 else _agree(found[0], found[1])


def template_intent(pod_template: Mapping, network_topology: Mapping | None = None) -> PlacementIntent | None:
    """The placement intent of a job from its (node job's or replica's) pod template annotations and
    its Volcano `networkTopology` (a TrainJob's runtime; None for a PyTorchJob, whose replica templates
    carry the annotations only)."""
    return read_intent((pod_template.get("metadata") or {}).get("annotations"), network_topology)
