"""Who may read /metrics: the API server decides, as controller-runtime's
`filters.WithAuthenticationAndAuthorization` (and kube-rbac-proxy) have it decide.

A bearer token is authenticated with a TokenReview, and the user it names is authorized with a
SubjectAccessReview for `get` on the non-resource URL (`/metrics`). Answers are cached for a short
while (10 s, kube-apiserver's default for delegated authentication and authorization) so a scraper
costs two API calls per token every 10 s at most. The controller's ServiceAccount needs `create` on
`tokenreviews.authentication.k8s.io` and `subjectaccessreviews.authorization.k8s.io`.

Give it a client without the leader's write guard: these POSTs change nothing, and a standby must
answer its scraper too.
"""
from __future__ import annotations

import hashlib
import logging
import time
from collections import OrderedDict
from typing import Callable

from gangctl.api.resources import Resource
from gangctl.kube.client import ApiError, Kube

log = logging.getLogger(__name__)

OK, UNAUTHORIZED, FORBIDDEN, UNAVAILABLE = 200, 401, 403, 503


class AccessReviewer:
    def __init__(self, kube: Kube, ttl: float = 10.0, max_entries: int = 1024,
                 clock: Callable[[], float] = time.monotonic):
        self.kube = kube
        self.ttl = ttl
        self.max_entries = max_entries
        self.clock = clock
        self.reviews = 0  # TokenReviews sent (the cache works when this stays low)
        self._cache: OrderedDict[tuple[str, str, str], tuple[float, int]] = OrderedDict()

    async def check(self, token: str | None, path: str, verb: str = "get") -> int:
        """200 when the token's user may `verb` the non-resource URL `path`; 401 for no token or one the
        API server does not accept, 403 when RBAC says no, 503 when the API server could not answer."""
        if not token:
            return UNAUTHORIZED
        key = (hashlib.sha256(token.encode()).hexdigest(), path, verb)
        now = self.clock()
        hit = self._cache.get(key)
        if hit and hit[0] > now:
            return hit[1]
        try:
            status = await self._review(token, path, verb)
        except (ApiError, OSError, TimeoutError) as err:
            log.warning("metrics auth: the API server could not review a token: %r", err)
            return UNAVAILABLE  # not cached
        self._cache[key] = (now + self.ttl, status)
        self._cache.move_to_end(key)
        while len(self._cache) > self.max_entries:
            self._cache.popitem(last=False)
        return status

    async def _review(self, token: str, path: str, verb: str) -> int:
        self.reviews += 1
        review = await self.kube.request("POST", "/apis/authentication.k8s.io/v1/tokenreviews", timeout=10, body={
            "apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview", "spec": {"token": token}})
        status = review.get("status") or {}
        if not status.get("authenticated"):
            return UNAUTHORIZED
        user = status.get("user") or {}
        sar = await self.kube.request("POST", "/apis/authorization.k8s.io/v1/subjectaccessreviews", timeout=10, body={
            "apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview",
            "spec": {"user": user.get("username"), "uid": user.get("uid"), "groups": user.get("groups") or [],
                     "extra": user.get("extra") or {},
                     "nonResourceAttributes": {"path": path, "verb": verb}}})
        return OK if (sar.get("status") or {}).get("allowed") else FORBIDDEN


async def may_list_and_watch(kube: Kube, resource: Resource, namespace: str | None = None) -> bool:
    """Whether this client may list and watch `resource` (in `namespace`, or in every namespace), as the
    API server's authorizer answers a SelfSubjectAccessReview (which every authenticated user may send:
    the built-in system:basic-user role)."""
    for verb in ("list", "watch"):
        review = await kube.create("/apis/authorization.k8s.io/v1/selfsubjectaccessreviews", {
            "apiVersion": "authorization.k8s.io/v1", "kind": "SelfSubjectAccessReview",
            "spec": {"resourceAttributes": {"group": resource.group, "resource": resource.plural, "verb": verb,
                                            **({"namespace": namespace} if namespace else {})}}})
        if not (review.get("status") or {}).get("allowed"):
            return False
    return True
