"""Raw-JSON access to the Kubernetes API.

kubernetes_asyncio loads the kubeconfig and builds the TLS session (client certs, tokens, CA); all
requests go through that one aiohttp session as plain JSON. Decoding into generated model classes
is where a Python informer spends most of its CPU, so gangctl never does it.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, AsyncIterator

import aiohttp
from kubernetes_asyncio.client import Configuration
from kubernetes_asyncio.client.rest import RESTClientObject

from gangctl.api.resources import Resource
from gangctl.kube.auth import load_configuration


class ApiError(Exception):
    """A non-2xx answer from the API server, with its Status reason and message."""

    def __init__(self, status: int, reason: str, message: str):
        super().__init__(f"{status} {reason}: {message}")
        self.status = status
        self.reason = reason
        self.message = message

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

    def __init__(self, configuration: Configuration):
        self._conf = configuration
        self._rest = RESTClientObject(configuration, maxsize=32)
        self.host = configuration.host.rstrip("/")

    @classmethod
    async def connect(cls, kubeconfig: Path | str | None = None) -> "Kube":
        """A session from `kubeconfig`, else $KUBECONFIG, else in-cluster, else ~/.kube/config
        (gangctl.kube.auth: certificates, token, tokenFile, exec plugins, service-account token)."""
        return cls(await load_configuration(kubeconfig))

    async def close(self) -> None:
        await self._rest.close()

    @property
    def session(self) -> aiohttp.ClientSession:
        return self._rest.pool_manager

    async def _headers(self, content_type: str = "application/json") -> dict[str, str]:
        headers = {"Accept": "application/json", "Content-Type": content_type}
        # The loaders put "Bearer <token>" (or "Basic …") there; the refresh hook runs first (gangctl.kube.auth).
        token = await self._conf.get_api_key_with_prefix("BearerToken")
        if token:
            headers["Authorization"] = token
        return headers

    async def _send(self, method: str, path: str, params: dict | None, body: Any, content_type: str,
                    timeout: float) -> str:
        """The response body as text; an ApiError (with the server's reason and message) on status >= 400."""
        data = None if body is None else json.dumps(body)
        async with self.session.request(method, self.host + path, params=_clean(params), data=data,
                                        headers=await self._headers(content_type),
                                        server_hostname=self._conf.tls_server_name,  # kubeconfig tls-server-name
                                        timeout=aiohttp.ClientTimeout(total=timeout)) as resp:
            text = await resp.text()
            if resp.status >= 400:
                payload = json.loads(text) if text.startswith("{") else {}
                raise ApiError(resp.status, payload.get("reason", resp.reason or ""), payload.get("message", text[:500]))
            return text

    async def request(self, method: str, path: str, *, params: dict | None = None, body: Any = None,
                      content_type: str = "application/json", timeout: float = 60) -> dict:
        text = await self._send(method, path, params, body, content_type, timeout)
        return json.loads(text) if text else {}

    async def text(self, path: str, *, timeout: float = 60, **params: Any) -> str:
        """GET a plain-text subresource, e.g. pods/log (proxied by the apiserver to the node's kubelet)."""
        return await self._send("GET", path, params, None, "application/json", timeout)

    async def get(self, path: str, **params: Any) -> dict:
        return await self.request("GET", path, params=params)

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

    async def merge_patch(self, path: str, patch: dict) -> dict:
        return await self.request("PATCH", path, body=patch, content_type="application/merge-patch+json")

    async def watch(self, path: str, resource_version: str, *, label_selector: str | None = None,
                    timeout_seconds: int = 300) -> AsyncIterator[dict]:
        """Yield watch events (dicts with type and object) until the server ends the stream."""
        params = {"watch": "true", "resourceVersion": resource_version, "allowWatchBookmarks": "true",
                  "timeoutSeconds": str(timeout_seconds), "labelSelector": label_selector}
        async with self.session.get(self.host + path, params=_clean(params), headers=await self._headers(),
                                    server_hostname=self._conf.tls_server_name,
                                    timeout=aiohttp.ClientTimeout(total=None, sock_read=timeout_seconds + 30)) as resp:
            if resp.status >= 400:
                text = await resp.text()
                payload = json.loads(text) if text.startswith("{") else {}
                raise ApiError(resp.status, payload.get("reason", ""), payload.get("message", text[:500]))
            async for line in resp.content:
                if line.strip():
                    yield json.loads(line)


def _clean(params: dict | None) -> dict | None:
    if not params:
        return None
    return {k: str(v) for k, v in params.items() if v is not None}
