"""Credential sources and refresh hooks of the client, and the controller's address flags (no cluster)."""
from __future__ import annotations

from pathlib import Path

from kubernetes_asyncio.client import Configuration

from gangctl.cli import split_host_port
from gangctl.kube.auth import DEFAULT_KUBECONFIG, IN_CLUSTER, TokenFile, config_source
from gangctl.obs.server import bearer_token

IN_CLUSTER_ENV = {"KUBERNETES_SERVICE_HOST": "10.96.0.1", "KUBERNETES_SERVICE_PORT": "443"}


def test_sources_in_controller_runtimes_order():
    assert config_source("/a", {"KUBECONFIG": "/b", **IN_CLUSTER_ENV}) == "/a"
    assert config_source(None, {"KUBECONFIG": "/b", **IN_CLUSTER_ENV}) == "/b"
    assert config_source(None, IN_CLUSTER_ENV) == IN_CLUSTER
    assert config_source(None, {"KUBERNETES_SERVICE_HOST": "10.96.0.1"}) == str(DEFAULT_KUBECONFIG.expanduser())
    assert config_source(None, {}) == str(DEFAULT_KUBECONFIG.expanduser())


def test_token_file_is_re_read_when_it_changes(tmp_path: Path):
    path = tmp_path / "token"
    path.write_text("first\n")
    clock = [0.0]
    hook = TokenFile(path, min_interval=1.0, clock=lambda: clock[0])
    conf = Configuration()
    hook(conf)
    assert conf.api_key["BearerToken"] == "Bearer first"
    # kubelet's rotation: a new file put in place atomically
    (tmp_path / "token.new").write_text("second")
    (tmp_path / "token.new").replace(path)
    hook(conf)
    assert conf.api_key["BearerToken"] == "Bearer first", "stat at most once per min_interval"
    clock[0] = 1.0
    hook(conf)
    assert conf.api_key["BearerToken"] == "Bearer second"
    clock[0] = 5.0
    hook(conf)
    assert hook.reads == 2, "an unchanged file is not read again"


def test_an_empty_token_file_keeps_the_last_good_token(tmp_path: Path):
    path = tmp_path / "token"
    path.write_text("good")
    clock = [0.0]
    hook = TokenFile(path, clock=lambda: clock[0])
    conf = Configuration()
    hook(conf)
    path.write_text("")
    clock[0] = 2.0
    hook(conf)
    assert conf.api_key["BearerToken"] == "Bearer good"


def test_bind_addresses():
    assert split_host_port("127.0.0.1:8080") == ("127.0.0.1", 8080)
    assert split_host_port(":8443") == ("0.0.0.0", 8443)
    assert split_host_port("[::1]:9090") == ("::1", 9090)


def test_bearer_token_header():
    assert bearer_token("Bearer abc ") == "abc"
    assert bearer_token("bearer abc") == "abc"
    assert bearer_token("Basic abc") is None
    assert bearer_token("Bearer ") is None
    assert bearer_token(None) is None
