"""What this machine offers a process node by default."""
from __future__ import annotations

import os


def machine_cpu() -> str:
    return str(len(os.sched_getaffinity(0)))


def machine_memory() -> str:
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemTotal:"):
                return f"{int(line.split()[1])}Ki"
    return "1Gi"
