"""Which children a job owns, decided once for every job kind (TrainJob, PyTorchJob).

gangctl deletes, patches or applies a child (Service, gang object, Job, ConfigMap, PVC, store pod)
only when the child's controller ownerReference holds the job's uid, and deletes with that child's
uid as a precondition. An object of a child's name that the job does not own is someone else's: it
is never changed, and the job waits with `REASON`, naming it. A PVC of a claim's name made before
the job is used as it is and never deleted (as JobSet: it deletes only the claims it created).
"""
from __future__ import annotations

from typing import Iterable

REASON = "ChildNotOwned"
# How often a job kept waiting by an object it does not own looks again: a person deleting or renaming
# that object sends gangctl no event (it is not labelled as gangctl's).
RECHECK_SECONDS = 10.0


def owned(obj: dict, owner_uid: str | None) -> bool:
    """Whether `obj`'s controller ownerReference is the job of uid `owner_uid`."""
    return bool(owner_uid) and any(ref.get("uid") == owner_uid and ref.get("controller")
                                   for ref in (obj.get("metadata") or {}).get("ownerReferences") or [])


def controller_uid(obj: dict) -> str | None:
    """The uid of `obj`'s controller (None: no object controls it)."""
    return next((ref.get("uid") for ref in (obj.get("metadata") or {}).get("ownerReferences") or []
                 if ref.get("controller")), None)


def foreign(owner_uid: str | None, objects: Iterable[dict | None]) -> dict | None:
    """The first of `objects` (children observed at the names the job uses; None: absent) that the
    job does not own."""
    return next((o for o in objects if o is not None and not owned(o, owner_uid)), None)


def mine(owner_uid: str | None, objects: Iterable[dict]) -> list[dict]:
    """The `objects` the job owns (the only ones it may delete or patch)."""
    return [o for o in objects if owned(o, owner_uid)]


def message(obj: dict, owner_kind: str) -> str:
    """Why the job waits, naming the object (what `kubectl get` / `kubectl describe` show)."""
    meta = obj.get("metadata") or {}
    return (f"{obj.get('kind') or 'object'} {meta.get('namespace')}/{meta.get('name')} exists and is not owned by "
            f"this {owner_kind}; delete or rename it")


def children_of(owner_uids: Iterable[str | None], objects: Iterable[dict]) -> list[dict]:
    """The `objects` with an ownerReference (controller or not) to one of `owner_uids`: the pods of
    an attempt's Jobs, as the Job controller made them. Reading only: see `mine` for what a job may change."""
    uids = set(owner_uids)
    return [o for o in objects if any(ref.get("uid") in uids for ref in o["metadata"].get("ownerReferences") or [])]
