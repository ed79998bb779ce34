"""Bearer tokens checked by the API server, as controller-runtime's
`filters.WithAuthenticationAndAuthorization` (and kube-rbac-proxy) have it: a TokenReview
authenticates the token, a SubjectAccessReview authorizes its user.

`Reviews` sends them for every endpoint of the process, behind one `ReviewGate` and with a
`Verdicts` cache per endpoint (gangctl.policy.review_gate: who is reviewed, who is answered from
memory, who gets 429), so callers with invented tokens cannot turn requests into API requests beyond
the gate's caps. `AccessReviewer` is /metrics' check: a token allowed `get` on the non-resource URL,
its verdict cached 10 s (kube-apiserver's default for delegated authentication and authorization).
The controller's ServiceAccount needs `create` on `tokenreviews.authentication.k8s.io` and
`subjectaccessreviews.authorization.k8s.io`.

Give it a client without the leader's write guard: these POSTs change nothing, and a standby must
answer its scraper too.
"""
from __future__ import annotations

import logging
import time
from typing import Awaitable, Callable, TypeVar

from gangctl.api.resources import Resource
from gangctl.kube.client import UNREACHABLE, ApiError, Kube
from gangctl.policy.review_gate import Busy, ReviewGate, Verdicts, token_key

log = logging.getLogger(__name__)

OK, UNAUTHORIZED, FORBIDDEN, UNAVAILABLE = 200, 401, 403, 503
TOKEN_REVIEW, ACCESS_REVIEW = "TokenReview", "SubjectAccessReview"
V = TypeVar("V")


class Reviews:
    """The process's token reviews: `verdict` answers from an endpoint's cache or sends a review the
    gate admits (`Busy` otherwise). `on_review(kind)` counts each review sent, `on_refused(limit)`
    each request refused by the gate."""

    def __init__(self, kube: Kube, gate: ReviewGate | None = None, *, clock: Callable[[], float] = time.monotonic,
                 on_review: Callable[[str], None] = lambda kind: None,
                 on_refused: Callable[[str], None] = lambda limit: None):
        self.kube = kube
        self.gate = gate or ReviewGate()
        self.clock = clock
        self.on_review, self.on_refused = on_review, on_refused

    async def verdict(self, cache: Verdicts[V], token: str, source: str,
                      review: Callable[[], Awaitable[tuple[V, bool]]], *scope: str) -> V:
        """`cache`'s verdict on `token` (for `scope`), or `review()`'s: (verdict, whether the API server
        authenticated the token). Raises `Busy`, or what `review` raises (not cached)."""
        key = token_key(token, *scope)
        hit, verdict = cache.fresh(key, self.clock())
        if hit:
            return verdict  # type: ignore[return-value]
        known = cache.known(key)
        try:
            self.gate.admit(source, known, self.clock())
        except Busy as busy:
            self.on_refused(busy.limit)
            raise
        try:
            verdict, authenticated = await review()
        finally:
            self.gate.done(source, known)
        cache.put(key, verdict, authenticated, self.clock())
        return verdict

    async def token_review(self, token: str, audiences: list[str] | None = None) -> dict:
        """The TokenReview's status (audiences: the API server's own when None)."""
        spec: dict = {"token": token}
        if audiences:
            spec["audiences"] = audiences
        self.on_review(TOKEN_REVIEW)
        review = await self.kube.request("POST", "/apis/authentication.k8s.io/v1/tokenreviews", timeout=10, body={
            "apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview", "spec": spec})
        return review.get("status") or {}

    async def allowed(self, user: dict, path: str, verb: str) -> bool:
        """Whether the SubjectAccessReview lets `user` (a TokenReview's) `verb` the non-resource URL."""
        self.on_review(ACCESS_REVIEW)
        sar = await self.kube.request("POST", "/apis/authorization.k8s.io/v1/subjectaccessreviews", timeout=10, body={
            "apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview",
            "spec": {"user": user.get("username"), "uid": user.get("uid"), "groups": user.get("groups") or [],
                     "extra": user.get("extra") or {},
                     "nonResourceAttributes": {"path": path, "verb": verb}}})
        return bool((sar.get("status") or {}).get("allowed"))


class AccessReviewer:
    def __init__(self, reviews: Reviews, ttl: float = 10.0, max_entries: int = 4096):
        self.reviews = reviews
        self.cache: Verdicts[int] = Verdicts(ttl, max_entries)

    async def check(self, token: str | None, path: str, source: str, verb: str = "get") -> int:
        """200 when the token's user may `verb` the non-resource URL `path`; 401 for no token or one the
        API server does not accept, 403 when RBAC says no, 503 when the API server could not answer.
        Raises `Busy` when the gate refuses a review."""
        if not token:
            return UNAUTHORIZED

        async def review() -> tuple[int, bool]:
            status = await self.reviews.token_review(token)
            if not status.get("authenticated"):
                return UNAUTHORIZED, False
            return (OK if await self.reviews.allowed(status.get("user") or {}, path, verb) else FORBIDDEN), True
        try:
            return await self.reviews.verdict(self.cache, token, source, review, path, verb)
        except (ApiError, *UNREACHABLE) as err:
            log.warning("metrics auth: the API server could not review a token: %r", err)
            return UNAVAILABLE  # not cached


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
