"""The per-container supervisor the node agent starts (like a container runtime's shim).

    python -m gangctl.nodeagent.shim --log FILE --status FILE --hostname NAME [--cwd DIR]
        [--bind SOURCE:TARGET]... [--hide PATH]... -- ARGV...

It is started by the agent inside the pod's network namespace (`ip netns exec`), and:

- dies with the agent: PR_SET_PDEATHSIG delivers SIGHUP when the agent goes away (even by SIGKILL),
  and SIGHUP kills every descendant with SIGKILL, so a lost node leaves no workers behind;
- is a child subreaper (PR_SET_CHILD_SUBREAPER): processes that leave the container's process group
  or session (torchrun starts workers with start_new_session=True) are reparented here, so they are
  found and killed too;
- gives the container its own UTS namespace with the pod's hostname (socket.gethostname() inside
  the pod is the pod's hostname, as in a real container);
- with --bind/--hide, its own private mount namespace (mountns.py): the pod's volumes (the
  ServiceAccount token folder) bind-mounted read-only at their mountPath, the agent's credentials
  covered up;
- writes stdout/stderr in the CRI log format (`<RFC3339Nano> <stream> <F|P> <text>`), the format
  kubelet serves `containerLogs` from;
- forwards SIGTERM to the container's main process (graceful stop); when the main process exits,
  every other process of the container is killed (as when a container's PID 1 exits), and the exit
  code, signal and times are written to the status file.
"""
from __future__ import annotations

import argparse
import ctypes
import json
import os
import signal
import subprocess
import sys
import threading
import time
from datetime import datetime, timezone

PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36
CLONE_NEWUTS = 0x04000000

_libc = ctypes.CDLL(None, use_errno=True)


def now_rfc3339() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def set_pdeathsig(sig: int) -> None:
    """Deliver `sig` to this process when its parent thread exits (Linux prctl)."""
    _libc.prctl(PR_SET_PDEATHSIG, sig, 0, 0, 0)


def descendants(root: int) -> list[int]:
    """Every process below `root`, from /proc (children of a subreaper are found after reparenting)."""
    parents: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        parents.setdefault(ppid, []).append(int(entry))
    out, todo = [], [root]
    while todo:
        for child in parents.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def kill_tree(root: int) -> None:
    for _ in range(50):
        pids = descendants(root)
        if not pids:
            return
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        _reap()
        time.sleep(0.02)


def _reap() -> None:
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


class CriLog:
    """Append lines in the CRI log format; one lock so stdout and stderr lines never interleave."""

    def __init__(self, path: str):
        self._f = open(path, "ab", buffering=0)
        self._lock = threading.Lock()

    def pump(self, stream, name: str) -> None:
        for chunk in iter(lambda: stream.readline(16384), b""):
            tag = b"F" if chunk.endswith(b"\n") else b"P"
            text = chunk[:-1] if tag == b"F" else chunk
            with self._lock:
                self._f.write(now_rfc3339().encode() + b" " + name.encode() + b" " + tag + b" " + text + b"\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="gangctl.nodeagent.shim")
    parser.add_argument("--log", required=True)
    parser.add_argument("--status", required=True)
    parser.add_argument("--hostname")
    parser.add_argument("--cwd")
    parser.add_argument("--parent", type=int, default=0, help="the agent's pid; exit at once if it is gone")
    parser.add_argument("--bind", action="append", default=[], help="SOURCE:TARGET, mounted read-only")
    parser.add_argument("--hide", action="append", default=[], help="a path the container must not see")
    parser.add_argument("argv", nargs=argparse.REMAINDER)
    opts = parser.parse_args(argv)
    command = opts.argv[1:] if opts.argv and opts.argv[0] == "--" else opts.argv

    set_pdeathsig(signal.SIGHUP)
    if opts.parent and os.getppid() != opts.parent:  # the agent died before prctl took effect
        return 137
    _libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    if opts.hostname:
        if _libc.unshare(CLONE_NEWUTS) == 0:
            name = opts.hostname.encode()
            _libc.sethostname(name, len(name))

    log = CriLog(opts.log)
    started = now_rfc3339()
    status: dict = {"startedAt": started}
    if opts.bind or opts.hide:
        from gangctl.nodeagent.mountns import MountError, set_up
        try:
            set_up([tuple(b.split(":", 1)) for b in opts.bind], opts.hide)
        except (MountError, OSError) as err:
            status.update(exitCode=128, reason="StartError", message=f"mounting the pod's volumes: {err}",
                          finishedAt=now_rfc3339())
            with open(opts.status, "w") as f:
                json.dump(status, f)
            return 128
    try:
        child = subprocess.Popen(command, cwd=opts.cwd or None, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, start_new_session=True,
                                 preexec_fn=lambda: set_pdeathsig(signal.SIGKILL))
    except OSError as err:
        status.update(exitCode=127 if isinstance(err, FileNotFoundError) else 126, reason="StartError",
                      message=f"{command[0] if command else ''}: {err.strerror or err}", finishedAt=now_rfc3339())
        with open(opts.status, "w") as f:
            json.dump(status, f)
        return status["exitCode"]

    def on_term(signum, frame):  # graceful stop: the main process decides what to do with it
        try:
            os.killpg(child.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass

    def on_kill(signum, frame):  # the agent is gone or wants it dead now
        kill_tree(os.getpid())
        os._exit(137)

    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGINT, on_term)
    signal.signal(signal.SIGHUP, on_kill)
    pumps = [threading.Thread(target=log.pump, args=(child.stdout, "stdout"), daemon=True),
             threading.Thread(target=log.pump, args=(child.stderr, "stderr"), daemon=True)]
    for t in pumps:
        t.start()
    code = child.wait()
    kill_tree(os.getpid())  # the container's other processes end with its main process
    for t in pumps:
        t.join(timeout=2)
    status["finishedAt"] = now_rfc3339()
    if code < 0:
        status.update(exitCode=128 - code, signal=-code)
    else:
        status["exitCode"] = code
    with open(opts.status + ".tmp", "w") as f:
        json.dump(status, f)
    os.replace(opts.status + ".tmp", opts.status)
    return status["exitCode"]


if __name__ == "__main__":
    sys.exit(main())
