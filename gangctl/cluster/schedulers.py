"""Extra scheduler backends beside kwokctl's components: Kueue, Volcano, KAI Scheduler or upstream
kube-scheduler with gang scheduling (native), as local processes.

`cluster up --scheduler kueue|volcano|kai|native` builds the backend (once, cached), writes its configuration,
starts its processes detached with their pids in <cache>/schedulers/<cluster>/pids (so `cluster down`
stops them, like the node agents), and installs its CRDs (read from the Go module cache) and any
webhook configuration. The coscheduling scheduler of the base cluster keeps running either way:
it is the cluster's default scheduler.
"""
from __future__ import annotations

import os
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from gangctl.config import ClusterSettings
from gangctl.processes import running

LOOPBACK = "127.0.0.1"


@dataclass(frozen=True)
class Process:
    name: str
    argv: list[str]
    env: dict[str, str]


def state_dir(settings: ClusterSettings) -> Path:
    return settings.cache_dir / "schedulers" / settings.cluster_name


def spawn(state: Path, proc: Process) -> int:
    (state / "pids").mkdir(parents=True, exist_ok=True)
    (state / "logs").mkdir(parents=True, exist_ok=True)
    with (state / "logs" / f"{proc.name}.log").open("ab") as out:
        child = subprocess.Popen(proc.argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                 env=proc.env, start_new_session=True)
    (state / "pids" / f"{proc.name}.pid").write_text(str(child.pid))
    return child.pid


def pids(state: Path) -> dict[str, int]:
    out = {}
    for f in sorted((state / "pids").glob("*.pid")) if (state / "pids").exists() else []:
        try:
            out[f.stem] = int(f.read_text())
        except ValueError:
            continue
    return out


def stop(state: Path, grace: float = 10) -> list[str]:
    """SIGTERM every recorded process, SIGKILL what is left after `grace`; returns their names."""
    found = pids(state)
    for pid in found.values():
        _kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while any(running(p) for p in found.values()) and time.monotonic() < deadline:
        time.sleep(0.1)
    for pid in found.values():
        if running(pid):
            _kill(pid, signal.SIGKILL)
    for name in found:
        (state / "pids" / f"{name}.pid").unlink(missing_ok=True)
    return sorted(found)


def _kill(pid: int, sig: int) -> None:
    try:
        os.killpg(pid, sig)  # the process and anything it started (its own session)
    except OSError:
        try:
            os.kill(pid, sig)
        except OSError:
            pass


def components(state: Path) -> list[dict]:
    return [{"name": name, "running": running(pid)} for name, pid in pids(state).items()]


def chosen(settings: ClusterSettings) -> str:
    """The scheduler the cluster was brought up with (coscheduling when none was recorded)."""
    f = state_dir(settings) / "scheduler"
    return f.read_text().strip() if f.exists() else "coscheduling"


def record_choice(settings: ClusterSettings, scheduler: str) -> None:
    state_dir(settings).mkdir(parents=True, exist_ok=True)
    (state_dir(settings) / "scheduler").write_text(scheduler + "\n")


