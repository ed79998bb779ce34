"""Authentication and authorization of the kubelet API, as kubelet does it (`--client-ca-file` and
`--authorization-mode=Webhook`):

- TLS asks for a client certificate and verifies it against the cluster CA (the CA that signs the
  apiserver's `--kubelet-client-certificate`); a certificate from another CA fails the handshake;
  a request without one is 401 Unauthorized (kubelet runs with anonymous auth off);
- the certificate's CN is the user and its O fields the groups; a SubjectAccessReview asks the
  apiserver whether that user may `<verb> nodes/<subresource>` on this node (kubelet's mapping:
  /stats → stats, /metrics → metrics, /logs → log, /spec → spec, anything else → proxy); no → 403.
  Answers are cached like kubelet's webhook authorizer (allowed 5 min, denied 30 s).
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Awaitable, Callable

from aiohttp import web

ALLOWED_TTL = 300.0
DENIED_TTL = 30.0
_VERBS = {"GET": "get", "HEAD": "get", "POST": "create", "PUT": "update", "PATCH": "patch", "DELETE": "delete"}
_SUBRESOURCES = (("/stats", "stats"), ("/metrics", "metrics"), ("/logs", "log"), ("/spec", "spec"))


@dataclass(frozen=True)
class Caller:
    user: str
    groups: tuple[str, ...]


def caller_from_cert(peercert: dict | None) -> Caller | None:
    """The user of a verified client certificate (ssl's getpeercert() form): CN and O fields."""
    if not peercert:
        return None
    cn, groups = None, []
    for rdn in peercert.get("subject", ()):
        for key, value in rdn:
            if key == "commonName":
                cn = value
            elif key == "organizationName":
                groups.append(value)
    return Caller(cn, tuple(groups)) if cn else None


def node_attributes(method: str, path: str) -> tuple[str, str]:
    """(verb, subresource) of a kubelet API request on the Node resource."""
    verb = _VERBS.get(method.upper(), "get")
    for prefix, sub in _SUBRESOURCES:
        if path == prefix or path.startswith(prefix + "/"):
            return verb, sub
    return verb, "proxy"


def access_review(caller: Caller, node: str, verb: str, subresource: str) -> dict:
    return {"apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview",
            "spec": {"user": caller.user, "groups": list(caller.groups),
                     "resourceAttributes": {"verb": verb, "resource": "nodes", "subresource": subresource,
                                            "name": node}}}


Review = Callable[[dict], Awaitable[bool]]  # posts a SubjectAccessReview; True when allowed


def auth_middleware(node: str, review: Review, clock: Callable[[], float] = time.monotonic):
    cache: dict[tuple, tuple[bool, float]] = {}

    @web.middleware
    async def middleware(request: web.Request, handler):
        ssl_object = request.transport.get_extra_info("ssl_object") if request.transport else None
        caller = caller_from_cert(ssl_object.getpeercert() if ssl_object else None)
        if caller is None:
            return web.Response(status=401, text="Unauthorized: a client certificate signed by the cluster CA "
                                                 "is required\n")
        verb, sub = node_attributes(request.method, request.path)
        key = (caller, verb, sub)
        hit = cache.get(key)
        if hit is None or hit[1] < clock():
            allowed = await review(access_review(caller, node, verb, sub))
            hit = (allowed, clock() + (ALLOWED_TTL if allowed else DENIED_TTL))
            cache[key] = hit
        if not hit[0]:
            return web.Response(status=403, text=f"Forbidden (user={caller.user}, verb={verb}, resource=nodes, "
                                                 f"subresource={sub})\n")
        return await handler(request)
    return middleware


def kubeconfig_ca(kubeconfig: dict, base_dir: str) -> tuple[str | None, str | None]:
    """(file, base64 data) of the current context's cluster CA in a kubeconfig: kubelet's default
    --client-ca-file on a kubeadm node is the same cluster CA."""
    clusters = {c["name"]: c.get("cluster") or {} for c in kubeconfig.get("clusters") or []}
    contexts = {c["name"]: c.get("context") or {} for c in kubeconfig.get("contexts") or []}
    current = contexts.get(kubeconfig.get("current-context", ""), {})
    cluster = clusters.get(current.get("cluster", ""), next(iter(clusters.values()), {}))
    path = cluster.get("certificate-authority")
    if path and not path.startswith("/"):
        path = f"{base_dir.rstrip('/')}/{path}"
    return path, cluster.get("certificate-authority-data")
