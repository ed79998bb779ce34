"""Pure: a topology replay's placement, measured on the real pods, beside the simulator's.

For each replayed job: the domains its pods ran in, at the level its intent names (the narrowest
level for a job that asks nothing), read from the bound pods' nodes and the nodes' labels. Grouped
by kind of ask as the simulator's summary groups them (`gangctl.sim.metrics.topology_summary`):
the jobs, the multi-pod gangs, the mean domains they spanned, their queueing delay, and the required
gangs that spanned more than one domain. And the stranded GPUs over the run (`stranded_gpus_mean`),
by the simulator's definition (`gangctl.sim.model.Cluster.stranded_gpus`), rebuilt from each gang's
pods' nodes and its bound and finished times.
"""
from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from gangctl.model.admission import GPU
from gangctl.model.names import TRAINJOB_NAME
from gangctl.validate.measure import RealOutcome, stats


def domains_by_trainjob(pods: Iterable[Mapping], nodes: Iterable[Mapping],
                        label_of: Mapping[str, str]) -> dict[str, int]:
    """TrainJob name -> how many domains its bound pods ran in: the values of the node label
    `label_of[name]` (the level its intent names) over its pods' nodes."""
    labels = {n["metadata"]["name"]: (n["metadata"].get("labels") or {}) for n in nodes}
    seen: dict[str, set[str]] = {}
    for pod in pods:
        meta, node = pod["metadata"], (pod.get("spec") or {}).get("nodeName")
        name = (meta.get("labels") or {}).get(TRAINJOB_NAME)
        if name in label_of and node:
            seen.setdefault(name, set()).add(labels.get(node, {}).get(label_of[name], "?"))
    return {name: len(values) for name, values in seen.items()}


@dataclass(frozen=True)
class GangSpan:
    """One replayed gang as the real run had it: the node of each of its pods (one entry per pod), the
    GPUs each pod took, when it was submitted, bound and finished (seconds, one clock for all; None:
    never), and the node label of the level it requires (None: it requires none)."""
    nodes: tuple[str, ...]
    gpus_per_pod: int
    submitted: float
    bound: float | None
    finished: float | None
    required: str | None = None
    pods: int = 0                    # its floor: the pods it waits for (0: as many as `nodes`)


def pods_by_trainjob(pods: Iterable[Mapping]) -> dict[str, list[str]]:
    """TrainJob name -> the nodes its bound pods ran on (one entry per pod; failed pods left out: a
    replayed gang's pods run once)."""
    out: dict[str, list[str]] = {}
    for pod in pods:
        name = (pod["metadata"].get("labels") or {}).get(TRAINJOB_NAME)
        node = (pod.get("spec") or {}).get("nodeName")
        if name and node and (pod.get("status") or {}).get("phase") != "Failed":
            out.setdefault(name, []).append(node)
    return out


def stranded_gpus_mean(nodes: Iterable[Mapping], levels: Sequence[str], gangs: Iterable[GangSpan],
                       sample_seconds: float) -> float:
    """The free GPUs in narrowest-level domains that hold none of the gangs waiting for a required
    level, sampled every `sample_seconds` from the first submission to the last finish, as the
    simulator samples its own (`levels`: the node labels, widest first). A gang waits from submitted
    to bound and occupies its pods' nodes from bound (`_occupancy`); with no required gang waiting
    nothing is stranded. Nodes without every level's label are in no domain."""
    gangs = list(gangs)
    nodes = list(nodes)
    labels = {n["metadata"]["name"]: (n["metadata"].get("labels") or {}) for n in nodes}
    capacity = {n["metadata"]["name"]: _gpus((n.get("status") or {}).get("allocatable") or {}) for n in nodes
                if all(lv in labels[n["metadata"]["name"]] for lv in levels)}
    if not gangs or not levels or not capacity:
        return 0.0
    start = min(g.submitted for g in gangs)
    end = max((g.finished for g in gangs if g.finished is not None), default=start)
    samples = [start + i * sample_seconds for i in range(max(1, math.ceil((end - start) / sample_seconds)))]
    held = _occupancy(gangs, capacity)
    total = 0
    for t in samples:
        free = {node: cap - sum(gpus for since, until, gpus in held.get(node, ()) if since <= t < until)
                for node, cap in capacity.items()}
        waiting: dict[tuple[str, int], int] = {}
        for g in gangs:
            if g.required and g.submitted <= t and (g.bound is None or t < g.bound):
                key, pods = (g.required, g.gpus_per_pod), g.pods or len(g.nodes)
                waiting[key] = min(pods, waiting.get(key, pods))
        total += _stranded(free, labels, levels, waiting)
    return total / len(samples)


def _occupancy(gangs: list[GangSpan], capacity: Mapping[str, int]) -> dict[str, list[tuple[float, float, int]]]:
    """Node -> (from, until, GPUs) of each pod on it. A pod holds its node from its gang's bound time
    until its gang was seen finished, or until a later pod was bound there that needed its room: the
    scheduler binds only into free room, so the earlier pod had exited by then (a gang is seen
    finished about a second after its pods exit). The earliest bound gives way first."""
    by_node: dict[str, list[tuple[float, float, int]]] = {}
    for g in gangs:
        if g.bound is None:
            continue
        for node in g.nodes:
            if node in capacity:
                by_node.setdefault(node, []).append((g.bound, math.inf if g.finished is None else g.finished,
                                                     g.gpus_per_pod))
    out: dict[str, list[tuple[float, float, int]]] = {}
    for node, pods in by_node.items():
        done: list[tuple[float, float, int]] = []
        active: list[tuple[float, float, int]] = []
        for since, until, gpus in sorted(pods):
            done += [a for a in active if a[1] <= since]
            active = [a for a in active if a[1] > since]
            while active and sum(a[2] for a in active) + gpus > capacity[node]:
                first = active.pop(0)
                done.append((first[0], since, first[2]))
            active.append((since, until, gpus))
        out[node] = done + active
    return out


def _stranded(free: Mapping[str, int], labels: Mapping[str, Mapping[str, str]], levels: Sequence[str],
              waiting: Mapping[tuple[str, int], int]) -> int:
    if not waiting:
        return 0
    members: dict[tuple[str, str], list[str]] = {}
    for node in free:
        for label in levels:
            members.setdefault((label, labels[node][label]), []).append(node)
    useful = {(label, value) for (label, gpp), pods in waiting.items()
              for (lv, value), names in members.items() if lv == label
              and sum(max(0, free[n]) // gpp for n in names) >= pods}
    narrowest, wanted = levels[-1], {label for label, _ in waiting}
    return sum(sum(free[n] for n in names) for (label, value), names in members.items() if label == narrowest
               and not any((w, labels[names[0]][w]) in useful for w in wanted))


def _gpus(resources: Mapping) -> int:
    try:
        return int(str(resources.get(GPU, 0)))
    except ValueError:
        return 0


def real_topology(kinds: Mapping[str, str], pods_of: Mapping[str, int], domains: Mapping[str, int],
                  outcomes: Iterable[RealOutcome], levels: list[str]) -> dict:
    """The replay's topology summary: `kinds` job id -> its ask ("" none), `pods_of` job id -> its
    pods, `domains` job id -> domains spanned (`domains_by_trainjob`, keyed by job id)."""
    outcomes = list(outcomes)
    by_kind: dict[str, dict] = {}
    violations = 0
    for kind in sorted({k or "none" for k in kinds.values()}):
        ids = [j for j, k in kinds.items() if (k or "none") == kind]
        spans = [domains[j] for j in ids if pods_of[j] > 1 and j in domains]
        violations += sum(1 for s in spans if s > 1) if kind.startswith("required") else 0
        delays = [o.queue_delay for o in outcomes if o.job_id in set(ids) and o.queue_delay is not None]
        by_kind[kind] = {"jobs": len(ids), "gang_starts": len(spans),
                         "mean_domains": statistics.fmean(spans) if spans else None,
                         "queue_delay_seconds": stats(delays)}
    return {"levels": levels, "required_violations": violations, "by_ask": by_kind}


def mean_topology(summaries: list[dict]) -> dict:
    """The simulator's topology summaries of several draws, averaged: per kind of ask the mean domains
    and the queueing delay's mean, p50 and p95; the violations of all draws together."""
    first = summaries[0]
    by_kind = {}
    for kind in first["by_ask"]:
        rows = [s["by_ask"][kind] for s in summaries if kind in s["by_ask"]]
        spans = [r["mean_domains"] for r in rows if r["mean_domains"] is not None]
        delay = {stat: _mean([r["queue_delay_seconds"][stat] for r in rows]) for stat in ("mean", "p50", "p95")}
        by_kind[kind] = {"jobs": first["by_ask"][kind]["jobs"], "gang_starts": first["by_ask"][kind]["gang_starts"],
                         "mean_domains": _mean(spans), "queue_delay_seconds": delay}
    return {"levels": first["levels"], "required_violations": sum(s["required_violations"] for s in summaries),
            "by_ask": by_kind, "stranded_gpus_mean": _mean([s["stranded_gpus_mean"] for s in summaries])}


def _mean(values: list) -> float | None:
    known = [v for v in values if v is not None]
    return statistics.fmean(known) if known else None
