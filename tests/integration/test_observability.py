"""/metrics, /healthz and /readyz of a running controller, after real jobs went through it."""
from __future__ import annotations

import aiohttp
import pytest

from tests.integration.helpers import (QUEUE_DEPTH, RECONCILES, eventually, get_trainjob, is_true, reconciles,
                                       scrape, settled, submit, trainjob)

pytestmark = [pytest.mark.integration, pytest.mark.asyncio(loop_scope="session")]


async def test_metrics_health_and_readiness(kube, controller, namespace):
    before = await reconciles(controller)
    await submit(kube, trainjob("observed", namespace, nodes=2, run_for="1s"))

    async def complete() -> bool:
        return is_true(await get_trainjob(kube, namespace, "observed"), "Complete")
    await eventually(complete, 60, "TrainJob Complete")

    async def counted() -> bool:
        return (await scrape(controller.url)).get("gangctl_trainjobs{phase=Complete}", 0) >= 1
    await eventually(counted, 10, "the Complete TrainJob counted in gangctl_trainjobs")

    # The work queue gauge is pre-registered (always exported): check its value, once the job's
    # reconciles are counted and the controller has nothing left to do.
    await settled(controller, before)
    metrics = await scrape(controller.url)
    assert metrics[RECONCILES] >= before + 3, "creating, Running and Complete were each decided in a reconcile"
    assert metrics["gangctl_gang_wait_seconds_count"] >= 1
    assert metrics[QUEUE_DEPTH] == 0
    async with aiohttp.ClientSession() as session:
        for path in ("/healthz", "/readyz"):
            async with session.get(controller.url + path) as resp:
                assert resp.status == 200, path
