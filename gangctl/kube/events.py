"""Kubernetes Events about TrainJobs (core/v1, which `kubectl describe` and the kubeflow SDK read)."""
from __future__ import annotations

import logging
from datetime import datetime, timezone

from gangctl.api.resources import Resource
from gangctl.kube.client import UNREACHABLE, ApiError, Kube

log = logging.getLogger(__name__)
CORE_EVENTS = Resource("", "v1", "events", "Event")


class EventRecorder:
    def __init__(self, kube: Kube, component: str = "gangctl"):
        self.kube = kube
        self.component = component

    async def normal(self, obj: dict, reason: str, message: str) -> None:
        await self._emit(obj, "Normal", reason, message)

    async def warning(self, obj: dict, reason: str, message: str) -> None:
        await self._emit(obj, "Warning", reason, message)

    async def _emit(self, obj: dict, kind: str, reason: str, message: str) -> None:
        meta = obj["metadata"]
        now = datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
        event = {
            "apiVersion": "v1", "kind": "Event",
            "metadata": {"generateName": f"{meta['name']}.", "namespace": meta.get("namespace", "default")},
            "involvedObject": {"apiVersion": obj.get("apiVersion"), "kind": obj.get("kind"), "name": meta["name"],
                               "namespace": meta.get("namespace"), "uid": meta.get("uid")},
            "type": kind, "reason": reason, "message": message[:1024],
            "firstTimestamp": now, "lastTimestamp": now, "count": 1,
            "source": {"component": self.component}, "reportingComponent": self.component,
        }
        try:
            await self.kube.create(CORE_EVENTS.path(meta.get("namespace", "default")), event)
        except (ApiError, *UNREACHABLE) as err:  # events are best effort; never fail a reconcile for one
            log.warning("could not record event %s on %s: %r", reason, meta["name"], err)
