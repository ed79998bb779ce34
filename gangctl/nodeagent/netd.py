"""The cluster network of process nodes: its namespace, CoreDNS, and CoreDNS's way to the API server.

    python -m gangctl.nodeagent.netd --cluster NAME --kubeconfig FILE --coredns BIN --state DIR

- creates the cluster network namespace and its bridge (gangctl.nodeagent.network);
- relays 127.0.0.1:6443 *inside that namespace* to the kube-apiserver on the host's loopback: the
  listening socket is created in the namespace (setns), the outgoing connection is made on the
  host, and bytes are copied both ways (TLS passes through untouched, so the apiserver's own
  certificate, which names 127.0.0.1, is verified by CoreDNS as usual);
- relays the `kubernetes` Service's ClusterIP and port (10.96.0.1:443 on a cluster made by
  `gangctl cluster up`) the same way: the address is put on the namespace's loopback, so pods reach
  it through their default route (the bridge) as KUBERNETES_SERVICE_HOST/PORT say, and verify the
  apiserver's certificate, which names that IP (`gangctl cluster up` adds it);
- relays the Service standing for the controller on the host (gangctl-local/host-controller, made
  by `gangctl cluster up`) to the host port its annotation names, so trainer pods reach the
  progress endpoint at the URL they are given and verify its certificate, which names the Service;
- runs real CoreDNS (built from the pinned module in integrations/coredns) in that namespace on
  10.244.0.1:53 with the kubernetes plugin for `cluster.local`, reading Services, EndpointSlices
  and Pods through the relay. Pods' resolv.conf names 10.244.0.1, reachable over their veth.

CoreDNS gets SIGKILL if this process dies (PR_SET_PDEATHSIG); SIGTERM stops both.
"""
from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import socket
import subprocess
import sys
from pathlib import Path

import yaml

from gangctl.nodeagent.network import (API_RELAY_PORT, DNS_IP, add_local_address, ensure_cluster_network,
                                       socket_in_netns)
from gangctl.nodeagent.shim import set_pdeathsig

log = logging.getLogger("gangctl.netd")
CLUSTER_DOMAIN = "cluster.local"


def corefile(kubeconfig: Path) -> str:
    # One server block for the cluster domain and the pod network's reverse zone (torch looks up
    # its peers' names); any other name is REFUSED at once: pods have no way out anyway.
    return f"""{CLUSTER_DOMAIN}:53 244.10.in-addr.arpa:53 {{
    errors
    kubernetes {CLUSTER_DOMAIN} 244.10.in-addr.arpa {{
        kubeconfig {kubeconfig}
        pods insecure
        ttl 1
    }}
}}
"""


def relay_kubeconfig(source: Path, target: Path, port: int = API_RELAY_PORT) -> Path:
    """The cluster's kubeconfig with the server moved to the relay (same host name, new port)."""
    conf = yaml.safe_load(source.read_text())
    for cluster in conf.get("clusters") or []:
        server = cluster["cluster"]["server"]
        scheme, rest = server.split("://", 1)
        host = rest.split("/", 1)[0].rsplit(":", 1)[0]
        cluster["cluster"]["server"] = f"{scheme}://{host}:{port}"
    target.write_text(yaml.safe_dump(conf))
    return target


def apiserver_address(kubeconfig: Path) -> tuple[str, int]:
    conf = yaml.safe_load(kubeconfig.read_text())
    server = conf["clusters"][0]["cluster"]["server"]
    hostport = server.split("://", 1)[1].split("/", 1)[0]
    host, port = hostport.rsplit(":", 1)
    return host, int(port)


async def kubernetes_service(kubeconfig: Path) -> tuple[str, int] | None:
    """ClusterIP and https port of the `kubernetes` Service in `default` (None if there is none)."""
    from gangctl.kube.client import ApiError, Kube

    kube = await Kube.connect(kubeconfig)
    try:
        svc = await kube.get("/api/v1/namespaces/default/services/kubernetes")
        port = next(p["port"] for p in svc["spec"]["ports"] if p.get("name") == "https")
        return svc["spec"]["clusterIP"], int(port)
    except (ApiError, KeyError, StopIteration) as err:
        log.warning("no `kubernetes` Service (%s): pods cannot reach the apiserver by it", err)
        return None
    finally:
        await kube.close()


async def host_controller_service(kubeconfig: Path) -> tuple[str, int, int] | None:
    """ClusterIP, port and host port of the Service standing for the controller on the host
    (gangctl.kube.host_controller; None if the cluster has none)."""
    from gangctl.kube import host_controller as host
    from gangctl.kube.client import ApiError, Kube

    kube = await Kube.connect(kubeconfig)
    try:
        svc = await kube.get(f"/api/v1/namespaces/{host.NAMESPACE}/services/{host.SERVICE}")
        return (svc["spec"]["clusterIP"], int(svc["spec"]["ports"][0]["port"]),
                int(svc["metadata"]["annotations"][host.HOST_PORT_ANNOTATION]))
    except (ApiError, KeyError, IndexError, ValueError) as err:
        log.info("no host controller Service (%s): trainer pods cannot report progress", err)
        return None
    finally:
        await kube.close()


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    except (ConnectionError, asyncio.CancelledError):
        pass
    finally:
        try:
            writer.close()
        except Exception:
            pass


async def serve_relay(listener: socket.socket, target: tuple[str, int]) -> asyncio.AbstractServer:
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection(*target)
        except OSError as err:
            log.warning("relay: cannot reach %s:%s: %s", *target, err)
            writer.close()
            return
        await asyncio.gather(_pipe(reader, up_writer), _pipe(up_reader, writer))
    return await asyncio.start_server(handle, sock=listener)


async def run(opts: argparse.Namespace) -> int:
    state = Path(opts.state)
    state.mkdir(parents=True, exist_ok=True)
    net = ensure_cluster_network(opts.cluster)
    listener = socket_in_netns(net, "127.0.0.1", API_RELAY_PORT, socket.SOCK_STREAM)
    upstream = apiserver_address(Path(opts.kubeconfig))
    server = await serve_relay(listener, upstream)
    service = await kubernetes_service(Path(opts.kubeconfig))
    service_server = None
    if service:
        add_local_address(net, service[0])
        service_server = await serve_relay(socket_in_netns(net, *service, socket.SOCK_STREAM), upstream)
        log.info("API relay on %s:%d (the kubernetes Service) in the namespace", *service)
    host_service = await host_controller_service(Path(opts.kubeconfig))
    host_server = None
    if host_service:
        ip, port, host_port = host_service
        add_local_address(net, ip)
        host_server = await serve_relay(socket_in_netns(net, ip, port, socket.SOCK_STREAM), ("127.0.0.1", host_port))
        log.info("controller relay on %s:%d in the namespace -> 127.0.0.1:%d on the host", ip, port, host_port)
    kubeconfig = relay_kubeconfig(Path(opts.kubeconfig), state / "coredns-kubeconfig.yaml")
    conf = state / "Corefile"
    conf.write_text(corefile(kubeconfig))
    dns_log = (state / "coredns.log").open("ab")
    coredns = subprocess.Popen(["ip", "netns", "exec", net, opts.coredns, "-conf", str(conf), "-dns.port", "53"],
                               stdout=dns_log, stderr=subprocess.STDOUT,
                               preexec_fn=lambda: set_pdeathsig(signal.SIGKILL))
    log.info("cluster network %s up: CoreDNS pid %d on %s:53, API relay on 127.0.0.1:%d in the namespace",
             net, coredns.pid, DNS_IP, API_RELAY_PORT)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)

    async def watch_coredns() -> None:
        while coredns.poll() is None:
            await asyncio.sleep(0.5)
        log.error("CoreDNS exited with %s; see %s", coredns.returncode, state / "coredns.log")
        stop.set()
    watcher = asyncio.create_task(watch_coredns())
    await stop.wait()
    watcher.cancel()
    server.close()
    for extra in (service_server, host_server):
        if extra:
            extra.close()
    if coredns.poll() is None:
        coredns.terminate()
        try:
            coredns.wait(5)
        except subprocess.TimeoutExpired:
            coredns.kill()
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="gangctl.nodeagent.netd")
    parser.add_argument("--cluster", required=True)
    parser.add_argument("--kubeconfig", required=True)
    parser.add_argument("--coredns", required=True)
    parser.add_argument("--state", required=True)
    opts = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    return asyncio.run(run(opts))


if __name__ == "__main__":
    sys.exit(main())
