"""Raw-JSON access to the Kubernetes API.

kubernetes_asyncio loads the kubeconfig and builds the TLS session (client certs, tokens, CA); all
requests go through that one aiohttp session as plain JSON. Decoding into generated model classes
is where a Python informer spends most of its CPU, so gangctl never does it.
"""
from __future__ import annotations

import asyncio
import json
import logging
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any, AsyncIterator, Awaitable, Callable, TypeVar

import aiohttp
from kubernetes_asyncio.client import Configuration
from kubernetes_asyncio.client.rest import RESTClientObject

from gangctl.api.resources import Resource
from gangctl.kube.auth import load_configuration
from gangctl.policy.leader import throttled_retry_in, write_timeout
from gangctl.policy.ratelimit import TokenBucket

log = logging.getLogger(__name__)
T = TypeVar("T")


class ApiError(Exception):
    """A non-2xx answer from the API server, with its Status reason and message."""

    def __init__(self, status: int, reason: str, message: str):
        super().__init__(f"{status} {reason}: {message}")
        self.status = status
        self.reason = reason
        self.message = message
        self.retry_after: float | None = None  # seconds the server asked us to wait (429)

    @property
    def gone(self) -> bool:
        return self.status == 410

    @property
    def not_found(self) -> bool:
        return self.status == 404

    @property
    def conflict(self) -> bool:
        return self.status == 409


class Kube:
    """One authenticated session to one API server."""

    def __init__(self, configuration: Configuration, *, qps: float = 0.0, burst: int = 1):
        self._conf = configuration
        self._rest = RESTClientObject(configuration, maxsize=32)
        self.host = configuration.host.rstrip("/")
        # One token bucket for every request of this session (client-go's QPS/burst); 0: unlimited.
        self._bucket = TokenBucket(qps, burst)
        # The leader elector's fence: seconds it stays open (writes go out only while > 0, and a
        # write's timeout is capped at it); None: no fence.
        self.write_fence: Callable[[], float] | None = None
        self.user_agent = USER_AGENT  # who is asking, in the apiserver's audit log
        self.throttled = 0  # 429 answers seen (the apiserver's Priority and Fairness said wait)

    @classmethod
    async def connect(cls, kubeconfig: Path | str | None = None) -> "Kube":
        """A session from `kubeconfig`, else $KUBECONFIG, else in-cluster, else ~/.kube/config
        (gangctl.kube.auth: certificates, token, tokenFile, exec plugins, service-account token)."""
        return cls(await load_configuration(kubeconfig))

    def set_rate_limit(self, qps: float, burst: int) -> None:
        """Requests per second (0: unlimited) and burst, shared by every loop using this session."""
        self._bucket = TokenBucket(qps, burst)

    async def close(self) -> None:
        await self._rest.close()

    @property
    def session(self) -> aiohttp.ClientSession:
        return self._rest.pool_manager

    async def _headers(self, content_type: str = "application/json") -> dict[str, str]:
        headers = {"Accept": "application/json", "Content-Type": content_type, "User-Agent": self.user_agent}
        # The loaders put "Bearer <token>" (or "Basic …") there; the refresh hook runs first (gangctl.kube.auth).
        token = await self._conf.get_api_key_with_prefix("BearerToken")
        if token:
            headers["Authorization"] = token
        return headers

    async def _send(self, method: str, path: str, params: dict | None, body: Any, content_type: str,
                    timeout: float) -> str:
        """The response body as text; an ApiError (with the server's reason and message) on status >= 400,
        `Unreachable` when no whole answer came (refused, reset, cut mid-body, timed out).

        Every request waits for the shared rate limit. A 429 (API Priority and Fairness, or a
        max-in-flight limit) is retried after the server's Retry-After, up to MAX_THROTTLE_RETRIES
        times, as client-go does; then it is an ApiError like any other. Under a write fence a write
        never outlives it: its timeout is capped at the time the fence stays open, and a 429 whose
        Retry-After would outlast the fence is given up at once."""
        data = None if body is None else json.dumps(body)
        fenced = method != "GET" and self.write_fence is not None
        for attempt in range(MAX_THROTTLE_RETRIES + 1):
            await self._wait_turn()
            headers = await self._headers(content_type)  # may run an exec plugin
            # The fence is checked last, right before the request leaves: rate-limit waits, 429
            # retries and credential refreshes can all outlast a renew deadline.
            left = self.write_fence() if fenced else None  # type: ignore[misc]
            capped = write_timeout(timeout, left)
            if capped is None:
                raise ApiError(0, "NotLeader", f"{method} {path} refused: this replica no longer holds the leader lease")
            try:
                async with self.session.request(method, self.host + path, params=_clean(params), data=data,
                                                headers=headers,
                                                server_hostname=self._conf.tls_server_name,  # kubeconfig tls-server-name
                                                timeout=aiohttp.ClientTimeout(total=capped)) as resp:
                    text = await resp.text()
            except aiohttp.ClientError as err:
                raise Unreachable(f"{method} {path}: {err!r}") from err
            if resp.status == 429 and attempt < MAX_THROTTLE_RETRIES:
                self.throttled += 1
                wait = throttled_retry_in(retry_after(resp.headers.get("Retry-After")),
                                          self.write_fence() if fenced else None)  # type: ignore[misc]
                if wait is not None:
                    await asyncio.sleep(wait)
                    continue
            if resp.status >= 400:
                raise _api_error(resp.status, resp.reason, text)
            return text
        raise AssertionError("unreachable")

    async def _wait_turn(self) -> None:
        delay = self._bucket.reserve(asyncio.get_running_loop().time())
        if delay > 0:
            await asyncio.sleep(delay)

    async def request(self, method: str, path: str, *, params: dict | None = None, body: Any = None,
                      content_type: str = "application/json", timeout: float = 30) -> dict:
        text = await self._send(method, path, params, body, content_type, timeout)
        return json.loads(text) if text else {}

    async def text(self, path: str, *, timeout: float = 60, **params: Any) -> str:
        """GET a plain-text subresource, e.g. pods/log (proxied by the apiserver to the node's kubelet)."""
        return await self._send("GET", path, params, None, "application/json", timeout)

    async def get(self, path: str, **params: Any) -> dict:
        return await self.request("GET", path, params=params)

    async def exists(self, path: str) -> bool:
        """Whether GET `path` finds something (404: False; any other error is raised)."""
        try:
            await self.get(path)
            return True
        except ApiError as err:
            if err.not_found:
                return False
            raise

    async def create(self, path: str, body: dict) -> dict:
        return await self.request("POST", path, body=body)

    async def delete(self, path: str, propagation: str = "Background", uid: str | None = None) -> dict | None:
        """Delete; None when it is gone already. With `uid`, only that incarnation: an object of the
        same name with another uid (409 on the precondition) is left alone, also returning None."""
        body: dict = {"propagationPolicy": propagation}
        if uid:
            body["preconditions"] = {"uid": uid}
        try:
            return await self.request("DELETE", path, body=body)
        except ApiError as err:
            if err.not_found or (uid and err.status == 409):
                return None
            raise

    async def apply(self, path: str, obj: dict, field_manager: str, force: bool = True) -> dict:
        """Server-side apply `obj` at `path` (an object path, or its /status)."""
        return await self.request("PATCH", path, body=obj, content_type="application/apply-patch+yaml",
                                  params={"fieldManager": field_manager, "force": "true" if force else None})

    async def json_patch(self, path: str, ops: list[dict]) -> dict:
        return await self.request("PATCH", path, body=ops, content_type="application/json-patch+json")

    async def remove_finalizer(self, path: str, obj: dict, finalizer: str) -> None:
        """Remove one finalizer, leaving any others (the garbage collector's foregroundDeletion…):
        a JSON patch that first tests the entry is where the cached copy says. A stale copy (the
        test fails: 422) is read again once; a gone object is fine."""
        for _ in range(2):
            finalizers = (obj.get("metadata") or {}).get("finalizers") or []
            if finalizer not in finalizers:
                return
            at = f"/metadata/finalizers/{finalizers.index(finalizer)}"
            try:
                await self.json_patch(path, [{"op": "test", "path": at, "value": finalizer},
                                             {"op": "remove", "path": at}])
                return
            except ApiError as err:
                if err.not_found:
                    return
                if err.status != 422:
                    raise
            try:
                obj = await self.get(path)
            except ApiError as err:
                if err.not_found:
                    return
                raise
        raise ApiError(409, "Conflict", f"finalizer {finalizer} of {path} kept moving")

    async def merge_patch(self, path: str, patch: dict) -> dict:
        return await self.request("PATCH", path, body=patch, content_type="application/merge-patch+json")

    async def list_pages(self, path: str, *, label_selector: str | None = None, field_selector: str | None = None,
                         limit: int = 500, page_timeout: float = 60) -> AsyncIterator[dict]:
        """A LIST in pages of `limit` (`limit`/`continue`), each page a dict with items and metadata.

        Each page has its own timeout, so a long list is not a failure. A continue token that expired
        (410) raises ApiError: the caller starts the list again."""
        token: str | None = None
        while True:
            page = await self.request("GET", path, params={"labelSelector": label_selector, "fieldSelector": field_selector,
                                                            "limit": limit, "continue": token}, timeout=page_timeout)
            yield page
            token = (page.get("metadata") or {}).get("continue")
            if not token:
                return

    async def watch(self, path: str, resource_version: str, *, label_selector: str | None = None,
                    timeout_seconds: int = 300, initial_events: bool = False) -> AsyncIterator[dict]:
        """Yield watch events (dicts with type and object) until the server ends the stream.

        `initial_events`: a streaming list (KEP-3157, the WatchList feature: on by default since
        Kubernetes 1.34): from the current state, every object first as an ADDED event served from the
        apiserver's watch cache, then a BOOKMARK annotated `k8s.io/initial-events-end`, then the
        changes. A server without the feature answers 422 (or 400)."""
        params = {"watch": "true", "resourceVersion": resource_version, "allowWatchBookmarks": "true",
                  "timeoutSeconds": str(timeout_seconds), "labelSelector": label_selector}
        if initial_events:
            params.update(sendInitialEvents="true", resourceVersionMatch="NotOlderThan")
        await self._wait_turn()
        try:
            async with self.session.get(self.host + path, params=_clean(params), headers=await self._headers(),
                                        server_hostname=self._conf.tls_server_name,
                                        timeout=aiohttp.ClientTimeout(total=None, sock_connect=30,
                                                                      sock_read=timeout_seconds + 30)) as resp:
                if resp.status == 429:
                    self.throttled += 1
                    raise _api_error(resp.status, resp.reason, await resp.text(),
                                     retry_after(resp.headers.get("Retry-After")))
                if resp.status >= 400:
                    raise _api_error(resp.status, resp.reason, await resp.text())
                async for line in resp.content:  # a line may be 4 MiB (read_bufsize 2 MiB): any object fits
                    if line.strip():
                        yield json.loads(line)
        except aiohttp.ClientError as err:
            raise Unreachable(f"watch {path}: {err!r}") from err


MAX_THROTTLE_RETRIES = 10  # client-go's maxRetries for 429 with Retry-After

def _user_agent() -> str:
    try:
        return f"gangctl/{version('gangctl')}"
    except PackageNotFoundError:  # run from a source tree
        return "gangctl"


USER_AGENT = _user_agent()


class Unreachable(ConnectionError):
    """No whole answer from the API server: the connection was refused or reset, the response was cut
    mid-body, or it timed out. aiohttp's own errors (`ServerDisconnectedError`, `ClientPayloadError`
    …) are raised as this, an OSError, so one `except UNREACHABLE` (or `except OSError`) covers them."""


# No answer from the API server (refused, reset, cut, timed out): a retry may well succeed; never a
# fault of the object being reconciled, and never a reason for a loop or the process to end. The one
# definition every loop that talks to the API server catches (aiohttp's errors for code that uses
# the session directly; the client's own requests raise them as `Unreachable`).
UNREACHABLE = (OSError, asyncio.TimeoutError, aiohttp.ClientError)


async def until_answered(call: Callable[[], Awaitable[T]], what: str, cap: float = 5.0) -> T:
    """`await call()`, again and again while the API server gives no answer (UNREACHABLE), with a
    backoff from 0.5 s capped at `cap`: a transport fault is waited out, never the end of a process.
    An answer, even an error (ApiError), is the caller's."""
    delay = 0.5
    while True:
        try:
            return await call()
        except UNREACHABLE as err:
            log.warning("%s: the API server did not answer (%r); retrying in %.1fs", what, err, delay)
            await asyncio.sleep(delay)
            delay = min(cap, delay * 2)


def retry_after(header: str | None, default: float = 1.0, cap: float = 30.0) -> float:
    """Seconds to wait from a Retry-After header (seconds only, as the apiserver sends it)."""
    try:
        return min(cap, max(0.0, float(header))) if header else default
    except ValueError:
        return default


def _api_error(status: int, reason: str | None, text: str, retry_after_seconds: float | None = None) -> "ApiError":
    payload = json.loads(text) if text.startswith("{") else {}
    err = ApiError(status, payload.get("reason", reason or ""), payload.get("message", text[:500]))
    err.retry_after = retry_after_seconds
    return err


def _clean(params: dict | None) -> dict | None:
    if not params:
        return None
    return {k: str(v) for k, v in params.items() if v is not None}
