"""The local real control plane: kube-apiserver, kube-controller-manager, the coscheduling scheduler,
etcd and the KWOK controller, all started by kwokctl's binary runtime from binaries built here.

Everything listens on loopback. State lives under the cache folder, not in ~/.kube or ~/.kwok.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import yaml

from gangctl.cluster.build import BuildError, pinned_version
from gangctl.config import ClusterSettings
from gangctl.processes import running, running_from

# kube-apiserver flags of a cluster made for the native gang backend (gangctl.cluster.native). The
# apiserver and kube-controller-manager get the gates (the apiserver's PodGroupProtection admission
# puts a finalizer on every PodGroup that only the controller-manager's controller of that name lifts);
# the base scheduler (scheduler-plugins, older libraries) knows none of them. TopologyAwareWorkloadScheduling
# (1.36 alpha, KEP-5732) serves PodGroup `schedulingConstraints.topology` and makes kube-scheduler place
# a gang in one domain of that node label.
NATIVE_GANG_ARGS = {"feature-gates": "GenericWorkload=true,GangScheduling=true,TopologyAwareWorkloadScheduling=true",
                    "runtime-config": "scheduling.k8s.io/v1alpha2=true"}
# kube-controller-manager settings that make node loss visible in seconds, not minutes.
NODE_MONITOR_ARGS = {
    "node-monitor-period": "2s",
    "node-monitor-grace-period": "16s",
}
# KWOK renews each fake node's Lease every duration/4. kwokctl's default (200 s, renewed every
# 50 s) outlives the 16 s grace period above, so every node would go NotReady between renewals.
# 20 s renews every 5 s: a node is NotReady only after three missed renewals, like a kubelet.
KWOK_NODE_LEASE_SECONDS = "20"
# KWOK manages only nodes with this annotation, so process nodes (real workers) stay real.
KWOK_NODE_ANNOTATION = ("kwok.x-k8s.io/node", "fake")
# KWOK's own convention (its docs' node and pod examples): fake nodes carry this NoSchedule taint
# ("avoid scheduling actual running pods to fake Node"), and only pods meant for them tolerate it and
# select them by the label type=kwok. So a pod that must really run (a process-node worker, the
# kubeflow SDK's default runtime) never lands on a node where nothing would run it.
KWOK_NODE_TAINT = {"key": "kwok.x-k8s.io/node", "value": "fake", "effect": "NoSchedule"}
KWOK_TOLERATION = {"key": "kwok.x-k8s.io/node", "operator": "Exists", "effect": "NoSchedule"}
KWOK_NODE_SELECTOR = {"type": "kwok"}
# The shipped runtime for gangs meant for the KWOK GPU nodes (deploy/runtimes/torch-kwok-gpu.yaml).
KWOK_RUNTIME = "torch-kwok-gpu"
LOOPBACK = "127.0.0.1"
# Service IPs as kubeadm hands them out; the `kubernetes` Service gets the first one. Pods on
# process nodes reach the apiserver there (netd relays it), so its certificate must name that IP.
SERVICE_CIDR = "10.96.0.0/12"
KUBERNETES_SERVICE_IP = "10.96.0.1"

# KWOK stages (read from the pinned kwok module) that drive fake nodes and their pods. A Stage list
# in kwokctl's --config replaces the defaults, so the node heartbeat must be listed too.
KWOK_STAGES = (
    "stage/node/fast/node-initialize.yaml",
    "stage/node/heartbeat-with-lease/node-heartbeat-with-lease.yaml",
    "stage/node/chaos/node-not-ready.yaml",
    "stage/pod/general/pod-create.yaml",
    "stage/pod/general/pod-init-container-running.yaml",
    "stage/pod/general/pod-init-container-completed.yaml",
    "stage/pod/general/pod-ready.yaml",
    # Job pods finish after the delay in the annotation pod-complete.stage.kwok.x-k8s.io/delay.
    "stage/pod/general/pod-complete.yaml",
    "stage/pod/general/pod-delete.yaml",
    # A pod labelled pod-container-running-failed.stage.kwok.x-k8s.io=true fails (exit code by annotation).
    "stage/pod/chaos/pod-container-running-failed.yaml",
)
# gangctl's own stages (integrations/kwok/stages/): a pod annotated
# pod-restart-all-containers.stage.gangctl.io/restarts=N has its containers restarted in place until
# they have N restarts, as a kubelet carrying out a RestartAllContainers rule does.
OWN_KWOK_STAGES = ("pod-restart-all-containers.yaml",)


# The local apiserver's audit policy: metadata (who, what, when, the answer's code; no bodies) of every
# write by a ServiceAccount of gangctl-system, where the controller's run; nothing else.
AUDIT_POLICY = {"apiVersion": "audit.k8s.io/v1", "kind": "Policy", "omitStages": ["RequestReceived"],
                "rules": [{"level": "Metadata", "verbs": ["create", "update", "patch", "delete", "deletecollection"],
                           "userGroups": ["system:serviceaccounts:gangctl-system"]},
                          {"level": "None"}]}


@dataclass(frozen=True)
class Ports:
    apiserver: int
    etcd: int
    etcd_peer: int
    controller_manager: int
    scheduler: int
    kwok: int

    @classmethod
    def pick(cls) -> "Ports":
        """Free loopback ports, chosen by the kernel."""
        socks = []
        try:
            for _ in range(6):
                sock = socket.socket()
                sock.bind((LOOPBACK, 0))
                socks.append(sock)
            return cls(*(s.getsockname()[1] for s in socks))
        finally:
            for sock in socks:
                sock.close()


RESTART_ATTEMPTS = 5


def _stays_up(child: subprocess.Popen, port: int | None, timeout: float = 60) -> bool:
    """Whether a started component gets going: it listens on `port` (when it has one) or is still alive
    after two seconds; False when it exits first."""
    deadline = time.monotonic() + (timeout if port else 2)
    while time.monotonic() < deadline:
        if child.poll() is not None:
            return False
        if port and _accepts(port) and child.poll() is None:
            return True
        time.sleep(0.1)
    return child.poll() is None


def _accepts(port: int) -> bool:
    try:
        with socket.create_connection((LOOPBACK, port), timeout=0.5):
            return True
    except OSError:
        return False


def _wait_port_released(port: int, timeout: float = 30) -> None:
    """Wait until nothing accepts connections on `port`. A killed multi-threaded process shows as a
    zombie while its other threads still exit, and its listening socket keeps completing handshakes
    until the last one is gone: a successor started then fails to bind, and a connect test would
    take the dying socket for the successor's."""
    deadline = time.monotonic() + timeout
    while _accepts(port) and time.monotonic() < deadline:
        time.sleep(0.05)


class ClusterError(RuntimeError):
    """The cluster could not be started, stopped or read; the message says what to do next."""


@dataclass(frozen=True)
class LocalCluster:
    settings: ClusterSettings
    bin_dir: Path
    # Serve Kubernetes' own gang scheduling API (scheduling.k8s.io/v1alpha2, GenericWorkload and
    # GangScheduling gates on the apiserver): `cluster up --scheduler native` creates it so.
    native_gangs: bool = False

    @property
    def kubeconfig(self) -> Path:
        return self.settings.kubeconfig

    def _kwokctl(self, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        """Run kwokctl; its own log goes to kwokctl.log in the cache and is shown only on failure."""
        env = dict(os.environ, KWOK_WORKDIR=str(self.settings.kwok_workdir))
        cmd = [str(self.bin_dir / "kwokctl"), "--name", self.settings.cluster_name, *args]
        result = subprocess.run(cmd, env=env, text=True, capture_output=True)
        log = self.settings.cache_dir / "kwokctl.log"
        log.parent.mkdir(parents=True, exist_ok=True)
        with log.open("a") as sink:
            sink.write(f"$ {' '.join(cmd)}\n{result.stdout}{result.stderr}")
        if check and result.returncode != 0:
            raise ClusterError(f"`kwokctl {' '.join(args[:2])}` failed (exit {result.returncode}):\n"
                               f"{result.stderr.strip()[-2000:]}\nkwokctl log: {log}; component logs: {self.logs_dir}")
        return result

    @property
    def state_dir(self) -> Path:
        return self.settings.kwok_workdir / "clusters" / self.settings.cluster_name

    @property
    def logs_dir(self) -> Path:
        return self.state_dir / "logs"

    @property
    def audit_log_path(self) -> Path:
        """The apiserver's audit log (JSON lines): AUDIT_POLICY's events."""
        return self.logs_dir / "audit.log"

    @property
    def audit_policy_path(self) -> Path:
        return self.settings.cache_dir / f"{self.settings.cluster_name}-audit-policy.yaml"

    def exists(self) -> bool:
        return (self.state_dir / "kwok.yaml").exists()

    def component_args(self, ports: "Ports") -> dict[str, dict[str, str]]:
        """Flags added to kwokctl's own, so every component listens on loopback only."""
        etcd_client = f"http://{LOOPBACK}:{ports.etcd}"
        etcd_peer = f"http://{LOOPBACK}:{ports.etcd_peer}"
        annotation = "=".join(KWOK_NODE_ANNOTATION)
        return {
            "etcd": {"listen-client-urls": etcd_client, "advertise-client-urls": etcd_client,
                     "listen-peer-urls": etcd_peer, "initial-advertise-peer-urls": etcd_peer,
                     "initial-cluster": f"node0={etcd_peer}"},
            "kube-apiserver": {"bind-address": LOOPBACK, "advertise-address": LOOPBACK,
                               "service-cluster-ip-range": SERVICE_CIDR,
                               # kwokctl gives the apiserver no kubelet client certificate; process
                               # nodes' kubelet API wants one signed by the cluster CA (kwokctl's one
                               # certificate, used by every component, is).
                               "kubelet-client-certificate": str(self.state_dir / "pki" / "admin.crt"),
                               "kubelet-client-key": str(self.state_dir / "pki" / "admin.key"),
                               # kwokctl turns API Priority and Fairness off and max-in-flight to 0;
                               # a real apiserver has both (its defaults), and gangctl is tested under them.
                               "enable-priority-and-fairness": "true",
                               "max-requests-inflight": "400", "max-mutating-requests-inflight": "200",
                               # who wrote what, when: the writes of gangctl-system's ServiceAccounts
                               # (the controller's), for tests that check two replicas never both wrote
                               "audit-policy-file": str(self.audit_policy_path),
                               "audit-log-path": str(self.audit_log_path),
                               "audit-log-maxsize": "100", "audit-log-maxbackup": "1",
                               **(NATIVE_GANG_ARGS if self.native_gangs else {})},
            # One controller-manager, nothing to elect; with election on it exits when an apiserver
            # restart outlasts its renew deadline, and no kubelet is here to start it again.
            "kube-controller-manager": {"bind-address": LOOPBACK, "leader-elect": "false", **NODE_MONITOR_ARGS,
                                        # its PodGroupProtection controller lifts the finalizer the
                                        # apiserver stamps on every PodGroup: without it none is ever deleted
                                        **({"feature-gates": NATIVE_GANG_ARGS["feature-gates"]}
                                           if self.native_gangs else {})},
            "kube-scheduler": {"bind-address": LOOPBACK},
            "kwok-controller": {"server-address": f"{LOOPBACK}:{ports.kwok}", "manage-all-nodes": "false",
                                "manage-nodes-with-annotation-selector": annotation,
                                "node-lease-duration-seconds": KWOK_NODE_LEASE_SECONDS},
        }

    def write_config(self, ports: "Ports") -> Path:
        """The kwokctl configuration: component args and the KWOK stages, as one multi-document file."""
        kwok_dir = kwok_module_dir(self.settings.integrations_dir)
        options: dict = {"runtime": "binary", "disableQPSLimits": True,
                         "kubeApiserverCertSANs": [KUBERNETES_SERVICE_IP]}
        kubectl = shutil.which("kubectl")
        if kubectl:
            options["kubectlBinary"] = kubectl
        docs: list[dict] = [{
            "apiVersion": "config.kwok.x-k8s.io/v1alpha1",
            "kind": "KwokctlConfiguration",
            "options": options,
            "componentsPatches": [
                {"name": name, "extraArgs": [{"key": k, "value": v} for k, v in args.items()]}
                for name, args in self.component_args(ports).items()
            ],
        }]
        for rel in KWOK_STAGES:
            docs.append(yaml.safe_load((kwok_dir / "kustomize" / rel).read_text()))
        for name in OWN_KWOK_STAGES:
            docs.append(yaml.safe_load((self.settings.integrations_dir / "kwok" / "stages" / name).read_text()))
        path = self.settings.cache_dir / f"{self.settings.cluster_name}-kwokctl.yaml"
        path.parent.mkdir(parents=True, exist_ok=True)
        self.audit_policy_path.write_text(yaml.safe_dump(AUDIT_POLICY, sort_keys=False))
        path.write_text(yaml.safe_dump_all(docs, sort_keys=False))
        return path

    def create(self) -> None:
        b = self.bin_dir
        ports = Ports.pick()
        self._kwokctl(
            "create", "cluster",
            "--runtime", "binary",
            "--config", str(self.write_config(ports)),
            "--kube-apiserver-port", str(ports.apiserver),
            "--etcd-port", str(ports.etcd),
            "--kube-controller-manager-port", str(ports.controller_manager),
            "--kube-scheduler-port", str(ports.scheduler),
            "--controller-port", str(ports.kwok),
            "--kube-apiserver-binary", str(b / "kube-apiserver"),
            "--kube-controller-manager-binary", str(b / "kube-controller-manager"),
            "--kube-scheduler-binary", str(b / "kube-scheduler"),
            "--kwok-controller-binary", str(b / "kwok"),
            "--etcd-binary", str(b / "etcd"),
            "--kube-scheduler-config", str(self.settings.integrations_dir / "coscheduling" / "scheduler-config.yaml"),
            "--kubeconfig", "",  # leave ~/.kube/config alone; use `gangctl cluster env`
            "--wait", "120s",
        )

    def start(self) -> None:
        self._kwokctl("start", "cluster", "--wait", "120s")

    def stop(self) -> None:
        self._kwokctl("stop", "cluster", check=False)

    def pids(self) -> list[int]:
        pids = []
        for pid_file in (self.state_dir / "pids").glob("*.pid"):
            try:
                pids.append(int(pid_file.read_text().strip()))
            except ValueError:
                continue
        return pids

    def delete(self, grace_seconds: float = 15) -> None:
        """Stop every component and remove the state; waits until the processes are gone."""
        pids = self.pids()
        if self.exists():
            self._kwokctl("delete", "cluster", check=False)
        deadline = time.monotonic() + grace_seconds
        # running(), not a bare /proc check: a component restarted by this process (restart_component)
        # is its child and stays a zombie until reaped, which is not a process left behind.
        while (left := [p for p in pids if running(p)]) and time.monotonic() < deadline:
            time.sleep(0.2)
        for pid in left:  # kwokctl could not stop it: make sure nothing is left behind
            os.kill(pid, signal.SIGKILL)
        shutil.rmtree(self.state_dir, ignore_errors=True)

    def restart_component(self, name: str, sig: int = signal.SIGTERM, timeout: float = 30) -> int:
        """Stop one component (`sig`, SIGKILL after `timeout`) and start it again exactly as kwokctl
        did (same binary, arguments, environment, working directory, log file); returns the new pid.
        A real restart for fault tests: kwokctl itself restarts only whole clusters."""
        pid_file = self.state_dir / "pids" / f"{name}.pid"
        pid = int(pid_file.read_text().strip())
        proc = Path(f"/proc/{pid}")
        argv = [a.decode() for a in (proc / "cmdline").read_bytes().split(b"\0") if a]
        env = dict(line.decode().split("=", 1) for line in (proc / "environ").read_bytes().split(b"\0")
                   if b"=" in line)
        cwd = os.readlink(proc / "cwd")
        os.kill(pid, sig)
        deadline = time.monotonic() + timeout
        while running(pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        if running(pid):
            os.kill(pid, signal.SIGKILL)
            while running(pid):
                time.sleep(0.05)
        port = next((int(a.split("=", 1)[1]) for a in argv if a.startswith("--secure-port=")), None)
        if port:
            _wait_port_released(port)
        for attempt in range(1, RESTART_ATTEMPTS + 1):
            with (self.logs_dir / f"{name}.log").open("ab") as log:
                child = subprocess.Popen(argv, env=env, cwd=cwd, stdout=log, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, start_new_session=True)
            pid_file.write_text(str(child.pid))
            if _stays_up(child, port):
                break
            # It exited while starting (e.g. its port not yet released by the old process): start it
            # again, as kubelet does for a control-plane static pod; the component's log says why.
            with (self.logs_dir / f"{name}.log").open("ab") as log:
                log.write(f"[gangctl] {name} exited with {child.returncode} while starting (attempt "
                          f"{attempt} of {RESTART_ATTEMPTS}); starting it again\n".encode())
            time.sleep(attempt)
        else:
            raise ClusterError(f"{name} exited each of the {RESTART_ATTEMPTS} times it was started again; "
                               f"its log says why: {self.logs_dir / (name + '.log')}")
        return child.pid

    def components(self) -> list[dict]:
        """Each component's name and whether its process is running."""
        if not self.exists():
            return []
        conf = next(d for d in yaml.safe_load_all((self.state_dir / "kwok.yaml").read_text())
                    if d and d.get("kind") == "KwokctlConfiguration")
        rows = []
        for comp in conf.get("components") or []:
            pid_file = self.state_dir / "pids" / f"{comp['name']}.pid"
            rows.append({"name": comp["name"], "running": running_from(pid_file)})
        return rows


def kwok_module_dir(integrations: Path) -> Path:
    """The pinned kwok module in the Go module cache (downloaded by the build)."""
    version = pinned_version(integrations / "kwok", "sigs.k8s.io/kwok")
    return go_module_dir("sigs.k8s.io/kwok", version or "", integrations / "kwok")


def go_module_dir(module: str, version: str, wrapper: Path) -> Path:
    """Folder of `module@version` in the Go module cache, downloading it if needed."""
    go = shutil.which("go")
    if go is None:
        raise BuildError("Go is not installed or not on PATH; install Go 1.24 or newer and retry.")
    env = dict(os.environ, GOSUMDB=os.environ.get("GOSUMDB", "off"), GOFLAGS="-mod=mod")
    out = subprocess.run([go, "mod", "download", "-json", f"{module}@{version}"], cwd=wrapper, env=env,
                         capture_output=True, text=True)
    info = json.loads(out.stdout or "{}")
    if out.returncode != 0 or "Dir" not in info:
        raise BuildError(f"could not find {module}@{version} in the Go module cache: {info.get('Error') or out.stderr}")
    return Path(info["Dir"])


def coscheduling_crd(integrations: Path) -> dict:
    """The scheduler-plugins PodGroup CRD at the pinned version, from the Go module cache."""
    version = pinned_version(integrations / "coscheduling", "sigs.k8s.io/scheduler-plugins")
    root = go_module_dir("sigs.k8s.io/scheduler-plugins", version or "", integrations / "coscheduling")
    docs = [d for d in yaml.safe_load_all((root / "manifests" / "coscheduling" / "crd.yaml").read_text()) if d]
    return next(d for d in docs if d["metadata"]["name"] == "podgroups.scheduling.x-k8s.io")
