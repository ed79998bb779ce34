"""Container logs: the CRI log format the shim writes, and the kubelet API that serves it.

kube-apiserver answers `pods/log` by proxying to `https://<node InternalIP>:<kubeletEndpoint.Port>
/containerLogs/<ns>/<pod>/<container>?follow=&tailLines=&timestamps=&sinceSeconds=&limitBytes=
&previous=`, so `kubectl logs [-f]` and the kubeflow SDK's `get_job_logs` read the files through
this server. It is aiohttp (already a dependency) over TLS with a self-signed certificate made by
the `openssl` command: the apiserver is not given a kubelet CA here (kwokctl sets no
--kubelet-certificate-authority), so it does not verify kubelet certificates. Callers, though, are
authenticated by their client certificate and authorized by the apiserver (kubeletauth.py).
"""
from __future__ import annotations

import asyncio
import ssl
import subprocess
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Awaitable, Callable, Iterable

from aiohttp import web

from gangctl.nodeagent.kubeletauth import Review, auth_middleware


@dataclass(frozen=True)
class LogLine:
    time: str
    stream: str
    partial: bool
    text: bytes


def parse_line(raw: bytes) -> LogLine | None:
    parts = raw.rstrip(b"\n").split(b" ", 3)
    if len(parts) < 3:
        return None
    text = parts[3] if len(parts) == 4 else b""
    return LogLine(parts[0].decode(), parts[1].decode(), parts[2] == b"P", text)


def parse_time(value: str) -> datetime:
    value = value.rstrip("Z")
    if "." in value:
        head, frac = value.split(".", 1)
        value = f"{head}.{frac[:6]}"
        return datetime.strptime(value, "%Y-%m-%dT%H:%M:%S.%f").replace(tzinfo=timezone.utc)
    return datetime.strptime(value, "%Y-%m-%dT%H:%M:%S").replace(tzinfo=timezone.utc)


@dataclass(frozen=True)
class LogOptions:
    follow: bool = False
    tail_lines: int | None = None
    timestamps: bool = False
    since: datetime | None = None
    limit_bytes: int | None = None
    previous: bool = False

    @classmethod
    def from_query(cls, query, now: datetime) -> "LogOptions":
        def flag(name: str) -> bool:
            return query.get(name, "false").lower() in ("true", "1")
        since = None
        if query.get("sinceSeconds"):
            since = datetime.fromtimestamp(now.timestamp() - int(query["sinceSeconds"]), timezone.utc)
        elif query.get("sinceTime"):
            since = parse_time(query["sinceTime"])
        return cls(follow=flag("follow"), timestamps=flag("timestamps"), previous=flag("previous"),
                   tail_lines=int(query["tailLines"]) if query.get("tailLines") else None,
                   limit_bytes=int(query["limitBytes"]) if query.get("limitBytes") else None, since=since)


def render(line: LogLine, timestamps: bool) -> bytes:
    body = line.text if line.partial else line.text + b"\n"
    return (line.time.encode() + b" " + body) if timestamps else body


def select(lines: Iterable[LogLine], opts: LogOptions) -> list[LogLine]:
    """Apply sinceTime and tailLines (counted in complete lines) to what is already written."""
    chosen = [ln for ln in lines if opts.since is None or parse_time(ln.time) >= opts.since]
    if opts.tail_lines is not None:
        if opts.tail_lines <= 0:
            return []
        ends = [i for i, ln in enumerate(chosen) if not ln.partial]
        if len(ends) > opts.tail_lines:
            start = ends[-opts.tail_lines - 1] + 1
            chosen = chosen[start:]
    return chosen


def read_lines(path: Path) -> tuple[list[LogLine], int]:
    """All complete records in the file and the offset after the last one."""
    data = path.read_bytes() if path.exists() else b""
    end = data.rfind(b"\n") + 1
    lines = [ln for raw in data[:end].split(b"\n") if raw and (ln := parse_line(raw))]
    return lines, end


# (namespace, pod, container, previous) -> (log file, is the container still writing to it?)
LogLookup = Callable[[str, str, str, bool], "tuple[Path, Callable[[], bool]] | None"]


async def stream_log(path: Path, running: Callable[[], bool], opts: LogOptions,
                     write: Callable[[bytes], Awaitable[None]], poll: float = 0.2) -> None:
    lines, offset = read_lines(path)
    budget = opts.limit_bytes

    async def send(line) -> bool:
        """Write one rendered line within limitBytes; False once the limit is used up."""
        nonlocal budget
        chunk = render(line, opts.timestamps)
        if budget is not None:
            chunk = chunk[:budget]
            budget -= len(chunk)
        await write(chunk)
        return budget is None or budget > 0

    for line in select(lines, opts):
        if not await send(line):
            return
    if not opts.follow:
        return
    pending = b""
    while True:
        alive = running()
        try:   # a container just started may not have made its file yet: nothing written so far
            with path.open("rb") as f:
                f.seek(offset)
                data = f.read()
        except FileNotFoundError:
            data = b""
        offset += len(data)
        pending += data
        *complete, pending = pending.split(b"\n")
        for raw in complete:
            line = parse_line(raw)
            if line is None or (opts.since and parse_time(line.time) < opts.since):
                continue
            if not await send(line):
                return
        if not alive and not data:
            return
        await asyncio.sleep(poll)


def kubelet_app(lookup: LogLookup, middlewares: tuple = ()) -> web.Application:
    async def container_logs(request: web.Request) -> web.StreamResponse:
        ns, pod, container = (request.match_info[k] for k in ("ns", "pod", "container"))
        try:
            opts = LogOptions.from_query(request.query, datetime.now(timezone.utc))
        except ValueError as err:
            return web.Response(status=400, text=str(err))
        found = lookup(ns, pod, container, opts.previous)
        if found is None:
            return web.Response(status=404, text=f"container {container!r} of pod {ns}/{pod} is not on this node")
        path, running = found
        resp = web.StreamResponse(headers={"Content-Type": "text/plain"})
        await resp.prepare(request)

        async def write(chunk: bytes) -> None:
            await resp.write(chunk)
        try:
            await stream_log(path, running, opts, write)
        except (ConnectionResetError, asyncio.CancelledError):
            return resp
        await resp.write_eof()
        return resp

    async def healthz(request: web.Request) -> web.Response:
        return web.Response(text="ok")

    app = web.Application(middlewares=list(middlewares))
    app.router.add_get("/containerLogs/{ns}/{pod}/{container}", container_logs)
    app.router.add_get("/healthz", healthz)
    return app


def self_signed(cert_dir: Path, name: str, ip: str) -> tuple[Path, Path]:
    """A serving certificate for the kubelet API (openssl, the standard tool for it)."""
    cert, key = cert_dir / "kubelet.crt", cert_dir / "kubelet.key"
    if not cert.exists() or not key.exists():
        cert_dir.mkdir(parents=True, exist_ok=True)
        subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key),
                        "-out", str(cert), "-days", "365", "-subj", f"/CN={name}",
                        "-addext", f"subjectAltName=IP:{ip},DNS:{name}"],
                       check=True, capture_output=True)
    return cert, key


async def serve_kubelet_api(lookup: LogLookup, host: str, port: int, cert_dir: Path, node: str, *,
                            client_ca: Path, review: Review) -> web.AppRunner:
    """The kubelet API over TLS; only callers with a certificate from `client_ca` whom the apiserver
    authorizes (`review`) get an answer."""
    cert, key = self_signed(cert_dir, node, host)
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.load_cert_chain(cert, key)
    ctx.load_verify_locations(cafile=str(client_ca))
    ctx.verify_mode = ssl.CERT_OPTIONAL  # none: 401 below; one from another CA: the handshake fails
    runner = web.AppRunner(kubelet_app(lookup, (auth_middleware(node, review),)), access_log=None)
    await runner.setup()
    await web.TCPSite(runner, host, port, ssl_context=ctx).start()
    return runner
