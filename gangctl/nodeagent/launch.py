"""Start and stop a cluster's process nodes: the cluster network (netd: namespace, bridge, CoreDNS)
and M node agents, as detached processes whose pids are recorded in <state>/pids, so `cluster down`
(or a test fixture) stops every one of them and removes the network namespaces.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from gangctl.nodeagent import network
from gangctl.processes import running, running_from

NETD = "netd"


def _pid_dir(state: Path) -> Path:
    return state / "pids"


def _spawn(name: str, argv: list[str], state: Path, env: dict[str, str]) -> int:
    logs = state / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    _pid_dir(state).mkdir(parents=True, exist_ok=True)
    with (logs / f"{name}.log").open("ab") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                env=env, start_new_session=True)
    (_pid_dir(state) / f"{name}.pid").write_text(str(proc.pid))
    return proc.pid


def node_name(prefix: str, index: int) -> str:
    return f"{prefix}-{index}"


def start(cluster: str, kubeconfig: Path, count: int, state: Path, coredns: Path, *,
          prefix: str = "process-node", cpu: str | None = None, memory: str | None = None,
          first_index: int = 0, token_max_age: float | None = None) -> list[str]:
    """Start the cluster network and `count` agents; returns the node names. Pods see neither the
    kubeconfig and its keys nor this state folder's netd files (a copy of the kubeconfig)."""
    env = dict(os.environ, KUBECONFIG=str(kubeconfig))
    py = sys.executable
    if not running_from(_pid_dir(state) / f"{NETD}.pid") and not networkrunning(cluster):
        _spawn(NETD, [py, "-m", "gangctl.nodeagent.netd", "--cluster", cluster, "--kubeconfig", str(kubeconfig),
                      "--coredns", str(coredns), "--state", str(state / NETD)], state, env)
    names = []
    for i in range(first_index, first_index + count):
        name = node_name(prefix, i)
        argv = [py, "-m", "gangctl.cli", "node-agent", "--name", name, "--cluster", cluster, "--index", str(i),
                "--kubeconfig", str(kubeconfig), "--state-dir", str(state / name), "--hide", str(state / NETD)]
        if token_max_age:
            argv += ["--token-max-age", str(token_max_age)]
        if cpu:
            argv += ["--cpu", cpu]
        if memory:
            argv += ["--memory", memory]
        _spawn(name, argv, state, env)
        names.append(name)
    return names


def networkrunning(cluster: str) -> bool:
    """Is a netd (with its CoreDNS) already serving this cluster's network namespace?"""
    net = network.net_namespace(cluster)
    return network.netns_exists(net) and bool(network._ip("netns", "pids", net, check=False).stdout.split())


def agent_pid(state: Path, name: str) -> int | None:
    try:
        return int((_pid_dir(state) / f"{name}.pid").read_text())
    except (OSError, ValueError):
        return None


def stop(cluster: str, state: Path, grace: float = 10) -> None:
    """Stop every agent (they kill their pods' processes), then netd, then remove the namespaces."""
    pid_files = sorted(_pid_dir(state).glob("*.pid"), key=lambda p: p.stem == NETD) if _pid_dir(state).exists() else []
    pids = []
    for f in pid_files:
        try:
            pids.append(int(f.read_text()))
        except ValueError:
            continue
    for pid in pids:
        _kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while any(running(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    for pid in pids:
        if running(pid):
            _kill(pid, signal.SIGKILL)
    owned_network = any(f.stem == NETD for f in pid_files)
    for f in pid_files:
        f.unlink(missing_ok=True)
    if owned_network:  # this state dir started the network: remove it and every pod namespace in it
        network.delete_cluster_network(cluster)


def _kill(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


