"""The informer against the real apiserver: a watch that expires (410 Gone) leads to a re-list that
loses no change made meanwhile, and the handlers hear about what was deleted while it was away."""
from __future__ import annotations

import asyncio

import pytest

from gangctl.api.resources import Resource
from gangctl.kube.informer import Informer
from tests.integration.helpers import eventually

pytestmark = [pytest.mark.integration, pytest.mark.asyncio(loop_scope="session")]

CONFIGMAPS = Resource("", "v1", "configmaps", "ConfigMap")
MINE = "gangctl.io/test=informer"  # kube-controller-manager adds kube-root-ca.crt to every namespace


def configmap(name: str, namespace: str) -> dict:
    labels = {"gangctl.io/test": "informer"}
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name, "namespace": namespace, "labels": labels},
            "data": {"k": name}}


async def test_expired_watch_relists_and_loses_no_change(kube, namespace):
    await kube.create(CONFIGMAPS.path(namespace), configmap("kept", namespace))
    await kube.create(CONFIGMAPS.path(namespace), configmap("removed-while-away", namespace))
    heard: list[tuple[str, str]] = []
    informer = Informer(kube, CONFIGMAPS, namespace=namespace, label_selector=MINE,
                        handlers=[lambda kind, obj: heard.append((kind, obj["metadata"]["name"]))])
    task = asyncio.create_task(informer.run())
    try:
        await asyncio.wait_for(informer.synced.wait(), 30)
        assert {f"{namespace}/kept", f"{namespace}/removed-while-away"} <= set(informer.cache)
        relists = informer.relists

        # The informer falls behind: its watch stops, changes happen, and its resourceVersion is
        # older than anything the apiserver still keeps when it comes back.
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await kube.delete(CONFIGMAPS.path(namespace, "removed-while-away"))
        await kube.create(CONFIGMAPS.path(namespace), configmap("added-while-away", namespace))
        informer._rv = "1"  # a resourceVersion long compacted away: the apiserver answers 410 Gone
        heard.clear()
        task = asyncio.create_task(informer.run())

        async def caught_up() -> bool:
            return informer.relists > relists and f"{namespace}/added-while-away" in informer.cache
        await eventually(caught_up, 30, "the informer to re-list after 410 Gone")
        assert set(informer.cache) == {f"{namespace}/kept", f"{namespace}/added-while-away"}
        assert ("DELETED", "removed-while-away") in heard
        assert ("ADDED", "added-while-away") in heard

        # and it watches again from the fresh list: a new change arrives without another re-list
        relists = informer.relists
        await kube.create(CONFIGMAPS.path(namespace), configmap("after", namespace))

        async def watched() -> bool:
            return f"{namespace}/after" in informer.cache
        await eventually(watched, 15, "a change after the re-list to arrive by watch")
        assert informer.relists == relists
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
