"""Name budgets: the longest names the API accepts, at the largest numNodes, make children of at most
63 characters; what depends on the runtime fails the TrainJob with a message naming the child."""
from __future__ import annotations

import copy

import pytest

from gangctl.api.runtime import MAX_NODES, REPLICATED_JOB_NAME_MAX, parse_runtime
from gangctl.api.trainjob import MAX_NAME_LENGTH, parse_trainjob
from gangctl.plugins import workload
from gangctl.model.names import MAX_NAME, child_job_name, master_addr, pod_hostname
from gangctl.plugins.torch import rendezvous_store, store_name
from gangctl.model import name_budget
from gangctl.policy import pytorchjob as pj
from gangctl.policy.decide import Apply, Create, decide
from gangctl.model.resolve import ResolveError, resolve
from tests.unit.test_decide import RUNTIME, condition, snap, trainjob, with_initializers
from gangctl.sim.objects import pytorchjob, replica

LONGEST = "a" * MAX_NAME_LENGTH


def named(name: str, nodes: int = 2, **spec) -> dict:
    tj = trainjob(nodes, **spec)
    tj["metadata"]["name"] = name
    return tj


def test_the_longest_accepted_name_at_the_largest_numnodes_makes_children_within_63():
    tj = named(LONGEST, MAX_NODES, elastic={"minNodes": 1, "maxNodes": MAX_NODES})
    parse_trainjob(tj)  # the API's own bounds: both are accepted
    job = resolve(tj, RUNTIME)
    owner = workload.owner_reference(tj)
    made = [workload.headless_service(job, owner), workload.node_job(job, owner, None, "default-scheduler"),
            rendezvous_store(job, owner, {})]
    names = [o["metadata"]["name"] for o in made] + [pod_hostname(LONGEST, MAX_NODES - 1), store_name(LONGEST)]
    assert len(pod_hostname(LONGEST, MAX_NODES - 1)) == MAX_NAME == 63, "the node pods' hostnames set the limit"
    assert all(len(n) <= MAX_NAME for n in names), names
    assert master_addr(LONGEST).split(".")[0] == pod_hostname(LONGEST, 0)
    assert name_budget.too_long(job) is None


def test_a_stored_name_over_the_api_limit_runs_while_its_children_fit_and_fails_naming_the_child_otherwise():
    stored = LONGEST + "a"   # 51: the limit before it was 50, or a CRD without the rule
    parse_trainjob(named(stored))  # an upgrade does not fail it for its name alone
    assert name_budget.too_long(resolve(named(stored, 4), RUNTIME)) is None
    with pytest.raises(ResolveError, match="the node Job's pod hostname .* would have 64 characters") as refused:
        resolve(named(stored, MAX_NODES, elastic={"minNodes": 1, "maxNodes": MAX_NODES}), RUNTIME)
    assert refused.value.reason == name_budget.NAME_TOO_LONG
    with pytest.raises(ValueError, match="metadata.name must be a DNS-1035 label"):
        parse_trainjob(named("a" * 64))


def test_every_replicated_job_name_the_api_accepts_fits_with_a_short_trainjob_name():
    step = "s" * REPLICATED_JOB_NAME_MAX
    rt = copy.deepcopy(RUNTIME)
    rt["spec"]["template"]["spec"]["replicatedJobs"].append(
        {"name": step, "replicas": 1, "template": {"spec": {"template": {"spec": {"containers": [{"name": step}]}}}}})
    parse_runtime(rt)
    # 63 = name + "-" + 20 + "-0": a TrainJob of 40 characters runs any step of one replica
    assert len(child_job_name("a" * 40, step, 0)) == 63
    assert name_budget.too_long(resolve(named("a" * 40), rt)) is None
    rt["spec"]["template"]["spec"]["replicatedJobs"][-1]["name"] = step + "s"
    with pytest.raises(ValueError, match=r"spec\.template\.spec\.replicatedJobs\[1\]\.name: must be at most 20"):
        parse_runtime(rt)


def test_an_initializer_job_too_long_for_its_trainjob_fails_it_naming_the_child():
    rt = with_initializers()
    fits = decide(snap(named("a" * 41, initializer={"dataset": {"storageUri": "hf://x/y"}}), rt=rt))
    assert [c.obj["metadata"]["name"] for c in fits.of(Create)] == ["a" * 41 + "-dataset-initializer-0"]

    plan = decide(snap(named("a" * 42), rt=rt))
    failed = condition(plan.status, "Failed")
    assert (failed["status"], failed["reason"]) == ("True", "NameTooLong")
    assert (f"the dataset-initializer Job '{'a' * 42}-dataset-initializer-0' would have 64 characters (at most 63); "
            "shorten metadata.name by 1 or the runtime's replicated job 'dataset-initializer'") in failed["message"]
    assert not plan.of(Create) and not plan.of(Apply), "nothing is made that the API would refuse"


def test_an_indexed_step_counts_its_pods_hostnames():
    rt = with_initializers()
    spec = rt["spec"]["template"]["spec"]["replicatedJobs"][0]["template"]["spec"]
    spec.update(completionMode="Indexed", completions=100)
    with pytest.raises(ResolveError, match=r"pod hostname '(a){39}-dataset-initializer-0-99' would have 64") as err:
        resolve(named("a" * 39), rt)
    assert err.value.reason == "NameTooLong"
    assert name_budget.too_long(resolve(named("a" * 38), rt)) is None


def test_a_pytorchjob_is_checked_by_its_longest_replica_name():
    with pytest.raises(pj.PyTorchJobMappingError, match=r"replica name 'n{54}-worker-10' has 64 characters"):
        pj.to_gang(pytorchjob("n" * 54, {"Master": replica(1), "Worker": replica(11)}))
    gang = pj.to_gang(pytorchjob("n" * 53, {"Master": replica(1), "Worker": replica(11)}))
    assert len(pj.replica_name(gang.name, "Worker", 10)) == 63 and len(pj.store_name(gang.name)) <= 63
