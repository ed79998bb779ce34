"""List+watch informers that keep a cache of raw JSON objects, as client-go's reflector does.

- The first list is a streaming list (a watch with `sendInitialEvents`, client-go's WatchListClient):
  the apiserver sends every object from its watch cache as an event, then a bookmark marking the
  end, and the same stream goes on with the changes. Against a server without the WatchList feature
  (off by default before Kubernetes 1.34; it answers 422) it is a paginated LIST (`limit`/`continue`)
  instead. Either way a cluster of 150,000 pods is never one response, and the event loop gets a
  turn every few hundred objects. The stream is the faster of the two (benchmarks/README.md, scale
  P3): the apiserver sends it from its watch cache without a consistent read per page, and no page
  of 500 whole pods stays alive while it is decoded, so Python's garbage collector is not set off
  over and over to walk the growing cache.
- The watch resumes from the last resourceVersion it saw. Only a 410 Gone (that version fell out
  of etcd's window) costs a new list; any other failure (connection reset, apiserver restart,
  429, 5xx) waits a capped, jittered backoff and watches again from where it was.
- Cached objects are stripped of what gangctl never reads (`managedFields`, kubectl's
  last-applied annotation): that is most of an object's bytes. A `transform` (the controller passes
  `gangctl.policy.cached.pod_view` for pods) keeps only the fields decisions read.
- A re-list updates the cache in place, page by page, and drops what the list did not show at its
  end: never two whole caches side by side.
- An optional label index answers "the objects with this label value in this namespace" without a
  scan of the whole cache.
- `problem()` says why the cache cannot be trusted (never listed, or failing for a while): the
  controller's /readyz reports it.

Handlers receive the object after every change (and a last copy on delete) and must only enqueue keys.
"""
from __future__ import annotations

import asyncio
import logging
import random
import time
from typing import Callable, Iterable

from gangctl.api.resources import Resource
from gangctl.kube.client import UNREACHABLE, ApiError, Kube

log = logging.getLogger(__name__)

Handler = Callable[[str, dict], None]  # (event type, object)

LAST_APPLIED = "kubectl.kubernetes.io/last-applied-configuration"
# client-go's reflector starts at 0.8 s and caps at 30 s. gangctl caps answered errors at 5 s: after an
# apiserver restart its RBAC caches refill for a moment and answer 403, and the failures counted while
# it was down would otherwise push the first retry past 20 s (measured). Nine informers retrying every
# 5 s cost a struggling apiserver nothing; 429s wait for the server's own Retry-After.
BACKOFF_START, BACKOFF_CAP = 0.8, 5.0
# No answer at all (connection refused or reset: an apiserver restarting) costs the server nothing,
# and the controller should resume within seconds of it coming back: a lower cap for that case.
UNREACHABLE_CAP = 2.0
STALE_AFTER = 30.0                        # failing this long makes the informer not ready
YIELD_EVERY = 500                         # objects handled between two turns of the event loop
INITIAL_EVENTS_END = "k8s.io/initial-events-end"


def streaming_list_refused(err: ApiError) -> bool:
    """Whether the apiserver refused a streaming list as a request it does not take (the WatchList
    feature off: 422 "sendInitialEvents is forbidden"; servers older than the feature: 400), so the
    informer should list in pages instead."""
    return err.status in (400, 422)


def object_key(obj: dict) -> str:
    meta = obj.get("metadata", {})
    ns = meta.get("namespace")
    return f"{ns}/{meta['name']}" if ns else meta["name"]


def strip(obj: dict) -> dict:
    """Drop what no decision reads; the cached copy is what the handlers and the reconciler see."""
    meta = obj.get("metadata")
    if meta:
        meta.pop("managedFields", None)
        annotations = meta.get("annotations")
        if annotations and LAST_APPLIED in annotations:
            del annotations[LAST_APPLIED]
    return obj


def backoff_delay(failures: int, rng: random.Random, cap: float = BACKOFF_CAP) -> float:
    """Exponential from 0.8 s, capped at `cap` (5 s for an answered error), with up to 100 % jitter
    (no thundering re-lists)."""
    base = min(cap, BACKOFF_START * 2.0 ** min(failures, 16))
    return min(cap, base * (1.0 + rng.random()))


class Informer:
    def __init__(self, kube: Kube, resource: Resource, *, namespace: str | None = None,
                 label_selector: str | None = None, handlers: Iterable[Handler] = (),
                 index_label: str | None = None, page_size: int = 500,
                 transform: Callable[[dict], dict] | None = None, streaming_list: bool = True):
        self.kube = kube
        self.transform = transform
        self.resource = resource
        self.namespace = namespace
        self.label_selector = label_selector
        self.handlers: list[Handler] = list(handlers)
        self.cache: dict[str, dict] = {}
        self.synced = asyncio.Event()
        self.relists = 0
        self.page_size = page_size
        self.streaming_list = streaming_list  # False: paginated LISTs (set when the server refuses streams)
        self.index_label = index_label
        self._index: dict[tuple[str | None, str], set[str]] = {}
        self._rv = ""
        self._failures = 0
        self._failing_since: float | None = None
        self._last_error = ""
        self._rng = random.Random()

    # --- reading the cache -----------------------------------------------------------------------
    def get(self, key: str) -> dict | None:
        return self.cache.get(key)

    def list(self, namespace: str | None = None, labels: dict[str, str] | None = None) -> list[dict]:
        labels = labels or {}
        if self.index_label is not None and self.index_label in labels and namespace is not None:
            candidates: Iterable[dict] = (self.cache[k] for k in self._index.get((namespace, labels[self.index_label]), ()))
        else:
            candidates = self.cache.values()
        out = []
        for obj in candidates:
            meta = obj["metadata"]
            if namespace is not None and meta.get("namespace") != namespace:
                continue
            if labels and any((meta.get("labels") or {}).get(k) != v for k, v in labels.items()):
                continue
            out.append(obj)
        return out

    def problem(self, now: float | None = None) -> str | None:
        """Why this cache is not to be trusted now, or None."""
        if not self.synced.is_set():
            return f"{self.resource.plural}: not listed yet" + (f" ({self._last_error})" if self._last_error else "")
        now = time.monotonic() if now is None else now
        if self._failing_since is not None and now - self._failing_since > STALE_AFTER:
            return f"{self.resource.plural}: watch failing for {now - self._failing_since:.0f}s ({self._last_error})"
        return None

    def write_through(self, obj: dict) -> None:
        """Put an object this process just wrote (the API's answer) into the cache, when it is newer
        than what the cache knows, so the next reconcile neither decides from what it wrote over nor
        writes again what it just wrote (a 1,024-pod gang triggers hundreds of reconciles before the
        watch shows its PodGroup). The watch delivers the same version later, and that event is
        what notifies handlers."""
        key = object_key(obj)
        cached = self.cache.get(key)
        if cached is None:
            # Just created: cached only if the watch has not passed its version yet (else the watch
            # has delivered it, or its deletion, already: inserting it could bring back the dead).
            if not _newer(obj, {"metadata": {"resourceVersion": self._rv}}):
                return
        elif cached["metadata"].get("uid") != obj["metadata"].get("uid") or not _newer(obj, cached):
            return
        obj = self._cached_form(obj)
        self.cache[key] = obj
        self._reindex(key, cached, obj)

    def _cached_form(self, obj: dict) -> dict:
        obj = strip(_with_kind(obj, self.resource))
        return self.transform(obj) if self.transform is not None else obj

    # --- running -------------------------------------------------------------------------------
    async def run(self) -> None:
        while True:
            try:
                if self._rv:
                    await self._watch()
                elif self.streaming_list:
                    await self._watch(listing=_Listing())
                else:
                    await self._relist()
                    await self._watch()
            except asyncio.CancelledError:
                raise
            except ApiError as err:
                if not self._rv and self.streaming_list and streaming_list_refused(err):
                    log.info("the apiserver refused a streaming list of %s (%s); listing in pages",
                             self.resource.plural, err)
                    self.streaming_list = False
                    continue
                if err.gone:
                    log.info("watch of %s expired (410 Gone); re-listing", self.resource.plural)
                    self._rv = ""
                    continue
                await self._failed(err, err.retry_after)
            except UNREACHABLE as err:  # no answer: an apiserver restarting, a connection reset or cut
                await self._failed(err, None, cap=UNREACHABLE_CAP)
            except Exception as err:  # timeouts, garbled streams
                await self._failed(err, None)

    async def _failed(self, err: Exception, retry_after: float | None, cap: float = BACKOFF_CAP) -> None:
        """Back off (the server's Retry-After when it gave one), then watch again from where we were."""
        self._failures += 1
        if self._failing_since is None:
            self._failing_since = time.monotonic()
        self._last_error = str(err) or type(err).__name__
        delay = retry_after if retry_after is not None else backoff_delay(self._failures - 1, self._rng, cap)
        level = logging.INFO if self._failures == 1 else logging.WARNING
        log.log(level, "watch of %s failed (%s); retrying in %.1fs", self.resource.plural, self._last_error, delay)
        await asyncio.sleep(delay)

    def _healthy(self) -> None:
        self._failures = 0
        self._failing_since = None
        self._last_error = ""

    async def _relist(self) -> None:
        """LIST in pages into the cache itself: each page's objects replace their cached versions as it
        arrives (a 150,000-pod list never holds two caches at once)."""
        listing = _Listing()
        rv = ""
        async for page in self.kube.list_pages(self.resource.path(self.namespace),
                                               label_selector=self.label_selector, limit=self.page_size):
            for obj in page.get("items", []):
                self._listed(listing, obj)
            rv = (page.get("metadata") or {}).get("resourceVersion") or rv
            await asyncio.sleep(0)  # let the rest of the controller run between pages
        self._listing_done(listing, rv)

    def _listed(self, listing: "_Listing", obj: dict) -> None:
        obj = self._cached_form(obj)
        key = object_key(obj)
        listing.seen.add(key)
        old = self.cache.get(key)
        if _rv_of(old) != _rv_of(obj):
            listing.changed.append(key)
        self.cache[key] = obj
        self._reindex(key, old, obj)

    def _listing_done(self, listing: "_Listing", rv: str) -> None:
        """The list is complete at `rv`: drop what it did not show, then tell the handlers of every
        change (only now: a half-listed cache is never announced)."""
        gone = [self.cache.pop(k) for k in list(self.cache.keys() - listing.seen)]
        for obj in gone:
            self._reindex(object_key(obj), obj, None)
        self._rv = rv
        self.relists += 1
        self._healthy()
        for obj in gone:
            self._notify("DELETED", obj)
        for key in listing.changed:
            if key in self.cache:
                self._notify("ADDED", self.cache[key])
        self.synced.set()

    async def _watch(self, listing: "_Listing | None" = None) -> None:
        """Watch from `self._rv`; with a `listing`, a streaming list first (from the current state),
        whose events fill the cache as a LIST's pages would until the bookmark that ends them. Its
        objects' resourceVersions come in no order, so the watch can resume only from that bookmark:
        a stream cut before it starts the list again."""
        started, events = time.monotonic(), 0
        async for event in self.kube.watch(self.resource.path(self.namespace), self._rv,
                                           label_selector=self.label_selector, initial_events=listing is not None):
            kind, obj = event["type"], event["object"]
            if kind == "ERROR":
                raise ApiError(obj.get("code", 500), obj.get("reason", ""), obj.get("message", ""))
            events += 1
            if events % YIELD_EVERY == 0:
                await asyncio.sleep(0)  # a stream of initial events is all buffered: let the loop run
            meta = obj["metadata"]
            if listing is not None:
                if kind != "BOOKMARK":
                    self._listed(listing, obj)
                elif (meta.get("annotations") or {}).get(INITIAL_EVENTS_END) == "true":
                    self._listing_done(listing, meta["resourceVersion"])
                    listing = None
                continue
            self._healthy()
            self._rv = meta["resourceVersion"]
            if kind == "BOOKMARK":
                continue
            obj = self._cached_form(obj)
            key = object_key(obj)
            old = self.cache.get(key)
            if kind == "DELETED":
                self.cache.pop(key, None)
            else:
                self.cache[key] = obj
            self._reindex(key, old, None if kind == "DELETED" else obj)
            self._notify(kind, obj)
        if not events and time.monotonic() - started < 1.0:
            # Closed at once with nothing said (an apiserver shutting down): not a normal end.
            raise ConnectionError("watch closed by the server without events")
        if listing is not None:  # the list is incomplete: back off and list again, /readyz says why
            raise ConnectionError(f"the streaming list ended after {events} events, before its "
                                  f"{INITIAL_EVENTS_END} bookmark")
        self._healthy()  # the server ended the stream normally (timeoutSeconds)

    # --- the label index -------------------------------------------------------------------------
    def _index_key(self, obj: dict | None) -> tuple[str | None, str] | None:
        if obj is None or self.index_label is None:
            return None
        meta = obj["metadata"]
        value = (meta.get("labels") or {}).get(self.index_label)
        return None if value is None else (meta.get("namespace"), value)

    def _reindex(self, key: str, old: dict | None, new: dict | None) -> None:
        before, after = self._index_key(old), self._index_key(new)
        if before == after:
            return
        if before is not None:
            bucket = self._index.get(before)
            if bucket is not None:
                bucket.discard(key)
                if not bucket:
                    del self._index[before]
        if after is not None:
            self._index.setdefault(after, set()).add(key)

    def _notify(self, kind: str, obj: dict) -> None:
        for handler in self.handlers:
            try:
                handler(kind, obj)
            except Exception:  # a broken handler must not stop the informer
                log.exception("informer handler failed for %s %s", self.resource.kind, object_key(obj))


class _Listing:
    """What one list (pages or a stream) has shown so far: the keys seen, and those that changed."""

    def __init__(self) -> None:
        self.seen: set[str] = set()
        self.changed: list[str] = []


def _newer(a: dict, b: dict) -> bool:
    """Whether `a` is a later version than `b`. resourceVersions are etcd revisions, compared as
    integers as client-go's mutation cache does; anything else is not known to be newer."""
    try:
        return int(a["metadata"]["resourceVersion"]) > int(b["metadata"]["resourceVersion"])
    except (KeyError, ValueError):
        return False


def _rv_of(obj: dict | None) -> str | None:
    return obj["metadata"].get("resourceVersion") if obj else None


def _with_kind(obj: dict, resource: Resource) -> dict:
    # List items carry no apiVersion/kind; fill them so cached objects look like single GETs.
    obj.setdefault("apiVersion", resource.api_version)
    obj.setdefault("kind", resource.kind)
    return obj
