"""What the benchmarks share: a local cluster of their own with `gangctl controller` serving it."""
from __future__ import annotations

import contextlib
import time
from pathlib import Path
from typing import Callable, Iterator

from gangctl.cluster.lifecycle import UpOptions, down, up
from gangctl.cluster.local import LocalCluster
from gangctl.config import ClusterSettings
from gangctl.processes import ControllerProcess


@contextlib.contextmanager
def cluster_with_controller(name: str, options: UpOptions, say: Callable[[str], None], *,
                            keep: bool = False) -> Iterator[tuple[ClusterSettings, LocalCluster, ControllerProcess]]:
    """Cluster `name` started afresh (one left by an interrupted run is deleted first) and the
    controller ready (log: /tmp/NAME-controller.log); both stopped at exit, the cluster deleted
    unless `keep`."""
    settings = ClusterSettings(cluster_name=name)
    down(settings, lambda m: None)
    started = time.monotonic()
    cluster = up(settings, options, say)
    say(f"cluster {name} up with {options.gpu_nodes} GPU nodes in {time.monotonic() - started:.0f} s")
    log_path = Path("/tmp") / f"{name}-controller.log"
    log_path.unlink(missing_ok=True)
    ctl = ControllerProcess(cluster.kubeconfig, log_path)
    ctl.start()
    try:
        ctl.wait_ready()
        yield settings, cluster, ctl
    finally:
        ctl.stop()
        if not keep:
            down(settings, say)
