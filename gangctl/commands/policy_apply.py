"""`gangctl policy apply`: a quota policy's Kueue, Volcano, KAI or coscheduling (and native) objects, server-side applied.

The objects come from the backend's own pure translation (`quota_objects` of gangctl.plugins'
backends: for coscheduling and native, gangctl admits the jobs itself and the policy is stored in
the ConfigMap gangctl-system/gangctl-quota-policy that the controller's quota gate reads); this
module only talks to the API server through gangctl.kube. `--dry-run` applies with `dryRun=All`
(so the diff shows what the server would store, defaults included) and diffs that against what is
there now; objects are never changed then.
"""
from __future__ import annotations

import difflib
from dataclasses import dataclass, field
from typing import Literal

import yaml

from gangctl.api.resources import NODES, object_path
from gangctl.kube.client import ApiError, Kube
from gangctl.model.quota import QuotaPolicy
from gangctl.plugins.base import topology_objects
from gangctl.plugins.quota_objects import stored_topology
from gangctl.plugins.registry import BACKENDS

FIELD_MANAGER = "gangctl-policy"

_VOLATILE_META = ("managedFields", "resourceVersion", "generation", "uid", "creationTimestamp")


def policy_text(policy: QuotaPolicy) -> str:
    """The policy as YAML (what the coscheduling ConfigMap stores when no file text is given)."""
    return yaml.safe_dump(policy.model_dump(mode="json", by_alias=True, exclude_none=True), sort_keys=False)


def objects_for(policy: QuotaPolicy, backend: str, text: str | None = None, nodes: list[dict] | None = None) -> list[dict]:
    """The backend's objects for `policy` (`backend`: one of gangctl.api.runtime.GANG_BACKENDS).
    `text`: the policy file as written (coscheduling, native and Volcano store it verbatim, comments
    included: gangctl admits their jobs by it, and preempts for priority under Volcano). With a
    topology, its objects come first (the flavor that names Kueue's Topology after it); `nodes`: the
    cluster's Node objects, which Volcano's HyperNodes list by name. The topology is also stored where
    gangctl's controller reads it (ConfigMap gangctl-system/gangctl-topology), for every backend."""
    plugin = BACKENDS[backend]
    objects = [*topology_objects(plugin, policy.topology, nodes or []),
               *(stored_topology(policy.topology) if policy.topology is not None else []),
               *plugin.quota_objects(policy, text if text is not None else policy_text(policy))]
    unique: dict[str, dict] = {}
    for obj in objects:   # gangctl-system comes with the stored topology and the stored policy alike
        unique.setdefault(ref(obj), obj)
    return list(unique.values())


def ref(obj: dict) -> str:
    meta = obj["metadata"]
    return f"{obj['kind']} {meta['namespace'] + '/' if meta.get('namespace') else ''}{meta['name']}"


@dataclass
class Change:
    kind: str
    name: str
    namespace: str | None
    action: Literal["create", "update", "unchanged", "created", "updated", "applied"]
    diff: list[str] = field(default_factory=list)

    def as_json(self) -> dict:
        out = {"kind": self.kind, "name": self.name, "action": self.action}
        if self.namespace:
            out["namespace"] = self.namespace
        if self.diff:
            out["diff"] = "".join(self.diff)
        return out


def comparable(obj: dict | None) -> dict | None:
    """An object without the fields the server keeps changing (status, managedFields, versions)."""
    if obj is None:
        return None
    out = {k: v for k, v in obj.items() if k != "status"}
    meta = {k: v for k, v in (obj.get("metadata") or {}).items() if k not in _VOLATILE_META}
    if isinstance(meta.get("annotations"), dict):
        meta["annotations"] = {k: v for k, v in meta["annotations"].items()
                               if k != "kubectl.kubernetes.io/last-applied-configuration"} or None
        if meta["annotations"] is None:
            del meta["annotations"]
    out["metadata"] = meta
    return out


def diff_lines(before: dict | None, after: dict | None, label: str) -> list[str]:
    a = yaml.safe_dump(comparable(before), sort_keys=True).splitlines(keepends=True) if before else []
    b = yaml.safe_dump(comparable(after), sort_keys=True).splitlines(keepends=True) if after else []
    return list(difflib.unified_diff(a, b, fromfile=f"{label} (cluster)", tofile=f"{label} (policy)"))


_NOT_SERVED = "the server could not find the requested resource"


def _not_served(err: ApiError) -> bool:
    """404 for the resource type itself (its CRD is not installed), not for one missing object."""
    return err.not_found and (_NOT_SERVED in err.message or "404 page not found" in err.message)


async def _get(kube: Kube, path: str) -> dict | None:
    try:
        return await kube.get(path)
    except ApiError as err:
        if err.not_found and not _not_served(err):
            return None
        raise


async def apply_policy(kube: Kube, policy: QuotaPolicy, backend: str, *, dry_run: bool,
                       text: str | None = None) -> list[Change]:
    changes = []
    # Only a backend whose topology objects name the nodes needs them (a list of every node, at 5,000 nodes).
    needs_nodes = policy.topology is not None and getattr(BACKENDS[backend], "topology_from_nodes", False)
    nodes = (await kube.get(NODES.path()))["items"] if needs_nodes else []
    for obj in objects_for(policy, backend, text, nodes):
        path, meta = object_path(obj), obj["metadata"]
        try:
            current = await _get(kube, path)
        except ApiError as err:
            if _not_served(err):
                raise RuntimeError(f"{ref(obj)}: the API server does not serve {obj['apiVersion']} "
                                   f"{obj['kind']}; {BACKENDS[backend].setup_hint}") from err
            raise
        if dry_run:
            try:
                after = await kube.request("PATCH", path, body=obj, content_type="application/apply-patch+yaml",
                                           params={"fieldManager": FIELD_MANAGER, "force": "true", "dryRun": "All"})
            except ApiError as err:
                if not err.not_found or _not_served(err):  # NotFound: a namespace this run would create
                    raise
                after = obj
            lines = diff_lines(current, after, ref(obj))
            action = "create" if current is None else ("update" if lines else "unchanged")
        else:
            after = await kube.apply(path, obj, FIELD_MANAGER)
            lines = diff_lines(current, after, ref(obj))
            action = "created" if current is None else ("updated" if lines else "unchanged")
        changes.append(Change(obj["kind"], meta["name"], meta.get("namespace"), action, lines if current else []))
    return changes
