"""Pure translation of a pod's projected volumes (the ServiceAccount token volume among them) into
files the node agent writes and mounts (no I/O, no clock reads).

The apiserver's ServiceAccount admission plugin adds to every pod whose pod spec and ServiceAccount
do not say `automountServiceAccountToken: false` a projected volume `kube-api-access-<x>`:

    serviceAccountToken {expirationSeconds: 3607, path: token}
    configMap kube-root-ca.crt {ca.crt}
    downwardAPI {namespace: metadata.namespace}

mounted read-only at /var/run/secrets/kubernetes.io/serviceaccount in each container. Kubelet
only honours the volume; so does the agent. Supported projected sources: serviceAccountToken,
configMap, downwardAPI (fieldRef, resourceFieldRef). Not supported (CreateContainerConfigError):
secret and clusterTrustBundle/podCertificate sources, subPath mounts of projected volumes.
Other volume types are ignored, as before.
"""
from __future__ import annotations

import posixpath
from dataclasses import dataclass

from gangctl.nodeagent.spec import SpecError, field_value, resource_value

SERVICE_ACCOUNT_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"
# Mount targets under this directory need not exist on the host: each container gets a tmpfs here.
SECRETS_ROOT = "/var/run/secrets"
DEFAULT_TOKEN_SECONDS = 3607  # what the ServiceAccount admission plugin sets (kubelet's warn-after + 7 s)
MIN_TOKEN_SECONDS = 600       # the TokenRequest API's minimum
KUBELET_MAX_TOKEN_AGE = 24 * 3600  # kubelet refreshes a token older than this whatever its lifetime


@dataclass(frozen=True)
class TokenFile:
    path: str
    audience: str | None
    expiration_seconds: int


@dataclass(frozen=True)
class ConfigMapFiles:
    name: str
    items: tuple[tuple[str, str], ...]  # (key, path); empty: every key under its own name
    optional: bool


@dataclass(frozen=True)
class FieldFile:
    path: str
    value: str


@dataclass(frozen=True)
class ProjectedVolume:
    name: str
    tokens: tuple[TokenFile, ...]
    config_maps: tuple[ConfigMapFiles, ...]
    fields: tuple[FieldFile, ...]
    mode: int


@dataclass(frozen=True)
class VolumeMount:
    volume: str
    path: str
    read_only: bool


def _relative(path: str, where: str) -> str:
    norm = posixpath.normpath(path)
    if not path or posixpath.isabs(path) or norm.startswith(".."):
        raise SpecError(f"{where}: path {path!r} must be relative and stay inside the volume")
    return norm


def projected_volumes(pod: dict, *, allocatable: dict[str, str]) -> dict[str, ProjectedVolume]:
    """Every projected volume of the pod, its downward API values resolved (metadata only:
    the pod IP is not a valid downwardAPI volume field)."""
    spec = pod.get("spec") or {}
    containers = {c["name"]: c for c in spec.get("containers") or []}
    out: dict[str, ProjectedVolume] = {}
    for vol in spec.get("volumes") or []:
        projected = vol.get("projected")
        if projected is None:
            continue
        name = vol["name"]
        tokens, maps, fields = [], [], []
        for source in projected.get("sources") or []:
            where = f"volume {name}"
            if "serviceAccountToken" in source:
                sat = source["serviceAccountToken"]
                seconds = int(sat.get("expirationSeconds") or DEFAULT_TOKEN_SECONDS)
                tokens.append(TokenFile(_relative(sat.get("path", ""), where), sat.get("audience") or None,
                                        max(seconds, MIN_TOKEN_SECONDS)))
            elif "configMap" in source:
                cm = source["configMap"]
                items = tuple((i["key"], _relative(i["path"], where)) for i in cm.get("items") or [])
                maps.append(ConfigMapFiles(cm["name"], items, bool(cm.get("optional"))))
            elif "downwardAPI" in source:
                for item in source["downwardAPI"].get("items") or []:
                    path = _relative(item["path"], where)
                    if "fieldRef" in item:
                        value = field_value(pod, item["fieldRef"]["fieldPath"], None, "")
                    elif "resourceFieldRef" in item:
                        ref = item["resourceFieldRef"]
                        container = containers.get(ref.get("containerName", ""))
                        if container is None:
                            raise SpecError(f"{where}: resourceFieldRef needs a containerName of this pod")
                        value = resource_value(container, ref, allocatable)
                    else:
                        raise SpecError(f"{where}: downwardAPI item {path!r} has no fieldRef or resourceFieldRef")
                    fields.append(FieldFile(path, value))
            else:
                kinds = sorted(k for k in source if source[k] is not None)
                raise SpecError(f"{where}: projected source {kinds} is not supported on process nodes "
                                "(serviceAccountToken, configMap and downwardAPI are)")
        out[name] = ProjectedVolume(name, tuple(tokens), tuple(maps), tuple(fields),
                                    int(projected.get("defaultMode", 0o644)))
    return out


def container_mounts(container: dict, volumes: dict[str, ProjectedVolume]) -> list[VolumeMount]:
    """The container's mounts of projected volumes (mounts of other volume types are not made)."""
    out = []
    for m in container.get("volumeMounts") or []:
        if m["name"] not in volumes:
            continue
        if m.get("subPath") or m.get("subPathExpr"):
            raise SpecError(f"container {container['name']}: subPath mounts of projected volume {m['name']} "
                            "are not supported on process nodes")
        if not posixpath.isabs(m["mountPath"]):
            raise SpecError(f"container {container['name']}: mountPath {m['mountPath']!r} must be absolute")
        out.append(VolumeMount(m["name"], posixpath.normpath(m["mountPath"]), bool(m.get("readOnly", True))))
    return out


def under_secrets_root(path: str) -> bool:
    """Mount targets here get a per-container tmpfs parent, so they need not exist on the host."""
    for root in (SECRETS_ROOT, "/run/secrets"):
        if path == root or path.startswith(root + "/"):
            return True
    return False


def token_request(pod: dict, token: TokenFile) -> dict:
    """The TokenRequest kubelet sends for a serviceAccountToken source: bound to the pod; no
    audience means the apiserver's own (its --api-audiences)."""
    meta = pod["metadata"]
    spec: dict = {"expirationSeconds": token.expiration_seconds,
                  "boundObjectRef": {"apiVersion": "v1", "kind": "Pod", "name": meta["name"], "uid": meta["uid"]}}
    if token.audience:
        spec["audiences"] = [token.audience]
    return {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": spec}


def service_account(pod: dict) -> str:
    spec = pod.get("spec") or {}
    return spec.get("serviceAccountName") or spec.get("serviceAccount") or "default"


def refresh_after(expiration_seconds: int, max_age: float = KUBELET_MAX_TOKEN_AGE) -> float:
    """Seconds after issue when kubelet replaces a token: at 80 % of its lifetime, or at max_age."""
    return min(0.8 * expiration_seconds, max_age)


def config_map_files(source: ConfigMapFiles, data: dict[str, str] | None) -> dict[str, str]:
    """path -> content for one configMap source; `data` None: the ConfigMap does not exist."""
    if data is None:
        if source.optional:
            return {}
        raise SpecError(f'configmap "{source.name}" not found')
    if not source.items:
        return dict(data)
    out = {}
    for key, path in source.items:
        if key not in data:
            if source.optional:
                continue
            raise SpecError(f"configmap {source.name} has no key {key!r}")
        out[path] = data[key]
    return out


def kubernetes_service_env(host: str, port: int) -> dict[str, str]:
    """The variables kubelet sets for the `kubernetes` Service of the default namespace (docker-link
    style, as for every service of the pod's namespace); what in-cluster client loaders read."""
    return {
        "KUBERNETES_SERVICE_HOST": host,
        "KUBERNETES_SERVICE_PORT": str(port),
        "KUBERNETES_SERVICE_PORT_HTTPS": str(port),
        "KUBERNETES_PORT": f"tcp://{host}:{port}",
        f"KUBERNETES_PORT_{port}_TCP": f"tcp://{host}:{port}",
        f"KUBERNETES_PORT_{port}_TCP_PROTO": "tcp",
        f"KUBERNETES_PORT_{port}_TCP_PORT": str(port),
        f"KUBERNETES_PORT_{port}_TCP_ADDR": host,
    }


def hidden_paths(kubeconfig_path: str | None, kubeconfig: dict | None, extra: list[str]) -> list[str]:
    """What a pod's mount namespace covers up: the agent's kubeconfig file and the folders of the
    client credentials it names (certificates, keys, token files), plus `extra` (the agent's own
    key folder and the other pods' volumes)."""
    out: list[str] = []
    if kubeconfig_path:
        out.append(kubeconfig_path)
        base = posixpath.dirname(kubeconfig_path)
        for user in (kubeconfig or {}).get("users") or []:
            for key in ("client-certificate", "client-key", "tokenFile"):
                path = (user.get("user") or {}).get(key)
                if path:
                    out.append(posixpath.dirname(posixpath.join(base, path)))
    out.extend(extra)
    seen: list[str] = []
    for p in out:
        p = posixpath.normpath(p)
        if p not in seen and p != "/":
            seen.append(p)
    return seen
