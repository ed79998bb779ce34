"""A container's own mount namespace (Linux mount(2) through ctypes), set up by the shim before it
starts the container's process:

- unshare(CLONE_NEWNS) and make every mount private first, so nothing mounted here reaches the
  host (or another container);
- a tmpfs on /run/secrets (the host keeps an empty directory there), so volumes mount at
  /var/run/secrets/... without anything being created on the host;
- each volume bind-mounted read-only at its mountPath;
- the agent's credentials covered up: an empty read-only tmpfs over a folder, /dev/null over a file.
  Hidden last, so the pod's own volume folders (inside a hidden folder) are bound first.
"""
from __future__ import annotations

import ctypes
import os

CLONE_NEWNS = 0x00020000
MS_RDONLY = 1
MS_NOSUID = 2
MS_NODEV = 4
MS_REMOUNT = 32
MS_BIND = 4096
MS_REC = 16384
MS_PRIVATE = 1 << 18

SECRETS_TMPFS = "/run/secrets"  # /var/run is /run

_libc = ctypes.CDLL(None, use_errno=True)
_libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p]


class MountError(OSError):
    pass


def _mount(source: str | None, target: str, fstype: str | None, flags: int, data: str | None = None) -> None:
    enc = (lambda s: s.encode() if s is not None else None)
    if _libc.mount(enc(source), enc(target), enc(fstype), flags, enc(data)) != 0:
        err = ctypes.get_errno()
        raise MountError(err, f"mount {source or fstype} on {target}: {os.strerror(err)}")


def private_namespace() -> None:
    if _libc.unshare(CLONE_NEWNS) != 0:
        err = ctypes.get_errno()
        raise MountError(err, f"unshare(CLONE_NEWNS): {os.strerror(err)}")
    _mount(None, "/", None, MS_REC | MS_PRIVATE)


def bind_read_only(source: str, target: str) -> None:
    _mount(source, target, None, MS_BIND)
    _mount(None, target, None, MS_BIND | MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV)


def hide(path: str) -> None:
    if os.path.isdir(path):
        _mount("tmpfs", path, "tmpfs", MS_RDONLY | MS_NOSUID | MS_NODEV, "size=4k,mode=000")
    elif os.path.exists(path):
        _mount("/dev/null", path, None, MS_BIND)


def in_secrets(target: str) -> bool:
    real = os.path.realpath(os.path.dirname(target)) + "/" + os.path.basename(target)
    return real == SECRETS_TMPFS or real.startswith(SECRETS_TMPFS + "/")


def set_up(binds: list[tuple[str, str]], hidden: list[str]) -> None:
    """Run in the shim before exec: a private mount namespace with `binds` (source, target) read-only
    and `hidden` covered up."""
    private_namespace()
    if any(in_secrets(target) for _, target in binds):
        _mount("tmpfs", SECRETS_TMPFS, "tmpfs", MS_NOSUID | MS_NODEV, "size=1m,mode=755")
    for source, target in binds:
        if in_secrets(target):
            os.makedirs(os.path.realpath(os.path.dirname(target)) + "/" + os.path.basename(target), exist_ok=True)
        bind_read_only(source, target)
    for path in hidden:
        hide(path)
