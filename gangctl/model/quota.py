"""The quota policy file (`policies/*.yaml`): teams, their namespaces, quotas, cohorts, priorities,
and optionally the cluster's topology (gangctl.model.topology).

The file speaks in GPUs, CPU cores and GiB of memory. `QuotaPolicy.to_quotas(scale)` compiles it
into the plain `admission.Quotas` that `admission.decide` reads, in the integer units the caller
works in. Reading the YAML is the caller's job (`QuotaPolicy.model_validate(yaml.safe_load(...))`);
this module does no I/O. `policies/schema.json` is `QuotaPolicy.model_json_schema(by_alias=True)`.
"""
from __future__ import annotations

from typing import Literal, Mapping

from pydantic import BaseModel, ConfigDict, Field, NonNegativeFloat, model_validator
from pydantic.alias_generators import to_camel

from gangctl.api.quantity import parse_quantity
from gangctl.model.admission import CPU, GPU, MEMORY, Quotas, Reclaim, TeamQuota, Workload
from gangctl.model.topology import Topology

_FIELD_RESOURCES = {"gpu": GPU, "cpu": CPU, "memory": MEMORY}

# The units of amounts parsed from Kubernetes quantities (GPUs, cores, bytes), per quota-file unit:
# `policy.to_quotas(QUANTITY_UNITS)` for workloads made by `podgroup_workload`.
QUANTITY_UNITS = {GPU: 1, CPU: 1, MEMORY: 2**30}


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True, alias_generator=to_camel, frozen=True)


class Resources(_Model):
    """An amount per resource; a resource left out is not limited."""

    gpu: NonNegativeFloat | None = Field(None, description="nvidia.com/gpu, in GPUs")
    cpu: NonNegativeFloat | None = Field(None, description="CPU cores")
    memory: NonNegativeFloat | None = Field(None, description="memory in GiB")

    def scaled(self, scale: dict[str, int]) -> dict[str, int | float]:
        out: dict[str, int | float] = {}
        for name, resource in _FIELD_RESOURCES.items():
            value = getattr(self, name)
            if value is not None:
                v = value * scale.get(resource, 1)
                out[resource] = int(v) if float(v).is_integer() else v
        return out


class Preemption(_Model):
    within_team: Literal["Never", "LowerPriority"] = Field(
        "Never", description="evict lower-priority gangs of the same team (Kueue withinClusterQueue)")
    reclaim_within_cohort: Reclaim = Field(
        Reclaim.NEVER, description="evict borrowing gangs of cohort members to get back lent quota")


class Team(_Model):
    name: str = Field(min_length=1)
    namespaces: list[str] = Field(default_factory=list, description="namespaces whose TrainJobs count against this team (default: the team name)")
    cohort: str | None = Field(None, description="teams in one cohort lend each other unused quota")
    nominal: Resources
    borrowing_limit: Resources | None = Field(None, description="most this team may use above nominal (absent: no limit)")
    lending_limit: Resources | None = Field(None, description="most of its unused nominal quota this team lends (absent: all)")
    queueing: Literal["StrictFIFO", "BestEffortFIFO"] = "StrictFIFO"
    preemption: Preemption = Field(default_factory=Preemption)
    default_priority: str | None = Field(None, description="priority class of this team's jobs that name none")

    @model_validator(mode="after")
    def _limits_need_cohort(self) -> Team:
        if self.cohort is None and (self.borrowing_limit or self.lending_limit):
            raise ValueError(f"team {self.name}: borrowingLimit/lendingLimit need a cohort")
        if self.lending_limit:
            for name in _FIELD_RESOURCES:
                lend, nominal = getattr(self.lending_limit, name), getattr(self.nominal, name)
                if lend is not None and (nominal is None or lend > nominal):
                    raise ValueError(f"team {self.name}: lendingLimit.{name} exceeds nominal.{name}")
        return self


class QuotaPolicy(_Model):
    priorities: dict[str, int] = Field(default_factory=lambda: {"default": 0},
                                       description="priority class name -> value (higher goes first)")
    default_priority: str = "default"
    teams: list[Team] = Field(min_length=1)
    topology: Topology | None = Field(None, description="the cluster's topology levels, widest first (absent: gangctl "
                                                         "places no gang by topology)")

    @model_validator(mode="after")
    def _consistent(self) -> QuotaPolicy:
        names = [t.name for t in self.teams]
        if len(set(names)) != len(names):
            raise ValueError("team names must be unique")
        seen: dict[str, str] = {}
        for t in self.teams:
            for ns in t.namespaces or [t.name]:
                if ns in seen:
                    raise ValueError(f"namespace {ns} belongs to both {seen[ns]} and {t.name}")
                seen[ns] = t.name
        for where, cls in [("defaultPriority", self.default_priority)] + [
                (f"team {t.name} defaultPriority", t.default_priority) for t in self.teams if t.default_priority]:
            if cls not in self.priorities:
                raise ValueError(f"{where}: unknown priority class {cls!r}")
        return self

    def team_of_namespace(self, namespace: str) -> str | None:
        for t in self.teams:
            if namespace in (t.namespaces or [t.name]):
                return t.name
        return None

    def priority_of(self, team: str, priority_class: str | None = None) -> int:
        """The priority value of a job; unknown class names raise KeyError."""
        if priority_class is None:
            t = next((t for t in self.teams if t.name == team), None)
            priority_class = (t.default_priority if t else None) or self.default_priority
        return self.priorities[priority_class]

    def to_quotas(self, scale: dict[str, int] | None = None) -> Quotas:
        """Compile for `admission.decide`; `scale` = caller units per file unit, e.g. {"cpu": 1000}."""
        sc = scale or {}
        return Quotas(
            teams={t.name: TeamQuota(
                name=t.name,
                nominal=t.nominal.scaled(sc),
                cohort=t.cohort,
                borrowing_limit=t.borrowing_limit.scaled(sc) if t.borrowing_limit else {},
                lending_limit=t.lending_limit.scaled(sc) if t.lending_limit else {},
                best_effort=t.queueing == "BestEffortFIFO",
                preempt_within_team=t.preemption.within_team == "LowerPriority",
                reclaim=t.preemption.reclaim_within_cohort,
            ) for t in self.teams},
            scale=dict(sc),
        )


def podgroup_workload(policy: QuotaPolicy, podgroup: Mapping, *, created: float,
                      priority_class: str | None = None) -> Workload | None:
    """A gang's PodGroup as quota admission sees it (amounts in QUANTITY_UNITS).

    The team is the one owning the PodGroup's namespace (None: no team, the gang is not under
    quota); the requests are `spec.minResources`; `created` orders the team's queue (FIFO) and
    `priority_class` is the pods' priorityClassName (None: the team's default)."""
    meta = podgroup["metadata"]
    team = policy.team_of_namespace(meta["namespace"])
    if team is None:
        return None
    spec = podgroup.get("spec") or {}
    requests = {r: parse_quantity(q) for r, q in (spec.get("minResources") or {}).items()}
    return Workload(f"{meta['namespace']}/{meta['name']}", team, policy.priority_of(team, priority_class),
                    created, requests)
