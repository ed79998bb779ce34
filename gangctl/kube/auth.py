"""Where the client's credentials come from, and how they stay fresh.

Sources, in controller-runtime's order (`config.GetConfig`): an explicit kubeconfig (the
`--kubeconfig` flag), the `KUBECONFIG` variable, the in-cluster configuration when
`KUBERNETES_SERVICE_HOST`/`KUBERNETES_SERVICE_PORT` are set, else `~/.kube/config`.

kubernetes_asyncio's own loaders do the parsing: `load_kube_config` (client certificates, `token`,
`tokenFile`, `exec` plugins, `tls-server-name`, CA) and `load_incluster_config` (service host and
port, the service-account token and `ca.crt`). The token they load lands in
`Configuration.api_key["BearerToken"]` (with its "Bearer " prefix), and a `refresh_api_key_hook`
on the Configuration runs before every `get_api_key_with_prefix` call: `Kube._headers` calls it
once per request. What the library lacks is hand-written here, in such hooks:

- `tokenFile` and the in-cluster token are re-read when the file changes. The library reads a
  kubeconfig `tokenFile` once (a rotated token is never seen) and the in-cluster token on a
  one-minute timer; here the file is stat'ed at most once a second and re-read as soon as its
  inode, size or mtime changes (kubelet swaps a projected token's `..data` symlink atomically).
- `exec` plugins are re-run before their credential expires. The library re-runs them only from
  `refresh_token`, a polling loop the caller must keep running; here the hook asks the library's
  loader, which re-runs the plugin 5 minutes before the `expirationTimestamp` the plugin gave (and
  never, as client-go, for a credential without one), with a lock so that a burst of requests runs
  the plugin once.
- Tokens are stripped of surrounding whitespace (a token file ending in a newline is common; the
  library would send the newline in the header).
"""
from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path
from typing import Any, Callable, Mapping

from kubernetes_asyncio import config as kube_config
from kubernetes_asyncio.client import Configuration

SERVICEACCOUNT_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")
DEFAULT_KUBECONFIG = Path("~/.kube/config")
IN_CLUSTER = "in-cluster"


def config_source(kubeconfig: Path | str | None, environ: Mapping[str, str]) -> str:
    """The kubeconfig path(s) to load, or IN_CLUSTER."""
    if kubeconfig:
        return str(kubeconfig)
    if environ.get("KUBECONFIG"):
        return environ["KUBECONFIG"]
    if environ.get("KUBERNETES_SERVICE_HOST") and environ.get("KUBERNETES_SERVICE_PORT"):
        return IN_CLUSTER
    return str(DEFAULT_KUBECONFIG.expanduser())


async def load_configuration(kubeconfig: Path | str | None = None, *, environ: Mapping[str, str] | None = None,
                             serviceaccount_dir: Path = SERVICEACCOUNT_DIR) -> Configuration:
    """A Configuration with host, TLS settings and a refresh hook that keeps the bearer token current."""
    env = os.environ if environ is None else environ
    source = config_source(kubeconfig, env)
    conf = Configuration()
    if source == IN_CLUSTER:
        token_file = serviceaccount_dir / "token"
        kube_config.load_incluster_config(client_configuration=conf, token_filename=str(token_file),
                                          cert_filename=str(serviceaccount_dir / "ca.crt"),
                                          environ=dict(env))
        conf.refresh_api_key_hook = TokenFile(token_file)
        return conf
    loader = await kube_config.load_kube_config(config_file=source, client_configuration=conf, persist_config=False)
    user = loader._user  # the library's own `refresh_token` reads it the same way
    if user is not None and "exec" in user:
        conf.refresh_api_key_hook = ExecCredential(loader)
    elif user is not None and "tokenFile" in user and not user.safe_get("token"):
        conf.refresh_api_key_hook = TokenFile(_relative_to(user["tokenFile"], user.path))
    elif "BearerToken" in conf.api_key:
        conf.api_key["BearerToken"] = conf.api_key["BearerToken"].strip()
    return conf


def _relative_to(path: str, config_path: str | None) -> Path:
    """A kubeconfig's relative file names are relative to the kubeconfig file (as the library resolves them)."""
    base = Path(config_path).resolve().parent if config_path else Path.cwd()
    return base / Path(path).expanduser()


class TokenFile:
    """A refresh hook: the bearer token read from `path`, re-read whenever the file changes."""

    def __init__(self, path: Path, min_interval: float = 1.0, clock: Callable[[], float] | None = None):
        self.path = path
        self.min_interval = min_interval
        self.clock = clock or time.monotonic
        self.reads = 0
        self._stamp: tuple[int, int, int] | None = None
        self._checked = float("-inf")
        self._token = ""

    def __call__(self, conf: Configuration) -> None:
        now = self.clock()
        if now - self._checked >= self.min_interval:
            self._checked = now
            try:
                st = os.stat(self.path)
                stamp = (st.st_ino, st.st_size, st.st_mtime_ns)
                if stamp != self._stamp:
                    token = self.path.read_text().strip()
                    if token:  # a file caught mid-write keeps the last good token
                        self._token, self._stamp = token, stamp
                        self.reads += 1
            except OSError:
                if not self._token:
                    raise
        conf.api_key["BearerToken"] = f"Bearer {self._token}"


class ExecCredential:
    """A refresh hook: the token of an `exec` credential plugin, fetched again before it expires."""

    def __init__(self, loader: Any):
        self.loader = loader
        self._lock: asyncio.Lock | None = None

    async def __call__(self, conf: Configuration) -> None:
        # Without an expirationTimestamp the credential is kept (client-go re-runs the plugin only on a 401).
        if hasattr(self.loader, "exec_plugin_expiry"):
            if self._lock is None:
                self._lock = asyncio.Lock()
            async with self._lock:
                await self.loader.load_from_exec_plugin()  # a no-op until 5 min before the expiry
        token = getattr(self.loader, "token", None)
        if token:
            conf.api_key["BearerToken"] = token.strip()

