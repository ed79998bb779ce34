"""Elastic sizing (shrink on loss without killing healthy workers, probe to grow) and the torchrun env."""
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


def test_trailing_unschedulable_indexes_are_cut_never_below_min():
    r = plan(4, 2, 4, [up(0), up(1), pending(2), pending(3)], T0)
    assert (r.size, r.cause, r.direction) == (2, "Unschedulable", "shrink")
    r = plan(4, 3, 4, [up(0), pending(1), pending(2), pending(3)], T0)
    assert r.size == 3, "never below minNodes"


def test_lost_node_shrinks_only_when_its_replacement_cannot_be_placed():
    assert plan(4, 2, 4, [up(0), up(1), up(2), lost(3), pending(3, since=T0)], T0) is None, "wait a moment"
    r = plan(4, 2, 4, [up(0), up(1), up(2), lost(3), pending(3)], T0)
    assert (r.size, r.cause) == (3, "NodeLost")
    r = plan(4, 2, 4, [up(0), up(1), up(2), lost(3)], T0)
    assert r.size == 3


def test_a_lost_low_index_never_kills_a_healthy_high_index():
    # rank 0's node lost: its replacement waits for capacity, torchrun goes on with 1..3
    assert plan(4, 2, 4, [lost(0), pending(0), up(1), up(2), up(3)], T0) is None


def test_grow_one_probe_at_a_time_after_the_backoff():
    r = plan(3, 2, 4, [up(0), up(1), up(2)], T0)
    assert (r.size, r.cause, r.direction) == (4, "CapacityProbe", "grow")
    assert plan(3, 2, 4, [up(0), up(1), up(2)], T0, last_shrink=T0 - timedelta(seconds=5)) is None
    assert plan(4, 2, 4, [up(0), up(1), up(2), up(3)], T0) is None, "at maxNodes"
    assert plan(3, 2, 4, [up(0), up(1), Worker(2, True, False, succeeded=True)], T0) is None, "finishing"


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
    anti = store["spec"]["affinity"]["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][0]
    assert anti["topologyKey"] == "kubernetes.io/hostname", "the store never shares a node with a worker"
    assert store["spec"]["subdomain"] == job.name and store["spec"]["hostname"] == f"{job.name}-rdzv"


def test_trainjob_override_and_elastic_job_spec():
    job = elastic_job(elasticPolicy={"minNodes": 3})
    assert (job.min_nodes, job.num_nodes) == (3, 4)
    spec = node_job(job, {"uid": "u"}, None, "s", size=3)["spec"]
    assert spec["completions"] == spec["parallelism"] == 3
    assert spec["backoffLimit"] == ELASTIC_BACKOFF_LIMIT
    assert spec["successPolicy"] == {"rules": [{"succeededCount": 1}]}
    import pytest
    from gangctl.model.resolve import ResolveError
    with pytest.raises(ResolveError, match="minNodes"):
        elastic_job(elasticPolicy={"minNodes": 5})
