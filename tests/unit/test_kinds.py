"""One work queue, one reconciler and one quota gate for every job kind (gangctl.runtime.kinds)."""
from __future__ import annotations

import asyncio

import pytest

from gangctl.runtime.kinds import JobKey

TRAINJOB = {"kind": "TrainJob", "apiVersion": "trainer.kubeflow.org/v1alpha1",
            "metadata": {"namespace": "team-a", "name": "llm", "uid": "tj-1", "resourceVersion": "3"}}
PYTORCHJOB = {"kind": "PyTorchJob", "apiVersion": "kubeflow.org/v1",
              "metadata": {"namespace": "team-a", "name": "llm", "uid": "pj-1", "resourceVersion": "4"}}


def test_a_key_names_the_kind_and_the_gate_ids_stay_as_its_messages_give_them():
    tj, pj = JobKey.of(TRAINJOB), JobKey.of(PYTORCHJOB)
    assert tj == ("TrainJob", "team-a", "llm") and pj == ("PyTorchJob", "team-a", "llm") and tj != pj
    assert (str(tj), str(pj)) == ("team-a/llm", "pytorchjob:team-a/llm")
    assert JobKey.parse(str(tj)) == tj and JobKey.parse(str(pj)) == pj
    assert tj.object_key == pj.object_key == "team-a/llm"


class FakeKube:
    """Records status applies; answers with the body, as the API server does."""

    def __init__(self, real):
        self.real, self.applied = real, []

    async def apply(self, path, body, field_manager):
        self.applied.append((path, body))
        return {**body, "metadata": {**body["metadata"], "resourceVersion": "9"}}


def with_controller(check):
    from kubernetes_asyncio.client import Configuration

    from gangctl.config import ControllerSettings
    from gangctl.kube.client import Kube
    from gangctl.runtime.controller import Controller

    async def run():
        conf = Configuration()
        conf.host = "https://127.0.0.1:9"  # never contacted
        kube = Kube(conf)
        try:
            await check(Controller(kube, ControllerSettings()), kube)
        finally:
            await kube.close()
    asyncio.run(run())


def test_children_requeue_the_job_of_their_kind():
    async def check(controller, _):
        labels = {"trainer.kubeflow.org/trainjob-name": "a", "training.kubeflow.org/job-name": "b"}
        controller._on_child("ADDED", {"kind": "Pod", "metadata": {"namespace": "ns", "name": "p", "labels": labels}})
        controller._on_job("ADDED", PYTORCHJOB)
        keys = {await controller.queue.get() for _ in range(len(controller.queue))}
        assert keys == {JobKey("TrainJob", "ns", "a"), JobKey("PyTorchJob", "ns", "b"), JobKey.of(PYTORCHJOB)}
        assert set(controller.gate.sources) == {"TrainJob", "PyTorchJob"}
    with_controller(check)


@pytest.mark.parametrize("obj,path", [
    (TRAINJOB, "/apis/trainer.kubeflow.org/v1alpha1/namespaces/team-a/trainjobs/llm/status"),
    (PYTORCHJOB, "/apis/kubeflow.org/v1/namespaces/team-a/pytorchjobs/llm/status")])
def test_one_status_writer_guards_each_kind_by_uid_and_version_and_keeps_other_writers_fields(obj, path):
    async def check(controller, kube):
        fake = FakeKube(kube)
        controller.reconciler.kube = fake
        kind = controller.kinds[obj["kind"]]
        kind.cache(controller.caches).cache["team-a/llm"] = obj
        await controller.reconciler.write_status(kind, obj, {"x": 1, "admission": {"team": "a"}})
        (sent_path, body), = fake.applied
        assert sent_path == path
        assert body["metadata"] == {**obj["metadata"]}
        assert body["status"] == ({"x": 1} if obj["kind"] == "TrainJob" else {"x": 1, "admission": {"team": "a"}})
        assert kind.cache(controller.caches).get("team-a/llm")["metadata"]["resourceVersion"] == "9"  # written through
    with_controller(check)
