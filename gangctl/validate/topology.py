"""Pure: a topology replay's placement, measured on the real pods, beside the simulator's.

For each replayed job: the domains its pods ran in, at the level its intent names (the narrowest
level for a job that asks nothing), read from the bound pods' nodes and the nodes' labels. Grouped
by kind of ask as the simulator's summary groups them (`gangctl.sim.metrics.topology_summary`):
the jobs, the multi-pod gangs, the mean domains they spanned, their queueing delay, and the required
gangs that spanned more than one domain.
"""
from __future__ import annotations

import statistics
from collections.abc import Iterable, Mapping

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
