"""Projected volumes on a process node (I/O; the translation is in volumes.py): the files of each
pod's projected volumes under <state>/volumes/<pod uid>/<volume>/, written the way kubelet writes
them, and their ServiceAccount tokens kept fresh.

- serviceAccountToken: a TokenRequest (`POST .../serviceaccounts/<sa>/token`) bound to the pod,
  re-requested at 80 % of its lifetime (or after `max_age`, kubelet's 24 h rule, configurable) and
  swapped in with rename(2), so a reader sees the old token or the new one, never half of one;
- configMap: read once from the API (kube-root-ca.crt: the cluster CA the controller-manager
  publishes in every namespace);
- downwardAPI: the values volumes.py resolved, written again when the pod's labels or annotations
  change (`refresh_fields`; kubelet does it on its next sync of the pod, within about a minute).

The folders are bind-mounted into the pod's containers by the shim; the agent removes them when the
pod stops.
"""
from __future__ import annotations

import asyncio
import logging
import os
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path

from gangctl.kube.client import ApiError, Kube
from gangctl.nodeagent.spec import SpecError
from gangctl.nodeagent.volumes import (KUBELET_MAX_TOKEN_AGE, ProjectedVolume, TokenFile, config_map_files,
                                       refresh_after, service_account, token_request)

log = logging.getLogger("gangctl.nodeagent.projected")


def write_atomic(path: Path, content: str, mode: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "w") as f:
        f.write(content)
    os.chmod(tmp, mode)
    os.replace(tmp, path)


@dataclass
class PodTokens:
    """One pod's tokens: where each goes and when it is due."""

    pod: dict
    files: list[tuple[Path, TokenFile, int]] = field(default_factory=list)  # (file, source, mode)
    due: dict[Path, float] = field(default_factory=dict)  # monotonic time of the next refresh
    task: asyncio.Task | None = None


class ProjectedVolumes:
    def __init__(self, kube: Kube, root: Path, max_age: float = KUBELET_MAX_TOKEN_AGE):
        self.kube = kube
        self.root = root
        self.max_age = max_age
        self.pods: dict[str, PodTokens] = {}

    def pod_dir(self, uid: str) -> Path:
        return self.root / uid

    async def prepare(self, pod: dict, volumes: dict[str, ProjectedVolume]) -> dict[str, Path]:
        """Write every projected volume of the pod; volume name -> its folder. SpecError when the
        API refuses a token or a ConfigMap is missing (the pod stays Pending and the agent tries again,
        as kubelet does)."""
        meta = pod["metadata"]
        out: dict[str, Path] = {}
        tokens = PodTokens(pod)
        for vol in volumes.values():
            folder = self.pod_dir(meta["uid"]) / vol.name
            folder.mkdir(parents=True, exist_ok=True)
            os.chmod(folder, 0o755)
            for source in vol.config_maps:
                data = await self._config_map(meta["namespace"], source.name)
                for path, content in config_map_files(source, data).items():
                    write_atomic(folder / path, content, vol.mode)
            for f in vol.fields:
                write_atomic(folder / f.path, f.value, vol.mode)
            for t in vol.tokens:
                tokens.files.append((folder / t.path, t, vol.mode))
            out[vol.name] = folder
        for path, source, mode in tokens.files:
            await self._refresh(tokens, path, source, mode)
        if tokens.files:
            self.pods[meta["uid"]] = tokens
            tokens.task = asyncio.create_task(self._keep_fresh(tokens))
        return out

    def refresh_fields(self, pod: dict, volumes: dict[str, ProjectedVolume]) -> int:
        """Write again the downward API files whose value changed (the pod's labels or annotations
        did), as kubelet updates them on a running pod; how many changed. Only volumes `prepare`
        made are touched."""
        changed = 0
        for vol in volumes.values():
            folder = self.pod_dir(pod["metadata"]["uid"]) / vol.name
            if not folder.is_dir():
                continue
            for f in vol.fields:
                path = folder / f.path
                try:
                    if path.read_text() == f.value:
                        continue
                except OSError:
                    pass
                write_atomic(path, f.value, vol.mode)
                changed += 1
        return changed

    async def _config_map(self, namespace: str, name: str) -> dict[str, str] | None:
        try:
            cm = await self.kube.get(f"/api/v1/namespaces/{namespace}/configmaps/{name}")
        except ApiError as err:
            if err.not_found:
                return None
            raise SpecError(f"configmap {name}: {err}") from err
        return cm.get("data") or {}

    async def _refresh(self, tokens: PodTokens, path: Path, source: TokenFile, mode: int) -> None:
        pod = tokens.pod
        ns, sa = pod["metadata"]["namespace"], service_account(pod)
        try:
            answer = await self.kube.create(f"/api/v1/namespaces/{ns}/serviceaccounts/{sa}/token",
                                            token_request(pod, source))
        except ApiError as err:
            raise SpecError(f"token for serviceaccount {ns}/{sa}: {err}") from err
        write_atomic(path, answer["status"]["token"], mode)
        tokens.due[path] = time.monotonic() + refresh_after(source.expiration_seconds, self.max_age)

    async def _keep_fresh(self, tokens: PodTokens) -> None:
        while True:
            wait = min(tokens.due.values()) - time.monotonic()
            if wait > 0:
                await asyncio.sleep(wait)
            for path, source, mode in tokens.files:
                if tokens.due[path] <= time.monotonic():
                    try:
                        await self._refresh(tokens, path, source, mode)
                    except SpecError as err:  # try again soon; the old token is valid a while longer
                        log.warning("pod %s/%s: %s", tokens.pod["metadata"]["namespace"],
                                    tokens.pod["metadata"]["name"], err)
                        tokens.due[path] = time.monotonic() + 5
                    except Exception:
                        log.exception("token refresh failed")
                        tokens.due[path] = time.monotonic() + 5

    def release(self, uid: str) -> None:
        """Stop refreshing the pod's tokens and remove its volumes."""
        tokens = self.pods.pop(uid, None)
        if tokens and tokens.task:
            tokens.task.cancel()
        shutil.rmtree(self.pod_dir(uid), ignore_errors=True)
