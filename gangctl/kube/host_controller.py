"""A controller running on the host of a local cluster, as the cluster's pods see it.

On a cluster made by `gangctl cluster up` the controller is a host process, not a pod: a
selector-less Service stands for it. Its ClusterIP is relayed into the process nodes' network (netd)
to the host port its annotation names, chosen once when the cluster is made; a controller given no
`--trainer-status-url` serves its progress endpoint there (gangctl.runtime.controller).
"""
from __future__ import annotations

NAMESPACE = "gangctl-local"
SERVICE = "host-controller"
PORT = 8443                                  # the Service's port, in the URL trainer pods are given
HOST_PORT_ANNOTATION = "gangctl.io/host-port"  # where on the host's loopback the controller listens
LABEL = ("gangctl.io/host-controller", "true")


def url() -> str:
    return f"https://{SERVICE}.{NAMESPACE}.svc:{PORT}"
