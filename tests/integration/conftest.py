"""One real local cluster per test session, and the gangctl controller running against it.

The cluster is the real thing: etcd, kube-apiserver, kube-controller-manager, the coscheduling
kube-scheduler and KWOK, built from the pinned Go modules. The controller runs as its own process
(`gangctl controller`), so tests can kill and restart it like an operator would.
"""
from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
import pytest_asyncio

from gangctl.api.resources import NODES
from gangctl.cluster.lifecycle import UpOptions, down, process_node_state, start_process_nodes, up
from gangctl.cluster.local import LocalCluster
from gangctl.config import ClusterSettings
from gangctl.kube.client import Kube
from gangctl.processes import ControllerProcess
from tests.integration.helpers import delete_namespace, token_for, user_kubeconfig

pytestmark = pytest.mark.integration

GPU_NODES = 64
GPUS_PER_NODE = 8
CONTROL_PLANE = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler")
LOG_TAIL = 12  # lines of each control-plane log shown under a failed test


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """A failed test on the session cluster shows the end of each control-plane component's log (a
    component that died says why there), since the cluster and its logs go when the session ends."""
    outcome = yield
    report = outcome.get_result()
    settings = item.funcargs.get("cluster_settings") if hasattr(item, "funcargs") else None
    if not report.failed or not isinstance(settings, ClusterSettings):
        return
    logs = LocalCluster(settings, Path("/nonexistent")).logs_dir
    for name in CONTROL_PLANE:
        log = logs / f"{name}.log"
        if log.exists():
            lines = log.read_bytes()[-64_000:].decode(errors="replace").splitlines()[-LOG_TAIL:]
            report.sections.append((f"{name} log, last {LOG_TAIL} lines ({log})", "\n".join(lines)))


# The modules that start extra schedulers built from source, and those schedulers in the order they run.
PREBUILT = {"test_schedulers": ("kai", "kueue", "volcano")}
# Builds that tests reach through a fixture, before and after the schedulers: CoreDNS for the process
# nodes (whose first test runs a few modules in), and helm when one session also collects the unit
# tests' chart checks (`pytest tests`; `make test` runs the unit tests first, in a session of their own).
PREBUILT_FIRST, PREBUILT_LAST = {"process_nodes": "coredns"}, {"helm": "helm"}
# The controller image (gangctl.cluster.image), built beside those by a process of its own.
IMAGE_MODULE = "test_image"


@pytest.fixture(scope="session", autouse=True)
def prebuilt(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory):
    """Build what the collected tests will need from source (CoreDNS, the extra schedulers their backend
    modules start, helm, the controller image), in the background from the first integration test on,
    under `nice -n 19` (as every build): on a fresh machine the builds (minutes each) overlap tests
    that mostly wait on the cluster, instead of running one after another in the tests' fixtures. A
    fixture or `cluster up` waits for the build's lock and reuses what it built; if the prebuild
    failed, it builds (and reports the error) itself."""
    modules = {item.module.__name__.rsplit(".", 1)[-1] for item in request.session.items}
    fixtures = {f for item in request.session.items for f in getattr(item, "fixturenames", ())}
    wanted = ([name for fixture, name in PREBUILT_FIRST.items() if fixture in fixtures]
              + [name for module, names in PREBUILT.items() if module in modules for name in names]
              + [name for fixture, name in PREBUILT_LAST.items() if fixture in fixtures])
    commands = ([["gangctl.cluster.build", *wanted]] if wanted else []) + (
        [["gangctl.cluster.image"]] if IMAGE_MODULE in modules else [])
    folder = tmp_path_factory.mktemp("prebuild")
    procs = []
    for number, command in enumerate(commands):
        with (folder / f"build-{number}.log").open("w") as out:
            procs.append(subprocess.Popen([sys.executable, "-m", *command], stdout=out, stderr=subprocess.STDOUT,
                                          stdin=subprocess.DEVNULL, start_new_session=True))
    yield procs
    for proc in procs:
        if proc.poll() is None:   # a run that did not reach those modules: stop the build and its children
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait()


@pytest.fixture(scope="session")
def cluster_settings() -> ClusterSettings:
    # GANGCTL_TEST_CLUSTER: run the suite against another cluster name (one per engineer/CI job).
    return ClusterSettings(cluster_name=os.environ.get("GANGCTL_TEST_CLUSTER", "gangctl-test"))


@pytest.fixture(scope="session")
def kubeconfig(cluster_settings: ClusterSettings) -> Path:
    down(cluster_settings, lambda m: None)  # a cluster left by an interrupted run
    cluster = up(cluster_settings, UpOptions(GPU_NODES, GPUS_PER_NODE), lambda m: print(f"[cluster] {m}"))
    yield cluster.kubeconfig
    down(cluster_settings, lambda m: print(f"[cluster] {m}"))


@pytest_asyncio.fixture(scope="session")
async def kube(kubeconfig: Path):
    client = await Kube.connect(kubeconfig)
    yield client
    await client.close()


@pytest_asyncio.fixture(scope="session")
async def controller_kubeconfig(kube: Kube, kubeconfig: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A kubeconfig for a ServiceAccount with exactly the permissions deploy/ grants gangctl (its
    roles copied under names of their own, so tests that install and remove deploy/ leave it alone):
    the whole suite runs the controller with least privilege, and a 403 anywhere fails it."""
    return await least_privilege_kubeconfig(kube, kubeconfig, tmp_path_factory.mktemp("sa") / "controller.yaml")


@pytest_asyncio.fixture(scope="session")
async def controller(controller_kubeconfig: Path, tmp_path_factory: pytest.TempPathFactory):
    ctl = ControllerProcess(controller_kubeconfig, tmp_path_factory.mktemp("controller") / "controller.log")
    ctl.start()
    await wait_ready(ctl)
    yield ctl
    ctl.stop()
    print(f"[controller] log: {ctl.log_path}")
    # RBAC's refusal names the user ("... is forbidden: User ... cannot ..."); a namespace being
    # deleted also answers 403 (NamespaceLifecycle), which is not a missing permission, and so does
    # an apiserver in its first seconds after a restart, before its RBAC caches are filled.
    forbidden = [line for line in ctl.log_path.read_text().splitlines()
                 if "403 Forbidden" in line and "is forbidden: User" in line and not _excused(line)]
    assert not forbidden, f"the controller was refused under deploy/'s RBAC: {forbidden[:3]}"


# (start, end) of times when the apiserver was restarted on purpose (test_runtime_faults adds them).
APISERVER_RESTARTS: list[tuple[float, float]] = []


def _excused(line: str) -> bool:
    from datetime import datetime

    try:  # the controller's log lines start with "YYYY-mm-dd HH:MM:SS,mmm" in local time
        at = datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f").timestamp()
    except ValueError:
        return False
    return any(start <= at <= end + 30 for start, end in APISERVER_RESTARTS)


SUITE_SA = "gangctl-suite"


@pytest_asyncio.fixture
async def reaper_kubeconfig(kube: Kube, kubeconfig: Path, tmp_path: Path) -> Path:
    """As controller_kubeconfig, with the RBAC of deploy/overlays/lost-pod-reaper (the base plus what
    the opt-in lost-pod reaper needs), for a ServiceAccount of its own."""
    return await least_privilege_kubeconfig(kube, kubeconfig, tmp_path / "reaper.yaml",
                                            "deploy/overlays/lost-pod-reaper", f"{SUITE_SA}-reaper")


async def least_privilege_kubeconfig(kube: Kube, admin: Path, path: Path, kustomization: str = "deploy",
                                     sa: str = SUITE_SA, without_groups: tuple[str, ...] = ()) -> Path:
    """A ServiceAccount `sa` with the RBAC that `kustomization` grants gangctl (less the rules for
    `without_groups`), and a kubeconfig for it at `path`."""
    import subprocess

    import yaml

    from gangctl.config import REPO_ROOT

    out = subprocess.run(["kubectl", "kustomize", str(REPO_ROOT / kustomization)], check=True, capture_output=True,
                         text=True).stdout
    docs = [d for d in yaml.safe_load_all(out) if d]
    namespace = next(d["metadata"]["name"] for d in docs if d["kind"] == "Namespace"
                     and d["metadata"]["name"] == "gangctl-system")
    roles = {(d["kind"], d["metadata"].get("namespace"), d["metadata"]["name"]): d
             for d in docs if d["kind"] in ("ClusterRole", "Role")}
    bindings = [d for d in docs if d["kind"] in ("ClusterRoleBinding", "RoleBinding")
                and any(s.get("kind") == "ServiceAccount" and s.get("name") == "gangctl" for s in d["subjects"])]
    objects: list[dict] = [
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}},
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": sa, "namespace": namespace}}]
    for binding in bindings:
        kind = "ClusterRole" if binding["kind"] == "ClusterRoleBinding" else "Role"
        role = roles[(binding["roleRef"]["kind"], binding["metadata"].get("namespace") if kind == "Role" else None,
                      binding["roleRef"]["name"])]
        name = f"{sa}-{role['metadata']['name']}"
        meta = {"name": name, **({"namespace": binding["metadata"]["namespace"]} if kind == "Role" else {})}
        objects.append({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": kind, "metadata": meta,
                        "rules": [r for r in role["rules"] if not set(r.get("apiGroups") or []) & set(without_groups)]})
        objects.append({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": binding["kind"], "metadata": meta,
                        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": kind, "name": name},
                        "subjects": [{"kind": "ServiceAccount", "name": sa, "namespace": namespace}]})
    applied = subprocess.run(["kubectl", "apply", "--server-side", "--field-manager=gangctl-test-suite", "-f", "-"],
                             input=yaml.safe_dump_all(objects), capture_output=True, text=True,
                             env={**os.environ, "KUBECONFIG": str(admin)})
    assert applied.returncode == 0, applied.stderr
    return user_kubeconfig(admin, path, {"token": await token_for(kube, namespace, sa, seconds=86400)})


async def wait_ready(ctl: ControllerProcess) -> None:
    await asyncio.to_thread(ctl.wait_ready)


# Process nodes (`gangctl node-agent`) the tests add to the session cluster: started by the first
# test that asks for them, shared by test_process_nodes.py, test_sdk.py and test_training.py.
PROCESS_NODES = 3
PROCESS_NODE_PREFIX = "itest-node"
PROCESS_NODE_FIRST_INDEX = 10  # pod subnets 10.244.11-13.0/24; further agents take the next indexes
PROCESS_RUNTIME = "torch-process-nodes"  # deploy/runtimes/torch-process-nodes.yaml, applied by `cluster up`


def process_node_test_state(settings: ClusterSettings) -> Path:
    return process_node_state(settings) / "itest"


@pytest.fixture(scope="session")
def process_nodes(cluster_settings: ClusterSettings, kubeconfig: Path):
    from gangctl.nodeagent import launch

    state = process_node_test_state(cluster_settings)
    names = start_process_nodes(cluster_settings, kubeconfig, PROCESS_NODES, lambda m: print(f"[nodes] {m}"),
                                state=state, prefix=PROCESS_NODE_PREFIX, first_index=PROCESS_NODE_FIRST_INDEX)
    yield names
    launch.stop(cluster_settings.cluster_name, state)
    _delete_nodes(kubeconfig, names)


def _delete_nodes(kubeconfig: Path, names: list[str]) -> None:
    async def go() -> None:
        kube = await Kube.connect(kubeconfig)
        try:
            for name in names:
                await kube.delete(NODES.path(name=name))
        finally:
            await kube.close()
    asyncio.run(go())


@pytest_asyncio.fixture(scope="session")
async def process_runtime(kube: Kube, process_nodes) -> str:
    """The shipped process-node runtime's name (installed with the cluster, from deploy/runtimes)."""
    await kube.get(f"/apis/trainer.kubeflow.org/v1alpha1/clustertrainingruntimes/{PROCESS_RUNTIME}")
    return PROCESS_RUNTIME


@pytest_asyncio.fixture
async def namespace(kube: Kube):
    name = f"t-{uuid.uuid4().hex[:8]}"
    await kube.create("/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})
    yield name
    await delete_namespace(kube, name)

