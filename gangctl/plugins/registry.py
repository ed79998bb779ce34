"""Scheduler backends by the name a runtime's podGroupPolicy uses."""
from __future__ import annotations

from gangctl.plugins.base import GangBackend
from gangctl.plugins.coscheduling import Coscheduling

BACKENDS: dict[str, GangBackend] = {
    "coscheduling": Coscheduling(),
}


def backend_for(name: str | None) -> GangBackend | None:
    """The backend a runtime names, None for a job without a gang; KeyError if unsupported."""
    if name is None:
        return None
    if name not in BACKENDS:
        raise KeyError(f"spec.podGroupPolicy.{name}: this backend is not supported yet "
                       f"(supported: {', '.join(sorted(BACKENDS))})")
    return BACKENDS[name]


def _all_backends() -> dict[str, GangBackend]:
    from gangctl.plugins.kueue import Kueue
    from gangctl.plugins.volcano import Volcano

    return {**BACKENDS, "volcano": Volcano(), "kueue": Kueue()}


# Every backend that has a builder. The reconciler serves BACKENDS; volcano and kueue join it once
# the reconciler handles a backend without a PodGroup (Kueue) and watches Volcano's PodGroup phase.
ALL_BACKENDS: dict[str, GangBackend] = _all_backends()
