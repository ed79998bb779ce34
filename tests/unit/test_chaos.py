"""The chaos plans (deterministic, bounded) and the auditor's bookkeeping of live pods per (job, index)."""
from __future__ import annotations

from gangctl.harness.audit import PodAuditor
from gangctl.harness.chaos import FAIL_EXIT_CODE, FAIL_LABEL, plan_jobs, plan_outages, trainjob
from gangctl.sim import objects

NODES = [f"gpu-node-{i:03d}" for i in range(10)]


def test_outage_plan_is_deterministic_and_never_exceeds_max_down():
    a = plan_outages(NODES, 7, 40, window=30, down_for=(5, 15), max_down=3)
    assert a == plan_outages(NODES, 7, 40, window=30, down_for=(5, 15), max_down=3)
    assert a != plan_outages(NODES, 8, 40, window=30, down_for=(5, 15), max_down=3)
    assert len(a) == 40
    for o in a:  # at each start (where concurrency rises): at most 3 down, no node twice
        active = [x for x in a if x.start <= o.start < x.start + x.duration]
        assert len(active) <= 3
        assert len({x.node for x in active}) == len(active)


def test_job_plan_marks_the_failing_jobs_and_the_manifest_carries_kwok_failure():
    jobs = plan_jobs(3, 20, min_nodes=(1, 2), max_nodes=(2, 4), run_for=(10, 20), failing=5)
    assert jobs == plan_jobs(3, 20, min_nodes=(1, 2), max_nodes=(2, 4), run_for=(10, 20), failing=5)
    assert sum(j.exit_code is not None for j in jobs) == 5
    assert all(1 <= j.min_nodes <= j.max_nodes <= 4 for j in jobs)
    failing = next(j for j in jobs if j.exit_code is not None)
    meta = trainjob(failing, "ns", "rt")["spec"]["podTemplateOverrides"][0]["metadata"]
    assert meta["labels"][FAIL_LABEL] == "true" and meta["annotations"][FAIL_EXIT_CODE] == str(failing.exit_code)
    ok = next(j for j in jobs if j.exit_code is None)
    spec = trainjob(ok, "ns", "rt")["spec"]
    assert FAIL_LABEL not in spec["podTemplateOverrides"][0]["metadata"]["labels"]
    assert spec["trainer"]["elasticPolicy"] == {"minNodes": ok.min_nodes, "maxNodes": ok.max_nodes}


def pod(uid, index, phase="Running", deleting=False, disrupted=False):
    return objects.pod(uid, namespace="ns", uid=uid, index=index,
                       labels={"trainer.kubeflow.org/trainjob-name": "el", "jobset.sigs.k8s.io/replicatedjob-name": "node"},
                       deleted_at="2026-01-01T00:00:00Z" if deleting else None, phase=phase,
                       conditions=[objects.disruption()] if disrupted else [])


def test_auditor_allows_a_replacement_once_the_old_pod_is_deleting_or_terminal():
    a = PodAuditor()
    a.check_event("ADDED", pod("a", 0))
    a.check_event("ADDED", pod("b", 1))
    a.check_event("MODIFIED", pod("a", 0, deleting=True, disrupted=True))  # evicted from a lost node
    a.check_event("ADDED", pod("c", 0, phase="Pending"))                   # the Job controller's replacement
    a.check_event("MODIFIED", pod("b", 1, phase="Failed"))
    a.check_event("ADDED", pod("d", 1))
    assert not a.violations
    assert a.disrupted == {"a"} and a.max_live_pods == 2 and a.live_pods == 2


def test_auditor_records_two_live_pods_for_one_index():
    a = PodAuditor()
    a.check_event("ADDED", pod("a", 0))
    a.check_event("ADDED", pod("b", 0, phase="Pending"))
    assert [(v["index"], v["pods"]) for v in a.violations] == [(0, ["a", "b"])]
    a.check_event("DELETED", pod("a", 0))
    a.check_event("MODIFIED", pod("b", 0))
    assert len(a.violations) == 1


def test_restart_all_asks_gangctls_kwok_stage_by_the_names_it_reads_and_leaves_nothing_to_chance():
    from gangctl.config import REPO_ROOT
    from gangctl.harness.chaos import COMPLETE_WEIGHT, RESTART_ALL, RESTART_ALL_AT, RESTART_ALL_EXIT_CODE, restart_all
    assert restart_all(2, 3) == {RESTART_ALL: "2", RESTART_ALL_EXIT_CODE: "3", COMPLETE_WEIGHT: "0"}
    assert restart_all(1, 1, "2026-11-30T03:00:00.000000Z")[RESTART_ALL_AT] == "2026-11-30T03:00:00.000000Z"
    stage = (REPO_ROOT / "integrations" / "kwok" / "stages" / "pod-restart-all-containers.yaml").read_text()
    for name in (RESTART_ALL, RESTART_ALL_EXIT_CODE, RESTART_ALL_AT):
        assert f'"{name}"' in stage, f"the stage does not read {name}"
