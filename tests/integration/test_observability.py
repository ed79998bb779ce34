"""/metrics, /healthz and /readyz of a running controller, after real jobs went through it."""
from __future__ import annotations

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.integration.helpers import eventually, get_trainjob, is_true, submit, trainjob

pytestmark = [pytest.mark.integration, pytest.mark.asyncio(loop_scope="session")]


async def scrape(url: str) -> dict[str, float]:
    async with aiohttp.ClientSession() as session, session.get(url + "/metrics") as resp:
        assert resp.status == 200
        text = await resp.text()
    samples = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            labels = ",".join(f"{k}={v}" for k, v in sorted(s.labels.items()) if k != "le")
            if "le" not in s.labels:
                samples[f"{s.name}{{{labels}}}" if labels else s.name] = s.value
    return samples


async def test_metrics_health_and_readiness(kube, controller, namespace):
    await submit(kube, trainjob("observed", namespace, nodes=2, run_for="1s"))

    async def complete() -> bool:
        return is_true(await get_trainjob(kube, namespace, "observed"), "Complete")
    await eventually(complete, 60, "TrainJob Complete")

    async def counted() -> bool:
        return (await scrape(controller.url)).get("gangctl_trainjobs{phase=Complete}", 0) >= 1
    await eventually(counted, 10, "the Complete TrainJob counted in gangctl_trainjobs")

    metrics = await scrape(controller.url)
    assert metrics["gangctl_reconcile_duration_seconds_count"] > 0
    assert metrics["gangctl_gang_wait_seconds_count"] >= 1
    assert "gangctl_workqueue_depth" in metrics
    async with aiohttp.ClientSession() as session:
        for path in ("/healthz", "/readyz"):
            async with session.get(controller.url + path) as resp:
                assert resp.status == 200, path
