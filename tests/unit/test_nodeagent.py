"""The node agent's pure parts: pod → processes, statuses, the Node, logs; and the shim on this machine."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from datetime import datetime, timezone

import pytest

from gangctl.nodeagent import network
from gangctl.nodeagent.logs import LogOptions, parse_line, read_lines, render, select, stream_log
from gangctl.nodeagent.spec import (ContainerState, NodeConfig, PodRuntime, SpecError, expand, hosts_file,
                                    node_object, pod_phase, pod_status, process_specs, resolv_conf,
                                    RESTARTING_ALL, restart_action)
from gangctl.plugins.workload import NODE_LOSS_TOLERATIONS
from gangctl.sim import objects

BASE = {"PATH": "/venv/bin:/usr/bin"}


def pod(**container) -> dict:
    c = {"name": "node", "image": "pytorch/pytorch:2", "command": ["torchrun"], "args": ["train.py"], **container}
    return objects.pod("tj-node-0-1-abcde", namespace="team", uid="u-1", labels={"app": "x"}, index=1, node="pn-0",
                       containers=[c], hostname="tj-node-0-1", subdomain="tj", restartPolicy="Never")


def test_env_downward_api_and_expansion():
    p = pod(env=[
        {"name": "PET_NODE_RANK", "valueFrom": {"fieldRef": {
            "fieldPath": "metadata.annotations['batch.kubernetes.io/job-completion-index']"}}},
        {"name": "POD", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
        {"name": "NS", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
        {"name": "IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
        {"name": "NODE", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
        {"name": "APP", "valueFrom": {"fieldRef": {"fieldPath": "metadata.labels['app']"}}},
        {"name": "CPUS", "valueFrom": {"resourceFieldRef": {"resource": "limits.cpu", "divisor": "0"}}},
        {"name": "MEM_MI", "valueFrom": {"resourceFieldRef": {"resource": "requests.memory", "divisor": "1Mi"}}},
        {"name": "GREETING", "value": "rank $(PET_NODE_RANK) of $(MISSING) $$(ESCAPED)"},
    ], args=["--rank=$(PET_NODE_RANK)"], workingDir="/workspace",
        resources={"requests": {"memory": "1536Mi"}})
    [spec] = process_specs(p, pod_ip="10.244.1.2", host_ip="127.0.0.1", allocatable={"cpu": "4"}, base_env=BASE)
    e = spec.env
    assert (e["PET_NODE_RANK"], e["POD"], e["NS"], e["IP"], e["NODE"], e["APP"]) == (
        "1", "tj-node-0-1-abcde", "team", "10.244.1.2", "pn-0", "x")
    assert e["CPUS"] == "4" and e["MEM_MI"] == "1536"  # no cpu limit: node allocatable
    assert e["GREETING"] == "rank 1 of $(MISSING) $(ESCAPED)"
    assert e["HOSTNAME"] == "tj-node-0-1" and e["PATH"] == "/venv/bin:/usr/bin"
    assert spec.argv == ["torchrun", "--rank=1"] and spec.working_dir == "/workspace"


def test_user_path_keeps_the_agent_venv_first():
    [spec] = process_specs(pod(env=[{"name": "PATH", "value": "/opt/conda/bin"}]), pod_ip=None,
                           host_ip="127.0.0.1", allocatable={}, base_env=BASE)
    assert spec.env["PATH"] == "/venv/bin:/opt/conda/bin"


@pytest.mark.parametrize("container", [
    {"command": []},
    {"env": [{"name": "S", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}}]},
    {"envFrom": [{"configMapRef": {"name": "c"}}]},
])
def test_what_a_process_node_cannot_do_is_a_config_error(container):
    with pytest.raises(SpecError):
        process_specs(pod(**container), pod_ip=None, host_ip="127.0.0.1", allocatable={}, base_env=BASE)


def test_expand():
    assert expand("$(A)-$(B)-$$(A)", {"A": "1"}) == "1-$(B)-$(A)"


def test_resolv_conf_and_hosts_like_kubelet():
    p = pod()
    assert resolv_conf(p, "10.244.0.1", "cluster.local") == (
        "search team.svc.cluster.local svc.cluster.local cluster.local\nnameserver 10.244.0.1\noptions ndots:5\n")
    assert "10.244.1.2\ttj-node-0-1.tj.team.svc.cluster.local\ttj-node-0-1" in hosts_file(p, "10.244.1.2", "cluster.local")


def _c(state, code=None, reason=""):
    return ContainerState("node", state=state, exit_code=code, reason=reason)


def test_phase_follows_containers_and_restart_policy():
    assert pod_phase([_c("waiting")], {"restartPolicy": "Never"}) == "Pending"
    assert pod_phase([_c("running")], {"restartPolicy": "Never"}) == "Running"
    assert pod_phase([_c("terminated", 0)], {"restartPolicy": "Never"}) == "Succeeded"
    assert pod_phase([_c("terminated", 1)], {"restartPolicy": "Never"}) == "Failed"
    assert pod_phase([_c("terminated", 1)], {"restartPolicy": "OnFailure"}) == "Running"
    assert pod_phase([_c("terminated", 0), _c("running")], {"restartPolicy": "Never"}) == "Running"



RULE_ALL_ON_42 = {"restartPolicy": "Never", "restartPolicyRules": [
    {"action": "RestartAllContainers", "exitCodes": {"operator": "In", "values": [42]}}]}


def test_restart_rules_decide_as_the_kubelet_does():
    never = {"restartPolicy": "Never"}
    assert restart_action({"name": "a", **RULE_ALL_ON_42}, never, 42) == "RestartAllContainers"
    assert restart_action({"name": "a", **RULE_ALL_ON_42}, never, 1) is None, "no rule matches: the container's Never"
    not_in = {"restartPolicy": "Never", "restartPolicyRules": [
        {"action": "Restart", "exitCodes": {"operator": "NotIn", "values": [0, 3]}}]}
    assert restart_action(not_in, never, 1) == "Restart" and restart_action(not_in, never, 3) is None
    rules_only = {"restartPolicyRules": RULE_ALL_ON_42["restartPolicyRules"]}
    assert restart_action(rules_only, never, 42) is None, "rules apply only beside a container restartPolicy"
    assert restart_action({"restartPolicy": "OnFailure"}, never, 1) == "Restart", "the container's policy first"
    assert restart_action({}, {}, 0) == "Restart", "the pod's policy defaults to Always"
    first = {"restartPolicy": "Never", "restartPolicyRules": [
        {"action": "Restart", "exitCodes": {"operator": "In", "values": [42]}}, *RULE_ALL_ON_42["restartPolicyRules"]]}
    assert restart_action(first, never, 42) == "Restart", "the first matching rule wins"


def test_a_pod_whose_containers_restart_by_rule_stays_running():
    spec = {"restartPolicy": "Never", "containers": [{"name": "node", **RULE_ALL_ON_42}, {"name": "side"}]}
    trigger = ContainerState("node", state="terminated", exit_code=42, reason="Error")
    victim = ContainerState("side", state="terminated", exit_code=137, reason=RESTARTING_ALL)
    assert pod_phase([trigger, victim], spec) == "Running"
    assert pod_phase([ContainerState("node", state="terminated", exit_code=1, reason="Error"),
                      ContainerState("side", state="terminated", exit_code=0, reason="Completed")], spec) == "Failed"
    restarting = PodRuntime(containers=[trigger, victim], restarting_all=True)
    cond = {c["type"]: c for c in pod_status({"spec": spec}, restarting, "2026-01-01T00:00:00Z")["conditions"]}
    assert cond["AllContainersRestarting"]["status"] == "True"
    assert cond["AllContainersRestarting"]["reason"] == "RestartAllContainersStarted"
    plain = {c["type"] for c in pod_status({"spec": {"containers": [{"name": "node"}]}}, PodRuntime(),
                                           "2026-01-01T00:00:00Z")["conditions"]}
    assert "AllContainersRestarting" not in plain

def test_pod_status_is_truthful():
    rt = PodRuntime(pod_ip="10.244.1.2", start_time="2026-01-01T00:00:00Z",
                    containers=[ContainerState("node", "img", "terminated", "Error", "", "2026-01-01T00:00:01Z",
                                               "2026-01-01T00:00:09Z", 3, None, 0, "process://42")])
    st = pod_status(pod(), rt, "2026-01-01T00:00:10Z")
    assert st["phase"] == "Failed" and st["podIP"] == "10.244.1.2" and st["podIPs"] == [{"ip": "10.244.1.2"}]
    term = st["containerStatuses"][0]["state"]["terminated"]
    assert term["exitCode"] == 3 and term["reason"] == "Error" and term["finishedAt"] == "2026-01-01T00:00:09Z"
    ready = next(c for c in st["conditions"] if c["type"] == "Ready")
    assert ready["status"] == "False" and ready["reason"] == "PodCompleted"


def test_node_is_labelled_untainted_unless_asked_and_not_kwok():
    node = node_object(NodeConfig("pn-0", "4", "8Gi", kubelet_port=10300), "2026-01-01T00:00:00Z")
    assert "kwok.x-k8s.io/node" not in node["metadata"]["annotations"]
    assert node["metadata"]["labels"]["gangctl.io/process-node"] == "true"
    assert not node["spec"].get("taints"), "pods written for any cluster run on a process node unchanged"
    tainted = node_object(NodeConfig("pn-1", "4", "8Gi", taint=True), "2026-01-01T00:00:00Z")
    assert tainted["spec"]["taints"] == [{"key": "gangctl.io/process-node", "value": "true", "effect": "NoSchedule"}]
    assert node["status"]["daemonEndpoints"]["kubeletEndpoint"]["Port"] == 10300
    assert node["status"]["addresses"] == [{"type": "InternalIP", "address": "127.0.0.1"}]
    assert {c["type"]: c["status"] for c in node["status"]["conditions"]}["Ready"] == "True"


def test_gang_pods_tolerate_node_loss_for_seconds():
    assert {t["key"] for t in NODE_LOSS_TOLERATIONS} == {"node.kubernetes.io/not-ready", "node.kubernetes.io/unreachable"}
    assert all(t["tolerationSeconds"] <= 10 and t["effect"] == "NoExecute" for t in NODE_LOSS_TOLERATIONS)


def test_network_names_fit_linux_limits():
    assert len(network.veth_name("0123456789ab-cdef-0123-4567")) <= 15
    assert network.pod_namespace("a", "u-1") != network.pod_namespace("b", "u-1")
    pool = network.IpPool(network.agent_subnet(0))
    assert pool.take() == "10.244.1.2" and pool.take() == "10.244.1.3"


def test_log_selection_and_rendering(tmp_path):
    f = tmp_path / "0.log"
    f.write_bytes(b"2026-01-01T00:00:01.000000Z stdout F one\n2026-01-01T00:00:02.000000Z stderr P tw\n"
                  b"2026-01-01T00:00:02.100000Z stderr F o\n2026-01-01T00:00:03.000000Z stdout F three\n")
    lines, end = read_lines(f)
    assert end == f.stat().st_size and parse_line(b"2026-01-01T00:00:01Z stdout F").text == b""
    out = b"".join(render(ln, False) for ln in select(lines, LogOptions()))
    assert out == b"one\ntwo\nthree\n"
    assert b"".join(render(ln, False) for ln in select(lines, LogOptions(tail_lines=2))) == b"two\nthree\n"
    since = datetime(2026, 1, 1, 0, 0, 2, 50000, tzinfo=timezone.utc)
    assert b"".join(render(ln, True) for ln in select(lines, LogOptions(since=since))).startswith(b"2026-01-01T00:00:02.100000Z o\n")


def test_following_a_log_the_container_has_not_made_yet_waits_for_it(tmp_path):
    """A container's state turns running when its process is spawned, before the shim makes the log
    file: a follow arriving then waits for the file (it ended the stream at once, empty, seen in CI
    as the SDK's get_job_logs(follow=True) returning nothing), and ends when the container does."""
    import asyncio

    f = tmp_path / "0.log"
    got: list[bytes] = []
    polls = {"n": 0}

    def running() -> bool:
        polls["n"] += 1
        if polls["n"] == 3:   # the shim makes the file and writes a line; the container then exits
            f.write_bytes(b"2026-01-01T00:00:01.000000Z stdout F tick 0\n")
        return polls["n"] <= 3

    async def write(chunk: bytes) -> None:
        got.append(chunk)
    asyncio.run(asyncio.wait_for(stream_log(f, running, LogOptions(follow=True), write, poll=0.01), 5))
    assert b"".join(got) == b"tick 0\n"


def test_shim_runs_logs_and_reports_exit(tmp_path):
    log, status = tmp_path / "0.log", tmp_path / "status.json"
    proc = subprocess.run([sys.executable, "-m", "gangctl.nodeagent.shim", "--log", str(log), "--status", str(status),
                           "--", "bash", "-c", "echo out; echo err >&2; exit 7"], timeout=30)
    assert proc.returncode == 7 and json.loads(status.read_text())["exitCode"] == 7
    text = log.read_bytes()
    assert b" stdout F out\n" in text and b" stderr F err\n" in text


def test_shim_kills_escaped_descendants_when_its_parent_dies(tmp_path):
    """A grandchild in its own session (as torchrun starts workers) dies when the agent is SIGKILLed."""
    marker = tmp_path / "pid"
    agent = subprocess.Popen([sys.executable, "-c", f"""
import subprocess, sys, time
subprocess.Popen([sys.executable, '-m', 'gangctl.nodeagent.shim', '--log', r'{tmp_path}/0.log',
                  '--status', r'{tmp_path}/s.json', '--', 'bash', '-c',
                  'setsid sleep 300 & echo $! > {marker}; sleep 300'])
time.sleep(300)
"""])
    deadline = time.time() + 20
    while not (marker.exists() and marker.read_text().strip()) and time.time() < deadline:
        time.sleep(0.1)
    grandchild = int(marker.read_text())
    os.kill(agent.pid, signal.SIGKILL)
    agent.wait()
    deadline = time.time() + 10
    while _alive(grandchild) and time.time() < deadline:
        time.sleep(0.1)
    assert not _alive(grandchild)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_an_exec_liveness_probe_takes_the_apis_defaults_and_expands_static_env():
    from gangctl.nodeagent.spec import ExecProbe, liveness_probe
    container = {"name": "node", "livenessProbe": {"exec": {"command": ["check", "$(WHERE)", "$(NOT_SET)"]}}}
    assert liveness_probe(container, {"WHERE": "/x"}) == ExecProbe(("check", "/x", "$(NOT_SET)"), 0, 10, 1, 3, None)
    tuned = {"livenessProbe": {"exec": {"command": ["true"]}, "initialDelaySeconds": 2, "periodSeconds": 5,
                               "timeoutSeconds": 10, "failureThreshold": 1, "terminationGracePeriodSeconds": 0}}
    assert liveness_probe(tuned, {}) == ExecProbe(("true",), 2, 5, 10, 1, 0)
    assert liveness_probe({"livenessProbe": {"httpGet": {"path": "/healthz", "port": 8080}}}, {}) is None
    assert liveness_probe({}, {}) is None


def test_downward_api_files_follow_the_pods_annotations(tmp_path):
    from gangctl.nodeagent.projected import ProjectedVolumes
    from gangctl.nodeagent.volumes import projected_volumes
    pod = objects.pod("p", namespace="ns", uid="u1", annotations={"gangctl.io/restart-attempt": "0"})
    pod["spec"]["volumes"] = [{"name": "attempt", "projected": {"sources": [{"downwardAPI": {"items": [
        {"path": "attempt", "fieldRef": {"fieldPath": "metadata.annotations['gangctl.io/restart-attempt']"}}]}}]}}]
    volumes = ProjectedVolumes(None, tmp_path)
    (tmp_path / "u1" / "attempt").mkdir(parents=True)
    assert volumes.refresh_fields(pod, projected_volumes(pod, allocatable={})) == 1
    assert (tmp_path / "u1" / "attempt" / "attempt").read_text() == "0"
    assert volumes.refresh_fields(pod, projected_volumes(pod, allocatable={})) == 0, "unchanged: not written"
    pod["metadata"]["annotations"]["gangctl.io/restart-attempt"] = "1"
    assert volumes.refresh_fields(pod, projected_volumes(pod, allocatable={})) == 1
    assert (tmp_path / "u1" / "attempt" / "attempt").read_text() == "1"
    other = objects.pod("q", namespace="ns", uid="u2")
    other["spec"]["volumes"] = pod["spec"]["volumes"]
    assert volumes.refresh_fields(other, projected_volumes(other, allocatable={})) == 0, "a volume never made"
