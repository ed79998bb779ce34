"""Scheduler backends by the name a runtime's podGroupPolicy uses.

The names are gangctl.api.runtime.GANG_BACKENDS (the API validates against them, below every other
layer); this registry gives each name its implementation, and refuses at import a name without
one or an implementation without a name, so the two cannot drift apart.
"""
from __future__ import annotations

from gangctl.api.runtime import GANG_BACKENDS
from gangctl.plugins.base import GangBackend
from gangctl.plugins.coscheduling import Coscheduling
from gangctl.plugins.kai import Kai
from gangctl.plugins.kueue import Kueue
from gangctl.plugins.native import Native
from gangctl.plugins.volcano import Volcano


def _registry(implementations: tuple[GangBackend, ...]) -> dict[str, GangBackend]:
    by_name = {b.name: b for b in implementations}
    if sorted(by_name) != sorted(GANG_BACKENDS) or len(by_name) != len(implementations):
        raise RuntimeError(f"gang backends {sorted(GANG_BACKENDS)} and their implementations "
                           f"{[b.name for b in implementations]} differ")
    return {name: by_name[name] for name in GANG_BACKENDS}


BACKENDS: dict[str, GangBackend] = _registry((Coscheduling(), Volcano(), Kueue(), Native(), Kai()))


def backend_for(name: str | None) -> GangBackend | None:
    """The backend a runtime names, None for a job without a gang; KeyError if unsupported."""
    if name is None:
        return None
    if name not in BACKENDS:
        raise KeyError(f"spec.podGroupPolicy.{name}: this backend is not supported "
                       f"(supported: {', '.join(sorted(BACKENDS))})")
    return BACKENDS[name]
