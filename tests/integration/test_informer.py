"""The informer against the real apiserver: a watch that expires (410 Gone) leads to a re-list that
loses no change made meanwhile, and the handlers hear about what was deleted while it was away.

The resourceVersion is made to expire for real: etcd is compacted past it and kube-apiserver is
restarted, so its watch cache starts after it too (Kubernetes 1.36 otherwise answers a watch from an
old resourceVersion out of what it still holds, without a 410)."""
from __future__ import annotations

import asyncio
import json
import urllib.request

import pytest
import yaml

from gangctl.api.resources import Resource
from gangctl.cluster.lifecycle import local_cluster
from gangctl.kube.informer import Informer
from tests.integration.conftest import APISERVER_RESTARTS
from tests.integration.helpers import eventually, restart_apiserver, volume_pod_scheduled

pytestmark = [pytest.mark.integration, pytest.mark.asyncio(loop_scope="session")]

CONFIGMAPS = Resource("", "v1", "configmaps", "ConfigMap")
MINE = "gangctl.io/test=informer"  # kube-controller-manager adds kube-root-ca.crt to every namespace


def configmap(name: str, namespace: str) -> dict:
    labels = {"gangctl.io/test": "informer"}
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name, "namespace": namespace, "labels": labels},
            "data": {"k": name}}


def compact_etcd(state_dir) -> int:
    """Compact the cluster's etcd at its current revision (etcd's v3 JSON gateway on loopback)."""
    docs = yaml.safe_load_all((state_dir / "kwok.yaml").read_text())
    port = next(d["options"]["etcdPort"] for d in docs if d and d.get("kind") == "KwokctlConfiguration")

    def post(path: str, body: dict) -> dict:
        req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=10) as answer:
            return json.loads(answer.read())
    revision = int(post("/v3/kv/range", {"key": "AA=="})["header"]["revision"])
    post("/v3/kv/compaction", {"revision": str(revision), "physical": True})
    return revision


async def test_expired_watch_relists_and_loses_no_change(kube, namespace, cluster_settings):
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
        cluster = local_cluster(cluster_settings)
        await asyncio.to_thread(compact_etcd, cluster.state_dir)
        APISERVER_RESTARTS.append(await restart_apiserver(kube, cluster))  # the controller's 403s meanwhile are excused
        waited = await volume_pod_scheduled(kube, namespace)   # the cluster's clients caught up (helpers)
        print(f"[apiserver restart] a pod on a pre-bound claim scheduled {waited:.1f} s after /readyz")
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


async def test_streamed_and_paged_lists_fill_the_same_cache_and_carry_objects_of_any_size(kube, namespace):
    """The streaming list (the default on Kubernetes 1.36) and the paginated LIST (the fallback for
    servers without the WatchList feature) give the same cache, and both then watch. Two ConfigMaps
    are near the 1 MiB limit: one watch line each, above aiohttp's default line limit (512 KiB;
    the session's read buffer allows 4 MiB)."""
    big = "x" * (1000 << 10)
    await kube.create(CONFIGMAPS.path(namespace), configmap("small", namespace))
    await kube.create(CONFIGMAPS.path(namespace), {**configmap("big", namespace), "data": {"k": big}})
    streamed = Informer(kube, CONFIGMAPS, namespace=namespace, label_selector=MINE)
    paged = Informer(kube, CONFIGMAPS, namespace=namespace, label_selector=MINE, streaming_list=False, page_size=1)
    tasks = [asyncio.create_task(inf.run()) for inf in (streamed, paged)]
    try:
        await asyncio.wait_for(asyncio.gather(streamed.synced.wait(), paged.synced.wait()), 30)
        assert streamed.streaming_list, "the apiserver took the streaming list (it did not fall back to pages)"
        for inf in (streamed, paged):
            assert set(inf.cache) == {f"{namespace}/small", f"{namespace}/big"}, inf.cache.keys()
            assert inf.get(f"{namespace}/big")["data"]["k"] == big
        assert streamed.relists == paged.relists == 1

        await kube.create(CONFIGMAPS.path(namespace), {**configmap("big-later", namespace), "data": {"k": big}})
        await kube.delete(CONFIGMAPS.path(namespace, "small"))

        async def both_watched() -> bool:
            return all(set(inf.cache) == {f"{namespace}/big", f"{namespace}/big-later"} for inf in (streamed, paged))
        await eventually(both_watched, 15, "the new big ConfigMap and the deletion to arrive by watch")
        assert streamed.get(f"{namespace}/big-later")["data"]["k"] == big
        assert streamed.relists == paged.relists == 1 and not streamed.problem() and not paged.problem()
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
