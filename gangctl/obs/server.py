"""/metrics, /healthz and /readyz over aiohttp.

With `authorize` (the controller's `--metrics-auth`: gangctl.kube.access_review), /metrics answers
only requests whose bearer token the API server accepts and allows `get` on `/metrics`; 401 or 403
otherwise, and 429 with Retry-After when the token would need a review that the review gate
(gangctl.policy.review_gate) does not admit now. /healthz and /readyz stay open for the kubelet's
probes; /readyz lists what keeps the replica from being ready, one line each.
"""
from __future__ import annotations

import errno
from typing import Awaitable, Callable

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from gangctl.obs import ports
from gangctl.policy.review_gate import Busy

# (bearer token or None, URL path, source address) -> HTTP status: 200 allowed, 401, 403, or 503 when
# it could not be checked; raises Busy when a review is not admitted now
Authorize = Callable[[str | None, str, str], Awaitable[int]]

_REFUSALS = {401: "Unauthorized", 403: "Forbidden", 503: "authorization unavailable"}


def bearer_token(header: str | None) -> str | None:
    if not header:
        return None
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer":
        return None
    return token.strip() or None


def retry_after_header(seconds: float) -> str:
    """A Retry-After header's value: whole seconds, at least 1."""
    return str(max(1, round(seconds)))


def make_app(registry: CollectorRegistry, problems: Callable[[], list[str]],
             authorize: Authorize | None = None,
             degraded: Callable[[], list[str]] = lambda: []) -> web.Application:
    """`problems()`: why this replica is not ready (its caches cannot be trusted); empty when ready.
    `degraded()`: what an optional feature cannot do now (the progress endpoint without its certificate):
    named by /readyz, which still answers 200, so an optional feature never holds a rollout or a drain."""
    async def metrics(request: web.Request) -> web.Response:
        if authorize is not None:
            try:
                status = await authorize(bearer_token(request.headers.get("Authorization")), request.path,
                                         request.remote or "")
            except Busy as busy:
                return web.Response(status=429, text="too many token reviews; retry later",
                                    headers={"Retry-After": retry_after_header(busy.seconds)})
            if status != 200:
                headers = {"WWW-Authenticate": 'Bearer realm="gangctl"'} if status == 401 else None
                return web.Response(status=status, text=_REFUSALS.get(status, "refused"), headers=headers)
        return web.Response(body=generate_latest(registry), headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def healthz(_: web.Request) -> web.Response:
        return web.Response(text="ok")

    async def readyz(_: web.Request) -> web.Response:
        found = problems()
        if not found:
            notes = degraded()
            return web.Response(text="ok" + "".join(f"\ndegraded: {n}" for n in notes) + "\n" * bool(notes))
        return web.Response(status=503, text="not ready:\n" + "\n".join(found) + "\n")

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    return app


# On stop, how long a request already being answered may take (aiohttp's default is 60 s, longer than a
# pod's grace period: a stuck scrape or report would turn a clean stop into a SIGKILL).
SHUTDOWN_SECONDS = 2.0


async def serve(app: web.Application, host: str, port: int) -> web.AppRunner:
    """Serve `app` on host:port; PortInUse says which process holds the port."""
    runner = web.AppRunner(app, access_log=None, shutdown_timeout=SHUTDOWN_SECONDS)
    await runner.setup()
    try:
        await web.TCPSite(runner, host, port).start()
    except OSError as err:
        await runner.cleanup()
        if err.errno == errno.EADDRINUSE:
            raise ports.PortInUse(host, port, ports.holders(port)) from None
        raise
    return runner
