"""The interface every scheduler backend implements, and their registry.

A backend is pure: from the resolved job and its gang it says how pods join the gang and which
objects (a PodGroup, …) must exist. Adding a backend is one module plus one registry line.
"""
from __future__ import annotations

from typing import Protocol

from gangctl.api.resources import Resource
from gangctl.policy.gang import Gang
from gangctl.policy.resolve import ResolvedJob


class GangBackend(Protocol):
    name: str
    group_resource: Resource  # the kind of object that represents the gang

    def pod_labels(self, job: ResolvedJob) -> dict[str, str]: ...

    def pod_annotations(self, job: ResolvedJob) -> dict[str, str]: ...

    def scheduler_name(self, job: ResolvedJob, default: str) -> str | None: ...

    def group(self, job: ResolvedJob, gang: Gang, owner: dict) -> dict: ...
