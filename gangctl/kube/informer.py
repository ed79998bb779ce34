"""List+watch informers that keep a cache of raw JSON objects.

A watch that ends is resumed from the last resourceVersion; a 410 Gone (the version fell out of
etcd's window) or any other error re-lists, so the cache never silently misses a change. Handlers
receive the object after every change (and a last copy on delete) and must only enqueue keys.
"""
from __future__ import annotations

import asyncio
import logging
from typing import Callable, Iterable

from gangctl.api.resources import Resource
from gangctl.kube.client import ApiError, Kube

log = logging.getLogger(__name__)

Handler = Callable[[str, dict], None]  # (event type, object)


def object_key(obj: dict) -> str:
    meta = obj.get("metadata", {})
    ns = meta.get("namespace")
    return f"{ns}/{meta['name']}" if ns else meta["name"]


class Informer:
    def __init__(self, kube: Kube, resource: Resource, *, namespace: str | None = None,
                 label_selector: str | None = None, handlers: Iterable[Handler] = ()):
        self.kube = kube
        self.resource = resource
        self.namespace = namespace
        self.label_selector = label_selector
        self.handlers: list[Handler] = list(handlers)
        self.cache: dict[str, dict] = {}
        self.synced = asyncio.Event()
        self.relists = 0
        self._rv = ""

    def get(self, key: str) -> dict | None:
        return self.cache.get(key)

    def list(self, namespace: str | None = None, labels: dict[str, str] | None = None) -> list[dict]:
        out = []
        for obj in self.cache.values():
            meta = obj["metadata"]
            if namespace is not None and meta.get("namespace") != namespace:
                continue
            if labels and any((meta.get("labels") or {}).get(k) != v for k, v in labels.items()):
                continue
            out.append(obj)
        return out

    async def run(self) -> None:
        backoff = 0.2
        while True:
            try:
                if not self._rv:
                    await self._relist()
                await self._watch()
                backoff = 0.2
            except asyncio.CancelledError:
                raise
            except ApiError as err:
                if err.gone:
                    log.info("watch of %s expired (410 Gone); re-listing", self.resource.plural)
                else:
                    log.warning("watch of %s failed: %s; re-listing", self.resource.plural, err)
                self._rv = ""
            except Exception as err:  # connection reset, apiserver restart, timeouts
                log.warning("watch of %s interrupted (%s); re-listing in %.1fs", self.resource.plural, err, backoff)
                self._rv = ""
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 10.0)

    async def _relist(self) -> None:
        listing = await self.kube.get(self.resource.path(self.namespace), labelSelector=self.label_selector)
        fresh = {object_key(o): _with_kind(o, self.resource) for o in listing.get("items", [])}
        gone = [self.cache[k] for k in self.cache.keys() - fresh.keys()]
        changed = [o for k, o in fresh.items() if _rv_of(self.cache.get(k)) != _rv_of(o)]
        self.cache = fresh
        self._rv = listing["metadata"]["resourceVersion"]
        self.relists += 1
        for obj in gone:
            self._notify("DELETED", obj)
        for obj in changed:
            self._notify("ADDED", obj)
        self.synced.set()

    async def _watch(self) -> None:
        async for event in self.kube.watch(self.resource.path(self.namespace), self._rv,
                                           label_selector=self.label_selector):
            kind, obj = event["type"], event["object"]
            if kind == "ERROR":
                raise ApiError(obj.get("code", 500), obj.get("reason", ""), obj.get("message", ""))
            self._rv = obj["metadata"]["resourceVersion"]
            if kind == "BOOKMARK":
                continue
            obj = _with_kind(obj, self.resource)
            key = object_key(obj)
            if kind == "DELETED":
                self.cache.pop(key, None)
            else:
                self.cache[key] = obj
            self._notify(kind, obj)

    def _notify(self, kind: str, obj: dict) -> None:
        for handler in self.handlers:
            try:
                handler(kind, obj)
            except Exception:  # a broken handler must not stop the informer
                log.exception("informer handler failed for %s %s", self.resource.kind, object_key(obj))


def _rv_of(obj: dict | None) -> str | None:
    return obj["metadata"].get("resourceVersion") if obj else None


def _with_kind(obj: dict, resource: Resource) -> dict:
    # List items carry no apiVersion/kind; fill them so cached objects look like single GETs.
    obj.setdefault("apiVersion", resource.api_version)
    obj.setdefault("kind", resource.kind)
    return obj
