"""gangctl's own topology placement inside the decision (issue 36 item 3): a gang whose backend has no
placement of its own is pinned by node affinity to the domain `placement.choose` picks, before its
pods exist; it waits naming the best domain, or fails with TopologyUnsatisfiable; a backend with a
mechanism gets the intent on its own object instead."""
from __future__ import annotations

import dataclasses
from datetime import datetime, timezone

import pytest

from gangctl.api.resources import JOBS, PODS
from gangctl.plugins.registry import BACKENDS
from gangctl.model.topology import KUEUE_REQUIRED, KUEUE_PREFERRED, Topology
from gangctl.policy import status as st
from gangctl.policy.decide import Apply, ClusterView, Create, Snapshot, WriteStatus, decide
from gangctl.model.room import NodeRoom
from gangctl.policy import placement
from gangctl.policy.placement import PLACEMENT_ANNOTATION, UNSATISFIABLE, WAITING
from gangctl.sim import objects

NOW = datetime(2026, 11, 28, 12, 0, tzinfo=timezone.utc)
BLOCK, RACK, HOST = "topology.gangctl.io/block", "topology.gangctl.io/rack", "kubernetes.io/hostname"
TOPOLOGY = Topology.model_validate({"name": "gpus", "levels": [{"name": "block", "nodeLabel": BLOCK},
                                                               {"name": "rack", "nodeLabel": RACK},
                                                               {"name": "host", "nodeLabel": HOST}]})
GPU = "nvidia.com/gpu"


def runtime(annotations: dict[str, str], gang: dict | None = None) -> dict:
    rt = objects.runtime(gang=gang)
    template = rt["spec"]["template"]["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]
    template.setdefault("metadata", {}).setdefault("annotations", {}).update(annotations)
    return rt


def trainjob(nodes: int = 3) -> dict:
    return objects.trainjob(uid="tj-1", metadata={"resourceVersion": "7", "generation": 1}, status={},
                            trainer={"numNodes": nodes, "resourcesPerNode": {"limits": {GPU: "8"}}})


def cluster(racks: int = 2, hosts: int = 4, busy: tuple[str, ...] = ()) -> ClusterView:
    """`racks` racks of `hosts` 8-GPU hosts; each host in `busy` runs a pod that takes all 8."""
    nodes, pods = [], []
    for r in range(racks):
        for h in range(hosts):
            name = f"r{r}-h{h}"
            nodes.append(objects.node(name, allocatable={GPU: "8", "cpu": "64", "memory": "512Gi", "pods": "110"},
                                      labels={BLOCK: "b0", RACK: f"r{r}", HOST: name}))
            if name in busy:
                pods.append({"metadata": {"name": f"other-{name}", "namespace": "other"},
                             "spec": {"nodeName": name, "containers": [{"name": "c", "resources": {
                                 "requests": {GPU: "8"}}}]}, "status": {"phase": "Running"}})
    return ClusterView(tuple(nodes), tuple(pods))


def snap(rt: dict, *, view: ClusterView | None = None, node_job: dict | None = None, topology=TOPOLOGY,
         groups: dict | None = None) -> Snapshot:
    return Snapshot("team-a/llm", NOW, trainjob(), runtime=rt, groups=groups or {"coscheduling": None},
                    topology=topology, cluster=view, node_job=node_job)


def applied_job(plan) -> dict:
    return next(s.obj for s in plan.steps if isinstance(s, Apply) and s.resource == JOBS)


def node_terms(job: dict) -> list[dict]:
    affinity = job["spec"]["template"]["spec"].get("affinity") or {}
    return affinity.get("nodeAffinity", {}).get("requiredDuringSchedulingIgnoredDuringExecution", {}).get(
        "nodeSelectorTerms", [])


def test_a_required_rack_asks_for_the_nodes_then_pins_the_gang_to_the_rack_with_room():
    rt = runtime({KUEUE_REQUIRED: RACK})
    first = decide(snap(rt))
    assert first.wants_nodes and not first.steps, "the nodes are listed before anything is created"
    plan = decide(snap(rt, view=cluster(busy=("r0-h0", "r0-h1"))))   # r0 has room for 2 of 3 pods, r1 for 4
    job = applied_job(plan)
    assert node_terms(job) == [{"matchExpressions": [{"key": RACK, "operator": "In", "values": ["r1"]}]}]
    assert job["spec"]["template"]["metadata"]["annotations"][PLACEMENT_ANNOTATION] == f"{RACK}=r1"


def test_an_existing_job_keeps_its_domain_whatever_the_nodes_say_now():
    rt = runtime({KUEUE_REQUIRED: RACK})
    job = applied_job(decide(snap(rt, view=cluster())))          # placed on r0 (the first by name)
    assert node_terms(job)[0]["matchExpressions"][0]["values"] == ["r0"]
    again = decide(snap(rt, node_job=job, view=None))
    assert not again.wants_nodes
    assert not [s for s in again.steps if isinstance(s, Apply) and s.resource == JOBS], "unchanged Job not reapplied"


def test_a_preferred_rack_is_a_preferred_node_affinity():
    job = applied_job(decide(snap(runtime({KUEUE_PREFERRED: RACK}), view=cluster())))
    preferred = job["spec"]["template"]["spec"]["affinity"]["nodeAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
    assert preferred == [{"weight": 100, "preference": {"matchExpressions": [
        {"key": RACK, "operator": "In", "values": ["r0"]}]}}]
    assert not node_terms(job)


def preferred_terms(job: dict) -> list[dict]:
    affinity = job["spec"]["template"]["spec"].get("affinity") or {}
    return affinity.get("nodeAffinity", {}).get("preferredDuringSchedulingIgnoredDuringExecution", [])


def test_a_gang_that_asks_for_no_level_is_packed_into_the_fullest_rack_that_holds_it():
    """As Kueue's TAS places a pod set without a topology request: the racks left whole are there for
    the next gang that requires one. Preferred, so the scheduler may still go elsewhere."""
    rt = runtime({})
    assert decide(snap(rt)).wants_nodes, "the nodes are listed before its Job is made"
    job = applied_job(decide(snap(rt, view=cluster(busy=("r1-h0",)))))   # room for 4 in r0, for 3 in r1
    assert preferred_terms(job) == [{"weight": 100, "preference": {"matchExpressions": [
        {"key": RACK, "operator": "In", "values": ["r1"]}]}}]
    assert not node_terms(job)
    assert job["spec"]["template"]["metadata"]["annotations"][PLACEMENT_ANNOTATION] == f"{RACK}=r1"
    again = decide(snap(rt, node_job={**job, "status": {"startTime": "2026-11-28T11:59:00Z"}}, view=None))
    assert not again.wants_nodes, "a Job whose pods started keeps its template"


def test_a_gang_that_asks_for_no_level_never_waits_for_a_domain():
    every_host = tuple(f"r{r}-h{h}" for r in range(2) for h in range(4))
    plan = decide(snap(runtime({}), view=cluster(busy=every_host)))
    job = applied_job(plan)
    assert not preferred_terms(job) and not node_terms(job)
    assert PLACEMENT_ANNOTATION not in (job["spec"]["template"]["metadata"].get("annotations") or {})
    assert st.gang_state(plan.status).get("reason") != WAITING


@pytest.mark.parametrize("backend, packs", [("native", True), ("kueue", False), ("volcano", False), ("kai", False)])
def test_gangctl_packs_a_gang_that_asks_for_nothing_only_where_its_scheduler_would_scatter_it(backend, packs):
    """Kueue's TAS, Volcano and KAI place such a gang themselves; kube-scheduler's native gangs spread it."""
    rt = runtime({}, gang=GANG_POLICIES[backend])
    assert decide(snap(rt, groups={backend: None})).wants_nodes is packs
    plan = decide(snap(rt, view=cluster(busy=("r1-h0",)), groups={backend: None}))
    jobs = [s.obj for s in plan.steps if isinstance(s, Apply) and s.resource == JOBS]
    assert [bool(preferred_terms(job)) for job in jobs] == [packs] * len(jobs)
    assert jobs or not packs, "gangctl makes the Job it packed"


def test_no_rack_with_room_now_waits_naming_the_best_rack_and_creates_nothing():
    busy = ("r0-h0", "r0-h1", "r1-h0", "r1-h1", "r1-h2")
    plan = decide(snap(runtime({KUEUE_REQUIRED: RACK}), view=cluster(busy=busy)))
    gang = st.gang_state(plan.status)
    assert gang["reason"] == WAITING, gang
    assert "rack r0: 2 of 4 hosts free" in gang["message"], gang["message"]
    assert not [s for s in plan.steps if isinstance(s, Apply)], "nothing is created while no rack has room"
    assert plan.requeue_after is not None


# Each backend's podGroupPolicy: the scheduler that places the gang (gangctl itself on coscheduling).
GANG_POLICIES = {"coscheduling": None, "kueue": {"kueue": {}}, "volcano": {"volcano": {"queue": "team-a"}},
                 "kai": {"kai": {"queue": "team-a"}}, "native": {"native": {}}}


@pytest.mark.parametrize("backend", list(GANG_POLICIES))
def test_a_rack_smaller_than_the_floor_fails_at_once_with_the_numbers(backend):
    """Whoever places the gang: waiting for a rack that can never hold it would be forever."""
    rt = runtime({KUEUE_REQUIRED: RACK}, gang=GANG_POLICIES[backend])
    assert decide(snap(rt, groups={backend: None})).wants_nodes, "the nodes are listed before its Job is made"
    plan = decide(snap(rt, view=cluster(hosts=2), groups={backend: None}))   # 2 hosts per rack, 3 pods
    assert not [s for s in plan.steps if isinstance(s, Apply)], "nothing is created for a gang that can never run"
    failed = next(c for c in plan.status["conditions"] if c["type"] == "Failed")
    assert failed["reason"] == UNSATISFIABLE
    assert "no rack can ever hold the gang's floor (3 pods of" in failed["message"]
    assert "2 hosts with room for 2 pods" in failed["message"]


def test_a_level_the_topology_lacks_fails_naming_the_annotation():
    plan = decide(snap(runtime({KUEUE_REQUIRED: "example.com/row"}), view=cluster()))
    failed = next(c for c in plan.status["conditions"] if c["type"] == "Failed")
    assert failed["reason"] == "InvalidPlacement"
    assert KUEUE_REQUIRED in failed["message"] and "example.com/row" in failed["message"]


def test_without_a_cluster_topology_nothing_is_pinned():
    plan = decide(snap(runtime({KUEUE_REQUIRED: RACK}), topology=None))
    assert not plan.wants_nodes
    assert not node_terms(applied_job(plan))


def test_volcano_places_the_gang_itself_from_its_podgroup():
    rt = runtime({KUEUE_REQUIRED: RACK}, gang={"volcano": {"queue": "team-a"}})
    plan = decide(snap(rt, view=cluster(), groups={"volcano": None}))
    group = next(s.obj for s in plan.steps if isinstance(s, Apply) and s.resource == BACKENDS["volcano"].group_resource)
    assert group["spec"]["networkTopology"] == {"mode": "hard", "highestTierAllowed": 1}
    assert not node_terms(applied_job(plan))


def test_a_gang_pinned_but_not_yet_bound_keeps_its_room_from_the_next_choice():
    rt = runtime({KUEUE_REQUIRED: RACK})
    first = applied_job(decide(snap(rt, view=cluster())))          # r0; its pods not created yet
    first = {**first, "metadata": {**first["metadata"], "uid": "job-a"}}
    view = cluster()
    view = ClusterView(view.nodes, view.pods, tuple(placement.pinned_gangs([first], [])))
    assert view.reserved == (placement.Reserved(f"{RACK}=r0", 3, {GPU: 8}),)
    second = applied_job(decide(snap(rt, view=view)))
    assert node_terms(second)[0]["matchExpressions"][0]["values"] == ["r1"], "r0 has room for 1 pod, not 3"


def test_bound_pods_and_finished_or_suspended_jobs_reserve_nothing():
    job = applied_job(decide(snap(runtime({KUEUE_REQUIRED: RACK}), view=cluster())))
    job = {**job, "metadata": {**job["metadata"], "uid": "job-a"}}
    pods = [{"metadata": {"name": f"p{i}", "ownerReferences": [{"uid": "job-a"}]}, "spec": {"nodeName": f"r0-h{i}"},
             "status": {"phase": "Running"}} for i in range(2)]
    assert [r.pods for r in placement.pinned_gangs([job], pods)] == [1]
    done = {**job, "status": {"conditions": [{"type": "Complete", "status": "True"}]}}
    held = {**job, "spec": {**job["spec"], "suspend": True}}
    assert placement.pinned_gangs([done, held], []) == []


def test_reserve_fills_the_domains_nodes_in_name_order():
    rooms = [NodeRoom(f"n{i}", {GPU: 8}, {RACK: "r0"}, {GPU: 8}) for i in range(3)]
    left = placement.reserve(rooms, [placement.Reserved(f"{RACK}=r0", 3, {GPU: 4})])
    assert [r.free[GPU] for r in left] == [0, 4, 8]
    assert placement.reserve(rooms, [placement.Reserved(f"{RACK}=r9", 3, {GPU: 4})]) == rooms


def test_a_gang_over_two_racks_reserves_and_pins_both():
    rooms = [NodeRoom(f"n{i}", {GPU: 8}, {RACK: f"r{i}"}, {GPU: 8}) for i in range(3)]
    left = placement.reserve(rooms, [placement.Reserved(f"{RACK}=r0,r2", 2, {GPU: 8})])
    assert [r.free[GPU] for r in left] == [0, 8, 0]
    template = placement.pinned({"spec": {}}, f"{RACK}=r0,r2", required=False)
    (term,) = template["spec"]["affinity"]["nodeAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
    assert term["preference"]["matchExpressions"] == [{"key": RACK, "operator": "In", "values": ["r0", "r2"]}]
    assert placement.mark_of(template) == f"{RACK}=r0,r2"


def test_a_job_created_while_held_by_quota_is_pinned_when_admitted():
    rt = runtime({KUEUE_REQUIRED: RACK})
    held = applied_job(decide(snap(rt, view=cluster())))
    held = {**held, "spec": {**held["spec"], "suspend": True}}
    held["spec"]["template"] = objects.runtime()["spec"]["template"]["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]
    plan = decide(snap(rt, node_job=held, view=cluster(busy=("r0-h0", "r0-h1"))))
    assert node_terms(applied_job(plan))[0]["matchExpressions"][0]["values"] == ["r1"]
    started = {**held, "status": {"startTime": "2026-11-28T11:00:00Z"}}
    plan = decide(snap(rt, node_job=started, view=None))
    assert not plan.wants_nodes, "a Job whose pods started keeps its template: nothing to choose"


def test_explain_shows_each_racks_room_and_the_rack_that_would_hold_the_gang():
    from gangctl.commands.explain import with_domains
    from gangctl.model.gang import size_gang
    from gangctl.model.topology import PlacementIntent
    from gangctl.policy.explain import Diagnosis, node_rooms

    view = cluster(busy=("r0-h0", "r0-h1", "r1-h0"))
    rooms = node_rooms(view.nodes, view.pods)
    gang = size_gang(3, {GPU: 8})
    d = with_domains(Diagnosis(WAITING, "waiting"), PlacementIntent(required="rack"), TOPOLOGY, rooms, gang, False)
    assert d.level == "rack" and d.next_domain == "rack r1"
    assert [(r.domain, r.hosts, r.hosts_with_room, r.room, r.gpus_free) for r in d.domains] == [
        ("r0", 4, 2, 2, 16), ("r1", 4, 3, 3, 24)]
    assert with_domains(Diagnosis(WAITING, "waiting"), None, TOPOLOGY, rooms, gang, False).domains == (), "no intent, no domains"
    assert with_domains(Diagnosis(WAITING, "waiting"), PlacementIntent(required="rack"), TOPOLOGY, rooms, gang,
                        True).domains == (), "a finished job waits for nothing"


def test_explain_says_a_gang_waits_for_its_rack_when_only_the_whole_cluster_has_room():
    """A backend that places by topology itself (Kueue, KAI, native) leaves a gang waiting although the
    nodes have room in total: explain names the required level and the best domain, not 'next try'."""
    from gangctl.commands.explain import with_domains
    from gangctl.model.gang import size_gang
    from gangctl.model.topology import PlacementIntent
    from gangctl.policy.explain import CAPACITY_AVAILABLE, Diagnosis, node_rooms

    view = cluster(busy=("r0-h0", "r0-h1", "r0-h2", "r1-h0", "r1-h1"))   # r0: 1 host free, r1: 2
    rooms = node_rooms(view.nodes, view.pods)
    gang = size_gang(3, {GPU: 8})
    room = Diagnosis(CAPACITY_AVAILABLE, "the scheduler takes the gang on its next try", 3, 3)
    d = with_domains(room, PlacementIntent(required="rack"), TOPOLOGY, rooms, gang, False)
    assert d.reason == WAITING and d.next_domain == ""
    assert "best rack r1: 2 of 4 hosts free, room for 2 of 3 pods" in d.message, d.message
    assert "room for 3 pod(s) in total, but the gang requires one rack" in d.message, d.message
    preferred = with_domains(room, PlacementIntent(preferred="rack"), TOPOLOGY, rooms, gang, False)
    assert preferred.reason == CAPACITY_AVAILABLE, "a preferred rack does not hold the gang back"
    fits = with_domains(room, PlacementIntent(required="rack"), TOPOLOGY, node_rooms(cluster().nodes, []), gang, False)
    assert fits.reason == CAPACITY_AVAILABLE and fits.next_domain == "rack r0"


def test_a_gang_refused_in_its_rack_past_the_schedule_timeout_is_placed_again():
    from datetime import timedelta

    from gangctl.policy.decide import Delete, Event

    rt = runtime({KUEUE_REQUIRED: RACK})          # the shipped runtime: scheduleTimeoutSeconds 120
    job = applied_job(decide(snap(rt, view=cluster())))
    job = {**job, "metadata": {**job["metadata"], "uid": "job-a", "creationTimestamp": st.timestamp(NOW)},
           "status": {"startTime": st.timestamp(NOW)}}
    unschedulable = [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable"}]
    pods = tuple(objects.pod(f"llm-node-0-{i}", namespace="team-a", index=i, owners=[{"uid": "job-a"}],
                             phase="Pending", conditions=unschedulable) for i in range(3))

    def at(seconds: float) -> Snapshot:
        return Snapshot("team-a/llm", NOW + timedelta(seconds=seconds), trainjob(), runtime=rt,
                        groups={"coscheduling": None}, topology=TOPOLOGY, node_job=job, pods=pods)
    assert not decide(at(60)).of(Delete), "still within the schedule timeout"
    plan = decide(at(121))
    assert [(d.name, d.uid) for d in plan.of(Delete)] == [("llm-node-0", "job-a")]
    assert [e.reason for e in plan.of(Event)] == ["PlacingAgain"]
    assert f"refused in {RACK}=r0 for 121s" in plan.of(Event)[0].message
    bound = tuple({**p, "spec": {**p["spec"], "nodeName": "r0-h0"}} if i == 0 else p for i, p in enumerate(pods))
    assert not decide(dataclasses.replace(at(121), pods=bound)).of(Delete), "a gang being bound is left alone"
    # Held suspended (by the quota gate, or waiting for a domain) for longer than the timeout, then
    # resumed: the Job controller resets startTime, and the timeout counts from there (seen in
    # benchmarks/topology_backends.py: gangs deleted as they bound, right after their resume).
    resumed = {**job, "status": {"startTime": st.timestamp(NOW + timedelta(seconds=100))}}
    assert not decide(dataclasses.replace(at(121), node_job=resumed)).of(Delete), "resumed 21 s ago"
    assert decide(dataclasses.replace(at(221), node_job=resumed)).of(Delete), "refused 121 s after its resume"
    never = {**job, "status": {}}
    assert not decide(dataclasses.replace(at(500), node_job=never)).of(Delete), "a Job not started yet"


# --- PyTorchJobs: the same annotations on a replica template, the gang placed as one

def pytorchjob(master: dict | None = None, worker: dict | None = None, workers: int = 3) -> dict:
    def replica(replicas: int, annotations: dict | None) -> dict:
        out = objects.replica(replicas, image="x", command=["python", "train.py"], requests={GPU: "8"})
        if annotations:
            out["template"].setdefault("metadata", {})["annotations"] = annotations
        return out
    return objects.pytorchjob("ddp", uid="pj-1", metadata={"resourceVersion": "7"},
                              replicas={"Master": replica(1, master), "Worker": replica(workers, worker)})


def pj_snap(obj: dict, view: ClusterView | None = None, jobs: tuple[dict, ...] = (), pods: tuple[dict, ...] = ()) -> Snapshot:
    return Snapshot("team-a/ddp", NOW, obj, scheduler_name="sched", gang_scheduler="coscheduling",
                    groups={"coscheduling": None}, topology=TOPOLOGY, cluster=view, jobs=jobs, pods=pods)


def test_a_pytorchjob_with_a_required_rack_is_placed_as_one_gang():
    from gangctl.policy import decide_pytorchjob as dp

    obj = pytorchjob(worker={KUEUE_REQUIRED: RACK})
    assert dp.decide(pj_snap(obj)).wants_nodes
    plan = dp.decide(pj_snap(obj, cluster(busy=("r0-h0",))))   # r0 has 3 free hosts: the gang needs 4
    pods = {s.obj["metadata"]["name"]: s.obj for s in plan.steps if isinstance(s, Create) and s.resource == PODS}
    assert set(pods) == {"ddp-master-0", "ddp-worker-0", "ddp-worker-1", "ddp-worker-2"}
    for pod in pods.values():
        assert node_terms({"spec": {"template": pod}}) == [
            {"matchExpressions": [{"key": RACK, "operator": "In", "values": ["r1"]}]}]
        assert pod["metadata"]["annotations"][PLACEMENT_ANNOTATION] == f"{RACK}=r1"
    # the pods made later (a restart, a replacement) keep the rack the running ones were placed in
    running = tuple(dict(pod, status={"phase": "Running"}) for name, pod in pods.items() if name != "ddp-worker-2")
    for pod in running:
        pod["metadata"] = {**pod["metadata"], "uid": pod["metadata"]["name"]}
    later = dp.decide(pj_snap(obj, cluster(busy=("r1-h0",)), pods=running))
    [again] = [s.obj for s in later.steps if isinstance(s, Create) and s.resource == PODS]
    assert again["metadata"]["name"] == "ddp-worker-2" and node_terms({"spec": {"template": again}}) == [
        {"matchExpressions": [{"key": RACK, "operator": "In", "values": ["r1"]}]}]


def test_a_pytorchjob_that_asks_for_no_level_is_packed_with_its_master():
    from gangctl.policy import decide_pytorchjob as dp

    obj = pytorchjob(workers=1)
    assert dp.decide(pj_snap(obj)).wants_nodes
    plan = dp.decide(pj_snap(obj, cluster(busy=("r0-h0", "r1-h0", "r1-h1"))))   # room for 3 in r0, 2 in r1
    pods = [s.obj for s in plan.steps if isinstance(s, Create) and s.resource == PODS]
    assert len(pods) == 2
    for pod in pods:
        assert preferred_terms({"spec": {"template": pod}})[0]["preference"]["matchExpressions"] == [
            {"key": RACK, "operator": "In", "values": ["r1"]}]
        assert pod["metadata"]["annotations"][PLACEMENT_ANNOTATION] == f"{RACK}=r1"


def test_a_pytorchjob_no_rack_can_hold_fails_with_the_numbers():
    from gangctl.policy import decide_pytorchjob as dp

    plan = dp.decide(pj_snap(pytorchjob(master={KUEUE_REQUIRED: RACK}, workers=5), cluster()))
    failed = next(c for c in plan.status["conditions"] if c["type"] == "Failed")
    assert UNSATISFIABLE in failed["message"] and "no rack can ever hold the gang's floor (6 pods" in failed["message"]


def test_a_pytorchjob_waiting_for_a_rack_is_held_suspended_and_says_why():
    from gangctl.policy import decide_pytorchjob as dp

    busy = ("r0-h0", "r0-h1", "r1-h0", "r1-h1")
    plan = dp.decide(pj_snap(pytorchjob(worker={KUEUE_REQUIRED: RACK}), cluster(busy=busy)))
    assert not [s for s in plan.steps if isinstance(s, Create) and s.resource == PODS], "no pod until a rack has room"
    suspended = next(c for c in plan.status["conditions"] if c["type"] == "Suspended")
    assert "best rack" in suspended["message"], suspended
    assert plan.requeue_after is not None


def test_replica_types_asking_for_different_placements_are_refused_naming_both():
    from gangctl.policy import decide_pytorchjob as dp

    plan = dp.decide(pj_snap(pytorchjob(master={KUEUE_REQUIRED: RACK}, worker={KUEUE_REQUIRED: BLOCK})))
    failed = next(c for c in plan.status["conditions"] if c["type"] == "Failed")
    assert "Master.template.metadata.annotations and spec.pytorchReplicaSpecs.Worker" in failed["message"], failed


def test_a_placed_gang_stays_pinned_when_the_topology_goes():
    rt = runtime({KUEUE_REQUIRED: RACK})
    job = applied_job(decide(snap(rt, view=cluster())))
    job = {**job, "metadata": {**job["metadata"], "uid": "job-a"}, "status": {"startTime": "2026-11-28T11:00:00Z"}}
    plan = decide(snap(rt, node_job=job, topology=None))
    assert not plan.wants_nodes
    assert not [s for s in plan.steps if isinstance(s, Apply) and s.resource == JOBS], \
        "the running Job's template is not changed (the API would refuse it)"


def test_a_pytorchjob_keeps_its_domain_for_both_replica_types():
    from gangctl.policy import decide_pytorchjob as dp

    obj = pytorchjob(worker={KUEUE_REQUIRED: RACK})
    first = dp.decide(pj_snap(obj, cluster()))
    jobs = tuple({**s.obj, "metadata": {**s.obj["metadata"], "uid": s.obj["metadata"]["name"]}}
                 for s in first.steps if isinstance(s, Apply) and s.resource == JOBS)
    later = dp.decide(Snapshot("team-a/ddp", NOW, obj, scheduler_name="sched", gang_scheduler="coscheduling",
                               groups={"coscheduling": None}, topology=None, jobs=jobs))
    assert not [s for s in later.steps if isinstance(s, Apply) and s.resource == JOBS]
