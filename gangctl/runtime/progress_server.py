"""The progress endpoint: trainer pods POST their `status.trainerStatus` here (Kubeflow Trainer's
KEP-2779 contract; the pure rules are in gangctl.model.progress).

    POST /apis/trainer.kubeflow.org/v1alpha1/namespaces/{namespace}/trainjobs/{name}/status
    Authorization: Bearer <the pod's token, audience trainer.kubeflow.org>
    {"trainerStatus": {"progressPercentage": 45, "estimatedRemainingSeconds": 600,
                       "metrics": [{"name": "loss", "value": "0.23"}], "lastUpdatedTime": "..."}}

    POST /apis/kubeflow.org/v1/namespaces/{namespace}/pytorchjobs/{name}/status   (gangctl's extension)

HTTPS only. A request is accepted when the API server's TokenReview (sent with the trainer audience)
says the token is bound to a pod, and that pod (looked up in the controller's caches, matched by uid)
is live and was made by a Job that this TrainJob (matched by uid) made (`progress.refusal`). Answers:
200 with the status written, 400 naming the bad field (or a body that is not JSON, or nested too
deeply), 401, 403 saying why, 404 (no such TrainJob), 413 (a body over 256 KiB), 429 with Retry-After
(per ServiceAccount: a token bucket of `rate` reports per second, `burst` deep; or a token review the
review gate does not admit now, gangctl.policy.review_gate), 503 when the API server could not be
asked. Verdicts are cached per token for `ttl` seconds, so a pod reporting every few seconds costs one
TokenReview a minute. Every replica serves it (a report is not a controller decision); the write is a
server-side apply of `status.trainerStatus` alone, under a field manager of its own that the
reconciler never sends back. A PyTorchJob's pods are checked the same way (pod -> PyTorchJob) and
their report goes to the PyTorchJob's annotation `gangctl.io/trainer-status` (a merge patch of it
alone): v1's status schema has no field for it.

`ProgressEndpoint` serves it with the certificate of gangctl.kube.serving_cert and checks the Secret
again every `check_seconds`: a certificate re-issued before expiry (here or by another replica) is
loaded into the same TLS context, for the next handshakes, without a restart. A Secret that cannot
serve leaves the endpoint off with its reason in `problem()` (the controller's /readyz), and the
controller runs on.
"""
from __future__ import annotations

import asyncio
import functools
import json
import logging
import os
import ssl
import tempfile
import time
from datetime import datetime, timezone
from typing import Callable

from aiohttp import web

from gangctl.api.resources import PYTORCHJOBS, TRAINJOBS
from gangctl.kube import serving_cert
from gangctl.kube.access_review import Reviews
from gangctl.kube.client import UNREACHABLE, ApiError, Kube
from gangctl.kube.serving_cert import MalformedSecret, ServingCert
from gangctl.obs.server import SHUTDOWN_SECONDS, bearer_token, retry_after_header
from gangctl.model import progress
from gangctl.policy.ratelimit import TokenBuckets
from gangctl.policy.review_gate import Busy, Verdicts
from gangctl.runtime.reconciler import Caches

log = logging.getLogger(__name__)
FIELD_MANAGER = "gangctl-trainer-status"
# One route per job kind whose pods report: the kind's own /status path.
ROUTES = {kind: f"/apis/{r.group}/{r.version}/namespaces/{{namespace}}/{r.plural}/{{name}}/status"
          for kind, r in progress.REPORTING_KINDS.items()}
MAX_BODY = 256 * 1024


class ProgressServer:
    def __init__(self, kube: Kube, reviews: Reviews, caches: Caches, *, rate: float = 1.0, burst: int = 10,
                 ttl: float = 60.0, on_answer: Callable[[int], None] = lambda code: None,
                 clock: Callable[[], float] = time.monotonic):
        self.kube = kube
        self.reviews = reviews
        self.caches = caches
        self.clock = clock
        self.on_answer = on_answer
        self.limits = TokenBuckets(rate, burst)
        self.senders: Verdicts[progress.Sender | None] = Verdicts(ttl)

    def app(self) -> web.Application:
        app = web.Application(client_max_size=MAX_BODY)
        for kind, route in ROUTES.items():
            app.router.add_post(route, functools.partial(self.handle, kind))
        return app

    async def handle(self, kind: str, request: web.Request) -> web.Response:
        response = await self._answer(request, kind)
        self.on_answer(response.status)
        return response

    async def _answer(self, request: web.Request, kind: str) -> web.Response:
        namespace, name = request.match_info["namespace"], request.match_info["name"]
        token = bearer_token(request.headers.get("Authorization"))
        if not token:
            return _error(401, f"no bearer token: send the pod's token, the file ${progress.ENV_TOKEN} names")
        try:
            who = await self.reviews.verdict(self.senders, token, request.remote or "", lambda: self._review(token))
        except Busy as busy:
            return _error(429, "too many new tokens at once; retry", retry_after=busy.seconds)
        except (ApiError, *UNREACHABLE) as err:
            log.warning("progress: the API server could not review a token: %r", err)
            return _error(503, "the API server could not review the token; retry later", retry_after=5)
        if who is None:
            return _error(401, f"token not accepted: it must be a pod's token for audience {progress.AUDIENCE} "
                               f"(the file ${progress.ENV_TOKEN} names)")
        jobs = self.caches.trainjobs if kind == "TrainJob" else self.caches.pytorchjobs
        why = progress.refusal(who, self.caches.pods.get(f"{who.namespace}/{who.pod}"),
                               jobs.get(f"{namespace}/{name}") if jobs is not None else None, self._owner,
                               namespace, name, kind)
        if why is not None:
            return _error(403, f"{why}: it may not report for {kind} {namespace}/{name}")
        if (wait := self.limits.take(who.subject, self.clock())) > 0:
            return _error(429, f"more than {self.limits.rate:g} reports a second from {who.subject}",
                          retry_after=wait)
        try:
            status = progress.parse_report(json.loads(await request.read() or b"null"), datetime.now(timezone.utc))
        except web.HTTPRequestEntityTooLarge:
            return _error(413, f"the body is over {MAX_BODY // 1024} KiB")
        except RecursionError:
            return _error(400, "the body is nested too deeply")
        except (ValueError, UnicodeDecodeError) as err:
            return _error(400, str(err) if isinstance(err, progress.ReportError) else f"the body is not JSON: {err}")
        try:
            if kind == "TrainJob":
                written = await self.kube.apply(TRAINJOBS.path(namespace, name, "status"), {
                    "apiVersion": TRAINJOBS.api_version, "kind": TRAINJOBS.kind,
                    "metadata": {"name": name, "namespace": namespace}, "status": {"trainerStatus": status}},
                    FIELD_MANAGER)
            else:
                written = await self.kube.merge_patch(PYTORCHJOBS.path(namespace, name), {"metadata": {"annotations": {
                    progress.REPORT_ANNOTATION: json.dumps(status, sort_keys=True, separators=(",", ":"))}}})
        except (ApiError, *UNREACHABLE) as err:
            if isinstance(err, ApiError) and err.not_found:
                return _error(404, f"{kind} {namespace}/{name} not found")
            if isinstance(err, ApiError) and err.status in (400, 422):
                return _error(400, err.message)
            log.warning("progress: writing %s/%s failed: %r", namespace, name, err)
            return _error(503, "the API server did not take the status; retry later", retry_after=5)
        return web.json_response({"trainerStatus": progress.reported(written)})

    async def _review(self, token: str) -> tuple[progress.Sender | None, bool]:
        status = await self.reviews.token_review(token, [progress.AUDIENCE])
        return progress.sender(status), bool(status.get("authenticated"))

    def _owner(self, namespace: str, kind: str, name: str) -> dict | None:
        """An owner of a trainer pod, from the caches (a TrainJob's pods come from Jobs; a PyTorchJob's
        pods are its own, so no lookup)."""
        return self.caches.jobs.get(f"{namespace}/{name}") if kind == "Job" else None


def _error(status: int, message: str, retry_after: float | None = None) -> web.Response:
    headers = {"Retry-After": retry_after_header(retry_after)} if retry_after is not None else None
    if status == 401:
        headers = {**(headers or {}), "WWW-Authenticate": 'Bearer realm="gangctl"'}
    return web.json_response({"code": status, "message": message}, status=status, headers=headers)


def server_context() -> ssl.SSLContext:
    return ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)


def load_cert(context: ssl.SSLContext, cert: ServingCert) -> None:
    """Put `cert` into `context` (handshakes from now on present it). The ssl module reads files only:
    a private temporary folder."""
    with tempfile.TemporaryDirectory(prefix="gangctl-tls-") as folder:
        os.chmod(folder, 0o700)
        cert_file, key_file = os.path.join(folder, "tls.crt"), os.path.join(folder, "tls.key")
        for path, text in ((cert_file, cert.cert_pem), (key_file, cert.key_pem)):
            with open(os.open(path, os.O_WRONLY | os.O_CREAT, 0o600), "w") as f:
                f.write(text)
        context.load_cert_chain(cert_file, key_file)


class ProgressEndpoint:
    """The progress endpoint served on host:port with the certificate in Secret `namespace/secret`
    (made or re-issued for `hosts` by serving_cert.ensure). `refresh()` checks the Secret once (and
    starts serving on the first success); `run()` refreshes every `check_seconds`. `on_served(cert)`
    after each success (the reconciler gives new pods the endpoint and its CA). Never raises."""

    def __init__(self, server: ProgressServer, kube: Kube, secret: str, hosts: list[str], host: str, port: int,
                 on_served: Callable[[ServingCert], None], check_seconds: float = 300.0):
        self.server, self.kube = server, kube
        self.namespace, _, self.secret = secret.partition("/")
        self.hosts, self.host, self.port = hosts, host, port
        self.on_served = on_served
        self.check_seconds = check_seconds
        self.context = server_context()
        self.cert: ServingCert | None = None
        self.runner: web.AppRunner | None = None
        self._problem: str | None = None

    def problem(self) -> str | None:
        """Why trainer pods cannot report to this replica now (None: they can)."""
        return self._problem

    async def refresh(self) -> None:
        try:
            await self._refresh()
        except Exception:  # noqa: BLE001 - an optional endpoint never takes the controller down
            log.exception("progress endpoint: checking the certificate failed")
            self._fail("checking the certificate failed (a bug: see the log)")

    async def _refresh(self) -> None:
        where = f"{self.namespace}/{self.secret}"
        try:
            cert = await serving_cert.ensure(self.kube, self.namespace, self.secret, self.hosts)
        except MalformedSecret as err:
            return self._fail(f"{err}; fix it, or delete it and gangctl makes a new one", needs_someone=True)
        except (ApiError, RuntimeError, *UNREACHABLE) as err:
            return self._fail(f"cannot read or make secret {where} ({err}); check the RBAC for it "
                              "(get and update by name, create)")
        try:
            if cert != self.cert:
                load_cert(self.context, cert)
                if self.cert is not None:
                    log.info("progress endpoint: serving the certificate now in secret %s", where)
                self.cert = cert
            if self.runner is None:
                self.runner = await serve(self.server, self.context, self.host, self.port)
                log.info("progress endpoint on https://%s:%d", self.host, self.port)
        except OSError as err:  # ssl.SSLError is one
            return self._fail(f"cannot serve on {self.host}:{self.port} with the certificate of secret {where} "
                              f"({err})")
        self._problem = None
        self.on_served(cert)

    def _fail(self, reason: str, needs_someone: bool = False) -> None:
        """A failed check. While a certificate is served, a passing API error is only a warning; a
        Secret someone must fix, or an endpoint not served at all, is a problem (/readyz)."""
        serving = self.runner is not None
        if serving and not needs_someone:
            log.warning("progress endpoint: %s; serving the certificate loaded before", reason)
            return
        self._problem = f"progress endpoint {'serving its last certificate' if serving else 'off'}: {reason}"
        log.error("%s (checked again every %.0fs)", self._problem, self.check_seconds)

    async def run(self) -> None:
        while True:
            await asyncio.sleep(self.check_seconds)
            await self.refresh()

    async def close(self) -> None:
        if self.runner is not None:
            await self.runner.cleanup()


async def serve(server: ProgressServer, context: ssl.SSLContext, host: str, port: int) -> web.AppRunner:
    """HTTPS on host:port; SO_REUSEPORT, so several replicas on one host (tests, a restart) all serve."""
    runner = web.AppRunner(server.app(), access_log=None, shutdown_timeout=SHUTDOWN_SECONDS)
    await runner.setup()
    try:
        await web.TCPSite(runner, host, port, ssl_context=context, reuse_port=True).start()
    except BaseException:
        await runner.cleanup()
        raise
    return runner
