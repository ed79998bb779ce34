"""Transport faults for real: a loopback TCP proxy between clients and the API server that, in bursts,
resets every connection (a TCP RST, as an apiserver restart or a dropped keep-alive connection gives)
and cuts responses mid-body (part of a chunk forwarded, then a reset). TLS passes through untouched:
the clients verify the apiserver's own certificate, and see only what a flaky network does.

    proxy = FaultyProxy(("127.0.0.1", 6443), seed=1)
    port = await proxy.start()                 # point a kubeconfig at 127.0.0.1:<port>
    task = asyncio.create_task(proxy.bursts(every=(3, 6), lasting=(0.5, 1.5)))
    ...
    await proxy.close()                        # proxy.resets, proxy.cuts: what it did

Used by tests/integration/test_transport_faults.py.
"""
from __future__ import annotations

import asyncio
import random
import socket
import struct
from dataclasses import dataclass, field

CHUNK = 64 * 1024


def _reset(writer: asyncio.StreamWriter) -> None:
    """Close with a TCP RST (SO_LINGER 0), not a FIN: the peer sees 'connection reset'."""
    sock = writer.get_extra_info("socket")
    if sock is not None:
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        except OSError:
            pass
    writer.transport.abort()


@dataclass
class FaultyProxy:
    upstream: tuple[str, int]
    seed: int = 0
    faulting: bool = False   # in a burst: every response chunk is cut and its connection reset
    connections: int = 0     # accepted
    resets: int = 0          # connections reset (at a burst's start, or refused during one)
    cuts: int = 0            # responses cut mid-chunk
    bursts_done: int = 0
    port: int = 0
    _live: set[tuple[asyncio.StreamWriter, asyncio.StreamWriter]] = field(default_factory=set)
    _server: asyncio.AbstractServer | None = None

    def __post_init__(self) -> None:
        self._rng = random.Random(self.seed)

    async def start(self) -> int:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self.port

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        self.reset_all()
        if self._server is not None:
            await self._server.wait_closed()

    def reset_all(self) -> int:
        """Reset every open connection (both sides); how many there were."""
        live = list(self._live)
        for client, upstream in live:
            _reset(client)
            _reset(upstream)
        self._live.clear()
        self.resets += len(live)
        return len(live)

    async def bursts(self, every: tuple[float, float], lasting: tuple[float, float]) -> None:
        """Until cancelled: wait `every` seconds (uniform in the range), then fault for `lasting` seconds:
        reset every open connection at once, and cut every response that arrives meanwhile."""
        try:
            while True:
                await asyncio.sleep(self._rng.uniform(*every))
                self.faulting = True
                self.reset_all()
                await asyncio.sleep(self._rng.uniform(*lasting))
                self.faulting = False
                self.bursts_done += 1
        finally:
            self.faulting = False

    async def _accept(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            up_r, up_w = await asyncio.open_connection(*self.upstream)
        except OSError:
            _reset(client_w)
            return
        pair = (client_w, up_w)
        self._live.add(pair)
        try:
            await asyncio.gather(self._pipe(client_r, up_w, pair, response=False),
                                 self._pipe(up_r, client_w, pair, response=True))
        finally:
            self._live.discard(pair)
            for w in pair:
                w.transport.abort()

    async def _pipe(self, src: asyncio.StreamReader, dst: asyncio.StreamWriter,
                    pair: tuple[asyncio.StreamWriter, asyncio.StreamWriter], *, response: bool) -> None:
        try:
            while data := await src.read(CHUNK):
                if response and self.faulting and pair in self._live:
                    # a response cut mid-body: part of what the server sent, then a reset
                    dst.write(data[:self._rng.randint(0, max(0, len(data) - 1))])
                    await dst.drain()
                    self._live.discard(pair)
                    self.cuts += 1
                    for w in pair:
                        _reset(w)
                    return
                dst.write(data)
                await dst.drain()
            if dst.can_write_eof():
                dst.write_eof()
        except (OSError, RuntimeError):  # the other side was reset (by us, or by its owner)
            for w in pair:
                w.transport.abort()
