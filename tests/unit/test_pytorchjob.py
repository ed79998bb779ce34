"""PyTorchJob (kubeflow.org/v1): v1.9's defaults and validation, the mapping onto gangctl's gang, the
names, labels and env a v1 user sees, the success rule and the v1 conditions; and the CRD."""
from __future__ import annotations

import copy
from datetime import datetime, timedelta, timezone
from fractions import Fraction
from pathlib import Path

import pytest
import yaml

from gangctl.api import pytorchjob as api
from gangctl.api.pytorchjob import PyTorchJobError, parse
from gangctl.policy import failure
from gangctl.policy import pytorchjob as pj
from gangctl.policy.decide_pytorchjob import replica_pod
from gangctl.policy.pytorchjob import ReplicaCounts
from gangctl.sim import objects
from gangctl.sim.objects import pytorchjob, replica

ROOT = Path(__file__).resolve().parents[2]
NOW = datetime(2026, 11, 23, 12, 0, 0, tzinfo=timezone.utc)


MASTER_ONLY = pytorchjob("simple", {"Master": replica(1, restartPolicy="OnFailure")})
DDP = pytorchjob("ddp", {"Master": replica(1, restartPolicy="OnFailure"),
                         "Worker": replica(3, restartPolicy="OnFailure")})
ELASTIC = pytorchjob("elastic", {"Worker": replica(4, restartPolicy="OnFailure", command=["torchrun", "train.py"])},
                     elasticPolicy={"rdzvBackend": "c10d", "minReplicas": 2, "maxReplicas": 4, "maxRestarts": 10})


def env_of(template: dict, container: str = "pytorch") -> dict[str, dict]:
    c = next(c for c in template["spec"]["containers"] if c["name"] == container)
    return {e["name"]: e for e in c["env"]}


def values(env: dict[str, dict]) -> dict[str, str]:
    return {k: e["value"] for k, e in env.items() if "value" in e}


# --- defaults and validation ----------------------------------------------------------------------

def test_v1_defaults_are_applied():
    job = parse(pytorchjob("d", {"master": replica(), "WORKER": replica()}))
    assert list(job.replica_specs) == ["Master", "Worker"]          # keys matched case-insensitively
    assert [s.replicas for s in job.replica_specs.values()] == [1, 1]
    assert {s.restart_policy for s in job.replica_specs.values()} == {"OnFailure"}
    ports = job.master.template["spec"]["containers"][0]["ports"]
    assert ports == [{"name": "pytorchjob-port", "containerPort": 23456}]
    assert job.nproc_per_node == "auto"
    assert job.run_policy.clean_pod_policy == "None"


def test_a_port_named_pytorchjob_port_is_kept():
    spec = replica(1)
    spec["template"]["spec"]["containers"][0]["ports"] = [{"name": "pytorchjob-port", "containerPort": 29500}]
    job = parse(pytorchjob("p", {"Master": spec}))
    assert job.master.port == 29500
    assert values(env_of(pj.to_gang(job).groups[0].job.pod_template))["MASTER_PORT"] == "29500"


def test_elastic_bounds_default_from_each_other_or_the_workers():
    def bounds(policy: dict) -> tuple[int, int]:
        e = parse(pytorchjob("e", {"Worker": replica(3)}, elasticPolicy=policy)).elastic
        return e.min_replicas, e.max_replicas

    assert bounds({}) == (3, 3)
    assert bounds({"maxReplicas": 5}) == (5, 5)
    assert bounds({"minReplicas": 2}) == (2, 2)
    assert bounds({"minReplicas": 2, "maxReplicas": 4}) == (2, 4)


def test_elastic_nproc_per_node_suppresses_the_auto_default():
    job = parse(pytorchjob("e", {"Worker": replica(2)}, elasticPolicy={"nProcPerNode": 4}))
    assert job.nproc_per_node is None and job.elastic.nproc_per_node == 4
    group = pj.to_gang(job).groups[0]
    assert values(env_of(group.job.pod_template))["PET_NPROC_PER_NODE"] == "4"
    assert group.job.num_proc_per_node == "4"


BAD = [
    ("master-two-replicas", pytorchjob(replicas={"Master": replica(2)}), "spec.pytorchReplicaSpecs[Master].replicas"),
    ("unknown-type", pytorchjob(replicas={"Master": replica(1), "Chief": replica(1)}), "spec.pytorchReplicaSpecs[Chief]"),
    ("elastic-min-over-max", pytorchjob(replicas={"Worker": replica(2)}, elasticPolicy={"minReplicas": 4, "maxReplicas": 2}),
     "spec.elasticPolicy.minReplicas"),
    ("worker-zero", pytorchjob(replicas={"Worker": replica(0)}), "spec.pytorchReplicaSpecs[Worker].replicas"),
    ("no-pytorch-container", pytorchjob(replicas={"Master": {"template": {"spec": {"containers": [
        {"name": "main", "image": "x"}]}}}}), "spec.pytorchReplicaSpecs[Master].template.spec.containers"),
    ("no-image", pytorchjob(replicas={"Master": {"template": {"spec": {"containers": [{"name": "pytorch"}]}}}}),
     "spec.pytorchReplicaSpecs[Master].template.spec.containers[0].image"),
    ("elastic-without-worker", pytorchjob(replicas={"Master": replica(1)}, elasticPolicy={"minReplicas": 1}),
     "spec.pytorchReplicaSpecs[Worker]"),
    ("both-nproc", pytorchjob(replicas={"Worker": replica(2)}, nprocPerNode="2", elasticPolicy={"nProcPerNode": 2}),
     "spec.elasticPolicy.nProcPerNode"),
    ("restart-policy", pytorchjob(replicas={"Master": replica(1, restartPolicy="Sometimes")}),
     "spec.pytorchReplicaSpecs[Master].restartPolicy"),
    ("clean-pod-policy", pytorchjob(runPolicy={"cleanPodPolicy": "Some"}), "spec.runPolicy.cleanPodPolicy"),
    ("managed-by", pytorchjob(runPolicy={"managedBy": "someone/else"}), "spec.runPolicy.managedBy"),
    ("no-replica-specs", pytorchjob(replicas={}), "spec.pytorchReplicaSpecs"),
    ("name", pytorchjob(name="1-bad"), "metadata.name"),
]


@pytest.mark.parametrize("case,obj,where", BAD, ids=[b[0] for b in BAD])
def test_bad_input_names_the_field(case, obj, where):
    with pytest.raises(PyTorchJobError) as err:
        parse(obj)
    assert err.value.field == where
    assert str(err.value).startswith(f"{where}: ")


def _generic(where: str) -> str:
    """A field path as the CEL messages write it: replica types and indexes become [*] unless the
    rule is about one type."""
    for t in ("Master", "Worker", "Chief"):
        where = where.replace(f"[{t}].template", "[*].template").replace(f"[{t}].restartPolicy", "[*].restartPolicy")
    return where.replace("[Chief]", "").replace("containers[0]", "containers[*]")


@pytest.mark.parametrize("case,obj,where", BAD, ids=[b[0] for b in BAD])
def test_the_crd_has_a_cel_rule_for_each_python_check(case, obj, where):
    """The API server refuses what parse refuses: a CEL rule whose message names the same field."""
    messages = [m for _, _, m in api.CEL_RULES] + [r["message"] for r in api.ROOT_RULES]
    assert any(m.startswith(_generic(where) + ":") for m in messages), (where, messages)


# --- the mapping: names, labels, env, gang --------------------------------------------------------

def test_master_only():
    gang = pj.to_gang(MASTER_ONLY)
    (group,) = gang.groups
    assert (group.replica_type, group.ranked, group.rank_offset) == ("Master", True, 0)
    template = group.job.pod_template
    assert template["metadata"]["labels"] == {
        "training.kubeflow.org/operator-name": "pytorchjob-controller",
        "training.kubeflow.org/job-name": "simple", "training.kubeflow.org/replica-type": "master",
        "training.kubeflow.org/job-role": "master"}
    assert values(env_of(template)) == {
        "PYTHONUNBUFFERED": "1", "MASTER_PORT": "23456", "PET_MASTER_PORT": "23456",
        "MASTER_ADDR": "simple-master-0", "PET_MASTER_ADDR": "simple-master-0", "WORLD_SIZE": "1",
        "PET_NPROC_PER_NODE": "auto", "PET_NNODES": "1"}   # RANK is the pod's (`replica_pod`)
    # v1's OnFailure: the kubelet restarts the container in place (gangctl charges the episodes)
    assert template["spec"]["restartPolicy"] == "OnFailure" and group.job.restart_in_place
    assert (gang.min_member, gang.size) == (1, 1)
    assert [s["metadata"]["name"] for s in gang.services] == ["simple-master-0"]
    assert group.job.runtime_kind == "PyTorchJob" and group.job.num_nodes == 1


def test_master_and_three_workers_ddp():
    gang = pj.to_gang(DDP)
    master, worker = gang.groups
    assert (worker.job.num_nodes, worker.ranked, worker.rank_offset) == (3, True, 1)
    wenv = env_of(worker.job.pod_template)
    assert values(wenv) == {
        "PYTHONUNBUFFERED": "1", "MASTER_PORT": "23456", "PET_MASTER_PORT": "23456", "MASTER_ADDR": "ddp-master-0",
        "PET_MASTER_ADDR": "ddp-master-0", "WORLD_SIZE": "4", "PET_NPROC_PER_NODE": "auto", "PET_NNODES": "4"}
    assert "schedulingGates" not in worker.job.pod_template["spec"] and "schedulingGates" not in master.job.pod_template["spec"]
    assert "training.kubeflow.org/job-role" not in worker.job.pod_template["metadata"]["labels"]
    assert (gang.min_member, gang.size) == (4, 4)
    assert gang.min_resources == {"cpu": Fraction(8), "memory": Fraction(4 * 2**30)}
    names = [s["metadata"]["name"] for s in gang.services]
    assert names == ["ddp-master-0", "ddp-worker-0", "ddp-worker-1", "ddp-worker-2"]
    svc = gang.services[2]
    assert svc["spec"]["clusterIP"] == "None" and svc["spec"]["publishNotReadyAddresses"] is True
    assert svc["spec"]["selector"] == {
        "training.kubeflow.org/operator-name": "pytorchjob-controller", "training.kubeflow.org/job-name": "ddp",
        "training.kubeflow.org/replica-type": "worker", "training.kubeflow.org/replica-index": "1"}
    assert svc["spec"]["ports"] == [{"name": "pytorchjob-port", "port": 23456}]
    assert gang.success_policy == {"operator": "All", "targetReplicatedJobs": ["master"]}


def test_the_user_env_is_kept_and_v1_wins_a_clash():
    m = copy.deepcopy(DDP)
    m["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["containers"][0]["env"] = [
        {"name": "NCCL_DEBUG", "value": "INFO"}, {"name": "WORLD_SIZE", "value": "99"}]
    env = env_of(pj.to_gang(m).groups[0].job.pod_template)
    assert env["NCCL_DEBUG"]["value"] == "INFO" and env["WORLD_SIZE"]["value"] == "4"
    names = [e["name"] for e in pj.to_gang(m).groups[0].job.pod_template["spec"]["containers"][0]["env"]]
    assert names.count("WORLD_SIZE") == 1 and names[0] == "NCCL_DEBUG"


OWNER = {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "name": "ddp", "uid": "u-1", "controller": True}


def pod(job: str, rtype: str, index: int, *, phase: str = "Running", **fields) -> dict:
    """Pod `index` of the `rtype` replicas of PyTorchJob `job`, as gangctl makes it."""
    return objects.pytorchjob_pod(pytorchjob(job), rtype, index, phase=phase, **fields)


def made(obj: dict, rtype: str, index: int) -> dict:
    """Pod `index` of the `rtype` replicas as gangctl makes it for `obj`."""
    gang = pj.to_gang(obj)
    group = next(g for g in gang.groups if g.replica_type.lower() == rtype)
    return replica_pod(group, index, OWNER, None, "default-scheduler")


def test_a_pod_has_v1s_name_labels_and_rank_index_plus_one():
    pod = made(DDP, "worker", 2)
    assert pod["metadata"]["name"] == "ddp-worker-2" and pod["metadata"]["ownerReferences"] == [OWNER]
    assert {k: v for k, v in pod["metadata"]["labels"].items() if k.startswith("training.kubeflow.org/")} == {
        "training.kubeflow.org/operator-name": "pytorchjob-controller", "training.kubeflow.org/job-name": "ddp",
        "training.kubeflow.org/replica-type": "worker", "training.kubeflow.org/replica-index": "2"}
    env = values(env_of(pod))
    assert (env["RANK"], env["PET_NODE_RANK"]) == ("3", "3") and "schedulingGates" not in pod["spec"]
    assert values(env_of(made(DDP, "master", 0)))["RANK"] == "0"
    assert made(DDP, "master", 0)["metadata"]["labels"]["training.kubeflow.org/job-role"] == "master"


def test_without_a_master_worker_zero_has_the_master_role():
    assert made(ELASTIC, "worker", 0)["metadata"]["labels"]["training.kubeflow.org/job-role"] == "master"
    assert "training.kubeflow.org/job-role" not in made(ELASTIC, "worker", 1)["metadata"]["labels"]
    assert "RANK" not in env_of(made(ELASTIC, "worker", 1)), "v1 sets no RANK without a Master"


def test_elastic_two_to_four():
    gang = pj.to_gang(ELASTIC)
    (worker,) = gang.groups
    assert not worker.ranked and worker.rank_offset == 0
    env = values(env_of(worker.job.pod_template))
    assert env == {"PYTHONUNBUFFERED": "1", "PET_NPROC_PER_NODE": "auto", "PET_RDZV_ENDPOINT": "elastic-rdzv-pt:29400",
                   "PET_RDZV_BACKEND": "c10d", "PET_NNODES": "2:4", "PET_MAX_RESTARTS": "10"}
    assert gang.rdzv_store
    # v1 #1571: the PodGroup asked for all 4; the floor is minReplicas.
    assert (gang.min_member, gang.size) == (2, 4)
    assert gang.gang().min_resources == {"cpu": Fraction(4), "memory": Fraction(2 * 2**30)}
    assert worker.job.min_nodes == 2 and worker.job.elastic == {"minNodes": 2, "maxNodes": 4, "maxRestarts": 10}
    assert gang.success_policy == {"operator": "All", "targetReplicatedJobs": ["worker"]}


def test_elastic_with_rdzv_host_and_min_available():
    m = copy.deepcopy(ELASTIC)
    m["spec"]["elasticPolicy"].update(rdzvHost="etcd.infra", rdzvId="run-7", rdzvBackend="etcd-v2",
                                      rdzvConf=[{"key": "timeout", "value": "900"}, {"key": "a", "value": "b"}])
    m["spec"]["runPolicy"] = {"schedulingPolicy": {"minAvailable": 3}}
    gang = pj.to_gang(m)
    env = values(env_of(gang.groups[0].job.pod_template))
    assert env["PET_RDZV_ENDPOINT"] == "etcd.infra:23456"   # v1: the worker's pytorchjob-port
    assert (env["PET_RDZV_BACKEND"], env["PET_RDZV_ID"], env["PET_RDZV_CONF"]) == ("etcd-v2", "run-7", "timeout=900,a=b")
    assert not gang.rdzv_store
    assert gang.min_member == 3
    m["spec"]["runPolicy"]["schedulingPolicy"]["minAvailable"] = 5
    with pytest.raises(pj.PyTorchJobMappingError, match=r"^spec\.runPolicy\.schedulingPolicy\.minAvailable"):
        pj.to_gang(m)


def test_a_name_too_long_for_its_replica_names_is_refused():
    name = "n" * 55          # valid for v1's webhook; "<name>-worker-0" has 64 characters
    with pytest.raises(pj.PyTorchJobMappingError, match=r"^metadata\.name: .* 64 characters"):
        pj.to_gang(pytorchjob(name, {"Worker": replica(1)}))
    pj.to_gang(pytorchjob("n" * 54, {"Worker": replica(1)}))


def test_backends():
    m = copy.deepcopy(DDP)
    m["spec"]["runPolicy"] = {"schedulingPolicy": {"queue": "research", "priorityClass": "high",
                                                   "scheduleTimeoutSeconds": 120}}
    assert (pj.to_gang(m).gang_backend, pj.to_gang(m).gang_settings) == (None, {})
    vol = pj.to_gang(m, default_backend="volcano")
    assert vol.gang_settings == {"queue": "research", "priorityClassName": "high"}
    kai = pj.to_gang(m, default_backend="kai")
    assert (kai.gang_backend, kai.gang_settings) == ("kai", {"queue": "research", "priorityClassName": "high"})
    cos = pj.to_gang(m, default_backend="coscheduling")
    assert cos.gang().schedule_timeout_seconds == 120
    # Kueue admits a PyTorchJob that names a LocalQueue, Master and Workers as one Workload; under
    # Kueue as the cluster's gang scheduler one that names none would run unadmitted: refused
    with pytest.raises(pj.PyTorchJobMappingError, match=r"^metadata\.labels\[kueue\.x-k8s\.io/queue-name\]: .*"
                                                        r"only when it names a LocalQueue"):
        pj.to_gang(m, default_backend="kueue")
    m["metadata"]["labels"] = {"kueue.x-k8s.io/queue-name": "lq"}
    kq = pj.to_gang(m, default_backend="volcano")
    assert (kq.gang_backend, kq.gang_settings) == ("kueue", {"queueName": "lq", "priorityClassName": "high"})
    assert [g.replica_type for g in kq.groups] == ["Master", "Worker"]


# --- failures: restart policies and backoffLimit on the restart budget ---------------------------

def _fail(job_reason: str, replicated_job: str, gang: pj.PyTorchGang, used: int) -> failure.Decision:
    f = failure.Failure(failure.USER, job_reason, "", "p", 1)
    return failure.decide(gang.failure_policy, f, failure.Restarts(user=used), replicated_job)


def test_on_failure_restarts_up_to_backoff_limit():
    m = copy.deepcopy(DDP)
    m["spec"]["runPolicy"] = {"backoffLimit": 2}
    gang = pj.to_gang(m)
    assert [_fail("BackoffLimitExceeded", "worker", gang, used).action for used in (0, 1, 2)] == [
        "Restart", "Restart", "Fail"]
    assert _fail("BackoffLimitExceeded", "worker", gang, 2).reason == failure.REASON_BUDGET
    unlimited = pj.to_gang(DDP)
    assert unlimited.failure_policy.max_restarts == pj.UNLIMITED_RESTARTS
    infra = failure.Failure(failure.INFRASTRUCTURE, "BackoffLimitExceeded", "", "p", None, "node lost")
    assert failure.decide(gang.failure_policy, infra, failure.Restarts(user=2), "worker").charged is False


def test_never_fails_at_once_and_exit_code_fails_only_below_128():
    m = pytorchjob("x", {"Master": replica(1, restartPolicy="Never"), "Worker": replica(2, restartPolicy="ExitCode")})
    gang = pj.to_gang(m)
    assert _fail("PodFailed", "master", gang, 0).action == "Fail"
    # ExitCode: a pod failing with 1-127 is judged with reason PodFailurePolicy and fails the job...
    worker = gang.groups[1].job
    assert pj.PERMANENT_EXIT_CODES == tuple(range(1, 128))
    assert _fail("PodFailurePolicy", "worker", gang, 0).action == "Fail"
    # ...and a signal (137, 143) restarts the gang.
    assert _fail("PodFailed", "worker", gang, 0).action == "Restart"
    assert worker.failure_policy["rules"][-1] == {"name": "worker-exit-code", "action": "FailJobSet",
                                                  "onJobFailureReasons": ["PodFailurePolicy"],
                                                  "targetReplicatedJobs": ["worker"]}


# --- success rule, replica statuses, conditions ----------------------------------------------------

def counts(**by_type: tuple[int, int, int]) -> dict[str, ReplicaCounts]:
    return {t: ReplicaCounts(*c) for t, c in by_type.items()}


def test_success_rule():
    ddp, elastic, workers = parse(DDP), parse(ELASTIC), parse(pytorchjob("w", {"Worker": replica(3)}))
    assert pj.succeeded(ddp, counts(Master=(0, 1, 0), Worker=(3, 0, 0)))
    assert not pj.succeeded(ddp, counts(Master=(1, 0, 0), Worker=(0, 3, 0)))
    assert pj.succeeded(workers, counts(Worker=(0, 3, 0)))
    assert not pj.succeeded(workers, counts(Worker=(2, 1, 0)))
    assert pj.succeeded(elastic, counts(Worker=(2, 1, 0)))
    assert not pj.succeeded(elastic, counts(Worker=(4, 0, 0)))


def test_count_pods_counts_a_deleted_running_pod_as_failed():
    job = parse(DDP)
    pods = [pod("ddp", "master", 0), pod("ddp", "worker", 0, phase="Succeeded"), pod("ddp", "worker", 1, phase="Failed"),
            pod("ddp", "worker", 2, deleted_at="2026-11-23T11:00:00Z"), pod("ddp", "worker", 3, phase="Pending"),
            pod("other", "worker", 0)]
    assert pj.count_pods(job, pods) == {"Master": ReplicaCounts(1, 0, 0), "Worker": ReplicaCounts(0, 1, 2)}
    statuses = pj.replica_statuses(job, pj.count_pods(job, pods))
    assert statuses["Master"] == {"active": 1, "selector": "training.kubeflow.org/job-name=ddp,"
                                  "training.kubeflow.org/operator-name=pytorchjob-controller,"
                                  "training.kubeflow.org/replica-type=master"}
    assert statuses["Worker"]["succeeded"] == 1 and statuses["Worker"]["failed"] == 2 and "active" not in statuses["Worker"]


def conds(status: dict) -> dict[str, tuple[str, str]]:
    return {c["type"]: (c["status"], c["reason"]) for c in status["conditions"]}


def test_conditions_through_a_run():
    job = parse(DDP)
    s = pj.next_status(None, job, counts(Master=(0, 0, 0), Worker=(0, 0, 0)), NOW)
    assert conds(s) == {"Created": ("True", "PyTorchJobCreated")} and s["startTime"] == "2026-11-23T12:00:00Z"
    s = pj.next_status(s, job, counts(Master=(1, 0, 0), Worker=(3, 0, 0)), NOW + timedelta(seconds=5))
    assert conds(s)["Running"] == ("True", "PyTorchJobRunning")
    running_since = s["conditions"][-1]["lastTransitionTime"]
    again = pj.next_status(s, job, counts(Master=(1, 0, 0), Worker=(3, 0, 0)), NOW + timedelta(seconds=9))
    assert again == s and again["conditions"][-1]["lastTransitionTime"] == running_since
    s = pj.next_status(s, job, counts(Master=(0, 0, 0), Worker=(2, 0, 1)), NOW + timedelta(seconds=20),
                       restarting="gang restart 1/3: pod ddp-worker-1 exited with code 1")
    assert "Running" not in conds(s) and conds(s)["Restarting"] == ("True", "PyTorchJobRestarting")
    s = pj.next_status(s, job, counts(Master=(1, 0, 0), Worker=(3, 0, 0)), NOW + timedelta(seconds=40))
    assert "Restarting" not in conds(s) and conds(s)["Running"] == ("True", "PyTorchJobRunning")
    s = pj.next_status(s, job, counts(Master=(0, 1, 0), Worker=(3, 0, 0)), NOW + timedelta(seconds=60))
    assert conds(s)["Succeeded"] == ("True", "PyTorchJobSucceeded") and conds(s)["Running"][0] == "False"
    assert s["completionTime"] == "2026-11-23T12:01:00Z"
    assert s["replicaStatuses"]["Master"]["succeeded"] == 1


def test_failed_is_final_and_turns_running_false():
    job = parse(DDP)
    s = pj.next_status(None, job, counts(Master=(1, 0, 0), Worker=(3, 0, 0)), NOW)
    s = pj.next_status(s, job, counts(Master=(1, 0, 0), Worker=(2, 0, 1)), NOW + timedelta(seconds=1),
                       failed="restart budget exhausted (2/2)")
    assert conds(s)["Failed"] == ("True", "PyTorchJobFailed") and conds(s)["Running"][0] == "False"
    later = pj.next_status(s, job, counts(Master=(0, 1, 0), Worker=(0, 3, 0)), NOW + timedelta(seconds=30))
    assert later == s


def test_active_deadline_fails_the_job():
    m = copy.deepcopy(DDP)
    m["spec"]["runPolicy"] = {"activeDeadlineSeconds": 60}
    job = parse(m)
    s = pj.next_status(None, job, counts(Master=(1, 0, 0), Worker=(3, 0, 0)), NOW)
    assert "Failed" not in conds(pj.next_status(s, job, counts(Master=(1, 0, 0)), NOW + timedelta(seconds=59)))
    assert conds(pj.next_status(s, job, counts(Master=(1, 0, 0)), NOW + timedelta(seconds=60)))["Failed"][0] == "True"


def test_suspend_and_resume():
    m = copy.deepcopy(DDP)
    s = pj.next_status(None, parse(m), counts(Master=(1, 0, 0), Worker=(3, 0, 0)), NOW)
    m["spec"]["runPolicy"] = {"suspend": True}
    s = pj.next_status(s, parse(m), counts(), NOW + timedelta(seconds=1))
    assert conds(s)["Suspended"] == ("True", "PyTorchJobSuspended") and conds(s)["Running"] == ("False", "PyTorchJobSuspended")
    m["spec"]["runPolicy"] = {"suspend": False}
    s = pj.next_status(s, parse(m), counts(Master=(1, 0, 0)), NOW + timedelta(seconds=2))
    assert conds(s)["Suspended"] == ("False", "PyTorchJobResumed") and conds(s)["Running"] == ("True", "PyTorchJobRunning")


def test_ttl_and_clean_pod_policy():
    m = copy.deepcopy(DDP)
    m["spec"]["runPolicy"] = {"ttlSecondsAfterFinished": 100, "cleanPodPolicy": "Running"}
    job = parse(m)
    done = {"completionTime": "2026-11-23T12:00:00Z"}
    assert pj.ttl_remaining(job, done, NOW + timedelta(seconds=40)) == 60
    assert pj.ttl_remaining(job, done, NOW + timedelta(seconds=400)) == 0
    assert pj.ttl_remaining(job, {}, NOW) is None and pj.ttl_remaining(parse(DDP), done, NOW) is None
    assert [pj.cleanup(parse(pytorchjob(runPolicy={"cleanPodPolicy": p}))) for p in ("None", "Running", "All")] == [
        "keep", "running", "delete"]
    assert pj.cleanup(job) == "running" and pj.cleanup(parse(DDP)) == "keep"


# --- the CRD --------------------------------------------------------------------------------------

CRD_PATH = ROOT / api.DEFAULT_OUT / api.CRD_FILE


def test_committed_crd_is_current():
    assert api.check(CRD_PATH.read_text()) == []
    crd = yaml.safe_load(CRD_PATH.read_text())
    (version,) = crd["spec"]["versions"]
    assert (crd["metadata"]["name"], version["name"]) == ("pytorchjobs.kubeflow.org", "v1")
    assert version["subresources"]["scale"] == {
        "labelSelectorPath": ".status.replicaStatuses.Worker.selector",
        "specReplicasPath": ".spec.pytorchReplicaSpecs.Worker.replicas",
        "statusReplicasPath": ".status.replicaStatuses.Worker.active"}
    spec = version["schema"]["openAPIV3Schema"]["properties"]["spec"]
    assert set(spec["properties"]) == {"elasticPolicy", "nprocPerNode", "pytorchReplicaSpecs", "runPolicy"}
    assert set(spec["properties"]["runPolicy"]["properties"]["schedulingPolicy"]["properties"]) == {
        "minAvailable", "queue", "minResources", "priorityClass", "scheduleTimeoutSeconds"}


def test_a_hand_edit_of_a_rule_is_caught():
    text = CRD_PATH.read_text().replace("self.minReplicas <= self.maxReplicas", "self.minReplicas < self.maxReplicas")
    assert text != CRD_PATH.read_text()
    assert api.check(text) != []
    assert api.check(None) != []


def test_cel_messages_name_a_field():
    for path, rule, message in api.CEL_RULES:
        assert message.split(":")[0].startswith(("spec.", "metadata.")), message
        field = message.split(":")[0]
        assert "self" in rule
        named = [p for p in path if p != "*"]
        assert all(p in field for p in named), (path, message)


@pytest.fixture(scope="module")
def upstream() -> Path:
    """The pinned Training Operator module, downloaded into the Go module cache if it is not there."""
    from gangctl.cluster.local import go_module_dir
    return go_module_dir(api.UPSTREAM_MODULE, api.UPSTREAM_VERSION, ROOT / "integrations" / "training-operator")


def test_committed_crd_is_generated_from_the_pinned_module(upstream):
    upstream = yaml.safe_load((upstream / api.UPSTREAM_CRD).read_text())
    assert api.check(CRD_PATH.read_text(), upstream) == []
    # The upstream schema is kept whole: every property path upstream has is in ours.
    ours = yaml.safe_load(CRD_PATH.read_text())

    def paths(node, prefix=()):
        if isinstance(node, dict):
            for k, v in node.items():
                if k not in ("description", "x-kubernetes-validations"):
                    yield prefix + (k,)
                    yield from paths(v, prefix + (k,))

    assert set(paths(upstream["spec"]["versions"][0]["schema"])) <= set(paths(ours["spec"]["versions"][0]["schema"]))
