"""Elastic sizing (shrink when workers cannot be placed, never killing healthy ones; probe to grow), the
elastic Job's pool of indexes, and the torchrun env."""
from __future__ import annotations

from datetime import datetime, timedelta, timezone

from gangctl.plugins.torch import rdzv_endpoint, rendezvous_store, torch_env
from gangctl.plugins.workload import ELASTIC_BACKOFF_LIMIT, node_job
from gangctl.policy.elastic import Worker, plan
from gangctl.model.resolve import resolve
from gangctl.sim.objects import runtime, trainjob

T0 = datetime(2026, 1, 1, tzinfo=timezone.utc)
LONG_AGO = T0 - timedelta(minutes=1)


def up(i):
    return Worker(i, bound=True, healthy=True)


def pending(i, since=LONG_AGO):
    return Worker(i, bound=False, healthy=False, unschedulable_since=since)


def lost(i):
    return Worker(i, bound=True, healthy=False, lost=True)


def test_workers_that_cannot_be_placed_are_cut_never_below_min():
    r = plan(4, 2, 4, [up(0), up(1), pending(2), pending(3)], T0)
    assert (r.size, r.cause, r.direction) == (2, "Unschedulable", "shrink")
    r = plan(4, 3, 4, [up(0), pending(1), pending(2), pending(3)], T0)
    assert r.size == 3, "never below minNodes"


def test_lost_node_shrinks_only_when_its_replacement_cannot_be_placed():
    # the Job controller replaces a lost worker at once, with a pod of a fresh index
    assert plan(4, 2, 4, [up(0), up(1), up(2), lost(3), pending(4, since=T0)], T0) is None, "wait a moment"
    r = plan(4, 2, 4, [up(0), up(1), up(2), lost(3), pending(4)], T0)
    assert (r.size, r.cause) == (3, "NodeLost")
    assert plan(4, 2, 4, [up(0), up(1), up(2), lost(3)], T0) is None, "its replacement comes: no cut before it"


def test_a_shrink_the_job_controller_has_not_carried_out_yet_is_not_cut_again():
    # size 3 recorded, the Job still shows the refused pod (it goes first): nothing more to cut
    assert plan(3, 2, 4, [up(0), up(1), up(2), pending(3)], T0) is None
    assert plan(3, 2, 4, [up(0), up(1), pending(2), pending(3)], T0).size == 2, "one more refused: one more cut"
    leaving = Worker(5, bound=False, healthy=False, unschedulable_since=LONG_AGO, deleting=True)
    assert plan(3, 2, 4, [up(0), up(1), up(2), leaving], T0, last_shrink=T0) is None, "a pod being deleted counts for nothing"


def test_a_lost_low_index_is_given_up_like_any_other():
    # rank 0's node lost and no node for its replacement: the size drops by one; lowering parallelism
    # makes the Job controller delete the unscheduled pod first, never one of the healthy 1..3
    r = plan(4, 2, 4, [lost(0), pending(4), up(1), up(2), up(3)], T0)
    assert (r.size, r.cause) == (3, "NodeLost")


def test_grow_one_probe_at_a_time_after_the_backoff():
    r = plan(3, 2, 4, [up(0), up(1), up(2)], T0)
    assert (r.size, r.cause, r.direction) == (4, "CapacityProbe", "grow")
    assert plan(3, 2, 4, [up(0), up(1), up(2)], T0, last_shrink=T0 - timedelta(seconds=5)) is None
    assert plan(4, 2, 4, [up(0), up(1), up(2), up(3)], T0) is None, "at maxNodes"
    assert plan(3, 2, 4, [up(0), up(1), Worker(2, True, False, succeeded=True)], T0) is None, "finishing"
    assert plan(3, 2, 4, [up(0), up(1), lost(2), up(7)], T0).size == 4, "a replaced worker counts as healthy"


def elastic_job(**trainer):
    elastic = runtime(elastic={"minNodes": 2, "maxNodes": 4, "maxRestarts": 7})
    return resolve(trainjob("mnist", trainer=trainer), elastic)


def test_torchrun_env_and_store():
    job = elastic_job()
    env = {e["name"]: e.get("value") for e in torch_env(job)}
    assert env["PET_NNODES"] == "2:4" and env["PET_RDZV_BACKEND"] == "c10d"
    assert env["PET_RDZV_ENDPOINT"] == rdzv_endpoint(job.name) == f"{job.name}-rdzv.{job.name}:29400"
    assert env["PET_MAX_RESTARTS"] == "7"
    assert "last_call_timeout=2" in env["PET_RDZV_CONF"] and "keep_alive_interval=1" in env["PET_RDZV_CONF"]
    assert env["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] == "1", "each round must publish the current rank 0's address"
    store = rendezvous_store(job, {"uid": "u"}, {})
    anti = store["spec"]["affinity"]["podAntiAffinity"]
    assert "requiredDuringSchedulingIgnoredDuringExecution" not in anti, \
        "symmetric: a required term would keep workers off the store's node"
    [term] = anti["preferredDuringSchedulingIgnoredDuringExecution"]
    assert term["weight"] == 100 and term["podAffinityTerm"]["topologyKey"] == "kubernetes.io/hostname"
    assert store["spec"]["subdomain"] == job.name and store["spec"]["hostname"] == f"{job.name}-rdzv"


def test_trainjob_override_and_elastic_job_spec():
    job = elastic_job(elasticPolicy={"minNodes": 3})
    assert (job.min_nodes, job.num_nodes) == (3, 4)
    spec = node_job(job, {"uid": "u"}, None, "s", size=3)["spec"]
    # a pool of indexes each tried once: a lost worker's replacement is a fresh index, never backed off
    assert (spec["parallelism"], spec["completions"], spec["backoffLimitPerIndex"]) == (3, 1_000, 0)
    assert spec["completionMode"] == "Indexed" and "maxFailedIndexes" not in spec
    assert spec["backoffLimit"] == ELASTIC_BACKOFF_LIMIT
    assert spec["successPolicy"] == {"rules": [{"succeededCount": 1}]}
    import pytest
    from gangctl.model.resolve import ResolveError
    with pytest.raises(ResolveError, match="minNodes"):
        elastic_job(elasticPolicy={"minNodes": 5})


def test_the_index_pool_grows_with_max_nodes_within_the_apis_limit():
    from gangctl.plugins.workload import elastic_job_spec
    pools = [elastic_job_spec({}, n, 2)["completions"] for n in (4, 50, 2_000)]
    assert pools == [1_000, 5_000, 100_000], "100 per node, at least 1,000, at most the API's 100,000"
    spec = elastic_job_spec({"podFailurePolicy": {"rules": []}, "backoffLimit": 3}, 4, 3)
    assert (spec["parallelism"], spec["backoffLimitPerIndex"], spec["backoffLimit"]) == (3, 0, ELASTIC_BACKOFF_LIMIT)
    assert spec["podFailurePolicy"] == {"rules": []}, "the runtime's own rules pass through"


def test_a_job_made_before_the_pool_keeps_its_shape_for_its_life():
    """backoffLimitPerIndex is immutable: an elastic Job an older gangctl made (completions = parallelism)
    is resized in its own shape, never re-applied with the pool (the API would refuse it, every pass)."""
    from gangctl.plugins.workload import pooled
    job = elastic_job()
    old = {"spec": {"completions": 4, "parallelism": 4}}
    spec = node_job(job, {"uid": "u"}, None, "s", size=3, pooled=pooled(old))["spec"]
    assert (spec["completions"], spec["parallelism"]) == (3, 3) and "backoffLimitPerIndex" not in spec
    assert pooled(None) and pooled({"spec": {"backoffLimitPerIndex": 0}}), "new Jobs, and those made so, get the pool"
