"""Pod networking for process nodes: one network namespace per pod, all on one bridge that lives in a
network namespace of its own (the "cluster network" namespace). Nothing is added to the host's
network namespace; the host's loopback keeps serving the control plane.

    cluster network netns  gangctl-<cluster>-net:  br0 10.244.0.1/16, CoreDNS on 10.244.0.1:53,
                                                   127.0.0.1:6443 relayed to the host's kube-apiserver,
                                                   and the `kubernetes` Service IP:443 (on its lo) too
    pod netns              gc<hash>-<pod uid>:     lo, eth0 10.244.<agent+1>.<n>/16 (veth, peer on br0)

`ip netns exec` bind-mounts /etc/netns/<netns>/{resolv.conf,hosts} over /etc/, which is how each
pod gets kubelet's ClusterFirst resolv.conf and its own /etc/hosts. iproute2 is the well-kept tool
for all of it; this module only names things and runs `ip` commands.
"""
from __future__ import annotations

import asyncio
import ctypes
import hashlib
import ipaddress
import os
import shutil
import signal
import subprocess
from dataclasses import dataclass
from pathlib import Path

POD_NETWORK = ipaddress.ip_network("10.244.0.0/16")
GATEWAY = "10.244.0.1"  # br0 in the cluster network namespace; CoreDNS listens here
DNS_IP = GATEWAY
API_RELAY_PORT = 6443   # inside the cluster network namespace, on its own loopback
NETNS_DIR = Path("/run/netns")
ETC_NETNS = Path("/etc/netns")
CLONE_NEWNET = 0x40000000


class NetworkError(RuntimeError):
    pass


def cluster_tag(cluster: str) -> str:
    return hashlib.sha256(cluster.encode()).hexdigest()[:4]


def net_namespace(cluster: str) -> str:
    return f"gangctl-{cluster}-net"[:60]


def pod_namespace(cluster: str, pod_uid: str) -> str:
    return f"gc{cluster_tag(cluster)}-{pod_uid.replace('-', '')[:12]}"


def veth_name(pod_uid: str) -> str:
    return "v" + pod_uid.replace("-", "")[:12]  # at most 15 characters (IFNAMSIZ)


def agent_subnet(index: int) -> ipaddress.IPv4Network:
    """The /24 an agent assigns pod IPs from: 10.244.<index+1>.0/24."""
    if not 0 <= index < 250:
        raise ValueError("agent index must be in [0, 250)")
    return ipaddress.ip_network(f"10.244.{index + 1}.0/24")


class IpPool:
    """Pod IPs of one agent's /24 (.2 – .254), handed out and returned."""

    def __init__(self, subnet: ipaddress.IPv4Network):
        self.subnet = subnet
        self.used: set[str] = set()

    def take(self) -> str:
        for host in list(self.subnet.hosts())[1:]:
            if str(host) not in self.used:
                self.used.add(str(host))
                return str(host)
        raise NetworkError(f"no free pod IP left in {self.subnet}")

    def give_back(self, ip: str | None) -> None:
        self.used.discard(ip or "")


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    result = subprocess.run(["ip", *args], capture_output=True, text=True)
    if check and result.returncode != 0:
        raise NetworkError(f"`ip {' '.join(args)}` failed: {result.stderr.strip()}")
    return result


def netns_exists(name: str) -> bool:
    return (NETNS_DIR / name).exists()


def bridge_mac(cluster: str) -> str:
    """A locally administered unicast MAC for the cluster's bridge, stable per cluster name."""
    digest = hashlib.sha256(cluster.encode()).digest()
    return ":".join(f"{b:02x}" for b in (0x02, *digest[:5]))


def ensure_cluster_network(cluster: str) -> str:
    """Create the cluster network namespace and its bridge (idempotent; safe to race)."""
    net = net_namespace(cluster)
    if not netns_exists(net):
        _ip("netns", "add", net, check=False)
    if _ip("-n", net, "link", "show", "br0", check=False).returncode != 0:
        # A fixed MAC: a bridge without one takes the lowest MAC of its ports, so adding or deleting a
        # pod's veth changes the gateway's MAC under every other pod's ARP entry, and their traffic
        # (the API relay's too) goes nowhere until the kernel re-resolves it: 10+ s of silence seen
        # on a newly elected gangctl leader when the old leader's pod went away.
        _ip("-n", net, "link", "add", "br0", "address", bridge_mac(cluster), "type", "bridge", check=False)
        _ip("-n", net, "addr", "add", f"{GATEWAY}/{POD_NETWORK.prefixlen}", "dev", "br0", check=False)
    _ip("-n", net, "link", "set", "lo", "up")
    _ip("-n", net, "link", "set", "br0", "up")
    return net


def add_local_address(netns: str, ip: str) -> None:
    """Own `ip` in `netns` (on its loopback): packets pods route to it through the bridge are
    delivered to sockets listening there (the `kubernetes` Service's ClusterIP, relayed by netd)."""
    _ip("-n", netns, "addr", "replace", f"{ip}/32", "dev", "lo")


def delete_cluster_network(cluster: str) -> None:
    """Remove every namespace of this cluster (pods' and the network's), killing what runs in them."""
    tag = f"gc{cluster_tag(cluster)}-"
    names = [p.name for p in NETNS_DIR.glob("*") if p.name.startswith(tag)] if NETNS_DIR.exists() else []
    for name in names + [net_namespace(cluster)]:
        delete_netns(name)


def kill_netns_processes(name: str) -> None:
    if not netns_exists(name):
        return
    out = _ip("netns", "pids", name, check=False).stdout.split()
    for pid in out:
        try:
            os.kill(int(pid), signal.SIGKILL)
        except (ProcessLookupError, ValueError):
            pass


def delete_netns(name: str) -> None:
    kill_netns_processes(name)
    if netns_exists(name):
        _ip("netns", "delete", name, check=False)
    shutil.rmtree(ETC_NETNS / name, ignore_errors=True)


@dataclass(frozen=True)
class PodNetwork:
    netns: str
    ip: str


def create_pod_network(cluster: str, pod_uid: str, ip: str, resolv_conf: str, hosts: str) -> PodNetwork:
    """A network namespace for one pod: lo up, eth0 with `ip` on the cluster bridge, its /etc files."""
    net = ensure_cluster_network(cluster)
    ns = pod_namespace(cluster, pod_uid)
    delete_netns(ns)  # a leftover from an earlier agent
    _ip("netns", "add", ns)
    veth = veth_name(pod_uid)
    _ip("-n", net, "link", "del", veth, check=False)
    _ip("link", "add", "name", veth, "netns", net, "type", "veth", "peer", "name", "eth0", "netns", ns)
    _ip("-n", net, "link", "set", veth, "master", "br0")
    _ip("-n", net, "link", "set", veth, "up")
    _ip("-n", ns, "addr", "add", f"{ip}/{POD_NETWORK.prefixlen}", "dev", "eth0")
    _ip("-n", ns, "link", "set", "eth0", "up")
    _ip("-n", ns, "link", "set", "lo", "up")
    _ip("-n", ns, "route", "add", "default", "via", GATEWAY)
    etc = ETC_NETNS / ns
    etc.mkdir(parents=True, exist_ok=True)
    (etc / "resolv.conf").write_text(resolv_conf)
    (etc / "hosts").write_text(hosts)
    return PodNetwork(ns, ip)


def delete_pod_network(cluster: str, pod_uid: str) -> None:
    delete_netns(pod_namespace(cluster, pod_uid))
    _ip("-n", net_namespace(cluster), "link", "del", veth_name(pod_uid), check=False)


async def acreate_pod_network(*args) -> PodNetwork:
    return await asyncio.to_thread(create_pod_network, *args)


async def adelete_pod_network(cluster: str, pod_uid: str) -> None:
    await asyncio.to_thread(delete_pod_network, cluster, pod_uid)


# --- sockets in another network namespace ---------------------------------------------------------

_libc = ctypes.CDLL(None, use_errno=True)


def socket_in_netns(netns: str, host: str, port: int, kind: int):
    """A listening/bound socket created inside `netns`; the calling thread returns to its own netns.

    A socket belongs to the network namespace it was created in, whatever thread uses it later,
    so one process can serve in the cluster network namespace and connect out on the host.
    """
    import socket

    own = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
    target = os.open(str(NETNS_DIR / netns), os.O_RDONLY)
    try:
        if _libc.setns(target, CLONE_NEWNET) != 0:
            raise NetworkError(f"setns({netns}) failed: {os.strerror(ctypes.get_errno())}")
        try:
            sock = socket.socket(socket.AF_INET, kind)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((host, port))
            if kind == socket.SOCK_STREAM:
                sock.listen(128)
            sock.setblocking(False)
            return sock
        finally:
            if _libc.setns(own, CLONE_NEWNET) != 0:
                raise NetworkError("could not return to the host network namespace")
    finally:
        os.close(own)
        os.close(target)
