"""The progress endpoint: trainer pods POST their `status.trainerStatus` here (Kubeflow Trainer's
KEP-2779 contract; the pure rules are in gangctl.policy.progress).

    POST /apis/trainer.kubeflow.org/v1alpha1/namespaces/{namespace}/trainjobs/{name}/status
    Authorization: Bearer <the pod's token, audience trainer.kubeflow.org>
    {"trainerStatus": {"progressPercentage": 45, "estimatedRemainingSeconds": 600,
                       "metrics": [{"name": "loss", "value": "0.23"}], "lastUpdatedTime": "..."}}

HTTPS only (gangctl.kube.serving_cert). A request is accepted when the API server's TokenReview (sent
with the trainer audience) says the token is bound to a pod, and that pod — looked up in the
controller's pod cache by name, matched by uid — belongs to the TrainJob in the URL. Answers: 200 with
the status written, 400 naming the bad field, 401, 403, 404 (no such TrainJob), 429 with Retry-After
(per ServiceAccount: a token bucket of `rate` reports per second, `burst` deep), 503 when the API
server could not be asked. Verdicts are cached per token for `ttl` seconds, so a pod reporting every
few seconds costs one TokenReview a minute. Every replica serves it (a report is not a controller
decision); the write is a server-side apply of `status.trainerStatus` alone, under a field manager of
its own that the reconciler never sends back.
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import ssl
import tempfile
import time
from collections import OrderedDict
from datetime import datetime, timezone
from typing import Callable

from aiohttp import web

from gangctl.api.resources import TRAINJOBS
from gangctl.kube.client import UNREACHABLE, ApiError, Kube
from gangctl.kube.serving_cert import ServingCert
from gangctl.obs.server import bearer_token
from gangctl.policy import progress
from gangctl.policy.ratelimit import TokenBucket

log = logging.getLogger(__name__)
FIELD_MANAGER = "gangctl-trainer-status"
ROUTE = "/apis/trainer.kubeflow.org/v1alpha1/namespaces/{namespace}/trainjobs/{name}/status"


class TokenBuckets:
    """One `TokenBucket` per key (the oldest keys dropped past `max_keys`): `take(key)` says how long
    to wait when the key's bucket is empty (0: go ahead)."""

    def __init__(self, rate: float, burst: int, max_keys: int = 4096, clock: Callable[[], float] = time.monotonic):
        self.rate, self.burst, self.max_keys, self.clock = rate, burst, max_keys, clock
        self._buckets: OrderedDict[str, TokenBucket] = OrderedDict()

    def take(self, key: str) -> float:
        bucket = self._buckets.pop(key, None) or TokenBucket(self.rate, self.burst)
        self._buckets[key] = bucket
        while len(self._buckets) > self.max_keys:
            self._buckets.popitem(last=False)
        return bucket.take(self.clock())


class ProgressServer:
    def __init__(self, kube: Kube, pod: Callable[[str], dict | None], *, rate: float = 1.0, burst: int = 10,
                 ttl: float = 60.0, on_answer: Callable[[int], None] = lambda code: None,
                 clock: Callable[[], float] = time.monotonic):
        self.kube = kube
        self.pod = pod                   # "ns/name" -> the pod from the controller's cache
        self.ttl = ttl
        self.clock = clock
        self.on_answer = on_answer
        self.limits = TokenBuckets(rate, burst, clock=clock)
        # A TokenReview per token at most every `ttl`; and at most 20 a second overall, so a flood of
        # made-up tokens cannot turn into a flood of API requests.
        self.reviews = TokenBuckets(20.0, 20, clock=clock)
        self.reviews_sent = 0
        self._senders: OrderedDict[str, tuple[float, progress.Sender | None]] = OrderedDict()

    def app(self) -> web.Application:
        app = web.Application(client_max_size=256 * 1024)
        app.router.add_post(ROUTE, self.handle)
        return app

    async def handle(self, request: web.Request) -> web.Response:
        response = await self._answer(request)
        self.on_answer(response.status)
        return response

    async def _answer(self, request: web.Request) -> web.Response:
        namespace, name = request.match_info["namespace"], request.match_info["name"]
        token = bearer_token(request.headers.get("Authorization"))
        if not token:
            return _error(401, f"no bearer token: send the pod's token, the file ${progress.ENV_TOKEN} names")
        try:
            who = await self._sender(token)
        except _Busy as busy:
            return _error(429, "too many new tokens at once; retry", retry_after=busy.seconds)
        except (ApiError, OSError, TimeoutError) as err:
            log.warning("progress: the API server could not review a token: %r", err)
            return _error(503, "the API server could not review the token; retry later", retry_after=5)
        if who is None:
            return _error(401, f"token not accepted: it must be a pod's token for audience {progress.AUDIENCE} "
                               f"(the file ${progress.ENV_TOKEN} names)")
        pod = self.pod(f"{who.namespace}/{who.pod}")
        if not progress.may_report(who, pod, namespace, name):
            return _error(403, f"pod {who.namespace}/{who.pod} is not a running pod of TrainJob {namespace}/{name}")
        if (wait := self.limits.take(who.subject)) > 0:
            return _error(429, f"more than {self.limits.rate:g} reports a second from {who.subject}",
                          retry_after=wait)
        try:
            body = json.loads(await request.read() or b"null")
            status = progress.parse_report(body, datetime.now(timezone.utc))
        except (ValueError, UnicodeDecodeError) as err:
            return _error(400, str(err) if isinstance(err, progress.ReportError) else f"the body is not JSON: {err}")
        try:
            written = await self.kube.apply(TRAINJOBS.path(namespace, name, "status"), {
                "apiVersion": TRAINJOBS.api_version, "kind": TRAINJOBS.kind,
                "metadata": {"name": name, "namespace": namespace}, "status": {"trainerStatus": status}},
                FIELD_MANAGER)
        except UNREACHABLE as err:
            log.warning("progress: writing %s/%s got no answer: %r", namespace, name, err)
            return _error(503, "the API server did not answer; retry later", retry_after=5)
        except ApiError as err:
            if err.not_found:
                return _error(404, f"TrainJob {namespace}/{name} not found")
            if err.status in (400, 422):
                return _error(400, err.message)
            log.warning("progress: writing %s/%s failed: %r", namespace, name, err)
            return _error(503, "the API server did not take the status; retry later", retry_after=5)
        return web.json_response({"trainerStatus": (written.get("status") or {}).get("trainerStatus")})

    async def _sender(self, token: str) -> progress.Sender | None:
        key = hashlib.sha256(token.encode()).hexdigest()
        now = self.clock()
        hit = self._senders.get(key)
        if hit and hit[0] > now:
            return hit[1]
        if (wait := self.reviews.take("")) > 0:
            raise _Busy(wait)
        self.reviews_sent += 1
        review = await self.kube.request("POST", "/apis/authentication.k8s.io/v1/tokenreviews", timeout=10, body={
            "apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview",
            "spec": {"token": token, "audiences": [progress.AUDIENCE]}})
        who = progress.sender(review.get("status") or {})
        self._senders[key] = (now + self.ttl, who)
        self._senders.move_to_end(key)
        while len(self._senders) > 4096:
            self._senders.popitem(last=False)
        return who


class _Busy(Exception):
    def __init__(self, seconds: float):
        super().__init__(seconds)
        self.seconds = seconds


def _error(status: int, message: str, retry_after: float | None = None) -> web.Response:
    headers = {"Retry-After": str(max(1, round(retry_after)))} if retry_after is not None else None
    if status == 401:
        headers = {**(headers or {}), "WWW-Authenticate": 'Bearer realm="gangctl"'}
    return web.json_response({"code": status, "message": message}, status=status, headers=headers)


def tls_context(cert: ServingCert) -> ssl.SSLContext:
    """A server context from PEM strings (the ssl module reads files: a private temporary folder)."""
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    with tempfile.TemporaryDirectory(prefix="gangctl-tls-") as folder:
        os.chmod(folder, 0o700)
        cert_file, key_file = os.path.join(folder, "tls.crt"), os.path.join(folder, "tls.key")
        for path, text in ((cert_file, cert.cert_pem), (key_file, cert.key_pem)):
            with open(os.open(path, os.O_WRONLY | os.O_CREAT, 0o600), "w") as f:
                f.write(text)
        context.load_cert_chain(cert_file, key_file)
    return context


async def serve(server: ProgressServer, cert: ServingCert, host: str, port: int) -> web.AppRunner:
    """HTTPS on host:port; SO_REUSEPORT, so several replicas on one host (tests, a restart) all serve."""
    runner = web.AppRunner(server.app(), access_log=None)
    await runner.setup()
    await web.TCPSite(runner, host, port, ssl_context=tls_context(cert), reuse_port=True).start()
    return runner
