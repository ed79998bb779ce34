"""What the controller keeps of each Pod and Node it caches: only the fields its decisions read.

A Pod as the API serves it is 5-25 KB of JSON (the whole container spec, volumes, env, tolerations,
every container status); decoded, a 1,024-pod gang's pods are tens of MB and 150,000 pods are
gigabytes. The reconcile, the elastic sizing, the failure classification and the lost-pod reaper
read only identity, labels and annotations, owner references, deletion, the node, the phase, the
conditions and each container's termination. The informers apply these projections before caching
(and before handlers see the object), so memory scales with what is decided on, not with pod specs.

Adding a decision that reads another field means adding it here; `tests/unit/test_cached.py` runs
the decisions on full and projected pods and requires the same answers.

The strings that repeat from object to object (label and annotation keys, label values, the
namespace, condition types and statuses) are interned: each watch event is decoded on its own, so
without it every cached pod would hold its own copy of "gangctl.io/managed-by" and the like.
"""
from __future__ import annotations

from sys import intern

_META = ("name", "namespace", "uid", "resourceVersion", "generation", "creationTimestamp", "deletionTimestamp",
         "deletionGracePeriodSeconds", "labels", "annotations", "finalizers")
_OWNER = ("apiVersion", "kind", "name", "uid", "controller", "blockOwnerDeletion")
_CONDITION = ("type", "status", "reason", "message", "lastTransitionTime")
_TERMINATED = ("exitCode", "reason", "message", "finishedAt", "startedAt")


def _pick(d: dict | None, keys: tuple[str, ...]) -> dict:
    return {k: d[k] for k in keys if d and k in d}


def _metadata(meta: dict) -> dict:
    out = _pick(meta, _META)
    if "namespace" in out:
        out["namespace"] = intern(out["namespace"])
    if out.get("labels"):  # label values are at most 63 characters
        out["labels"] = {intern(k): intern(v) for k, v in out["labels"].items()}
    if out.get("annotations"):
        out["annotations"] = {intern(k): v for k, v in out["annotations"].items()}
    if meta.get("ownerReferences"):
        out["ownerReferences"] = [_pick(ref, _OWNER) for ref in meta["ownerReferences"]]
    return out


def _conditions(status: dict) -> list[dict]:
    out = [_pick(c, _CONDITION) for c in status.get("conditions") or []]
    for c in out:
        for k in ("type", "status", "reason"):
            if isinstance(c.get(k), str):
                c[k] = intern(c[k])
    return out


def _container_status(cs: dict) -> dict:
    out: dict = {"name": intern(cs["name"]) if isinstance(cs.get("name"), str) else cs.get("name")}
    if cs.get("restartCount"):   # in-place restarts are charged from it
        out["restartCount"] = cs["restartCount"]
    for which in ("state", "lastState"):
        terminated = (cs.get(which) or {}).get("terminated")
        if terminated:
            out[which] = {"terminated": _pick(terminated, _TERMINATED)}
        elif cs.get(which):   # running / waiting: which one, and when a running one started (stall silence)
            out[which] = {intern(k): _pick(v, ("startedAt",)) if k == "running" else {} for k, v in cs[which].items()}
    return out


def pod_view(pod: dict) -> dict:
    """The cached form of a Pod."""
    spec, status = pod.get("spec") or {}, pod.get("status") or {}
    out: dict = {"metadata": _metadata(pod.get("metadata") or {}),
                 "spec": _pick(spec, ("nodeName", "schedulerName", "schedulingGates")),
                 "status": _pick(status, ("phase", "reason", "message"))}
    for key in ("apiVersion", "kind"):
        if key in pod:
            out[key] = pod[key]
    if ((spec.get("affinity") or {}).get("nodeAffinity") or {}).get("requiredDuringSchedulingIgnoredDuringExecution"):
        # where gangctl pinned a gang, read back from a PyTorchJob's pods (`decide_pytorchjob._as_made`)
        out["spec"]["affinity"] = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution":
                                                    spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]}}
    if status.get("conditions"):
        out["status"]["conditions"] = _conditions(status)
    if status.get("containerStatuses"):
        out["status"]["containerStatuses"] = [_container_status(cs) for cs in status["containerStatuses"]]
    return out


def node_view(node: dict) -> dict:
    """The cached form of a Node: whether and since when it is Ready (the lost-pod reaper), and what
    decides which pods may land on it and whether it restarts a pod's containers in place (the
    restart mode a runtime leaves to gangctl, `gangctl.policy.restart_mode`)."""
    status = node.get("status") or {}
    out: dict = {"metadata": _pick(node.get("metadata") or {}, ("name", "uid", "resourceVersion", "labels")),
                 "spec": _pick(node.get("spec") or {}, ("taints", "unschedulable")),
                 "status": {"conditions": _conditions(status)}}
    if status.get("declaredFeatures"):
        out["status"]["declaredFeatures"] = [intern(f) for f in status["declaredFeatures"]]
    for key in ("apiVersion", "kind"):
        if key in node:
            out[key] = node[key]
    return out
