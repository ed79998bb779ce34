"""The scheduler backends on real local clusters, one module for all of them: KAI, Kueue, Kubernetes'
native gangs (KEP-4671) and Volcano, each on a cluster of its own (`gangctl-it-<backend>`).

Every test takes the module-scoped `backend` fixture, parameterized over the backends, so pytest runs
one backend's tests together and starts its cluster once (deleting the previous backend's first).
A test that only some backends have is parameterized over those (`only`). The checks every backend
shares are written once; what differs (its gang object, its scheduler's name, its words for a waiting
gang) is read from the backend's module in gangctl/plugins or kept beside the check, keyed by backend.
Within a backend the tests run in the order written: the gangs the builder tests create directly go
before gangctl's controller starts on the cluster, and `cluster down` is the last test.

- Kueue: the quota policy applied and read back; Jobs admitted by quota; a plain Job is Kueue's in a
  team namespace only.
- Kueue, KAI and native: from the policy's `topology:` section, a gang (TrainJob or PyTorchJob) that
  requires a rack is placed in one rack by the scheduler's own topology feature, waits naming the rack
  when none has room and starts when one frees; a gang that prefers a rack spans the fewest racks;
  an unknown level, two vocabularies that disagree and a rack smaller than the gang fail at once; an
  elastic gang that requires a rack and loses a host shrinks in its rack and grows back there.
- KAI: the quota policy as a Queue tree, gangs bound whole or not at all, TrainJobs waiting with
  KAI's reason, priority preemption within a team.
- native: `--scheduler native` serves the PodGroup API (GenericWorkload and GangScheduling gates) and
  runs upstream kube-scheduler 1.36 with GangScheduling as `native-gang-scheduler`. Native gangs have
  no quota system of their own, so gangctl's quota gate admits them, as for coscheduling: the same
  checks as the other backends, with the same policy and the same jobs; `gangctl sim-check --backend
  native` replays a scenario slice as native gangs.
- Volcano: the quota policy as Queues, and gangs bound whole or not at all.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from gangctl.api.resources import (CLUSTER_TRAINING_RUNTIMES, JOBS, NAMESPACES, NODES, PODS, PYTORCHJOBS,
                                   TRAINING_RUNTIMES, TRAINJOBS)
from gangctl.cluster import schedulers
from gangctl.cluster.local import KWOK_NODE_SELECTOR, KWOK_TOLERATION, LocalCluster
from gangctl.cluster.native import NATIVE_SCHEDULER
from gangctl.commands.policy_apply import apply_policy
from gangctl.kube.client import Kube
from gangctl.model.quota import QuotaPolicy
from gangctl.model.topology import KAI_REQUIRED, KUEUE_PREFERRED, KUEUE_REQUIRED
from gangctl.plugins import kai, volcano
from gangctl.plugins.kueue import PRIORITY_LABEL, QUEUE_LABEL, WORKLOADS
from gangctl.plugins.registry import BACKENDS
from gangctl.policy.placement import PLACEMENT_ANNOTATION, UNSATISFIABLE
from gangctl.sim.replay import RUNTIME
from tests.integration.helpers import (bound, condition, eventually, gang_state, get_trainjob, node_not_ready,
                                       node_ready, nodes_state, pod_group, pods_of, running, submit,
                                       trainjob, trainjob_state)
from tests.integration.quota_common import (POLICY_FILE, TEAMS, assert_preempted_event,
                                            assert_same_jobs_within_policy, empty_teams, get_pytorchjob, pj_pods,
                                            preempt_low_with_high, pytorchjob, runtime as quota_runtime,
                                            runtime_name, v1_condition)
from tests.integration.schedulers_common import (EXAMPLE_POLICY, cli, exposed_listeners, gang_objects,
                                                remove_builder_gangs, serve_backend, start, stop)

pytestmark = pytest.mark.integration
# coscheduling is the scheduler of the session's own cluster, which every other module tests.
CLUSTER_BACKENDS = tuple(name for name in BACKENDS if name != "coscheduling")
NS = "team-b"   # where the builder tests create their gangs
# The podGroupPolicy the builder tests' gangs are made with.
BUILDER_POLICY = {"kai": {"kai": {"queue": kai.DEFAULT_QUEUE}}, "volcano": {"volcano": {"queue": "team-b"}},
                  "native": {"native": {"schedulerName": NATIVE_SCHEDULER}}}
# The pod schedulerName each queue-based backend's PyTorchJob gangs carry.
SCHEDULER_NAME = {"kai": kai.SCHEDULER_NAME, "volcano": volcano.SCHEDULER_NAME}


def only(*backends: str) -> pytest.MarkDecorator:
    """A test that only these backends have."""
    assert set(backends) <= set(CLUSTER_BACKENDS), backends
    return pytest.mark.parametrize("backend", backends, indirect=True)


@pytest.fixture(scope="module", params=CLUSTER_BACKENDS)
def backend(request: pytest.FixtureRequest) -> str:
    return request.param


@pytest.fixture(scope="module")
def cluster(backend: str):
    settings, kubeconfig = start(f"gangctl-it-{backend}", backend)
    yield settings, kubeconfig
    stop(settings)


@pytest.fixture
async def kube(cluster, backend: str):
    k = await Kube.connect(cluster[1])
    if backend == "native":   # no quota policy applied yet: the builder tests' namespace is made here
        await k.apply(NAMESPACES.path(name=NS), {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}},
                      "gangctl-tests")
    yield k
    await k.close()


@pytest.fixture(scope="module")
async def backend_controller(cluster, backend: str, tmp_path_factory):
    """gangctl serving TrainJobs on the backend's cluster, with the backend tests' policy applied (the
    gangs the builder tests created directly removed first)."""
    group = BACKENDS[backend].group_resource
    prepare = remove_builder_gangs(group, NS, "first", "second") if group is not None else None
    async with serve_backend(cluster, backend, tmp_path_factory.mktemp(f"{backend}-controller"), prepare) as ctl:
        yield ctl


# --- the quota policy, applied with the CLI ---------------------------------------------------------


@only("kai")
async def test_policy_applied_as_a_queue_tree_and_read_back(cluster, kube):
    done = cli(cluster, "policy", "apply", str(POLICY_FILE), "-o", "json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["backend"] == "kai", "the backend defaults to the cluster's scheduler"
    assert "team team-b: lendingLimit is not enforced by KAI" in " ".join(done.stderr.split()), done.stderr
    queues = {q["metadata"]["name"]: q["spec"] for q in (await kube.get(kai.KAI_QUEUES.path()))["items"]}
    assert {"default-queue", "cohort-shared", "team-a", "team-b"} <= set(queues)
    assert queues["cohort-shared"]["resources"]["gpu"]["limit"] == 32, "the cohort holds its teams' 16 + 16"
    assert queues["team-a"]["parentQueue"] == "cohort-shared"
    assert queues["team-a"]["resources"]["gpu"] == {"quota": 16, "limit": 24, "overQuotaWeight": 1}
    again = cli(cluster, "policy", "apply", str(POLICY_FILE), "--dry-run", "-o", "json")
    assert {o["action"] for o in json.loads(again.stdout)["objects"]} == {"unchanged"}


@only("kueue")
async def test_policy_applied_and_read_back(cluster, kube):
    dry = cli(cluster, "policy", "apply", str(EXAMPLE_POLICY), "--dry-run", "-o", "json")
    assert dry.returncode == 0, dry.stderr
    assert {o["action"] for o in json.loads(dry.stdout)["objects"]} == {"create"}
    assert (await kube.get("/apis/kueue.x-k8s.io/v1beta2/clusterqueues"))["items"] == [], "dry run changed nothing"

    done = cli(cluster, "policy", "apply", str(EXAMPLE_POLICY))
    assert done.returncode == 0, done.stderr
    cqs = {c["metadata"]["name"]: c for c in (await kube.get("/apis/kueue.x-k8s.io/v1beta2/clusterqueues"))["items"]}
    assert set(cqs) == {"ml-a", "ml-b", "prod", "eval"}
    gpu = cqs["ml-a"]["spec"]["resourceGroups"][0]["flavors"][0]["resources"][0]
    assert gpu == {"name": "nvidia.com/gpu", "nominalQuota": "64", "borrowingLimit": "32"}
    assert cqs["ml-b"]["spec"]["cohortName"] == "research" and cqs["ml-b"]["spec"]["queueingStrategy"] == "BestEffortFIFO"
    # A v1beta1 client (Kueue <= v0.14 manifests) reads it through Kueue's conversion webhook, renamed back.
    assert (await kube.get("/apis/kueue.x-k8s.io/v1beta1/clusterqueues/ml-b"))["spec"]["cohort"] == "research"
    lqs = (await kube.get("/apis/kueue.x-k8s.io/v1beta2/localqueues"))["items"]
    assert {(q["metadata"]["namespace"], q["spec"]["clusterQueue"]) for q in lqs} == {
        ("ml-a", "ml-a"), ("ml-a-dev", "ml-a"), ("ml-b", "ml-b"), ("prod", "prod"), ("eval", "eval")}
    cohorts = (await kube.get("/apis/kueue.x-k8s.io/v1beta2/cohorts"))["items"]
    assert {c["metadata"]["name"] for c in cohorts} == {"research", "product"}
    wpcs = (await kube.get("/apis/kueue.x-k8s.io/v1beta2/workloadpriorityclasses"))["items"]
    assert {w["metadata"]["name"]: w["value"] for w in wpcs} == {"low": 10, "normal": 100, "high": 1000}

    async def active() -> bool:  # Kueue marks a ClusterQueue Active once its flavor and cohort resolve
        cq = await kube.get("/apis/kueue.x-k8s.io/v1beta2/clusterqueues/ml-b")
        return any(c["type"] == "Active" and c["status"] == "True" for c in cq.get("status", {}).get("conditions", []))
    await eventually(active, 30, "ClusterQueue ml-b Active")

    # Applying the same policy again changes nothing, through the Python API too.
    policy = QuotaPolicy.model_validate(yaml.safe_load(EXAMPLE_POLICY.read_text()))
    assert {c.action for c in await apply_policy(kube, policy, "kueue", dry_run=True)} == {"unchanged"}


@only("volcano")
async def test_policy_applied_as_queues_and_read_back(cluster, kube):
    # The backend tests' policy (two teams in a cohort, 32 of the cluster's 40 GPUs): the example
    # policy is sized for 256 GPUs and its guarantees would leave these queues nothing.
    done = cli(cluster, "policy", "apply", str(POLICY_FILE), "-o", "json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["backend"] == "volcano", "the backend defaults to the cluster's scheduler"
    queues = {q["metadata"]["name"]: q["spec"] for q in (await kube.get(volcano.VOLCANO_QUEUES.path()))["items"]}
    assert {"default", "team-a", "team-b"} <= set(queues)
    assert queues["team-a"]["deserved"] == {"nvidia.com/gpu": "16"}
    assert queues["team-a"]["capability"]["nvidia.com/gpu"] == "24", "nominal 16 + borrowing limit 8"
    assert queues["team-b"]["guarantee"] == {"resource": {"nvidia.com/gpu": "8"}}, "16 nominal - 8 lent"
    again = cli(cluster, "policy", "apply", str(POLICY_FILE), "--dry-run", "-o", "json")
    assert {o["action"] for o in json.loads(again.stdout)["objects"]} == {"unchanged"}


# --- gangs built by gangctl's builders, created directly ---------------------------------------------


async def bound_pods(kube: Kube, name: str) -> list[dict]:
    pods = (await kube.get(PODS.path(NS), labelSelector=f"jobset.sigs.k8s.io/jobset-name={name}"))["items"]
    return [p for p in pods if p["spec"].get("nodeName") and not p["metadata"].get("deletionTimestamp")]


async def create_gang(kube: Kube, backend: str, name: str, nodes: int) -> None:
    gang_backend = BACKENDS[backend]
    group, job = gang_objects(gang_backend, name, NS, nodes, BUILDER_POLICY[backend])
    assert group is not None and gang_backend.group_resource is not None
    await kube.create(gang_backend.group_resource.path(NS), group)
    await kube.create(JOBS.path(NS), job)


def native_scheduled(pg: dict) -> dict:
    return next((c for c in (pg.get("status") or {}).get("conditions") or [] if c["type"] == "PodGroupScheduled"), {})


def refused(backend: str, pg: dict) -> bool:
    """Whether the scheduler reported the gang object `pg` unschedulable, in its own way."""
    if backend == "kai":
        return bool((pg.get("status") or {}).get("schedulingConditions"))
    if backend == "native":
        cond = native_scheduled(pg)
        return cond.get("status") == "False" and cond.get("reason") == "Unschedulable"
    return any(c["type"] == "Unschedulable" for c in pg.get("status", {}).get("conditions", []))


async def assert_bound_whole(kube: Kube, backend: str, group) -> None:
    """The first gang's pods and its gang object, as its scheduler left them once it bound them."""
    if backend == "native":
        pods = await bound_pods(kube, "first")
        assert {p["spec"]["schedulingGroup"]["podGroupName"] for p in pods} == {"first"}
        assert {p["spec"]["schedulerName"] for p in pods} == {NATIVE_SCHEDULER}
        pg = await kube.get(group.path(NS, "first"))
        assert pg["spec"]["schedulingPolicy"] == {"gang": {"minCount": 4}}
        assert native_scheduled(pg).get("status") == "True", pg.get("status")
    elif backend == "volcano":
        pg = await kube.get(group.path(NS, "first"))
        assert pg["spec"]["minTaskMember"] == {"node": 4} and pg["spec"]["queue"] == "team-b"


@only("kai", "native", "volcano")
async def test_gangs_bind_whole_or_wait_whole(backend, kube):
    # 40 GPUs in the cluster (KAI: an unlimited queue): a 4 x 8 gang binds; a 2 x 8 gang then finds 8
    # free and binds no pod, with the scheduler's reason on its group.
    group = BACKENDS[backend].group_resource
    await create_gang(kube, backend, "first", 4)

    async def first_bound() -> bool:
        return len(await bound_pods(kube, "first")) == 4
    await eventually(first_bound, 60, "the 4-node gang bound whole")
    await assert_bound_whole(kube, backend, group)
    await create_gang(kube, backend, "second", 2)

    async def second_refused() -> bool:
        return refused(backend, await kube.get(group.path(NS, "second")))
    await eventually(second_refused, 60, f"the 2-node gang's group reported unschedulable by {backend}")
    if backend == "kai":
        pg = await kube.get(group.path(NS, "second"))
        assert "2 are required for gang scheduling" in pg["status"]["schedulingConditions"][-1]["message"]
    assert await bound_pods(kube, "second") == [], "no pod of a gang that does not fit is bound"

    await kube.delete(JOBS.path(NS, "first-node-0"), propagation="Foreground")

    async def second_bound() -> bool:
        return len(await bound_pods(kube, "second")) == 2
    await eventually(second_bound, 90, "the 2-node gang bound whole once the first gang's pods went away")


# --- TrainJobs and PyTorchJobs run by gangctl's controller -------------------------------------------


async def gone(kube: Kube, path: str) -> bool:
    return not await kube.exists(path)


def waits_in_its_words(backend: str, message: str) -> bool:
    """A TrainJob's WaitingForQuota message, as each backend's scheduler (or gangctl's quota gate) says it."""
    if backend == "kueue":   # Kueue first says "not evaluated yet", then why it does not admit: wait for the why
        return "Kueue" in message and "insufficient" in message and "nvidia.com/gpu" in message
    return {"kai": "KAI queue team-a", "native": "team team-a uses 16", "volcano": "queue team-a"}[backend] in message


async def assert_gang_of_a_big(kube: Kube, backend: str, ns: str) -> None:
    """a-big's gang object and pods, as gangctl made them for the backend."""
    if backend == "kai":
        pg = await kube.get(kai.KAI_POD_GROUPS.path(ns, "a-big"))
        assert pg["spec"]["queue"] == "team-a" and pg["spec"]["minMember"] == 2
        assert pg["spec"]["priorityClassName"] == "batch"
        assert {p["spec"]["schedulerName"] for p in await pods_of(kube, ns, "a-big")} == {kai.SCHEDULER_NAME}
    elif backend == "kueue":
        job = await kube.get(JOBS.path(ns, "a-big-node-0"))
        assert job["metadata"]["labels"][QUEUE_LABEL] == "default"
    elif backend == "native":
        pg = await kube.get(BACKENDS["native"].group_resource.path(ns, "a-big"))
        assert pg["spec"]["schedulingPolicy"] == {"gang": {"minCount": 2}}
        assert pg["metadata"]["ownerReferences"][0]["kind"] == "TrainJob"
        pods = bound(await pods_of(kube, ns, "a-big"))
        assert len(pods) == 2 and {p["spec"]["schedulingGroup"]["podGroupName"] for p in pods} == {"a-big"}
    else:
        pg = await kube.get(volcano.VOLCANO_POD_GROUPS.path(ns, "a-big"))
        assert pg["spec"]["queue"] == "team-a" and pg["spec"]["minMember"] == 2
        assert pg["spec"]["minResources"]["nvidia.com/gpu"] == "16"


async def release_a_big(kube: Kube, backend: str, ns: str) -> None:
    """Delete a-big and wait until its gang object is gone with it."""
    await kube.delete(TRAINJOBS.path(ns, "a-big"))
    group = BACKENDS[backend].group_resource
    if backend == "native":
        # The PodGroup's protection finalizer holds it until no running pod names it: once the Job is gone
        # (nothing recreates them), its pods go at once (kubelet's SIGKILL), not after KWOK's 30 s grace.
        await eventually(lambda: gone(kube, JOBS.path(ns, "a-big-node-0")), 30, "a-big's Job deleted with it")
        await kube.request("DELETE", PODS.path(ns), body={"gracePeriodSeconds": 0},
                           params={"labelSelector": "jobset.sigs.k8s.io/jobset-name=a-big"})
        await eventually(lambda: gone(kube, group.path(ns, "a-big")), 30, "a-big's PodGroup deleted with it")
    elif group is not None:
        async def released() -> bool:
            return await pod_group(kube, ns, "a-big", group) is None
        await eventually(released, 30, "a-big's PodGroup deleted with it")


async def test_trainjobs_wait_for_quota_with_the_reason_and_start_when_it_frees(backend, cluster, backend_controller,
                                                                                kube):
    # team-a: 16 GPUs nominal + 8 borrowed from team-b = 24 (Volcano: its queue's capability; KAI: its
    # queue's limit). Kueue's jobs are 2 + 1 nodes and a 1-node one that waits; the others' 2 and 2.
    ns = TEAMS["team-a"]
    rt = dict(runtime=runtime_name("batch"), runtime_kind="TrainingRuntime")
    first = {"a-big": 2, "a-small": 1} if backend == "kueue" else {"a-big": 2}
    for name, nodes in first.items():
        await submit(kube, trainjob(name, ns, nodes=nodes, **rt))
    for name, nodes in first.items():
        await eventually(lambda: running(kube, ns, name), 60 if backend == "kueue" else 90,
                         f"{name} admitted and running on {backend}")
        if backend == "kueue":
            assert len(bound(await pods_of(kube, ns, name))) == nodes
    await assert_gang_of_a_big(kube, backend, ns)

    await submit(kube, trainjob("a-waits", ns, nodes=1 if backend == "kueue" else 2, **rt))

    async def waits_for_quota() -> bool:
        cond = gang_state(await get_trainjob(kube, ns, "a-waits"))
        return cond.get("reason") == "WaitingForQuota" and waits_in_its_words(backend, cond.get("message", ""))
    await eventually(waits_for_quota, 90 if backend == "kueue" else 60,
                     f"a-waits waiting for quota, in {backend}'s words")
    assert bound(await pods_of(kube, ns, "a-waits")) == [], "a job beyond quota holds no node"
    if backend == "kai":
        explained = cli(cluster, "explain", f"trainjob/{ns}/a-waits")
        assert "KAI queue team-a" in " ".join(explained.stdout.split()), explained.stdout + explained.stderr
    if backend == "native":
        assert await gone(kube, BACKENDS["native"].group_resource.path(ns, "a-waits")), \
            "a job waiting for quota has no PodGroup"

    await release_a_big(kube, backend, ns)
    await eventually(lambda: running(kube, ns, "a-waits"), 120 if backend in ("kai", "volcano") else 90,
                     "a-waits running once a-big's quota is free")
    if backend in ("kai", "volcano"):
        assert len(bound(await pods_of(kube, ns, "a-waits"))) == 2
    if backend == "kueue":
        workloads = (await kube.get(WORKLOADS.path(ns)))["items"]
        assert not [w for w in workloads if "a-big" in w["metadata"]["name"]], "a deleted TrainJob leaves no Workload"
        await kube.delete(TRAINJOBS.path(ns, "a-small"))
    await kube.delete(TRAINJOBS.path(ns, "a-waits"))


@only("kueue")
async def test_a_pytorchjob_with_a_queue_name_waits_in_kueues_words_and_runs_when_admitted(backend_controller, kube):
    ns = TEAMS["team-a"]   # 24 GPUs at most
    await empty_teams(kube, ns)
    try:
        def queued(name: str, **kw) -> dict:   # its priority a WorkloadPriorityClass of the policy's
            obj = pytorchjob(name, ns, **kw)
            obj["metadata"]["labels"] = {QUEUE_LABEL: "default", PRIORITY_LABEL: "batch"}
            return obj
        await kube.create(PYTORCHJOBS.path(ns), queued("pj-a", masters=0, workers=3))

        async def runs(name: str) -> bool:
            return v1_condition(await get_pytorchjob(kube, ns, name), "Running").get("status") == "True"
        await eventually(lambda: runs("pj-a"), 90, "a 24-GPU PyTorchJob admitted by Kueue and running")
        assert len(bound(await pj_pods(kube, ns, "pj-a"))) == 3
        await kube.create(PYTORCHJOBS.path(ns), queued("pj-b", masters=0, workers=1))

        async def waits_in_kueues_words() -> bool:
            held = v1_condition(await get_pytorchjob(kube, ns, "pj-b"), "Suspended")
            return (held.get("status") == "True" and held.get("reason") == "WaitingForQuota"
                    and "insufficient" in held.get("message", "") and "nvidia.com/gpu" in held.get("message", ""))
        await eventually(waits_in_kueues_words, 90, "pj-b Suspended, waiting for quota in Kueue's words")
        assert bound(await pj_pods(kube, ns, "pj-b")) == [], "a job beyond quota holds no node"
        await kube.delete(PYTORCHJOBS.path(ns, "pj-a"))
        await eventually(lambda: runs("pj-b"), 90, "pj-b running once Kueue admits it")
        assert v1_condition(await get_pytorchjob(kube, ns, "pj-b"), "Suspended")["status"] == "False"

        # Kueue admits the PyTorchJob itself: a Master and a Worker are one Workload of two pod sets
        # (8 + 8 GPUs beside pj-b's 8: the team's 24), and neither of gangctl's pods is Kueue's
        await kube.create(PYTORCHJOBS.path(ns), queued("pj-whole", workers=1))
        async def both_run() -> bool:   # v1's Running follows the Master; the Worker may bind a moment later
            return await runs("pj-whole") and len(bound(await pj_pods(kube, ns, "pj-whole"))) == 2
        await eventually(both_run, 90, "a Master + Worker PyTorchJob admitted by Kueue, running, both pods bound")
        job = await get_pytorchjob(kube, ns, "pj-whole")
        [workload] = [w for w in (await kube.get(WORKLOADS.path(ns)))["items"]
                      if any(r["uid"] == job["metadata"]["uid"] for r in w["metadata"].get("ownerReferences") or [])]
        assert [(p["name"], p["count"]) for p in workload["spec"]["podSets"]] == [("master", 1), ("worker", 1)]
        children = await pj_pods(kube, ns, "pj-whole")
        assert sorted(p["metadata"]["name"] for p in children) == ["pj-whole-master-0", "pj-whole-worker-0"]
        assert not [p for p in children if QUEUE_LABEL in p["metadata"].get("labels", {})]
        assert not [j for j in (await kube.get(JOBS.path(ns)))["items"] if j["metadata"]["name"].startswith("pj-whole")]

        # without Kueue's priority label, Kueue takes the priority from schedulingPolicy.priorityClass,
        # a PriorityClass this cluster lacks: Kueue would make no Workload, so the job fails naming it
        unlabelled = queued("pj-nopc", masters=0, workers=1)
        del unlabelled["metadata"]["labels"][PRIORITY_LABEL]
        await kube.create(PYTORCHJOBS.path(ns), unlabelled)

        async def failed_naming_the_field() -> bool:
            failed = v1_condition(await get_pytorchjob(kube, ns, "pj-nopc"), "Failed")
            return failed.get("status") == "True" and "schedulingPolicy.priorityClass" in failed.get("message", "")
        await eventually(failed_naming_the_field, 60, "pj-nopc Failed, naming schedulingPolicy.priorityClass")
    finally:   # the GPU nodes go back to the tests after this one, pass or fail
        await kube.request("DELETE", PYTORCHJOBS.path(ns), body={"propagationPolicy": "Background"})
        await empty_teams(kube, ns)


@only("kai", "volcano")
async def test_pytorchjobs_are_gangs_in_their_queue(backend, backend_controller, kube):
    ns = TEAMS["team-a"]   # queue team-a: at most 24 GPUs (KAI: its limit; Volcano: its capability)
    group = BACKENDS[backend].group_resource
    await empty_teams(kube, ns)

    def in_queue(name: str) -> dict:   # a Master and a Worker of 8 GPUs: 16 GPUs
        obj = pytorchjob(name, ns, workers=1)
        obj["spec"]["runPolicy"]["schedulingPolicy"]["queue"] = "team-a"
        return obj

    async def runs(name: str) -> bool:
        job = await get_pytorchjob(kube, ns, name)
        return v1_condition(job, "Running").get("status") == "True" and len(bound(await pj_pods(kube, ns, name))) == 2
    try:
        await kube.create(PYTORCHJOBS.path(ns), in_queue("pj-first"))
        await eventually(lambda: runs("pj-first"), 90, f"a PyTorchJob admitted by its {backend} queue and running")
        pg = await kube.get(group.path(ns, "pj-first-pytorch"))
        assert pg["spec"]["queue"] == "team-a" and pg["spec"]["minMember"] == 2
        if backend == "volcano":
            assert pg["spec"]["minResources"]["nvidia.com/gpu"] == "16"
        assert {p["spec"]["schedulerName"] for p in await pj_pods(kube, ns, "pj-first")} == {SCHEDULER_NAME[backend]}

        await kube.create(PYTORCHJOBS.path(ns), in_queue("pj-second"))   # 16 + 16 > 24: the scheduler holds it

        async def held_whole() -> bool:
            pg = await pod_group(kube, ns, "pj-second-pytorch", group)   # None: not made yet
            if pg is None:
                return False
            if backend == "kai":
                return bool((pg.get("status") or {}).get("schedulingConditions"))
            return ((pg.get("status") or {}).get("phase") in ("Pending", "Inqueue")
                    and len(await pj_pods(kube, ns, "pj-second")) == 2)
        await eventually(held_whole, 60, f"pj-second's gang made and held by {backend}")
        assert bound(await pj_pods(kube, ns, "pj-second")) == [], "a gang beyond its queue holds no node"
        await kube.delete(PYTORCHJOBS.path(ns, "pj-first"))
        if backend == "volcano":
            async def released() -> bool:
                return await pod_group(kube, ns, "pj-first-pytorch", group) is None
            await eventually(released, 30, "pj-first's PodGroup deleted with it")
        await eventually(lambda: runs("pj-second"), 120, "pj-second running once the queue has room")
    finally:   # the GPU nodes go back to the tests after this one, pass or fail
        await kube.request("DELETE", PYTORCHJOBS.path(ns), body={"propagationPolicy": "Background"})
        await empty_teams(kube, ns)


async def test_a_higher_priority_trainjob_preempts_within_the_team(backend, backend_controller, kube):
    # Kueue's Evicted condition is cleared once it requeues the workload: either reason shows.
    # KAI's preempt action evicts the batch gang (DisruptionTarget: PreemptionByScheduler, so it is
    # not charged) and the batch job waits for its queue again: 16 urgent + 24 batch > team-a's limit.
    # Volcano keeps the urgent PodGroup Pending while team-a's queue is full, and its preempt action
    # only looks at Inqueue jobs: gangctl evicts the batch gang, which queues again behind it (and so
    # does gangctl's quota gate for native gangs).
    low = await preempt_low_with_high(kube, ("Evicted", "WaitingForQuota") if backend == "kueue"
                                      else ("WaitingForQuota",))
    if backend != "kueue":
        words = {"kai": "KAI queue team-a", "native": "team team-a", "volcano": "queue team-a"}[backend]
        assert words in gang_state(low).get("message", "")
    if backend in ("native", "volcano"):   # gangctl, not the scheduler, evicted the batch gang
        await assert_preempted_event(kube)


async def test_the_same_jobs_never_exceed_the_policy(backend, backend_controller, kube):
    # Kueue runs half the mix: it admits one workload at a time until its pods are ready
    # (blockAdmission), so 24 jobs took three minutes of CI; the 200-job run is benchmarks/quota_backends.py.
    await assert_same_jobs_within_policy(kube, **({"count": 12} if backend == "kueue" else {}))
    group = BACKENDS[backend].group_resource
    if backend == "native":
        async def no_podgroups() -> bool:
            left = [pg for ns in TEAMS.values() for pg in (await kube.get(group.path(ns)))["items"]]
            return not left
        await eventually(no_podgroups, 30, "every finished job's PodGroup deleted")


@only("kueue")
async def test_a_job_without_a_queue_name_is_kueues_only_in_a_team_namespace(kube):
    """Kueue >= v0.12 (GA and locked on since v0.17) puts a Job without a queue name in its namespace's
    LocalQueue named `default`, which the policy makes in each team namespace; elsewhere Kueue leaves
    it alone (`manageJobsWithoutQueueName: false`)."""
    outside = "kueue-outside"
    await kube.apply(NAMESPACES.path(name=outside), {"apiVersion": "v1", "kind": "Namespace",
                                                      "metadata": {"name": outside}}, "gangctl-tests")
    made = {}
    for namespace in (outside, "ml-a"):
        _, plain = gang_objects(BACKENDS["kueue"], "plain", namespace, 1, {"kueue": {}})
        del plain["metadata"]["labels"][QUEUE_LABEL]
        plain["spec"]["suspend"] = False  # gangctl creates Kueue's Jobs suspended; this one is the user's
        made[namespace] = await kube.create(JOBS.path(namespace), plain)
    assert made[outside]["spec"].get("suspend") is False and QUEUE_LABEL not in made[outside]["metadata"]["labels"]
    assert made["ml-a"]["metadata"]["labels"][QUEUE_LABEL] == "default" and made["ml-a"]["spec"]["suspend"] is True

    async def workload_of(namespace: str) -> bool:
        uid = made[namespace]["metadata"]["uid"]
        return any(any(o.get("uid") == uid for o in w["metadata"].get("ownerReferences", []))
                   for w in (await kube.get(WORKLOADS.path(namespace)))["items"])
    await eventually(lambda: workload_of("ml-a"), 30, "a Workload for the team namespace's plain Job")
    assert not await workload_of(outside), "a Job outside the teams' namespaces has no Workload"
    for namespace, job in made.items():
        deleted = await kube.delete(JOBS.path(namespace, job["metadata"]["name"]), propagation="Background",
                                    uid=job["metadata"]["uid"])
        assert deleted, f"the plain Job in {namespace} deleted"  # left running, it held a rack's host (CI)
        await kube.request("DELETE", PODS.path(namespace), body={"gracePeriodSeconds": 0},
                           params={"labelSelector": f"batch.kubernetes.io/controller-uid={job['metadata']['uid']}"})


async def assert_topology_objects(kube: Kube, backend: str, zone: str, rack: str) -> None:
    """What `policy apply` made of the topology on the backend."""
    if backend == "kueue":
        flavor = await kube.get("/apis/kueue.x-k8s.io/v1beta2/resourceflavors/default-flavor")
        assert flavor["spec"]["topologyName"] == "test-racks" and flavor["spec"]["nodeLabels"] == {zone: "z0"}
        levels = (await kube.get("/apis/kueue.x-k8s.io/v1beta2/topologies/test-racks"))["spec"]["levels"]
        assert levels == [{"nodeLabel": zone}, {"nodeLabel": rack}]
    elif backend == "kai":
        levels = (await kube.get(f"/apis/{kai.KAI_TOPOLOGY_API}/topologies/test-racks"))["spec"]["levels"]
        assert levels == [{"nodeLabel": zone}, {"nodeLabel": rack}]


async def assert_gang_asks_for_a_rack(kube: Kube, backend: str, ns: str, name: str, rack: str) -> None:
    """The gang's object carries the intent in the backend's own words."""
    if backend == "kueue":
        workload = next(w for w in (await kube.get(WORKLOADS.path(ns)))["items"] if name in w["metadata"]["name"])
        assert workload["spec"]["podSets"][0].get("topologyRequest", {}).get("required") == rack, workload["spec"]
        assert workload["status"]["admission"]["podSetAssignments"][0].get("topologyAssignment"), workload["status"]
    elif backend == "kai":
        pg = await kube.get(kai.KAI_POD_GROUPS.path(ns, name))
        assert pg["spec"]["topologyConstraint"] == {"topology": "test-racks", "requiredTopologyLevel": rack}
    else:
        pg = await kube.get(BACKENDS["native"].group_resource.path(ns, name))
        assert pg["spec"]["schedulingConstraints"] == {"topology": [{"key": rack}]}


ZONE, RACK = "test.gangctl.io/zone", "test.gangctl.io/rack"
FILLER_NS = "topology-filler"


async def racks_ready(kube: Kube, cluster, backend: str, tmp_path) -> tuple[list[str], dict[str, str]]:
    """Four of the five GPU nodes in zone z0, two racks of two hosts (t0, t1; this module's labels), the
    policy with its `topology:` section applied with the CLI, and no pod left on those nodes. Each
    topology test calls it: labelling and applying again change nothing."""
    await empty_teams(kube, *TEAMS.values())
    selector = ",".join(f"{k}={v}" for k, v in KWOK_NODE_SELECTOR.items())
    names = sorted(n["metadata"]["name"] for n in (await kube.get(NODES.path(), labelSelector=selector))["items"])
    racks = {name: f"t{i // 2}" for i, name in enumerate(names[:4])}
    for name, value in racks.items():
        await kube.merge_patch(NODES.path(name=name), {"metadata": {"labels": {ZONE: "z0", RACK: value}}})

    async def on_the_racks() -> list[str]:   # a scheduler counts every pod bound to a node, its own or not
        pods = (await kube.get(PODS.path()))["items"]
        return [f"{p['metadata']['namespace']}/{p['metadata']['name']}" for p in pods
                if p["spec"].get("nodeName") in racks and p["status"].get("phase") not in ("Succeeded", "Failed")]

    async def racks_free() -> bool:
        return await on_the_racks() == []
    try:
        await eventually(racks_free, 120, "the racks' nodes free of earlier tests' pods")
    except AssertionError as err:
        raise AssertionError(f"{err}: {await on_the_racks()}") from None
    policy = yaml.safe_load(POLICY_FILE.read_text())
    policy["topology"] = {"name": "test-racks", "nodeLabels": {ZONE: "z0"},
                          "levels": [{"name": "zone", "nodeLabel": ZONE}, {"name": "rack", "nodeLabel": RACK}]}
    path = tmp_path / "two-teams-racks.yaml"
    path.write_text(yaml.safe_dump(policy))
    done = cli(cluster, "policy", "apply", str(path), "--backend", backend)
    assert done.returncode == 0, done.stdout + done.stderr
    return names, racks


async def hold_one_host(kube: Kube, node: str) -> dict:
    """A user's pod holding all 8 GPUs of `node` (bound by name, in a namespace of no team, so no quota
    counts it), running."""
    await kube.apply(NAMESPACES.path(name=FILLER_NS), {"apiVersion": "v1", "kind": "Namespace",
                                                        "metadata": {"name": FILLER_NS}}, "gangctl-tests")
    filler = await kube.create(PODS.path(FILLER_NS), {
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "holds-one-host"},
        "spec": {"nodeName": node, "tolerations": [dict(KWOK_TOLERATION)], "containers": [{
            "name": "main", "image": "busybox", "resources": {"limits": {"nvidia.com/gpu": "8"}}}]}})

    async def filler_running() -> bool:
        return (await kube.get(PODS.path(FILLER_NS, "holds-one-host")))["status"].get("phase") == "Running"
    await eventually(filler_running, 30, "the user's pod running on rack t0")
    return filler


async def free_host(kube: Kube, filler: dict) -> None:
    await kube.request("DELETE", PODS.path(FILLER_NS, "holds-one-host"), body={
        "gracePeriodSeconds": 0, "preconditions": {"uid": filler["metadata"]["uid"]}})

    async def gone() -> bool:
        return not [p for p in (await kube.get(PODS.path(FILLER_NS)))["items"]
                    if p["metadata"]["uid"] == filler["metadata"]["uid"]]
    await eventually(gone, 30, "the user's pod gone")


def racks_of(pods: list[dict], racks: dict[str, str]) -> list[str]:
    return sorted(racks.get(p["spec"]["nodeName"], "no rack") for p in pods)


def rack_trainjob(name: str, namespace: str, nodes: int, annotations: dict[str, str]) -> dict:
    job = trainjob(name, namespace, nodes=nodes, runtime=runtime_name("batch"), runtime_kind="TrainingRuntime")
    job["spec"]["podTemplateOverrides"][0]["metadata"]["annotations"].update(annotations)
    return job


@only("kueue", "kai", "native")
async def test_a_gang_that_requires_a_rack_runs_in_one_rack_by_the_schedulers_own_topology(backend, cluster,
                                                                                         backend_controller, kube,
                                                                                         tmp_path):
    """The scheduler's own topology placement, from the policy's `topology:` section: four of the five
    GPU nodes get a zone and two racks of two hosts (this module's labels); `policy apply` makes the
    backend's objects (Kueue: a Topology, the flavor's `topologyName` and the zone as its `nodeLabels`;
    KAI: a Topology; native: none, kube-scheduler reads the labels). A user's pod holds one host of
    rack t0, so four hosts are free and only rack t1 holds a gang of two 8-GPU pods that requires a
    rack (Kueue's annotation, as users write it): the gang runs there, placed by Kueue's TAS, KAI's
    topology plugin or kube-scheduler's TopologyAwareWorkloadScheduling (alpha, on in the native
    cluster). The first of each backend's topology tests, after its other job tests: a Kueue flavor's
    topologyName cannot be taken back."""
    names, racks = await racks_ready(kube, cluster, backend, tmp_path)
    await assert_topology_objects(kube, backend, ZONE, RACK)
    again = cli(cluster, "policy", "apply", str(tmp_path / "two-teams-racks.yaml"), "--backend", backend,
                "--dry-run", "-o", "json")
    assert {o["action"] for o in json.loads(again.stdout)["objects"]} == {"unchanged"}, again.stdout
    filler = await hold_one_host(kube, names[0])

    ns = TEAMS["team-a"]
    await submit(kube, rack_trainjob("tas", ns, 2, {KUEUE_REQUIRED: RACK}))
    await eventually(lambda: running(kube, ns, "tas"), 90, f"the gang placed by {backend} and running")
    pods = bound(await pods_of(kube, ns, "tas"))
    assert racks_of(pods, racks) == ["t1", "t1"], \
        "the only rack with two free hosts: " + str({p["metadata"]["name"]: p["spec"]["nodeName"] for p in pods})
    await assert_gang_asks_for_a_rack(kube, backend, ns, "tas", RACK)

    # A second such gang fits only across racks (t0's free host and the unlabelled node): it waits, and
    # `gangctl explain` says for which rack, whatever the scheduler's own words; it runs once t0 frees.
    await submit(kube, rack_trainjob("tas-2", TEAMS["team-b"], 2, {KUEUE_REQUIRED: RACK}))

    async def waits_for_a_rack() -> bool:
        if gang_state(await get_trainjob(kube, TEAMS["team-b"], "tas-2")).get("state") != "Waiting":
            return False
        said = json.loads(cli(cluster, "explain", f"trainjob/{TEAMS['team-b']}/tas-2", "-o", "json").stdout)
        return said["reason"] in ("WaitingForTopology", "WaitingForQuota") and "rack" in said["message"]
    await eventually(waits_for_a_rack, 60, "the second gang waiting for a rack, explain naming it")
    said = json.loads(cli(cluster, "explain", f"trainjob/{TEAMS['team-b']}/tas-2", "-o", "json").stdout)
    if backend != "kueue":   # Kueue holds the gang as quota: its own words name the topology
        assert said["reason"] == "WaitingForTopology" and "best rack t0: 1 of 2 hosts free" in said["message"], said
    assert bound(await pods_of(kube, TEAMS["team-b"], "tas-2")) == [], "a waiting gang holds no node"
    await free_host(kube, filler)
    await eventually(lambda: running(kube, TEAMS["team-b"], "tas-2"), 120, "the second gang running once t0 frees")
    pods = bound(await pods_of(kube, TEAMS["team-b"], "tas-2"))
    assert racks_of(pods, racks) == ["t0", "t0"], {p["metadata"]["name"]: p["spec"]["nodeName"] for p in pods}
    for name, namespace in (("tas", ns), ("tas-2", TEAMS["team-b"])):
        await kube.delete(TRAINJOBS.path(namespace, name))


@only("kueue", "kai", "native")
async def test_a_gang_that_prefers_a_rack_spans_the_fewest_racks(backend, cluster, backend_controller, kube, tmp_path):
    """With one host of t0 held, a gang of two that prefers a rack runs in t1 alone, and one of three
    (more than a rack holds) still runs, over the two racks. Kueue and KAI place a preferred gang
    themselves (Kueue's annotation passed through; KAI's `preferredTopologyLevel`); native has no
    preferred mode, so gangctl pins the gang to the rack it chose (its placement annotation). Without
    the preference KAI and native spread such a gang over both racks (seen)."""
    names, racks = await racks_ready(kube, cluster, backend, tmp_path)
    filler = await hold_one_host(kube, names[0])
    ns = TEAMS["team-a"]
    try:
        await submit(kube, rack_trainjob("pref", ns, 2, {KUEUE_PREFERRED: RACK}))
        await eventually(lambda: running(kube, ns, "pref"), 90, f"the preferring gang placed by {backend}")
        pods = bound(await pods_of(kube, ns, "pref"))
        assert racks_of(pods, racks) == ["t1", "t1"], {p["metadata"]["name"]: p["spec"]["nodeName"] for p in pods}
        if backend == "kueue":
            workload = next(w for w in (await kube.get(WORKLOADS.path(ns)))["items"] if "pref" in w["metadata"]["name"])
            assert workload["spec"]["podSets"][0].get("topologyRequest", {}).get("preferred") == RACK, workload["spec"]
        elif backend == "kai":
            pg = await kube.get(kai.KAI_POD_GROUPS.path(ns, "pref"))
            assert pg["spec"]["topologyConstraint"] == {"topology": "test-racks", "preferredTopologyLevel": RACK}
        else:
            assert {p["metadata"]["annotations"].get(PLACEMENT_ANNOTATION) for p in pods} == {f"{RACK}=t1"}
        await kube.delete(TRAINJOBS.path(ns, "pref"))
        await free_host(kube, filler)
        await submit(kube, rack_trainjob("pref-3", ns, 3, {KUEUE_PREFERRED: RACK}))
        await eventually(lambda: running(kube, ns, "pref-3"), 90, "a preferring gang larger than a rack running")
        pods = bound(await pods_of(kube, ns, "pref-3"))
        assert len(set(racks_of(pods, racks))) == 2, {p["metadata"]["name"]: p["spec"]["nodeName"] for p in pods}
    finally:
        await kube.request("DELETE", TRAINJOBS.path(ns), body={"propagationPolicy": "Background"})
        await empty_teams(kube, ns)
        if (await kube.get(PODS.path(FILLER_NS)))["items"]:
            await free_host(kube, filler)


@only("kueue", "kai", "native")
async def test_a_pytorchjob_that_requires_a_rack_runs_in_one_rack(backend, cluster, backend_controller, kube, tmp_path):
    """The same intent on a PyTorchJob's replica template: with one host of t0 held, its pods run in t1.
    KAI and native: a Master and a Worker, one PodGroup carrying the constraint. Kueue places each pod
    set in a domain of its own, so its gang is two Workers (one pod set of the Workload asking for the
    rack)."""
    names, racks = await racks_ready(kube, cluster, backend, tmp_path)
    filler = await hold_one_host(kube, names[0])
    ns = TEAMS["team-a"]
    job = pytorchjob("pj-rack", ns, masters=0 if backend == "kueue" else 1, workers=2 if backend == "kueue" else 1)
    job["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["metadata"]["annotations"][KUEUE_REQUIRED] = RACK
    if backend == "kueue":
        job["metadata"]["labels"] = {QUEUE_LABEL: "default", PRIORITY_LABEL: "batch"}
    elif backend == "kai":
        job["spec"]["runPolicy"]["schedulingPolicy"]["queue"] = "team-a"
    try:
        await kube.create(PYTORCHJOBS.path(ns), job)

        async def runs() -> bool:
            obj = await get_pytorchjob(kube, ns, "pj-rack")
            assert v1_condition(obj, "Failed").get("status") != "True", obj.get("status")
            return v1_condition(obj, "Running").get("status") == "True" and len(bound(await pj_pods(kube, ns, "pj-rack"))) == 2
        await eventually(runs, 90, f"the PyTorchJob placed by {backend} and running")
        pods = bound(await pj_pods(kube, ns, "pj-rack"))
        assert racks_of(pods, racks) == ["t1", "t1"], {p["metadata"]["name"]: p["spec"]["nodeName"] for p in pods}
        if backend == "kueue":
            workload = next(w for w in (await kube.get(WORKLOADS.path(ns)))["items"] if "pj-rack" in w["metadata"]["name"])
            assert workload["spec"]["podSets"][0].get("topologyRequest", {}).get("required") == RACK, workload["spec"]
        else:
            await assert_gang_asks_for_a_rack(kube, backend, ns, "pj-rack-pytorch", RACK)
    finally:
        await kube.request("DELETE", PYTORCHJOBS.path(ns), body={"propagationPolicy": "Background"})
        await empty_teams(kube, ns)
        await free_host(kube, filler)


@only("kueue", "kai", "native")
async def test_an_elastic_gang_that_requires_a_rack_shrinks_in_its_rack_when_it_loses_a_host(backend, cluster,
                                                                                           backend_controller,
                                                                                           kube, tmp_path):
    """An elastic gang (1-2 nodes) that requires a rack runs on both hosts of one rack. One of them goes
    NotReady: its pod is evicted, and the only free hosts are in the other rack or in none, so the pod's
    replacement cannot run in the gang's rack: the gang runs on with its survivor alone (KAI: its Job
    shrinks to one; Kueue sizes an admitted Job itself; native: Kubernetes refuses to resize a gang's
    Job, so it keeps two and the replacement waits), and no pod of it runs outside the rack. Once the
    host is Ready again the gang grows back to two, in the rack."""
    names, racks = await racks_ready(kube, cluster, backend, tmp_path)
    ns = TEAMS["team-a"]
    rt = quota_runtime(backend, ns, "batch")
    rt["metadata"]["name"] = "gang-elastic"
    rt["spec"]["mlPolicy"]["torch"]["elasticPolicy"] = {"minNodes": 1, "maxNodes": 2}
    await kube.apply(TRAINING_RUNTIMES.path(ns, "gang-elastic"), rt, "gangctl-tests")
    job = trainjob("el-rack", ns, nodes=2, runtime="gang-elastic", runtime_kind="TrainingRuntime")
    job["spec"]["podTemplateOverrides"][0]["metadata"]["annotations"][KUEUE_REQUIRED] = RACK
    outside: dict[str, str] = {}   # every pod of the gang ever seen bound outside its rack: pod -> node

    async def live() -> list[dict]:
        pods = [p for p in bound(await pods_of(kube, ns, "el-rack")) if not p["metadata"].get("deletionTimestamp")
                and p["status"].get("phase") == "Running"]
        homes = {racks.get(p["spec"]["nodeName"], "no rack") for p in pods}
        if len(homes) > 1 or homes - {"t0", "t1"}:
            outside.update({p["metadata"]["name"]: p["spec"]["nodeName"] for p in pods})
        return pods

    node = None
    try:
        await submit(kube, job)

        async def both_running() -> bool:
            return len(await live()) == 2
        try:   # time for one shrink and grow-back (3 s + the 30 s probe backoff) if a pod waits at first
            await eventually(both_running, 180, f"the elastic gang placed by {backend} on two hosts")
        except AssertionError as err:
            logs = [*(schedulers.state_dir(cluster[0]) / "logs").glob("*.log"),
                    LocalCluster(cluster[0], Path("/nonexistent")).logs_dir / "kube-scheduler.log"]
            raise AssertionError(f"{err}:\n{await trainjob_state(kube, ns, 'el-rack')}\n"
                                 f"{await nodes_state(kube, sorted(racks), logs)}") from None
        pods = await live()
        homes = set(racks_of(pods, racks))
        assert len(homes) == 1 and homes <= {"t0", "t1"}, {p["metadata"]["name"]: p["spec"]["nodeName"] for p in pods}
        (home,) = homes
        victim = max(pods, key=lambda p: p["metadata"]["name"])
        node = victim["spec"]["nodeName"]
        survivor = next(p["metadata"]["uid"] for p in pods if p is not victim)
        await node_not_ready(kube, node)

        size = {"kai": 1, "kueue": 2, "native": 2}[backend]   # the Job's, as the docstring says

        async def shrunk() -> bool:
            el = ((await get_trainjob(kube, ns, "el-rack")).get("status") or {}).get("elastic") or {}
            return (el.get("currentNodes"), el.get("size")) == (1, size) and \
                [p["metadata"]["uid"] for p in await live()] == [survivor]
        try:
            await eventually(shrunk, 120, f"the gang shrunk to its survivor in rack {home}, its Job's size {size}")
        except AssertionError as err:
            raise AssertionError(f"{err}:\n{await trainjob_state(kube, ns, 'el-rack')}") from None
        assert outside == {}, f"pods of a gang that requires a rack ran outside rack {home}: {outside}"

        await node_ready(kube, node)
        node = None

        async def grown() -> bool:
            return len(await live()) == 2
        await eventually(grown, 180, "the gang grown back to two once the host is Ready")
        assert set(racks_of(await live(), racks)) == {home}
        assert survivor in {p["metadata"]["uid"] for p in await live()}, "growing kills no worker"
        assert outside == {}, f"pods of a gang that requires a rack ran outside rack {home}: {outside}"
    finally:
        if node is not None:
            await node_ready(kube, node)
        await kube.request("DELETE", TRAINJOBS.path(ns), body={"propagationPolicy": "Background"})
        await empty_teams(kube, ns)


@only("kueue", "kai", "native")
async def test_bad_topology_asks_fail_naming_the_field_or_the_numbers(backend, cluster, backend_controller, kube,
                                                                      tmp_path):
    """On a backend that places gangs itself, gangctl still refuses what can never run: a level the
    topology lacks (the annotation named), two vocabularies that disagree (both fields named), and a
    required rack smaller than the gang (the numbers; the scheduler would keep it pending for ever).
    None of them makes a pod."""
    await racks_ready(kube, cluster, backend, tmp_path)
    ns = TEAMS["team-b"]
    asks = {"row": (2, {KUEUE_REQUIRED: "example.com/row"}),
            "both": (2, {KUEUE_REQUIRED: RACK, KAI_REQUIRED: ZONE}),
            "big": (3, {KUEUE_REQUIRED: RACK})}
    try:
        for name, (nodes, annotations) in asks.items():
            await submit(kube, rack_trainjob(name, ns, nodes, annotations))

        async def all_failed() -> bool:
            said = [condition(await get_trainjob(kube, ns, n), "Failed") or {} for n in asks]
            return all(c.get("status") == "True" for c in said)
        await eventually(all_failed, 60, "the three jobs failed")
        said = {n: condition(await get_trainjob(kube, ns, n), "Failed") for n in asks}
        assert said["row"]["reason"] == "InvalidPlacement" and KUEUE_REQUIRED in said["row"]["message"], said["row"]
        assert KUEUE_REQUIRED in said["both"]["message"] and KAI_REQUIRED in said["both"]["message"], said["both"]
        assert "disagree" in said["both"]["message"], said["both"]
        assert said["big"]["reason"] == UNSATISFIABLE, said["big"]
        assert "no rack can ever hold the gang's floor (3 pods of" in said["big"]["message"], said["big"]
        assert "2 hosts with room for 2 pods" in said["big"]["message"], said["big"]
        for name in asks:
            assert await pods_of(kube, ns, name) == [], f"{name} made pods"
    finally:
        await kube.request("DELETE", TRAINJOBS.path(ns), body={"propagationPolicy": "Background"})


# --- the cluster's processes -------------------------------------------------------------------------


@only("native")
async def test_sim_check_replays_on_the_clusters_backend(backend, cluster, backend_controller, kube):
    """`gangctl sim-check --backend native`: the replayed TrainJobs name a copy of the shipped runtime
    whose podGroupPolicy names the backend, all of them run to the end, and the simulation beside them
    decides with the same backend."""
    scenario = EXAMPLE_POLICY.parents[1] / "simulations" / "replay-check.yaml"
    run = cli(cluster, "sim-check", str(scenario), "--backend", backend, "--jobs", "8", "--compression", "600",
              "--timeout", "240", "-o", "json")
    assert run.returncode in (0, 2), f"sim-check could not run: {run.stderr[-2000:]}"
    result = json.loads(run.stdout)
    assert result["backend"] == backend and result["real"]["jobs"]["done"] == result["jobs"] == 8, result["real"]
    assert result["model"]["jobs"]["done"] == 8, result["model"]
    runtime = await kube.get(CLUSTER_TRAINING_RUNTIMES.path(None, f"{RUNTIME}-{backend}"))
    assert runtime["spec"]["podGroupPolicy"] == {"native": {"schedulerName": NATIVE_SCHEDULER}}


def test_no_process_listens_beyond_loopback_or_on_gangctls_ports(backend, cluster):
    """KAI: the podgroupcontroller ignores its --metrics-bind-address (controller-runtime's default :8080,
    moved to loopback by integrations/kai/build.json). KAI's scheduler binds its plugin server on every
    interface in code (`":%d"`, no flag): the one exception, on a free port."""
    exposed = exposed_listeners(cluster[0])
    if backend != "kai":
        assert exposed == {}
        return
    assert list(exposed) in ([], ["kai-scheduler"]), exposed
    assert all(not a.startswith(("127.", "[::1]:")) for a in exposed.get("kai-scheduler", [])), exposed
    assert len(exposed.get("kai-scheduler", [])) <= 1, exposed


# The processes `cluster status` lists for each backend's scheduler (at least these).
COMPONENTS = {"kai": {"kai-scheduler", "kai-binder", "kai-podgroupcontroller", "kai-queuecontroller"},
              "kueue": {"kueue"}, "native": {"kube-scheduler-native"},
              "volcano": {"vc-scheduler", "vc-controller-manager"}}


def test_status_and_down_leave_nothing_behind(backend, cluster):
    status = cli(cluster, "cluster", "status", "-o", "json")
    info = json.loads(status.stdout)
    assert info["scheduler"] == backend and info["running"]
    assert {c["name"] for c in info["components"]} >= COMPONENTS[backend]
    if backend == "kai":
        assert all(c["running"] for c in info["components"])
    if backend == "kueue":
        assert any(c["name"] == "kueue" and c["running"] for c in info["components"])
    assert stop(cluster[0]) == [], f"a {backend} scheduler process still runs after cluster down"
