"""Whether a local process still runs, read from /proc (Linux); shared by everything that starts
and stops local processes (the cluster's components, the extra schedulers, the node agents)."""
from __future__ import annotations

from pathlib import Path


def running(pid: int) -> bool:
    """Alive and not a zombie waiting to be reaped (kill(pid, 0) succeeds for zombies too)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def running_from(pid_file: Path) -> bool:
    """`running` for the pid recorded in `pid_file`; False if the file is missing or garbled."""
    try:
        return running(int(pid_file.read_text().strip()))
    except (OSError, ValueError):
        return False
