"""`status.trainerStatus`: how a training script reports its progress, as Kubeflow Trainer defines it
(KEP-2779, Trainer v2.2+). Pure: the pod wiring, the report's validation and who may send it.

The contract a script sees, in every container of every trainer pod:

    KUBEFLOW_TRAINER_STATUS_URL      https://<controller>/apis/trainer.kubeflow.org/v1alpha1/namespaces/<ns>/trainjobs/<name>/status
    KUBEFLOW_TRAINER_STATUS_CA_CERT  /var/run/secrets/kubeflow/trainer/ca.crt   (ConfigMap <trainjob>-tls-config)
    KUBEFLOW_TRAINER_STATUS_TOKEN    /var/run/secrets/kubeflow/trainer/token    (audience trainer.kubeflow.org)

and a POST of `{"trainerStatus": {...}}` with `Authorization: Bearer <token>` sets the TrainJob's
`status.trainerStatus`. The token is the pod's own (bound to the pod), so a pod can report only for
the TrainJob whose child Job made it (`refusal`).

A PyTorchJob's pods (gangctl's extension: Training Operator v1 had no progress) get the same three
variables, with the URL `.../apis/kubeflow.org/v1/namespaces/<ns>/pytorchjobs/<name>/status`; v1's
status schema prunes unknown fields, so the report is kept in the PyTorchJob's annotation
`gangctl.io/trainer-status` (`reported` reads either).
"""
from __future__ import annotations

import copy
import json
import re
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Callable

from gangctl.api.resources import PYTORCHJOBS, TRAINJOBS, Resource
from gangctl.model.names import TRAINJOB_NAME

AUDIENCE = "trainer.kubeflow.org"
VOLUME = "kubeflow-trainer-token"
MOUNT_PATH = "/var/run/secrets/kubeflow/trainer"
ENV_URL = "KUBEFLOW_TRAINER_STATUS_URL"
ENV_CA_CERT = "KUBEFLOW_TRAINER_STATUS_CA_CERT"
ENV_TOKEN = "KUBEFLOW_TRAINER_STATUS_TOKEN"
TOKEN_SECONDS = 3600
CA_KEY = "ca.crt"
MAX_METRICS = 256           # the CRD's limit on status.trainerStatus.metrics
INT32_MAX = 2**31 - 1
# What the API server's TokenReview puts in user.extra for a token bound to a pod.
POD_NAME_EXTRA = "authentication.kubernetes.io/pod-name"
POD_UID_EXTRA = "authentication.kubernetes.io/pod-uid"
SA_PREFIX = "system:serviceaccount:"


def url_hosts(base_url: str) -> list[str]:
    """The names a serving certificate must carry for `base_url` (a Service's short and full names)."""
    host = base_url.split("://", 1)[-1].split("/", 1)[0].rsplit(":", 1)[0]
    hosts = [host]
    if host.endswith(".svc"):
        hosts.append(host + ".cluster.local")
    return hosts


@dataclass(frozen=True)
class Endpoint:
    """Where this controller takes reports: the base URL its pods are given, and the CA they trust."""

    base_url: str
    ca_pem: str


# The job kinds whose pods report, by kind: the resource whose `.../status` URL they POST to.
REPORTING_KINDS: dict[str, Resource] = {"TrainJob": TRAINJOBS, "PyTorchJob": PYTORCHJOBS}
# Where a PyTorchJob keeps its last report (v1's status schema has no field for it).
REPORT_ANNOTATION = "gangctl.io/trainer-status"


def config_map_name(trainjob: str, kind: str = "TrainJob") -> str:
    """Trainer's name for a TrainJob's; a PyTorchJob's differs, so one of each may share a name."""
    return f"{trainjob}-tls-config" if kind == "TrainJob" else f"{trainjob}-{kind.lower()}-tls-config"


def status_path(namespace: str, trainjob: str, kind: str = "TrainJob") -> str:
    return REPORTING_KINDS[kind].path(namespace, trainjob, "status")


def status_url(base_url: str, namespace: str, trainjob: str, kind: str = "TrainJob") -> str:
    return base_url.rstrip("/") + status_path(namespace, trainjob, kind)


def config_map(namespace: str, trainjob: str, ca_pem: str, owner: dict, labels: dict | None = None,
               kind: str = "TrainJob") -> dict:
    """The CA a trainer pod verifies the controller's certificate with, owned by its job."""
    return {"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": config_map_name(trainjob, kind), "namespace": namespace,
                         "labels": labels or {TRAINJOB_NAME: trainjob}, "ownerReferences": [owner]},
            "data": {CA_KEY: ca_pem}}


def inject(spec: dict, base_url: str, namespace: str, trainjob: str, kind: str = "TrainJob") -> None:
    """Give every container of a trainer pod spec the three variables and the projected volume (token
    with the trainer audience, and the CA). A container's own value of a variable wins."""
    volumes = [v for v in spec.get("volumes") or [] if v.get("name") != VOLUME]
    volumes.append({"name": VOLUME, "projected": {"sources": [
        {"serviceAccountToken": {"audience": AUDIENCE, "expirationSeconds": TOKEN_SECONDS, "path": "token"}},
        {"configMap": {"name": config_map_name(trainjob, kind), "items": [{"key": CA_KEY, "path": CA_KEY}]}}]}})
    spec["volumes"] = volumes
    env = [{"name": ENV_URL, "value": status_url(base_url, namespace, trainjob, kind)},
           {"name": ENV_CA_CERT, "value": f"{MOUNT_PATH}/{CA_KEY}"},
           {"name": ENV_TOKEN, "value": f"{MOUNT_PATH}/token"}]
    for container in spec.get("containers") or []:
        own = {e["name"] for e in container.get("env") or []}
        container["env"] = [*(container.get("env") or []), *(copy.deepcopy(e) for e in env if e["name"] not in own)]
        mounts = [m for m in container.get("volumeMounts") or [] if m.get("name") != VOLUME]
        container["volumeMounts"] = [*mounts, {"name": VOLUME, "mountPath": MOUNT_PATH, "readOnly": True}]


def injected_url(job: dict | None) -> str | None:
    """The status URL an existing Job's pods were given (None: made without progress reporting). A
    Job's pod template is immutable: what its pods got is kept, whatever this controller serves now.
    A pod (a PyTorchJob's) is read the same way."""
    spec = (job or {}).get("spec") or {}
    spec = (spec.get("template") or {}).get("spec") or {} if "template" in spec else spec
    if not any(v.get("name") == VOLUME for v in spec.get("volumes") or []):
        return None
    for container in spec.get("containers") or []:
        for env in container.get("env") or []:
            if env.get("name") == ENV_URL and env.get("value"):
                return env["value"]
    return None


def base_of(url: str, namespace: str, trainjob: str, kind: str = "TrainJob") -> str:
    """The endpoint's base URL out of a status URL made by `status_url`."""
    path = status_path(namespace, trainjob, kind)
    return url[: -len(path)] if url.endswith(path) else url


# --- a report -------------------------------------------------------------------------------------
class ReportError(ValueError):
    """A report the API would refuse: the message names the field."""


def parse_report(body: Any, now: datetime) -> dict:
    """The `status.trainerStatus` a report sets. Fields as the CRD types them; `lastUpdatedTime`
    defaults to the time the controller received the report."""
    if not isinstance(body, dict) or set(body) - {"trainerStatus"}:
        raise ReportError('the body must be a JSON object {"trainerStatus": {...}}')
    status = body.get("trainerStatus")
    if not isinstance(status, dict):
        raise ReportError("trainerStatus: must be an object")
    allowed = {"progressPercentage", "estimatedRemainingSeconds", "metrics", "lastUpdatedTime"}
    if unknown := sorted(set(status) - allowed):
        raise ReportError(f"trainerStatus.{unknown[0]}: unknown field (known: {', '.join(sorted(allowed))})")
    out: dict = {}
    for field, high in (("progressPercentage", 100), ("estimatedRemainingSeconds", INT32_MAX)):
        value = status.get(field)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= high:
            raise ReportError(f"trainerStatus.{field}: must be an integer from 0 to {high}, got {value!r}")
        out[field] = value
    metrics = status.get("metrics")
    if metrics is not None:
        if not isinstance(metrics, list) or len(metrics) > MAX_METRICS:
            raise ReportError(f"trainerStatus.metrics: must be a list of at most {MAX_METRICS} items")
        for i, metric in enumerate(metrics):
            if not isinstance(metric, dict) or set(metric) != {"name", "value"} or not all(
                    isinstance(metric[k], str) and metric[k] for k in ("name", "value")):
                raise ReportError(f"trainerStatus.metrics[{i}]: must be {{\"name\": string, \"value\": string}}, "
                                  "both non-empty (a number is sent as a string)")
        out["metrics"] = [{"name": m["name"], "value": m["value"]} for m in metrics]
    when = status.get("lastUpdatedTime")
    if when is None:
        out["lastUpdatedTime"] = now.strftime("%Y-%m-%dT%H:%M:%SZ")
    else:
        try:
            datetime.fromisoformat(str(when).replace("Z", "+00:00"))
        except ValueError:
            raise ReportError(f"trainerStatus.lastUpdatedTime: must be an RFC 3339 time, got {when!r}") from None
        out["lastUpdatedTime"] = when
    return out


# --- who sent it ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class Sender:
    """The pod a token was issued to, from the API server's TokenReview."""

    subject: str        # system:serviceaccount:<ns>:<sa> (the rate limit's key)
    namespace: str
    pod: str
    pod_uid: str


def sender(review_status: dict) -> Sender | None:
    """Who a TokenReview (sent with the trainer audience) says the token belongs to; None unless it is
    authenticated, for that audience, and bound to a pod."""
    if not review_status.get("authenticated") or AUDIENCE not in (review_status.get("audiences") or []):
        return None
    user = review_status.get("user") or {}
    username = user.get("username") or ""
    extra = user.get("extra") or {}
    pod, uid = (extra.get(POD_NAME_EXTRA) or [None])[0], (extra.get(POD_UID_EXTRA) or [None])[0]
    if not username.startswith(SA_PREFIX) or not pod or not uid:
        return None
    namespace = username[len(SA_PREFIX):].split(":", 1)[0]
    return Sender(username, namespace, pod, uid)


TERMINAL_PHASES = ("Succeeded", "Failed")
MAX_OWNER_HOPS = 3  # pod -> Job -> TrainJob (a JobSet between them would be one more)


def controller_of(obj: dict) -> dict | None:
    """The ownerReference marked controller and blocking its owner's deletion (the object that made
    `obj`: the Job controller and gangctl set both), if any. Where the API server runs the
    OwnerReferencesPermissionEnforcement admission plugin, only a user allowed to update the owner's
    finalizers can set blockOwnerDeletion, so a hand-made pod cannot claim a Job it did not come from."""
    return next((r for r in (obj.get("metadata") or {}).get("ownerReferences") or []
                 if r.get("controller") and r.get("blockOwnerDeletion")), None)


def refusal(who: Sender, pod: dict | None, trainjob: dict | None,
            owner: Callable[[str, str, str], dict | None], namespace: str, name: str,
            kind: str = "TrainJob") -> str | None:
    """Why the pod `who` names may not report for the `kind` (TrainJob or PyTorchJob) `namespace/name`;
    None when it may.

    Only from a live pod (not Succeeded or Failed, not being deleted), the very pod the token was bound
    to (same uid), whose chain of controller ownerReferences (pod -> Job -> TrainJob; a PyTorchJob's
    pod -> PyTorchJob), each matched by uid, leads to this job's uid: labels prove nothing, anyone
    allowed to create pods can set them. `pod` and `trainjob` come from the controller's caches;
    `owner(namespace, kind, name)` looks an intermediate owner (a Job) up there too."""
    where = f"pod {who.namespace}/{who.pod}"
    meta = (pod or {}).get("metadata") or {}
    group = REPORTING_KINDS[kind].group
    if who.namespace != namespace:
        return f"{where} is not in the {kind}'s namespace {namespace}"
    if pod is None or meta.get("uid") != who.pod_uid:
        return f"{where} is not a pod gangctl knows (gone, or not made for a {kind})"
    if meta.get("deletionTimestamp"):
        return f"{where} is being deleted"
    if (phase := (pod.get("status") or {}).get("phase")) in TERMINAL_PHASES:
        return f"{where} has finished ({phase})"
    uid = ((trainjob or {}).get("metadata") or {}).get("uid")
    obj: dict | None = pod
    for _ in range(MAX_OWNER_HOPS):
        ref = controller_of(obj) if obj is not None else None
        if ref is None:
            break
        if ref.get("kind") == kind and str(ref.get("apiVersion", "")).startswith(group + "/"):
            if uid and ref.get("uid") == uid and ref.get("name") == name:
                return None
            break
        obj = owner(namespace, ref.get("kind", ""), ref.get("name", ""))
        if obj is not None and (obj.get("metadata") or {}).get("uid") != ref.get("uid"):
            obj = None  # an object of that name, but not the one that made this pod
    return f"{where} was not made for {kind} {namespace}/{name} (its owner references do not lead to it)"


# --- stalls -----------------------------------------------------------------------------------------
# A runtime's stall timeout (gangctl extension; docs/api.md): a running TrainJob whose progress
# reports stop for longer is restarted with reason Stalled.
STALL_TIMEOUT_ANNOTATION = "gangctl.io/stall-timeout"
STALLED = "Stalled"
_DURATION = re.compile(r"^(?:(\d+)h)?(?:(\d+)m)?(?:(\d+)s)?$")


def stall_timeout(annotations: dict | None) -> int | None:
    """The stall timeout in seconds from a runtime's annotations (None: not set); ValueError naming the
    annotation for anything but a positive duration (`90s`, `10m`, `1h30m`, or seconds)."""
    raw = (annotations or {}).get(STALL_TIMEOUT_ANNOTATION)
    if raw is None:
        return None
    text = str(raw).strip()
    match = _DURATION.match(text) if not text.isdigit() else None
    seconds = int(text) if text.isdigit() else (
        int(match.group(1) or 0) * 3600 + int(match.group(2) or 0) * 60 + int(match.group(3) or 0) if match else 0)
    if seconds <= 0:
        raise ValueError(f"metadata.annotations[{STALL_TIMEOUT_ANNOTATION}]: {raw!r} is not a positive duration "
                         "(e.g. 300s, 10m, 1h)")
    return seconds


def reported(obj: dict | None) -> dict | None:
    """A job's last progress report: a TrainJob's `status.trainerStatus`, a PyTorchJob's annotation
    (None: none, or an annotation that is not a JSON object)."""
    if (status := ((obj or {}).get("status") or {}).get("trainerStatus")) is not None:
        return status
    text = (((obj or {}).get("metadata") or {}).get("annotations") or {}).get(REPORT_ANNOTATION)
    try:
        found = json.loads(text) if text else None
    except ValueError:
        return None
    return found if isinstance(found, dict) else None


def silent_for(trainer_status: dict | None, attempt_started: datetime, now: datetime) -> float | None:
    """Seconds since the job's last progress report, counted from no earlier than the current attempt's
    start (a restarted attempt gets the whole timeout); None when the job never reported (a job that
    does not report is never judged stalled)."""
    when = (trainer_status or {}).get("lastUpdatedTime")
    try:   # a PyTorchJob's annotation can be edited by hand: a time that does not parse is no report
        last = datetime.fromisoformat(str(when).replace("Z", "+00:00")) if when else None
    except ValueError:
        return None
    if last is None or last.tzinfo is None:
        return None
    return (now - max(last, attempt_started)).total_seconds()
