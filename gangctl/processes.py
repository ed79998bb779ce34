"""Local processes: whether one still runs (read from /proc, Linux), a free loopback port, and
`gangctl controller` as a child process; shared by everything that starts and stops local processes
(the cluster's components, the extra schedulers, the node agents, the demo, tests and benchmarks)."""
from __future__ import annotations

import os
import signal
import socket
import ssl
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable


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


def free_ports(count: int) -> list[int]:
    """`count` distinct TCP ports free on 127.0.0.1 now (all held open together while picked)."""
    socks = []
    try:
        for _ in range(count):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now."""
    return free_ports(1)[0]


def wait_http_ok(url: str, timeout: float, what: str, check_alive: Callable[[], bool]) -> None:
    """Poll a health endpoint on loopback until it answers 200 (https: a component's self-signed
    serving certificate, not verified: the endpoint is on loopback and answers only health)."""
    deadline = time.monotonic() + timeout
    context = ssl._create_unverified_context() if url.startswith("https://") else None  # noqa: S323
    while True:
        try:
            with urllib.request.urlopen(url, timeout=2, context=context) as resp:  # noqa: S310 - loopback only
                if resp.status == 200:
                    return
        except OSError:
            pass
        if not check_alive():
            raise RuntimeError(f"{what} exited while starting")
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what} ({url})")
        time.sleep(0.5)


@dataclass
class ControllerProcess:
    """`gangctl controller` as a child process against `kubeconfig`, which can be stopped and started
    again (as an operator restarts it); its output is appended to `log_path`."""

    kubeconfig: Path
    log_path: Path
    metrics_port: int = 0
    proc: subprocess.Popen | None = None
    args: tuple[str, ...] = ()                          # more flags, e.g. ("--leader-elect",)
    env: dict[str, str] = field(default_factory=dict)   # more environment, e.g. {"POD_NAME": "a"}
    command: tuple[str, ...] = ()                       # what runs `gangctl` (default: this Python's gangctl.cli),
                                                        # e.g. `podman run ... IMAGE` (gangctl.cluster.image)

    def __post_init__(self) -> None:
        self.metrics_port = self.metrics_port or free_port()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.metrics_port}"

    def start(self) -> None:
        env = dict(os.environ, KUBECONFIG=str(self.kubeconfig), **self.env)
        with self.log_path.open("a") as log:
            self.proc = subprocess.Popen(
                [*(self.command or (sys.executable, "-m", "gangctl.cli")), "controller", "--metrics-port",
                 str(self.metrics_port), *self.args],
                env=env, stdout=log, stderr=subprocess.STDOUT)

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 15) -> int | None:
        """Signal it and wait (SIGKILL after `timeout`: SIGTERM drains for up to 10 s, then releases its
        leader Lease); its exit code (None if it was not running)."""
        code = None
        if self.proc:
            if self.proc.poll() is None:
                self.proc.send_signal(sig)
                try:
                    self.proc.wait(timeout)
                except subprocess.TimeoutExpired:
                    self.proc.kill()
                    self.proc.wait()
            code = self.proc.returncode
        self.proc = None
        return code

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def wait_ready(self, timeout: float = 30) -> None:
        """Block until /readyz answers 200 (its informers synced); the log's tail if it exited."""
        try:
            wait_http_ok(self.url + "/readyz", timeout, "gangctl controller", self.alive)
        except RuntimeError as err:
            tail = self.log_path.read_text()[-3000:] if self.log_path.exists() else ""
            raise RuntimeError(f"{err}; log {self.log_path}:\n{tail}") from None
