"""`gangctl node-agent`: a process node. It does a kubelet's job for pods bound to its Node, with
local processes instead of containers (I/O here; the translations are in spec.py).

- registers the Node (capacity, the label `gangctl.io/process-node=true`; no taint unless asked
  for, since it really runs pods as a kubelet's node does: the fake KWOK nodes are the tainted ones;
  no KWOK annotation, so KWOK leaves it alone), renews its Lease in kube-node-lease every few
  seconds and refreshes the Node's conditions;
- watches pods with spec.nodeName=<node>; for each: a network namespace and IP (network.py), its
  /etc/resolv.conf and /etc/hosts, then one shim per container (shim.py) running command+args with
  the env kubelet would give (downward API included) in this Python environment (the image is not
  pulled: the venv's bin comes first on PATH, so `torchrun` and `python` are this venv's);
- reports pod status as it changes; on deletion: SIGTERM, the grace period, SIGKILL, then removes
  the pod object (DELETE with gracePeriodSeconds=0, as kubelet confirms a deletion);
- gives each pod what kubelet gives it to reach the API: its projected volumes (the ServiceAccount
  token from the TokenRequest API, kept fresh; ca.crt; namespace — projected.py) bind-mounted at
  their mountPath in a private mount namespace per container, with the agent's own kubeconfig and
  keys covered up; and KUBERNETES_SERVICE_HOST/PORT… naming the `kubernetes` Service, which netd
  relays to the apiserver inside the pod network;
- serves container logs over the kubelet API (logs.py) to callers with a client certificate from the
  cluster CA whom the apiserver authorizes (kubeletauth.py);
- on exit kills every process it started; if it is SIGKILLed, the shims' PR_SET_PDEATHSIG does it.
"""
from __future__ import annotations

import asyncio
import base64
import json
import logging
import os
import signal
import sys
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from gangctl.api.resources import NODES, PODS, Resource
from gangctl.kube.client import ApiError, Kube
from gangctl.kube.events import EventRecorder
from gangctl.kube.informer import Informer
import yaml

from gangctl.nodeagent import network
from gangctl.nodeagent.kubeletauth import kubeconfig_ca
from gangctl.nodeagent.logs import serve_kubelet_api
from gangctl.nodeagent.projected import ProjectedVolumes
from gangctl.nodeagent.volumes import (KUBELET_MAX_TOKEN_AGE, container_mounts, hidden_paths,
                                       kubernetes_service_env, projected_volumes, under_secrets_root)
from gangctl.nodeagent.spec import (RESTART_ALL, RESTARTING_ALL, ContainerState, NodeConfig, PodRuntime, SpecError,
                                    hosts_file, keep_transition_times, lease_object, node_conditions, node_object,
                                    pod_status, process_specs, resolv_conf, restart_action)

log = logging.getLogger("gangctl.nodeagent")
LEASES = Resource("coordination.k8s.io", "v1", "leases", "Lease")
CLUSTER_DOMAIN = "cluster.local"
LEASE_RENEW_SECONDS = 2.0
STATUS_SECONDS = 10.0
CONFIG_ERROR = "CreateContainerConfigError"
CONFIG_RETRY_FIRST, CONFIG_RETRY_MAX = 1.0, 10.0  # seconds; kubelet's pod workers retry every 10 s


def now() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def now_micro() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


@dataclass(frozen=True)
class AgentConfig:
    node: NodeConfig
    cluster: str
    index: int
    state_dir: Path
    kubeconfig: Path | None = None
    dns: str | None = network.DNS_IP
    token_max_age: float = KUBELET_MAX_TOKEN_AGE  # refresh tokens at 80 % of their life or after this
    client_ca: Path | None = None  # kubelet API callers' CA; default: the kubeconfig's cluster CA
    hide: tuple[str, ...] = ()  # more paths pods must not see (the kubeconfig and its keys always)


class NodePods(Resource):
    """Pods bound to one node: the pods resource with a spec.nodeName field selector."""

    def __init__(self, node: str):
        super().__init__("", "v1", "pods", "Pod")
        object.__setattr__(self, "node", node)

    def path(self, namespace=None, name=None, sub=None) -> str:
        return super().path(namespace, name, sub) + f"?fieldSelector=spec.nodeName%3D{self.node}"


@dataclass
class Container:
    state: ContainerState
    log_dir: Path
    proc: asyncio.subprocess.Process | None = None
    spec: Any = None                 # its process (gangctl.nodeagent.spec.ProcessSpec), once planned
    task: asyncio.Task | None = None  # the loop that runs (and restarts) it

    def log_file(self, restart: int | None = None) -> Path:
        return self.log_dir / f"{self.state.restart_count if restart is None else restart}.log"


@dataclass
class PodWorker:
    key: str
    uid: str
    rt: PodRuntime = field(default_factory=PodRuntime)
    containers: dict[str, Container] = field(default_factory=dict)
    wake: asyncio.Event = field(default_factory=asyncio.Event)
    task: asyncio.Task | None = None
    started: bool = False
    finished: bool = False
    conditions: list[dict] = field(default_factory=list)
    config_error: tuple[str, str] | None = None
    config_retries: int = 0
    retry_at: float = 0.0  # monotonic time of the next attempt after a config error
    binds: dict[str, list[tuple[str, str]]] = field(default_factory=dict)  # container -> (folder, mountPath)
    metadata_seen: tuple[dict, dict] | None = None  # the labels and annotations its downward API files show
    restart_all_done: asyncio.Event = field(default_factory=asyncio.Event)  # set when a RestartAllContainers ends


class NodeAgent:
    def __init__(self, kube: Kube, cfg: AgentConfig):
        self.kube = kube
        self.cfg = cfg
        self.name = cfg.node.name
        self.pool = network.IpPool(network.agent_subnet(cfg.index))
        self.pods: dict[str, PodWorker] = {}
        self.informer = Informer(kube, NodePods(self.name), handlers=[self._on_pod])
        self.events = EventRecorder(kube, component="gangctl-node-agent")
        self.node_uid: str | None = None
        self.volumes = ProjectedVolumes(kube, cfg.state_dir / "volumes", cfg.token_max_age)
        self.service_env: dict[str, str] = {}
        self.kubeconfig_path = Path(cfg.kubeconfig or os.environ.get("KUBECONFIG") or Path.home() / ".kube" / "config")
        try:
            self.kubeconfig = yaml.safe_load(self.kubeconfig_path.read_text()) or {}
        except OSError:
            self.kubeconfig = {}
        self.hidden = hidden_paths(str(self.kubeconfig_path), self.kubeconfig,
                                   [str(cfg.state_dir / "pki"), str(cfg.state_dir / "volumes"), *cfg.hide])
        venv_bin = str(Path(sys.executable).parent)
        self.base_env = {"PATH": f"{venv_bin}:{os.environ.get('PATH', '/usr/local/bin:/usr/bin:/bin')}",
                         "LANG": os.environ.get("LANG", "C.UTF-8"), "HOME": os.environ.get("HOME", "/root"),
                         "PYTHONUNBUFFERED": "1"}
        self._tasks: list[asyncio.Task] = []

    # --- the Node --------------------------------------------------------------------------------

    async def register(self) -> None:
        node = node_object(self.cfg.node, now())
        try:
            created = await self.kube.create(NODES.path(), node)
        except ApiError as err:
            if not err.conflict:
                raise
            created = await self.kube.merge_patch(NODES.path(name=self.name),
                                                  {"metadata": {"labels": node["metadata"]["labels"]},
                                                   "spec": node["spec"]})
            await self.kube.merge_patch(NODES.path(name=self.name, sub="status"), {"status": node["status"]})
        self.node_uid = created["metadata"]["uid"]
        try:
            svc = await self.kube.get("/api/v1/namespaces/default/services/kubernetes")
            port = next(p["port"] for p in svc["spec"]["ports"] if p.get("name") == "https")
            self.service_env = kubernetes_service_env(svc["spec"]["clusterIP"], port)
        except (ApiError, KeyError, StopIteration) as err:
            log.warning("no `kubernetes` Service (%s): pods get no KUBERNETES_SERVICE_HOST", err)
        log.info("node %s registered (kubelet API on %s:%d)", self.name, self.cfg.node.address, self.cfg.node.kubelet_port)

    async def renew_lease(self) -> None:
        path = LEASES.path("kube-node-lease", self.name)
        while True:
            try:
                await self.kube.apply(path, lease_object(self.name, self.node_uid, now_micro()), "gangctl-node-agent")
            except Exception as err:
                log.warning("lease renewal failed: %s", err)
            await asyncio.sleep(LEASE_RENEW_SECONDS)

    async def post_node_status(self) -> None:
        while True:
            await asyncio.sleep(STATUS_SECONDS)
            try:
                await self.kube.request("PATCH", NODES.path(name=self.name, sub="status"),
                                        body={"status": {"conditions": node_conditions(now())}},
                                        content_type="application/strategic-merge-patch+json")
            except Exception as err:
                log.warning("node status update failed: %s", err)

    # --- pods -----------------------------------------------------------------------------------

    def _on_pod(self, kind: str, pod: dict) -> None:
        key = f"{pod['metadata']['namespace']}/{pod['metadata']['name']}"
        worker = self.pods.get(key)
        if worker is not None and worker.uid != pod["metadata"]["uid"]:
            worker.wake.set()  # an old pod of the same name: its worker sees it is gone
            worker = None
        if worker is None:
            if kind == "DELETED" or pod["status"].get("phase") in ("Succeeded", "Failed") and not pod["metadata"].get("deletionTimestamp"):
                return
            worker = PodWorker(key, pod["metadata"]["uid"])
            self.pods[key] = worker
            worker.task = asyncio.create_task(self._run_pod(worker))
        worker.wake.set()

    def _pod(self, worker: PodWorker) -> dict | None:
        pod = self.informer.get(worker.key)
        return pod if pod and pod["metadata"]["uid"] == worker.uid else None

    async def _run_pod(self, w: PodWorker) -> None:
        try:
            while True:
                await w.wake.wait()
                w.wake.clear()
                pod = self._pod(w)
                if pod is None or pod["metadata"].get("deletionTimestamp"):
                    await self._stop_pod(w, pod)
                    return
                if not w.started:
                    await self._start_pod(w, pod)
                elif w.config_error and w.config_error[0] == CONFIG_ERROR and time.monotonic() >= w.retry_at:
                    await self._start_containers(w, pod)
                elif not w.finished and not w.config_error:
                    self._refresh_downward_api(w, pod)
                await self._post_status(w, pod)
        except Exception:
            log.exception("pod %s: worker failed", w.key)
        finally:
            if self.pods.get(w.key) is w:
                del self.pods[w.key]

    async def _start_pod(self, w: PodWorker, pod: dict) -> None:
        w.started = True
        status = pod.get("status") or {}
        if any("running" in (cs.get("state") or {}) or "terminated" in (cs.get("state") or {})
               for cs in status.get("containerStatuses") or []):
            # Its processes ran under an earlier agent and died with it: say so, do not rerun them.
            for cs in status["containerStatuses"]:
                c = ContainerState(cs["name"], cs.get("image", ""), "terminated", "ContainerStatusUnknown",
                                   "The container could not be located when the node agent restarted",
                                   (cs["state"].get("running") or cs["state"].get("terminated") or {}).get("startedAt"),
                                   now(), 137)
                if "terminated" in cs["state"]:
                    t = cs["state"]["terminated"]
                    c = ContainerState(cs["name"], cs.get("image", ""), "terminated", t.get("reason", ""),
                                       t.get("message", ""), t.get("startedAt"), t.get("finishedAt"), t.get("exitCode"))
                w.containers[c.name] = Container(c, self._log_dir(pod, c.name))
            w.rt.pod_ip = status.get("podIP")
            w.rt.start_time = status.get("startTime")
            w.finished = True
            return
        w.rt.start_time = now()
        for c in pod["spec"]["containers"]:
            state = ContainerState(c["name"], c.get("image", ""))
            w.containers[c["name"]] = Container(state, self._log_dir(pod, c["name"]))
        ip = self.pool.take()
        try:
            await network.acreate_pod_network(self.cfg.cluster, w.uid, ip,
                                              resolv_conf(pod, self.cfg.dns, CLUSTER_DOMAIN),
                                              hosts_file(pod, ip, CLUSTER_DOMAIN))
        except network.NetworkError as err:
            self.pool.give_back(ip)
            w.config_error = ("CreatePodSandboxError", str(err))
            for c in w.containers.values():
                c.state.reason, c.state.message = "CreatePodSandboxError", str(err)
            return
        w.rt.pod_ip = ip
        await self._start_containers(w, pod)

    async def _start_containers(self, w: PodWorker, pod: dict) -> None:
        """Plan the containers' processes and volumes, then start them. A SpecError leaves the pod
        Pending with the reason and is tried again later, as kubelet does (its pod workers retry every
        10 s): the kube-root-ca.crt ConfigMap of every token volume reaches a new namespace a moment
        after the namespace itself, and any ConfigMap or token may be there later."""
        try:
            specs = process_specs(pod, pod_ip=w.rt.pod_ip, host_ip=self.cfg.node.address,
                                  allocatable=self.cfg.node.capacity, base_env=self.base_env,
                                  service_env=self.service_env)
            await self._prepare_volumes(w, pod)
        except SpecError as err:
            if w.config_error != (CONFIG_ERROR, str(err)):
                await self.events.warning(pod, "Failed", f"Error: {err}")
            w.config_error = (CONFIG_ERROR, str(err))
            for c in w.containers.values():
                c.state.reason, c.state.message = CONFIG_ERROR, str(err)
            delay = min(CONFIG_RETRY_MAX, CONFIG_RETRY_FIRST * 2 ** w.config_retries)
            w.config_retries += 1
            w.retry_at = time.monotonic() + delay
            asyncio.get_running_loop().call_later(delay, w.wake.set)
            return
        if w.config_error:
            log.info("pod %s: configured after %d retries", w.key, w.config_retries)
            w.config_error = None
            for c in w.containers.values():
                c.state.reason, c.state.message = "ContainerCreating", ""
        await self._post_status(w, pod)  # the pod IP before any process starts, so peers can resolve it
        images = ", ".join(sorted({s.image for s in specs if s.image})) or "none"
        await self.events.normal(pod, "ProcessNode",
                                 f"image(s) {images} not pulled: containers run as local processes in the node "
                                 f"agent's Python environment ({sys.prefix}) on {self.name}")
        for spec in specs:
            w.containers[spec.container].task = asyncio.create_task(self._run_container(w, pod, spec))
            w.containers[spec.container].spec = spec

    async def _prepare_volumes(self, w: PodWorker, pod: dict) -> None:
        """Write the pod's projected volumes and plan each container's bind mounts (SpecError if a
        mount cannot be made)."""
        vols = projected_volumes(pod, allocatable=self.cfg.node.capacity)
        mounts = {c["name"]: container_mounts(c, vols) for c in pod["spec"]["containers"]}
        for name, ms in mounts.items():
            for m in ms:
                if not under_secrets_root(m.path) and not Path(m.path).is_dir():
                    raise SpecError(f"container {name}: mountPath {m.path} does not exist on the process node "
                                    "(only folders under /var/run/secrets are made for a pod)")
        used = {m.volume for ms in mounts.values() for m in ms}
        folders = await self.volumes.prepare(pod, {k: v for k, v in vols.items() if k in used})
        w.binds = {name: [(str(folders[m.volume]), m.path) for m in ms] for name, ms in mounts.items()}

    def _refresh_downward_api(self, w: PodWorker, pod: dict) -> None:
        """The pod's labels or annotations changed: its downward API files say so now."""
        meta = pod["metadata"]
        seen = (meta.get("labels") or {}, meta.get("annotations") or {})
        if seen == w.metadata_seen:
            return
        w.metadata_seen = seen
        try:
            vols = projected_volumes(pod, allocatable=self.cfg.node.capacity)
        except SpecError:
            return   # it was writable when the pod started; the spec cannot change since
        if self.volumes.refresh_fields(pod, vols):
            log.info("pod %s: downward API files updated", w.key)

    def _log_dir(self, pod: dict, container: str) -> Path:
        m = pod["metadata"]
        d = self.cfg.state_dir / "pods" / f"{m['namespace']}_{m['name']}_{m['uid']}" / container
        d.mkdir(parents=True, exist_ok=True)
        return d

    async def _run_container(self, w: PodWorker, pod: dict, spec) -> None:
        c = w.containers[spec.container]
        container = next((x for x in pod["spec"]["containers"] if x["name"] == spec.container), {})
        while True:
            if c.state.restart_count:   # the first start runs what _start_containers just planned
                spec = c.spec = self._spec_now(w, pod, spec)
            status_file = c.log_dir / f"{c.state.restart_count}.status.json"
            argv = self._in_container(w, pod, c, spec, c.log_file(), status_file, spec.argv)
            from gangctl.nodeagent.shim import set_pdeathsig
            c.proc = await asyncio.create_subprocess_exec(
                *argv, env=spec.env, stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.DEVNULL,
                stderr=open(c.log_dir / "shim.err", "ab"), start_new_session=True,
                preexec_fn=lambda: set_pdeathsig(signal.SIGHUP))
            c.state.state, c.state.reason, c.state.message = "running", "", ""
            c.state.started_at, c.state.container_id = now(), f"process://{c.proc.pid}"
            w.wake.set()
            probe = (asyncio.create_task(self._liveness(w, pod, c, spec, c.proc)) if spec.liveness is not None
                     else None)
            code = await c.proc.wait()
            if probe is not None:
                probe.cancel()
            result = {}
            try:
                result = json.loads(status_file.read_text())
            except (OSError, ValueError):
                pass
            exit_code = result.get("exitCode", 128 - code if code < 0 else code)
            c.state.state, c.state.exit_code = "terminated", exit_code
            c.state.signal = result.get("signal") or (-code if code < 0 else None)
            c.state.finished_at = now()
            c.state.reason = result.get("reason") or ("Completed" if exit_code == 0 else "Error")
            c.state.message = result.get("message", "")
            c.proc = None
            pod_now = self._pod(w)
            if pod_now is None or pod_now["metadata"].get("deletionTimestamp") or w.finished:
                w.wake.set()
                return
            if w.rt.restarting_all:   # stopped by another container's RestartAllContainers rule
                c.state.reason = RESTARTING_ALL
                w.wake.set()
                await w.restart_all_done.wait()
            else:
                action = restart_action(container, pod["spec"], exit_code)
                w.wake.set()
                if action is None:
                    return
                if action == RESTART_ALL:
                    await self._restart_all(w, pod)
                else:
                    await asyncio.sleep(1)
            c.state.last_terminated = {"exitCode": exit_code, "reason": c.state.reason,
                                       "startedAt": c.state.started_at, "finishedAt": c.state.finished_at}
            c.state.restart_count += 1

    def _in_container(self, w: PodWorker, pod: dict, c: Container, spec, log_file: Path, status_file: Path,
                      command: list[str]) -> list[str]:
        """The argv that runs `command` as the container runs: under the shim, in the pod's network
        namespace, with the container's mounts and working directory."""
        work = spec.working_dir if spec.working_dir and Path(spec.working_dir).is_dir() else str(c.log_dir.parent)
        return ["ip", "netns", "exec", network.pod_namespace(self.cfg.cluster, w.uid),
                sys.executable, "-m", "gangctl.nodeagent.shim", "--log", str(log_file),
                "--status", str(status_file), "--hostname", pod["spec"].get("hostname") or pod["metadata"]["name"],
                "--cwd", work, "--parent", str(os.getpid()),
                *(a for src, dst in w.binds.get(spec.container, []) for a in ("--bind", f"{src}:{dst}")),
                *(a for path in self.hidden for a in ("--hide", path)), "--", *command]

    def _spec_now(self, w: PodWorker, pod: dict, spec):
        """The container's process as it starts now: the kubelet computes a container's env anew at
        every start, so a downward API value (an annotation) changed since shows in it."""
        current = self._pod(w) or pod
        try:
            specs = process_specs(current, pod_ip=w.rt.pod_ip, host_ip=self.cfg.node.address,
                                  allocatable=self.cfg.node.capacity, base_env=self.base_env,
                                  service_env=self.service_env)
        except SpecError:
            return spec   # it could be planned when the pod started, and a pod's spec does not change
        return next((s for s in specs if s.container == spec.container), spec)

    async def _liveness(self, w: PodWorker, pod: dict, c: Container, spec, proc: asyncio.subprocess.Process) -> None:
        """The container's exec liveness probe, as kubelet runs it: in the container (its network
        namespace, mounts and env), every period after the initial delay; after `failure_threshold`
        failures in a row an Unhealthy Event each, then Killing, and the container is stopped within
        the grace period. Its exit then goes through its restart policy and rules like any other."""
        probe = spec.liveness
        await asyncio.sleep(probe.initial_delay)
        failures = 0
        while proc.returncode is None:
            try:
                ok, output = await self._exec_in(w, pod, c, spec, probe.command, probe.timeout)
            except OSError as err:   # the probe could not be started: a failure, as kubelet counts it
                ok, output = False, f"probe not started: {err}"
            if proc.returncode is not None:
                return
            failures = 0 if ok else failures + 1
            if not ok:
                await self.events.warning(pod, "Unhealthy", f"Liveness probe failed: {output}")
                if failures >= probe.failure_threshold:
                    await self.events.normal(pod, "Killing", f"Container {spec.container} failed liveness probe, "
                                                             "will be restarted")
                    grace = probe.grace if probe.grace is not None else pod["spec"].get("terminationGracePeriodSeconds", 30)
                    await _stop([proc], float(grace or 0))
                    return
            await asyncio.sleep(probe.period)

    async def _exec_in(self, w: PodWorker, pod: dict, c: Container, spec, command: tuple[str, ...],
                       timeout: float) -> tuple[bool, str]:
        """Run `command` in the container as a probe does; (exited 0 in time, what it printed or why not)."""
        out = c.log_dir / "probe.log"
        out.unlink(missing_ok=True)
        argv = self._in_container(w, pod, c, spec, out, c.log_dir / "probe.status.json", list(command))
        proc = await asyncio.create_subprocess_exec(*argv, env=spec.env, stdin=asyncio.subprocess.DEVNULL,
                                                    stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL,
                                                    start_new_session=True)
        try:
            code = await asyncio.wait_for(proc.wait(), timeout)
        except asyncio.TimeoutError:
            await _stop([proc], 0)
            return False, f"command {list(command)} timed out after {timeout:g}s"
        try:
            printed = out.read_text(errors="replace")[-1024:].strip()
        except OSError:
            printed = ""
        if code == 0:
            return True, printed
        return False, printed or f"command {list(command)} exited with code {code}"

    async def _restart_all(self, w: PodWorker, pod: dict) -> None:
        """A container exited as a RestartAllContainers rule says: as the kubelet does, stop every other
        container of the pod (within the pod's grace period; the pod keeps its node, IP and volumes),
        then start them all again, the pod showing AllContainersRestarting meanwhile."""
        w.rt.restarting_all, w.restart_all_done = True, asyncio.Event()
        w.wake.set()
        grace = pod["spec"].get("terminationGracePeriodSeconds", 30) or 0
        await self._kill_containers(w, grace)
        while any(c.state.state == "running" for c in w.containers.values()):
            await asyncio.sleep(0.05)   # each container's own loop records its exit
        w.rt.restarting_all = False
        w.restart_all_done.set()
        me = asyncio.current_task()
        for c in w.containers.values():   # those that had ended for good start again too
            if c.task is not None and c.task is not me and c.task.done() and c.spec is not None:
                c.state.last_terminated = {"exitCode": c.state.exit_code, "reason": c.state.reason,
                                           "startedAt": c.state.started_at, "finishedAt": c.state.finished_at}
                c.state.restart_count += 1
                c.task = asyncio.create_task(self._run_container(w, pod, c.spec))
        w.wake.set()

    async def _stop_pod(self, w: PodWorker, pod: dict | None) -> None:
        w.finished = True
        grace = 0
        if pod is not None:
            grace = pod["metadata"].get("deletionGracePeriodSeconds",
                                        pod["spec"].get("terminationGracePeriodSeconds", 30)) or 0
        await self._kill_containers(w, grace)
        if pod is not None and w.containers:
            for c in w.containers.values():
                if c.state.state != "terminated":
                    c.state.state, c.state.reason, c.state.exit_code = "terminated", "ContainerStatusUnknown", 137
                    c.state.finished_at = now()
            try:
                await self._post_status(w, pod)
            except ApiError:
                pass
        await network.adelete_pod_network(self.cfg.cluster, w.uid)
        self.pool.give_back(w.rt.pod_ip)
        self.volumes.release(w.uid)
        if pod is not None:
            try:
                await self.kube.request("DELETE", PODS.path(pod["metadata"]["namespace"], pod["metadata"]["name"]),
                                        body={"gracePeriodSeconds": 0, "preconditions": {"uid": w.uid}})
            except ApiError as err:
                if not (err.not_found or err.conflict):
                    raise
        log.info("pod %s stopped and removed", w.key)

    async def _kill_containers(self, w: PodWorker, grace: float) -> None:
        await _stop([c.proc for c in w.containers.values() if c.proc is not None and c.proc.returncode is None], grace)
        # Anything still in the pod's network namespace is part of the pod.
        await asyncio.to_thread(network.kill_netns_processes, network.pod_namespace(self.cfg.cluster, w.uid))

    async def _post_status(self, w: PodWorker, pod: dict) -> None:
        w.rt.containers = [c.state for c in w.containers.values()]
        status = pod_status(pod, w.rt, now())
        if w.config_error:
            status["phase"] = "Pending"
        status["conditions"] = keep_transition_times(w.conditions or (pod.get("status") or {}).get("conditions"),
                                                     status["conditions"])
        w.conditions = status["conditions"]
        m = pod["metadata"]
        try:
            await self.kube.request("PATCH", PODS.path(m["namespace"], m["name"], "status"),
                                    body={"metadata": {"uid": w.uid}, "status": status},
                                    content_type="application/strategic-merge-patch+json")
        except ApiError as err:
            if not (err.not_found or err.conflict):
                raise
        if status["phase"] in ("Succeeded", "Failed") and not w.finished:
            w.finished = True
            await network.adelete_pod_network(self.cfg.cluster, w.uid)
            self.pool.give_back(w.rt.pod_ip)
            self.volumes.release(w.uid)

    # --- logs -----------------------------------------------------------------------------------

    def lookup_log(self, ns: str, pod: str, container: str, previous: bool):
        w = self.pods.get(f"{ns}/{pod}")
        if w is not None and container in w.containers:
            c = w.containers[container]
            if previous:
                if c.state.restart_count == 0:
                    return None
                return c.log_file(c.state.restart_count - 1), lambda: False
            return c.log_file(), lambda: c.state.state != "terminated" or (c.proc is not None)
        # A finished pod whose worker is gone: its files stay until the pod is deleted.
        base = self.cfg.state_dir / "pods"
        for d in base.glob(f"{ns}_{pod}_*/{container}"):
            files = sorted(d.glob("*.log"), key=lambda p: int(p.stem))
            if files:
                return (files[-2] if previous and len(files) > 1 else files[-1]), lambda: False
        return None

    # --- the kubelet API's callers ---------------------------------------------------------------

    def _client_ca(self) -> Path:
        if self.cfg.client_ca:
            return self.cfg.client_ca
        path, data = kubeconfig_ca(self.kubeconfig, str(self.kubeconfig_path.parent))
        if path:
            return Path(path)
        if not data:
            raise RuntimeError(f"no cluster CA in {self.kubeconfig_path}: give the agent --client-ca-file")
        target = self.cfg.state_dir / "pki" / "client-ca.crt"
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(base64.b64decode(data))
        return target

    async def _review(self, review: dict) -> bool:
        try:
            answer = await self.kube.create("/apis/authorization.k8s.io/v1/subjectaccessreviews", review)
        except ApiError as err:
            log.warning("kubelet API: SubjectAccessReview failed: %s", err)
            return False
        return bool((answer.get("status") or {}).get("allowed"))

    # --- run ------------------------------------------------------------------------------------

    async def run(self, stop: asyncio.Event) -> None:
        await self.register()
        os.makedirs(os.path.realpath("/var/run") + "/secrets", exist_ok=True)  # where pods' tmpfs goes
        runner = await serve_kubelet_api(self.lookup_log, self.cfg.node.address, self.cfg.node.kubelet_port,
                                         self.cfg.state_dir / "pki", self.name, client_ca=self._client_ca(),
                                         review=self._review)
        self._tasks = [asyncio.create_task(t) for t in (self.renew_lease(), self.post_node_status(), self.informer.run())]
        await stop.wait()
        log.info("node agent %s stopping: killing its pods' processes", self.name)
        for t in self._tasks:
            t.cancel()
        await asyncio.gather(*(self._kill_containers(w, 0) for w in list(self.pods.values())), return_exceptions=True)
        for w in list(self.pods.values()):
            await network.adelete_pod_network(self.cfg.cluster, w.uid)
            self.volumes.release(w.uid)
        await runner.cleanup()


async def _stop(procs: list[asyncio.subprocess.Process], grace: float) -> None:
    """Stop shims as the kubelet stops containers: SIGTERM, then after `grace` s the whole tree."""
    for p in procs:
        _signal(p.pid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while any(p.returncode is None for p in procs) and time.monotonic() < deadline:
        await asyncio.sleep(0.1)
    for p in procs:
        if p.returncode is None:
            _signal(p.pid, signal.SIGHUP)  # the shim kills the whole tree
    for p in procs:
        try:
            await asyncio.wait_for(p.wait(), 5)
        except asyncio.TimeoutError:
            _signal(p.pid, signal.SIGKILL)


def _signal(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


async def run_agent(cfg: AgentConfig) -> None:
    kube = await Kube.connect(cfg.kubeconfig)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        await NodeAgent(kube, cfg).run(stop)
    finally:
        await kube.close()
