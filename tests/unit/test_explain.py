"""The pure 'why is it pending' diagnosis: a gang's requests against free room on schedulable nodes."""
from __future__ import annotations

from fractions import Fraction

from gangctl.model.room import NodeRoom
from gangctl.policy.explain import Exclusion, diagnose, diagnose_pytorchjob, node_rooms, screen_nodes, slots_on
from gangctl.model.gang import Gang, size_gang
from gangctl.sim import objects

GPU = "nvidia.com/gpu"


def node(name: str, gpus: int, *, ready: bool = True, taints: list | None = None, unschedulable: bool = False) -> dict:
    return objects.node(name, ready="True" if ready else "False", taints=taints or [], unschedulable=unschedulable,
                        allocatable={GPU: str(gpus), "cpu": "96", "memory": "1Ti"})


def pod(node_name: str | None, gpus: int, phase: str = "Running") -> dict:
    return objects.pod(nodeName=node_name, containers=[{"resources": {"limits": {GPU: str(gpus)}}}], phase=phase)


def waiting(bound: int = 0, min_member: int = 4) -> dict:
    return {"gang": {"state": "Waiting", "reason": "WaitingForGang",
                     "message": f"{bound}/{min_member} pods of the gang are bound"}}


def gang(nodes: int, gpus: int = 8):
    return size_gang(nodes, {GPU: Fraction(gpus)})


def test_free_room_counts_running_pods_and_skips_what_cannot_take_a_pod():
    nodes = [node("a", 8), node("b", 8), node("down", 8, ready=False), node("cordoned", 8, unschedulable=True),
             node("tainted", 8, taints=[{"key": "gangctl.io/process-node", "value": "true", "effect": "NoSchedule"}])]
    pods = [pod("a", 6), pod("a", 1, phase="Succeeded"), pod(None, 8)]
    rooms = {r.name: r.free[GPU] for r in node_rooms(nodes, pods)}
    assert rooms == {"a": 2, "b": 8}, "finished and unbound pods hold nothing; NotReady, cordoned, tainted nodes are out"
    tolerated = node_rooms(nodes, pods, {"tolerations": [{"key": "gangctl.io/process-node", "operator": "Exists"}]})
    assert "tainted" in {r.name for r in tolerated}


def test_a_gang_bigger_than_the_free_cluster_lacks_capacity_with_numbers():
    rooms = [NodeRoom(f"n{i}", {GPU: Fraction(8)}) for i in range(2)]
    d = diagnose(waiting(0, 4), gang(4), 0, rooms, scheduler_says="0/2 nodes are available")
    assert d.reason == "InsufficientCapacity"
    assert d.pods_missing == 4 and d.slots == 2
    row = next(r for r in d.rows if r.resource == GPU)
    assert (row.needed, row.free) == (32, 16)
    assert "32 needed, 16 free" in d.message
    assert d.scheduler_says == "0/2 nodes are available"


def test_enough_in_total_but_spread_over_nodes_too_small_is_fragmentation():
    rooms = [NodeRoom(f"n{i}", {GPU: Fraction(4)}) for i in range(4)]  # 16 free, but no node holds an 8-GPU pod
    d = diagnose(waiting(0, 2), gang(2), 0, rooms)
    assert d.reason == "Fragmented"
    assert d.slots == 0 and sum(r.free for r in d.rows if r.resource == GPU) == 16


def test_room_for_every_missing_pod_means_the_scheduler_has_not_tried_yet():
    rooms = [NodeRoom(f"n{i}", {GPU: Fraction(8)}) for i in range(4)]
    d = diagnose(waiting(1, 4), gang(4), 1, rooms, retry_seconds=20)
    assert d.reason == "CapacityAvailable"
    assert d.pods_missing == 3 and d.slots == 4
    assert "every 20 s" in d.message


def test_running_suspended_and_finished_jobs_say_so():
    running = {"gang": {"state": "Running", "reason": "GangScheduled"}}
    assert diagnose(running, gang(2), 2, []).reason == "GangScheduled"
    suspended = {"conditions": [{"type": "Suspended", "status": "True"}]}
    assert "spec.suspend=false" in diagnose(suspended, gang(2), 0, []).message
    failed = {"conditions": [{"type": "Failed", "status": "True", "reason": "BackoffLimitExceeded",
                              "message": "Job has reached the specified backoff limit"}]}
    d = diagnose(failed, gang(2), 0, [])
    assert d.reason == "BackoffLimitExceeded" and "backoff limit" in d.message
    missing = {"gang": {"state": "Pending", "reason": "RuntimeNotFound",
                        "message": "ClusterTrainingRuntime 'x' not found"}}
    assert diagnose(missing, gang(2), 0, []).reason == "RuntimeNotFound"


def test_slots_take_the_scarcest_resource():
    room = NodeRoom("n", {GPU: Fraction(8), "cpu": Fraction(10)})
    assert slots_on(room, {GPU: Fraction(2), "cpu": Fraction(4)}) == 2
    assert slots_on(room, {GPU: Fraction(2)}) == 4
    assert slots_on(room, {"example.com/fpga": Fraction(1)}) == 0


def v1(*conditions: tuple[str, str, str]) -> dict:
    """A PyTorchJob status with v1's conditions (type, status, reason)."""
    return {"conditions": [{"type": t, "status": s, "reason": r, "message": f"PyTorchJob x is {t.lower()}."}
                           for t, s, r in conditions]}


def test_a_pytorchjob_is_read_by_v1_conditions_and_waits_on_the_same_numbers():
    created = v1(("Created", "True", "PyTorchJobCreated"))
    rooms = [NodeRoom(f"n{i}", {GPU: Fraction(8)}) for i in range(2)]
    d = diagnose_pytorchjob(created, gang(4), 0, rooms)
    assert d.reason == "InsufficientCapacity" and d.pods_missing == 4 and d.slots == 2
    assert [(r.resource, r.needed, r.free) for r in d.rows if r.resource == GPU] == [(GPU, 32, 16)]
    running = v1(("Created", "True", "PyTorchJobCreated"), ("Running", "True", "PyTorchJobRunning"))
    assert diagnose_pytorchjob(running, gang(4), 4, []).reason == "GangScheduled"
    restarting = v1(("Running", "False", "PyTorchJobRestarting"), ("Restarting", "True", "PyTorchJobRestarting"))
    assert diagnose_pytorchjob(restarting, gang(2), 0, rooms).reason == "CapacityAvailable"
    suspended = v1(("Suspended", "True", "PyTorchJobSuspended"))
    assert "spec.runPolicy.suspend=false" in diagnose_pytorchjob(suspended, gang(2), 0, []).message
    held = v1(("Suspended", "True", "WaitingForQuota"))
    d = diagnose_pytorchjob(held, gang(2), 0, rooms)
    assert d.reason == "WaitingForQuota" and "quota admits it" in d.message and "runPolicy" not in d.message
    failed = v1(("Running", "False", "PyTorchJobFailed"), ("Failed", "True", "PyTorchJobFailed"))
    d = diagnose_pytorchjob(failed, gang(2), 0, [])
    assert d.reason == "PyTorchJobFailed" and d.message.startswith("Failed: PyTorchJob x is failed")
    done = v1(("Running", "False", "PyTorchJobSucceeded"), ("Succeeded", "True", "PyTorchJobSucceeded"))
    assert diagnose_pytorchjob(done, gang(2), 0, []).reason == "PyTorchJobSucceeded"
    # a TrainJob's vocabulary means nothing here: Complete is not a v1 condition
    assert diagnose_pytorchjob(v1(("Complete", "True", "Done")), gang(4), 0, rooms).reason == "InsufficientCapacity"


def test_a_gang_its_backend_holds_for_quota_is_explained_by_the_backend_not_the_nodes():
    held = {"gang": {"state": "Waiting", "reason": "WaitingForQuota",
                     "message": "KAI queue team-a has no room for PodGroup x: OverLimit"}}
    d = diagnose(held, gang(2), 0, [NodeRoom("a", {GPU: Fraction(8)})])
    assert d.reason == "WaitingForQuota" and d.message.startswith("KAI queue team-a has no room")
    assert "queue has room" in d.message and d.rows == ()


KWOK_TAINT = {"key": "kwok.x-k8s.io/node", "value": "fake", "effect": "NoSchedule"}


def test_a_gang_kept_off_tainted_nodes_is_told_which_taint_and_what_to_add():
    """The case from the topology issue: 32 GPUs free, all on nodes whose taint the pods lack."""
    nodes = [node(f"kwok-{i}", 8, taints=[KWOK_TAINT]) for i in range(4)] + [node("cpu-only", 0)]
    rooms, excluded = screen_nodes(nodes, [], {"containers": []})
    assert [r.name for r in rooms] == ["cpu-only"] and len(excluded) == 4
    d = diagnose(waiting(0, 4), gang(4), 0, rooms, excluded=excluded)
    assert d.reason == "InsufficientCapacity"
    assert d.excluded == (Exclusion("taint kwok.x-k8s.io/node=fake:NoSchedule", d.excluded[0].fix, 4, 4),)
    assert "4 node(s) with room for 4 pod(s) are excluded by taint kwok.x-k8s.io/node=fake:NoSchedule" in d.message
    assert "add a toleration" in d.message and "key kwok.x-k8s.io/node" in d.message
    tolerated, none_out = screen_nodes(nodes, [], {"tolerations": [{"operator": "Exists"}]})
    assert len(tolerated) == 5 and not none_out, "a toleration of everything tolerates every taint"


def test_node_selector_and_required_affinity_exclude_nodes_with_their_rule_named():
    a = objects.node("a", labels={"pool": "train", "zone": "z1"}, allocatable={GPU: "8"})
    b = objects.node("b", labels={"pool": "serve", "zone": "z1"}, allocatable={GPU: "8"})
    c = objects.node("c", labels={"pool": "train", "zone": "z2"}, allocatable={GPU: "8"})
    spec = {"nodeSelector": {"pool": "train"},
            "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
                {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["z1"]}]}]}}}}
    rooms, excluded = screen_nodes([a, b, c], [], spec)
    assert [r.name for r in rooms] == ["a"]
    why = {e.room.name: e.what for e in excluded}
    assert why == {"b": "nodeSelector pool=train", "c": "required node affinity (no nodeSelectorTerm matches)"}
    either = {"matchExpressions": [{"key": "zone", "operator": "NotIn", "values": ["z1"]}]}
    spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"].append(either)
    assert [r.name for r in screen_nodes([a, b, c], [], spec)[0]] == ["a", "c"], "terms are ORed"


def test_excluded_nodes_without_room_for_a_pod_are_not_offered_as_a_fix():
    nodes = [node("a", 8), node("full", 8, taints=[KWOK_TAINT])]
    rooms, excluded = screen_nodes(nodes, [pod("full", 8)])
    d = diagnose(waiting(0, 2), gang(2), 0, rooms, excluded=excluded)
    assert d.reason == "InsufficientCapacity" and d.excluded[0].slots == 0
    assert "excluded" not in d.message


def test_quantities_are_printed_in_kubernetes_units():
    per_pod = {GPU: Fraction(1), "memory": Fraction(4 * 2**30), "cpu": Fraction(1, 2)}
    rooms = [NodeRoom("n0", {GPU: Fraction(8), "memory": Fraction(6 * 2**30), "cpu": Fraction(8)})]
    d = diagnose(waiting(0, 2), Gang(min_member=2, size=2, per_pod=per_pod), 0, rooms)
    assert d.reason == "InsufficientCapacity"
    assert "memory: 8Gi needed, 6Gi free" in d.message and "500m cpu, 4Gi memory" in d.message
    assert "e+09" not in d.message
