"""The lost-pod decision: which of gangctl's pods stuck Terminating on a NotReady node to force-finish."""
from __future__ import annotations

from datetime import datetime, timedelta, timezone

from gangctl.policy.lost_pods import failed_status, lost_pods
from gangctl.sim import objects

NOW = datetime(2026, 1, 1, 12, 0, 0, tzinfo=timezone.utc)
AFTER = timedelta(seconds=30)


def stamp(seconds_ago: float) -> str:
    return (NOW - timedelta(seconds=seconds_ago)).strftime("%Y-%m-%dT%H:%M:%SZ")


def node(name="n1", ready=False, since=60):
    return objects.node(name, ready="True" if ready else "Unknown", since=stamp(since))


def pod(name="p", node_name="n1", deleted_ago=40, grace=30, phase="Running", managed=True, disrupted=True):
    deleted = deleted_ago is not None
    return objects.pod(
        name, namespace="ns", uid=f"uid-{name}", labels={"gangctl.io/managed-by": "gangctl"} if managed else {},
        # deletionTimestamp = time of the delete + the grace period
        deleted_at=stamp(deleted_ago - grace) if deleted else None, grace=grace if deleted else None,
        node=node_name, phase=phase, conditions=[objects.disruption("DeletionByTaintManager")] if disrupted else [])


def names(pods, nodes):
    return [p.name for p in lost_pods(pods, {n["metadata"]["name"]: n for n in nodes}, NOW, AFTER)]


def test_a_managed_pod_terminating_past_the_timeout_on_a_not_ready_node_is_reaped():
    got = lost_pods([pod()], {"n1": node()}, NOW, AFTER)
    assert [(p.name, p.node, p.has_disruption) for p in got] == [("p", "n1", True)]
    assert got[0].terminating_since == NOW - timedelta(seconds=40)


def test_the_grace_period_is_not_counted_as_time_terminating():
    # deleted 20 s ago with a 30 s grace: deletionTimestamp is 10 s in the future; not yet 30 s
    assert names([pod(deleted_ago=20)], [node()]) == []


def test_nothing_is_reaped_on_a_ready_node_or_a_node_not_ready_only_briefly():
    assert names([pod()], [node(ready=True)]) == []
    assert names([pod()], [node(since=10)]) == []


def test_only_gangctl_pods_that_are_deleting_and_not_terminal_on_a_known_node():
    assert names([pod(managed=False)], [node()]) == []
    assert names([pod(deleted_ago=None)], [node()]) == []
    assert names([pod(phase="Failed"), pod("s", phase="Succeeded")], [node()]) == []
    assert names([pod(node_name="gone")], [node()]) == []  # orphaned: PodGC's job
    assert names([pod(node_name="")], [node()]) == []


def test_the_status_written_marks_a_disruption_unless_the_eviction_did():
    lost = lost_pods([pod(disrupted=False)], {"n1": node()}, NOW, AFTER)[0]
    status = failed_status(lost, NOW)
    assert status["phase"] == "Failed"
    assert status["conditions"][0]["type"] == "DisruptionTarget" and status["conditions"][0]["reason"] == "DeletionByGangctl"
    evicted = lost_pods([pod()], {"n1": node()}, NOW, AFTER)[0]
    assert failed_status(evicted, NOW) == {"phase": "Failed"}
