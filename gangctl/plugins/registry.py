"""Scheduler backends by the name a runtime's podGroupPolicy uses."""
from __future__ import annotations

from gangctl.plugins.base import GangBackend
from gangctl.plugins.coscheduling import Coscheduling
from gangctl.plugins.kai import Kai
from gangctl.plugins.kueue import Kueue
from gangctl.plugins.native import Native
from gangctl.plugins.volcano import Volcano

BACKENDS: dict[str, GangBackend] = {
    "coscheduling": Coscheduling(),
    "volcano": Volcano(),
    "kueue": Kueue(),
    "native": Native(),
    "kai": Kai(),
}


def backend_for(name: str | None) -> GangBackend | None:
    """The backend a runtime names, None for a job without a gang; KeyError if unsupported."""
    if name is None:
        return None
    if name not in BACKENDS:
        raise KeyError(f"spec.podGroupPolicy.{name}: this backend is not supported "
                       f"(supported: {', '.join(sorted(BACKENDS))})")
    return BACKENDS[name]
