"""What counts as "no answer from the API server" (gangctl.kube.client.UNREACHABLE): the transport
faults every loop retries, including aiohttp's own that are not OSErrors, and never an API answer."""
from __future__ import annotations

import asyncio

import aiohttp
import pytest

from gangctl.kube import client
from gangctl.kube.client import UNREACHABLE, ApiError, Unreachable, until_answered

TRANSPORT_FAULTS = [aiohttp.ServerDisconnectedError(), aiohttp.ClientPayloadError("cut mid-body"),
                    aiohttp.ClientConnectionResetError("reset"), ConnectionResetError(104, "reset by peer"),
                    ConnectionRefusedError(111, "refused"), asyncio.TimeoutError(), Unreachable("GET /api: cut")]


@pytest.mark.parametrize("fault", TRANSPORT_FAULTS, ids=lambda e: type(e).__name__)
def test_transport_faults_are_unreachable(fault):
    assert isinstance(fault, UNREACHABLE)


def test_the_clients_own_fault_is_an_oserror_so_older_handlers_catch_it_too():
    assert issubclass(Unreachable, OSError)


def test_an_answer_is_not_a_transport_fault():
    assert not isinstance(ApiError(503, "ServiceUnavailable", "etcd"), UNREACHABLE)
    assert not isinstance(ApiError(0, "NotLeader", "refused"), UNREACHABLE)


async def test_until_answered_waits_out_transport_faults_and_passes_answers_on(monkeypatch):
    slept: list[float] = []

    async def no_sleep(seconds: float) -> None:
        slept.append(seconds)
    monkeypatch.setattr(client.asyncio, "sleep", no_sleep)
    faults = iter([aiohttp.ServerDisconnectedError(), aiohttp.ClientPayloadError("cut"), ConnectionResetError()])

    async def flaky() -> str:
        fault = next(faults, None)
        if fault is not None:
            raise fault
        return "answer"
    assert await until_answered(flaky, "discovery", cap=1.0) == "answer"
    assert slept == [0.5, 1.0, 1.0]  # backoff from 0.5 s, capped

    async def refused() -> str:
        raise ApiError(403, "Forbidden", "no")
    with pytest.raises(ApiError):  # an answer, even an error, is the caller's
        await until_answered(refused, "discovery")


async def test_the_fault_proxy_gives_the_faults_aiohttp_reports_and_all_are_unreachable():
    """gangctl.harness.netfaults against a loopback HTTP server: a response cut mid-body and an idle
    keep-alive connection reset are what aiohttp raises as ClientPayloadError / ServerDisconnectedError,
    neither an OSError, both UNREACHABLE."""
    from aiohttp import web

    from gangctl.harness.netfaults import FaultyProxy

    app = web.Application()
    app.router.add_get("/", lambda request: web.Response(body=b"x" * 500_000))
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    proxy = FaultyProxy(("127.0.0.1", site._server.sockets[0].getsockname()[1]), seed=1)
    url = f"http://127.0.0.1:{await proxy.start()}/"
    seen = []
    try:
        async with aiohttp.ClientSession() as session:
            async with session.get(url) as resp:
                assert len(await resp.read()) == 500_000  # passes through untouched between bursts
            assert proxy.reset_all() == 1                  # the idle keep-alive connection
            await asyncio.sleep(0.1)
            proxy.faulting = True
            for _ in range(2):
                try:
                    async with session.get(url) as resp:
                        await resp.read()
                except UNREACHABLE as err:
                    seen.append(type(err))
    finally:
        await proxy.close()
        await runner.cleanup()
    assert proxy.cuts >= 1 and seen and all(issubclass(t, aiohttp.ClientError) for t in seen), seen
