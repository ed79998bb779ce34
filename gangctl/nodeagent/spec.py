"""Pure translation between Kubernetes objects and local processes (no I/O, no clock reads).

A pod's containers become `ProcessSpec`s (argv, env, working directory) the way kubelet builds
them: env `value`s with `$(VAR)` expansion, the downward API (`fieldRef`, `resourceFieldRef`), and
`command`+`args`. The observed process states become the pod's status; the Node, its Lease and its
conditions are built here too, so all of it is unit-tested without a cluster.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

from gangctl.api.quantity import parse_quantity

PROCESS_NODE_LABEL = "gangctl.io/process-node"
# Only with `gangctl node-agent --taint` (to reserve a process node for pods that tolerate it). By
# default a process node is untainted: it runs pods for real, so pods written for any cluster (the
# kubeflow SDK's default runtime) run here unchanged; KWOK's fake nodes carry KWOK's taint instead.
PROCESS_NODE_TAINT = {"key": PROCESS_NODE_LABEL, "value": "true", "effect": "NoSchedule"}
AGENT_VERSION = "v1.33.0-gangctl.nodeagent"
LEASE_SECONDS = 40


class SpecError(ValueError):
    """The pod asks for something a process node cannot give (kubelet's CreateContainerConfigError)."""


@dataclass(frozen=True)
class ProcessSpec:
    container: str
    argv: list[str]
    env: dict[str, str]
    working_dir: str | None
    image: str = ""
    liveness: ExecProbe | None = None


@dataclass
class ContainerState:
    """What the agent knows about one container's process."""

    name: str
    image: str = ""
    state: str = "waiting"  # waiting | running | terminated
    reason: str = "ContainerCreating"
    message: str = ""
    started_at: str | None = None
    finished_at: str | None = None
    exit_code: int | None = None
    signal: int | None = None
    restart_count: int = 0
    container_id: str = ""
    last_terminated: dict | None = None


@dataclass
class PodRuntime:
    """The agent's view of one pod: its address and its containers' states."""

    pod_ip: str | None = None
    host_ip: str = "127.0.0.1"
    start_time: str | None = None
    containers: list[ContainerState] = field(default_factory=list)
    restarting_all: bool = False   # a RestartAllContainers rule fired: its containers are being restarted


# --- env and the downward API -------------------------------------------------------------------

_FIELD_RE = re.compile(r"^metadata\.(labels|annotations)\['(.+)'\]$")


def field_value(pod: dict, path: str, pod_ip: str | None, host_ip: str) -> str:
    """The value of a `fieldRef.fieldPath`, as kubelet's podFieldSelectorRuntimeValue computes it."""
    meta, spec = pod.get("metadata") or {}, pod.get("spec") or {}
    match = _FIELD_RE.match(path)
    if match:
        return str((meta.get(match.group(1)) or {}).get(match.group(2), ""))
    simple = {
        "metadata.name": meta.get("name", ""),
        "metadata.namespace": meta.get("namespace", ""),
        "metadata.uid": meta.get("uid", ""),
        "spec.nodeName": spec.get("nodeName", ""),
        "spec.serviceAccountName": spec.get("serviceAccountName", ""),
        "status.podIP": pod_ip or "",
        "status.podIPs": pod_ip or "",
        "status.hostIP": host_ip,
        "status.hostIPs": host_ip,
    }
    if path in simple:
        return str(simple[path])
    if path in ("metadata.labels", "metadata.annotations"):
        items = meta.get(path.split(".")[1]) or {}
        return "\n".join(f'{k}="{v}"' for k, v in sorted(items.items()))
    raise SpecError(f"unsupported fieldRef.fieldPath {path!r}")


def resource_value(container: dict, ref: dict, allocatable: dict[str, str]) -> str:
    """`resourceFieldRef`: the container's limit (node allocatable when unset) or request, ÷ divisor, rounded up."""
    resource = ref["resource"]
    kind, _, name = resource.partition(".")
    if kind not in ("limits", "requests") or name not in ("cpu", "memory", "ephemeral-storage"):
        raise SpecError(f"unsupported resourceFieldRef.resource {resource!r}")
    resources = container.get("resources") or {}
    value = (resources.get(kind) or {}).get(name)
    if value is None and kind == "requests":
        value = (resources.get("limits") or {}).get(name)
    if value is None:
        value = allocatable.get(name, "0") if kind == "limits" else "0"
    divisor = parse_quantity(ref.get("divisor") or "0")
    if divisor == 0:  # the API defaults it to "0", which kubelet reads as 1
        divisor = parse_quantity("1")
    if divisor < 0:
        raise SpecError(f"resourceFieldRef divisor must be positive, got {ref.get('divisor')!r}")
    return str(math.ceil(parse_quantity(value) / divisor))


_VAR_RE = re.compile(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_.\-]*)\)")


def expand(text: str, env: dict[str, str]) -> str:
    """Kubernetes `$(VAR)` expansion: defined names are replaced, `$$` escapes, unknown ones stay."""
    def sub(m: re.Match) -> str:
        if m.group(0) == "$$":
            return "$"
        name = m.group(1)
        return env[name] if name in env else m.group(0)
    return _VAR_RE.sub(sub, text)


def container_env(pod: dict, container: dict, *, pod_ip: str | None, host_ip: str,
                  allocatable: dict[str, str]) -> dict[str, str]:
    env: dict[str, str] = {}
    if container.get("envFrom"):
        raise SpecError("envFrom (ConfigMaps/Secrets) is not supported on process nodes")
    for item in container.get("env") or []:
        name = item["name"]
        if "valueFrom" not in item:
            env[name] = expand(str(item.get("value", "")), env)
            continue
        source = item["valueFrom"]
        if "fieldRef" in source:
            env[name] = field_value(pod, source["fieldRef"]["fieldPath"], pod_ip, host_ip)
        elif "resourceFieldRef" in source:
            env[name] = resource_value(container, source["resourceFieldRef"], allocatable)
        else:
            raise SpecError(f"env {name}: valueFrom {sorted(source)} is not supported on process nodes")
    return env


def process_specs(pod: dict, *, pod_ip: str | None, host_ip: str, allocatable: dict[str, str],
                  base_env: dict[str, str], service_env: dict[str, str] | None = None) -> list[ProcessSpec]:
    """The processes of a pod's containers (init containers are not supported). `service_env`
    (KUBERNETES_SERVICE_HOST…) comes before the container's own env, which may override it."""
    spec = pod.get("spec") or {}
    if spec.get("initContainers"):
        raise SpecError("initContainers are not supported on process nodes")
    out = []
    for container in spec.get("containers") or []:
        own = container_env(pod, container, pod_ip=pod_ip, host_ip=host_ip, allocatable=allocatable)
        command = [expand(c, own) for c in container.get("command") or []]
        args = [expand(a, own) for a in container.get("args") or []]
        argv = command + args if command else args
        if not command:
            raise SpecError(f"container {container['name']}: no command; a process node cannot run an image's "
                            "entrypoint (the image is not pulled)")
        env = dict(base_env)
        env["HOSTNAME"] = pod_hostname(pod)
        env.update(service_env or {})
        env.update(own)
        if "PATH" in own and base_env.get("PATH"):
            # The image is not there: the agent's environment (its venv's bin first) must stay reachable.
            env["PATH"] = base_env["PATH"].split(":", 1)[0] + ":" + own["PATH"]
        out.append(ProcessSpec(container["name"], argv, env, container.get("workingDir"), container.get("image", ""),
                               liveness_probe(container, {e["name"]: e["value"] for e in container.get("env") or []
                                                          if "value" in e})))
    return out


# --- liveness probes (exec) -------------------------------------------------------------------------

@dataclass(frozen=True)
class ExecProbe:
    """A container's exec livenessProbe with the API's defaults: run `command` in the container every
    `period` s from `initial_delay` s after it starts; `failure_threshold` failures in a row (a non-zero
    exit, or no exit within `timeout` s) kill the container, within `grace` s (the probe's
    terminationGracePeriodSeconds, else the pod's), and its restart policy and rules decide what next."""
    command: tuple[str, ...]
    initial_delay: float = 0
    period: float = 10
    timeout: float = 1
    failure_threshold: int = 3
    grace: float | None = None


def liveness_probe(container: dict, env: dict[str, str]) -> ExecProbe | None:
    """The container's exec livenessProbe, its command `$(VAR)`-expanded with `env` (kubelet expands
    with the container's static `value`s only, which the caller passes); None without one, or for
    httpGet, tcpSocket and grpc probes, which process nodes do not run (docs/process-nodes.md)."""
    probe = container.get("livenessProbe") or {}
    command = (probe.get("exec") or {}).get("command")
    if not command:
        return None
    grace = probe.get("terminationGracePeriodSeconds")
    return ExecProbe(tuple(expand(c, env) for c in command), float(probe.get("initialDelaySeconds") or 0),
                     float(probe.get("periodSeconds") or 10), float(probe.get("timeoutSeconds") or 1),
                     int(probe.get("failureThreshold") or 3), float(grace) if grace is not None else None)


# --- names ----------------------------------------------------------------------------------------

def pod_hostname(pod: dict) -> str:
    """spec.hostname, else the pod name (truncated to 63 like kubelet)."""
    return ((pod.get("spec") or {}).get("hostname") or pod["metadata"]["name"])[:63]


def pod_fqdn(pod: dict, cluster_domain: str) -> str | None:
    spec = pod.get("spec") or {}
    if not spec.get("subdomain"):
        return None
    return f"{pod_hostname(pod)}.{spec['subdomain']}.{pod['metadata']['namespace']}.svc.{cluster_domain}"


def resolv_conf(pod: dict, nameserver: str | None, cluster_domain: str) -> str:
    """The ClusterFirst resolv.conf kubelet writes: search <ns>.svc, svc, the domain; ndots 5."""
    ns = pod["metadata"]["namespace"]
    lines = [f"search {ns}.svc.{cluster_domain} svc.{cluster_domain} {cluster_domain}"]
    if nameserver:
        lines.append(f"nameserver {nameserver}")
    lines.append("options ndots:5")
    return "\n".join(lines) + "\n"


def hosts_file(pod: dict, pod_ip: str, cluster_domain: str) -> str:
    """The /etc/hosts kubelet writes: loopback names and the pod's own hostname (and FQDN)."""
    name = pod_hostname(pod)
    fqdn = pod_fqdn(pod, cluster_domain)
    own = f"{pod_ip}\t{fqdn}\t{name}" if fqdn else f"{pod_ip}\t{name}"
    return ("# Kubernetes-managed hosts file (gangctl node agent).\n127.0.0.1\tlocalhost\n"
            "::1\tlocalhost ip6-localhost ip6-loopback\n" + own + "\n")


# --- pod status -----------------------------------------------------------------------------------

def _state(c: ContainerState) -> dict:
    if c.state == "running":
        return {"running": {"startedAt": c.started_at}}
    if c.state == "terminated":
        term = {"exitCode": c.exit_code if c.exit_code is not None else -1, "reason": c.reason,
                "startedAt": c.started_at, "finishedAt": c.finished_at, "containerID": c.container_id}
        if c.signal:
            term["signal"] = c.signal
        if c.message:
            term["message"] = c.message
        return {"terminated": term}
    waiting = {"reason": c.reason}
    if c.message:
        waiting["message"] = c.message
    return {"waiting": waiting}


# --- restarts: the kubelet's container restart rules (ContainerRestartRules, beta and on since 1.35;
# RestartAllContainersOnContainerExits, beta and on in 1.36) ------------------------------------------

RESTART = "Restart"
RESTART_ALL = "RestartAllContainers"
# The kubelet's reason on a container it stopped because another one asked for RestartAllContainers.
RESTARTING_ALL = "RestartingAllContainers"
# What a 1.36 kubelet declares in node.status.declaredFeatures for the features process nodes implement
# (the scheduler's NodeDeclaredFeatures filter keeps pods that need one off nodes that lack it).
DECLARED_FEATURES = ("RestartAllContainersOnContainerExits",)


def restart_rule(container: dict, exit_code: int) -> dict | None:
    """The first of the container's restartPolicyRules its exit code matches (the kubelet's
    FindMatchingContainerRestartRule); a rule with an unknown operator never matches."""
    for rule in container.get("restartPolicyRules") or []:
        codes = rule.get("exitCodes")
        if not codes:
            continue
        listed = exit_code in (codes.get("values") or [])
        if (codes.get("operator") == "In" and listed) or (codes.get("operator") == "NotIn" and not listed):
            return rule
    return None


def restart_action(container: dict, pod_spec: dict, exit_code: int) -> str | None:
    """What the kubelet does when `container` exits with `exit_code` (its ContainerShouldRestart):
    RESTART_ALL (every container of the pod restarts in place), RESTART, or None. Rules apply only to a
    container with its own restartPolicy; no rule matching, that policy decides; no container
    policy, the pod's (default Always)."""
    own = container.get("restartPolicy")
    if own is not None:
        rule = restart_rule(container, exit_code)
        if rule is not None and rule.get("action") in (RESTART, RESTART_ALL):
            return rule["action"]
    policy = own if own in ("Always", "OnFailure", "Never") else pod_spec.get("restartPolicy") or "Always"
    return RESTART if policy == "Always" or (policy == "OnFailure" and exit_code != 0) else None


def restarts_all_possible(pod_spec: dict) -> bool:
    """Whether a container of the pod has a RestartAllContainers rule (the pod then carries the
    AllContainersRestarting condition)."""
    return any(rule.get("action") == RESTART_ALL for c in pod_spec.get("containers") or []
               for rule in c.get("restartPolicyRules") or [])


def pod_phase(containers: list[ContainerState], pod_spec: dict) -> str:
    """The kubelet's getPhase for a pod's regular containers, restart rules included: a container that
    exited and will restart (by its rule, its policy, the pod's, or because another asked for
    RestartAllContainers) keeps the pod Running."""
    if not containers:
        return "Pending"
    specs = {c.get("name"): c for c in pod_spec.get("containers") or []}
    running = waiting = stopped = succeeded = final = 0
    for c in containers:
        exited = ({"exitCode": c.exit_code, "reason": c.reason} if c.state == "terminated"
                  else c.last_terminated if c.state == "waiting" else None)
        if c.state == "running":
            running += 1
        elif not exited:
            waiting += 1
        else:
            stopped += 1
            code = exited.get("exitCode") or 0
            succeeded += c.state == "terminated" and code == 0
            final += (restart_action(specs.get(c.name, {}), pod_spec, code) is None
                      and exited.get("reason") != RESTARTING_ALL)
    if waiting:
        return "Pending"
    if running:
        return "Running"
    if stopped != final:
        return "Running"   # at least one container is restarting
    return "Succeeded" if succeeded == stopped else "Failed"


def pod_status(pod: dict, rt: PodRuntime, now: str, *, failed_reason: str | None = None,
               failed_message: str = "") -> dict:
    """status for a strategic-merge patch of pods/status (conditions merge by type)."""
    phase = "Failed" if failed_reason else pod_phase(rt.containers, pod.get("spec") or {})
    running = [c for c in rt.containers if c.state == "running"]
    all_ready = bool(rt.containers) and len(running) == len(rt.containers)
    ready = "True" if all_ready and phase == "Running" else "False"
    ready_reason = None if ready == "True" else ("PodCompleted" if phase in ("Succeeded", "Failed") else "ContainersNotReady")
    conditions = [
        {"type": "PodReadyToStartContainers", "status": "True" if rt.pod_ip else "False"},
        {"type": "Initialized", "status": "True"},
        {"type": "ContainersReady", "status": ready},
        {"type": "Ready", "status": ready},
        {"type": "PodScheduled", "status": "True"},
        *([{"type": "AllContainersRestarting", "status": "True" if rt.restarting_all else "False",
            **({"reason": "RestartAllContainersStarted", "message": "container exited with restart policy rule"}
               if rt.restarting_all else {})}] if restarts_all_possible(pod.get("spec") or {}) else []),
    ]
    for cond in conditions:
        cond["lastTransitionTime"] = now
        if cond["type"] in ("ContainersReady", "Ready") and ready_reason:
            cond["reason"] = ready_reason
    status = {
        "phase": phase,
        "conditions": conditions,
        "hostIP": rt.host_ip,
        "hostIPs": [{"ip": rt.host_ip}],
        "startTime": rt.start_time or now,
        "qosClass": (pod.get("status") or {}).get("qosClass", "BestEffort"),
        "containerStatuses": [{
            "name": c.name,
            "image": c.image,
            "imageID": "",
            "containerID": c.container_id,
            "ready": c.state == "running",
            "started": c.state == "running",
            "restartCount": c.restart_count,
            "state": _state(c),
            **({"lastState": {"terminated": c.last_terminated}} if c.last_terminated else {"lastState": {}}),
        } for c in rt.containers],
    }
    if rt.pod_ip:
        status["podIP"] = rt.pod_ip
        status["podIPs"] = [{"ip": rt.pod_ip}]
    if failed_reason:
        status["reason"] = failed_reason
        status["message"] = failed_message
    return status


def keep_transition_times(old: list[dict], new: list[dict]) -> list[dict]:
    """Keep a condition's lastTransitionTime when its status did not change."""
    before = {c["type"]: c for c in old or []}
    for cond in new:
        prev = before.get(cond["type"])
        if prev and prev.get("status") == cond["status"] and prev.get("lastTransitionTime"):
            cond["lastTransitionTime"] = prev["lastTransitionTime"]
    return new


# --- the Node and its Lease -----------------------------------------------------------------------

@dataclass(frozen=True)
class NodeConfig:
    name: str
    cpu: str
    memory: str
    pods: int = 110
    kubelet_port: int = 10250
    address: str = "127.0.0.1"
    labels: dict[str, str] = field(default_factory=dict)
    taint: bool = False
    pod_cidr: str | None = None

    @property
    def capacity(self) -> dict[str, str]:
        return {"cpu": self.cpu, "memory": self.memory, "pods": str(self.pods), "ephemeral-storage": "100Gi"}


def node_conditions(now: str, ready: bool = True) -> list[dict]:
    conds = [
        ("MemoryPressure", "False", "KubeletHasSufficientMemory", "the agent does not track memory pressure"),
        ("DiskPressure", "False", "KubeletHasNoDiskPressure", "the agent does not track disk pressure"),
        ("PIDPressure", "False", "KubeletHasSufficientPID", "the agent does not track PIDs"),
        ("Ready", "True" if ready else "False", "KubeletReady" if ready else "KubeletNotReady",
         "gangctl node agent is posting ready status; pods run as local processes (images are not pulled)"),
    ]
    return [{"type": t, "status": s, "reason": r, "message": m, "lastHeartbeatTime": now,
             "lastTransitionTime": now} for t, s, r, m in conds]


def node_object(cfg: NodeConfig, now: str) -> dict:
    labels = {"kubernetes.io/hostname": cfg.name, "kubernetes.io/os": "linux", "kubernetes.io/arch": "amd64",
              PROCESS_NODE_LABEL: "true", "gangctl.io/node-kind": "process", "type": "process", **cfg.labels}
    spec: dict = {"taints": [PROCESS_NODE_TAINT]} if cfg.taint else {}
    if cfg.pod_cidr:
        spec["podCIDR"] = cfg.pod_cidr
        spec["podCIDRs"] = [cfg.pod_cidr]
    return {
        "apiVersion": "v1", "kind": "Node",
        # No kwok.x-k8s.io/node annotation: KWOK leaves this node to its agent.
        "metadata": {"name": cfg.name, "labels": labels,
                     "annotations": {"gangctl.io/node-agent": "process", "node.alpha.kubernetes.io/ttl": "0"}},
        "spec": spec,
        "status": node_status(cfg, now),
    }


def node_status(cfg: NodeConfig, now: str) -> dict:
    return {
        "capacity": cfg.capacity,
        "allocatable": cfg.capacity,
        "conditions": node_conditions(now),
        # The apiserver proxies pods/log, exec… to <InternalIP>:<kubeletEndpoint.Port>.
        "addresses": [{"type": "InternalIP", "address": cfg.address}],
        "daemonEndpoints": {"kubeletEndpoint": {"Port": cfg.kubelet_port}},
        "declaredFeatures": list(DECLARED_FEATURES),
        "nodeInfo": {"kubeletVersion": AGENT_VERSION, "kubeProxyVersion": "", "operatingSystem": "linux",
                     "architecture": "amd64", "containerRuntimeVersion": "gangctl-process://0.1",
                     "osImage": "gangctl process node", "kernelVersion": "", "machineID": "", "systemUUID": "",
                     "bootID": ""},
    }


def lease_object(node: str, node_uid: str | None, now_micro: str) -> dict:
    meta: dict = {"name": node, "namespace": "kube-node-lease"}
    if node_uid:
        meta["ownerReferences"] = [{"apiVersion": "v1", "kind": "Node", "name": node, "uid": node_uid}]
    return {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": meta,
            "spec": {"holderIdentity": node, "leaseDurationSeconds": LEASE_SECONDS, "renewTime": now_micro}}

