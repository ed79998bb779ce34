"""`gangctl controller` on a port that is taken: the error names the process that holds it."""
from __future__ import annotations

import asyncio
import subprocess
import sys

import pytest
from aiohttp import web

from gangctl.obs import ports
from gangctl.obs.server import serve

HOLD = ("'port-holder'; import socket, sys; s = socket.socket(socket.AF_INET6 if ':' in sys.argv[1] else socket.AF_INET); "
        "s.bind((sys.argv[1], 0)); s.listen(); print(s.getsockname()[1], flush=True); sys.stdin.read()")


@pytest.fixture(params=["0.0.0.0", "::1"])
def held(request):
    """A port some other process listens on (on every IPv4 interface, or IPv6 loopback)."""
    proc = subprocess.Popen([sys.executable, "-c", HOLD, request.param], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    try:
        yield proc, int(proc.stdout.readline())
    finally:
        proc.kill()
        proc.wait()


def test_the_holder_of_a_port_is_named(held):
    proc, port = held
    (holder,) = ports.holders(port)
    assert holder.pid == proc.pid and "port-holder" in holder.command
    assert holder.address.endswith(f":{port}")


def test_serve_on_a_taken_port_says_which_process_holds_it(held):
    proc, port = held

    async def bind() -> None:
        runner = await serve(web.Application(), "::1" if "[" in ports.holders(port)[0].address else "127.0.0.1", port)
        await runner.cleanup()
    with pytest.raises(ports.PortInUse) as err:
        asyncio.run(bind())
    assert f"held by pid {proc.pid} (" in err.value.describe() and "port-holder" in err.value.describe()


def test_a_free_port_has_no_holder():
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # bound, not listening
    assert ports.holders(port) == []


def test_what_a_process_listens_on(held):
    proc, port = held
    (address,) = ports.listening(proc.pid)
    assert address in (f"0.0.0.0:{port}", f"[::1]:{port}")
