"""Who listens on a TCP port: the answer to "address already in use".

Reads /proc/net/tcp and /proc/net/tcp6 for sockets in LISTEN on the port, then /proc/<pid>/fd for the
processes holding them (as `ss -ltnp` does). Another user's processes are visible only to root: then
the socket is found but not its process.
"""
from __future__ import annotations

import errno
import ipaddress
import os
from dataclasses import dataclass
from pathlib import Path

LISTEN = "0A"


@dataclass(frozen=True)
class Holder:
    address: str           # the listening address, e.g. "0.0.0.0:8080", "[::]:8080"
    pid: int | None        # None: the process could not be read (another user's)
    command: str = ""


class PortInUse(OSError):
    """Binding host:port failed because something listens there; `holders` says what."""

    def __init__(self, host: str, port: int, holders: list[Holder]):
        super().__init__(errno.EADDRINUSE, f"{host}:{port} is in use")
        self.host, self.port, self.holders = host, port, holders

    def describe(self) -> str:
        """'held by pid 123 (kai-podgroupcontroller --metrics-bind-address :8080) on 0.0.0.0:8080'."""
        if not self.holders:
            return "held by a process this user cannot see"
        return "; ".join(f"held by pid {h.pid} ({h.command}) on {h.address}" if h.pid is not None
                         else f"held on {h.address} by a process this user cannot see" for h in self.holders)


def _address(hex_address: str) -> tuple[str, int]:
    host, port = hex_address.split(":")
    raw = bytes.fromhex(host)
    if len(raw) == 4:
        return ".".join(str(b) for b in reversed(raw)), int(port, 16)
    words = [raw[i:i + 4][::-1] for i in range(0, 16, 4)]  # four little-endian 32-bit words
    return f"[{ipaddress.IPv6Address(b''.join(words)).compressed}]", int(port, 16)


def listening_sockets(port: int | None = None, proc: Path = Path("/proc")) -> dict[int, str]:
    """{socket inode: listening address} for the sockets in LISTEN on `port` (None: on any port)."""
    out = {}
    for table in ("tcp", "tcp6"):
        try:
            lines = (proc / "net" / table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if len(fields) < 10 or fields[3] != LISTEN:
                continue
            host, local_port = _address(fields[1])
            if port is None or local_port == port:
                out[int(fields[9])] = f"{host}:{local_port}"
    return out


def _readlink(path: Path) -> str:
    try:
        return os.readlink(path)
    except OSError:  # closed meanwhile (the listing's own descriptor, for one)
        return ""


def _socket_inodes(pid: int | str, proc: Path) -> set[int]:
    try:
        fds = list((proc / str(pid) / "fd").iterdir())
    except OSError:
        return set()
    return {int(link[8:-1]) for link in map(_readlink, fds) if link.startswith("socket:[")}


def listening(pid: int, proc: Path = Path("/proc")) -> list[str]:
    """The TCP addresses process `pid` listens on."""
    sockets = listening_sockets(None, proc)
    return sorted(sockets[inode] for inode in _socket_inodes(pid, proc) if inode in sockets)


def command(pid: int | str, proc: Path = Path("/proc")) -> str:
    """The command line of `pid` (its first 200 characters; '' when it cannot be read)."""
    try:
        return (proc / str(pid) / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()[:200]
    except OSError:
        return ""


def holders(port: int, proc: Path = Path("/proc")) -> list[Holder]:
    """The processes listening on `port` (one per socket; pid None when it cannot be read)."""
    sockets = listening_sockets(port, proc)
    found: dict[int, Holder] = {}
    for entry in proc.iterdir() if sockets else ():
        if not entry.name.isdigit():
            continue
        for inode in _socket_inodes(entry.name, proc):
            if inode in sockets and inode not in found:
                found[inode] = Holder(sockets[inode], int(entry.name), command(entry.name, proc))
    return [found.get(inode, Holder(address, None)) for inode, address in sockets.items()]
