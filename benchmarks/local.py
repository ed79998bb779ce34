"""What the benchmarks share: a local cluster of their own with `gangctl controller` serving it."""
from __future__ import annotations

import contextlib
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Callable, Iterator

from gangctl.cluster.lifecycle import UpOptions, down, up
from gangctl.cluster.local import LocalCluster
from gangctl.config import ClusterSettings
from gangctl.processes import ControllerProcess


@contextlib.contextmanager
def own_cluster(name: str, make: Callable[[ClusterSettings], LocalCluster], say: Callable[[str], None], *,
                keep: bool = False) -> Iterator[tuple[ClusterSettings, LocalCluster]]:
    """Cluster `name` made afresh by `make(settings)` (one left by an interrupted run is deleted
    first); deleted at exit unless `keep`, also when `make` fails half-way, and when the run is
    stopped by SIGTERM (`timeout`, `kill`): that becomes SystemExit, so this `finally` runs."""
    settings = ClusterSettings(cluster_name=name)
    down(settings, lambda m: None)
    with _sigterm_exits():
        try:
            yield settings, make(settings)
        finally:
            if not keep:
                down(settings, say)


@contextlib.contextmanager
def _sigterm_exits() -> Iterator[None]:
    """SIGTERM raises SystemExit(143) in the main thread while inside (Python's default would end
    the process at once, skipping every `finally` and leaving the cluster's processes running)."""
    if threading.current_thread() is not threading.main_thread() or \
            signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
        yield
        return

    def stop(signum, frame):
        sys.exit(128 + signum)
    signal.signal(signal.SIGTERM, stop)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)


@contextlib.contextmanager
def controller(kubeconfig: Path, log_path: Path, *, env: dict[str, str] | None = None,
               ready_timeout: float = 30) -> Iterator[ControllerProcess]:
    """`gangctl controller` against `kubeconfig`, ready (its informers synced); stopped at exit."""
    ctl = ControllerProcess(kubeconfig, log_path, env=dict(env or {}))
    ctl.start()
    try:
        ctl.wait_ready(ready_timeout)
        yield ctl
    finally:
        ctl.stop()


@contextlib.contextmanager
def cluster_with_controller(name: str, options: UpOptions, say: Callable[[str], None], *,
                            keep: bool = False, env: dict[str, str] | None = None,
                            ) -> Iterator[tuple[ClusterSettings, LocalCluster, ControllerProcess]]:
    """Cluster `name` started afresh (one left by an interrupted run is deleted first) and the
    controller ready (log: /tmp/NAME-controller.log, its environment `env` on top of ours); both
    stopped at exit, the cluster deleted unless `keep`."""
    def make(settings: ClusterSettings) -> LocalCluster:
        started = time.monotonic()
        cluster = up(settings, options, say)
        say(f"cluster {name} up with {options.gpu_nodes} GPU nodes in {time.monotonic() - started:.0f} s")
        return cluster

    with own_cluster(name, make, say, keep=keep) as (settings, cluster):
        log_path = Path("/tmp") / f"{name}-controller.log"
        log_path.unlink(missing_ok=True)
        with controller(cluster.kubeconfig, log_path, env=env) as ctl:
            yield settings, cluster, ctl
