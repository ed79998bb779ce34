"""gangctl's own quota admission (QuotaGate) against the real API server.

The gate is driven directly: the tests build its informers and run it in the test's event loop,
apply the policy with the same code as `gangctl policy apply --backend coscheduling`, create
TrainJobs, and call `wants` / `forget` the way the reconciler does. The session's controller (which
runs a gate of its own) is stopped meanwhile, so this gate is the only one and nothing reconciles
these TrainJobs: where a job must finish, the test writes its status condition itself, under a
field manager of its own ("test-reconciler"), as the reconciler would. The path through the
controller is tests/integration/test_quota_coscheduling.py. No mocks: every read and write goes to the real kube-apiserver.

The last two tests restart the real controller on jobs and a policy made while it was down: its gate
decides only from the full list, and an invalid policy with no valid one before it holds jobs
(QuotaPolicyInvalid) until fixed.
"""
from __future__ import annotations

import asyncio
import contextlib
from datetime import datetime, timezone
from fractions import Fraction

import pytest
import yaml
from prometheus_client import CollectorRegistry

from gangctl.api.resources import TRAINJOBS
from gangctl.kube.client import ApiError, Kube
from gangctl.kube.events import CORE_EVENTS, EventRecorder
from gangctl.kube.informer import Informer
from gangctl.obs.metrics import Metrics
from gangctl.model.admission import GPU
from gangctl.model.quota import QuotaPolicy
from gangctl.api.resources import TRAINING_RUNTIMES
from gangctl.plugins.quota_objects import POLICY_CONFIGMAP, policy_configmap, POLICY_KEY, POLICY_NAMESPACE
from gangctl.commands.policy_apply import apply_policy
from gangctl.runtime.quota_gate import FIELD_MANAGER, QuotaGate, policy_informer
from tests.integration.helpers import (bound, condition, eventually, gang_state, get_trainjob, pods_of, running, submit,
                                       trainjob)
from tests.integration.quota_common import runtime, runtime_name

pytestmark = [pytest.mark.integration, pytest.mark.asyncio(loop_scope="session")]

CM_PATH = f"/api/v1/namespaces/{POLICY_NAMESPACE}/configmaps/{POLICY_CONFIGMAP}"


def policy_yaml(namespace: str, gpus: int = 16, preemption: str = "LowerPriority") -> str:
    return yaml.safe_dump({
        "priorities": {"low": 1, "high": 10}, "defaultPriority": "low",
        "teams": [{"name": "team-a", "namespaces": [namespace], "nominal": {"gpu": gpus},
                   "preemption": {"withinTeam": preemption}}]})


async def apply_policy_text(kube: Kube, text: str, dry_run: bool = False):
    return await apply_policy(kube, QuotaPolicy.model_validate(yaml.safe_load(text)), "coscheduling",
                              dry_run=dry_run, text=text)


class RunningGate:
    """A QuotaGate with its own informers, as the controller will run it."""

    def __init__(self, kube: Kube):
        self.kube = kube
        self.trainjobs = Informer(kube, TRAINJOBS)
        self.configmaps = policy_informer(kube)
        self.metrics = Metrics(CollectorRegistry())
        self.changed: list[str] = []
        self.gate = QuotaGate(kube, [self.trainjobs], self.configmaps, self.metrics, EventRecorder(kube),
                              on_change=self.changed.append)
        self.tasks: list[asyncio.Task] = []

    async def __aenter__(self) -> RunningGate:
        self.tasks = [asyncio.create_task(i.run()) for i in (self.trainjobs, self.configmaps)]
        await asyncio.gather(self.trainjobs.synced.wait(), self.configmaps.synced.wait())
        self.tasks.append(asyncio.create_task(self.gate.run()))
        return self

    async def __aexit__(self, *exc) -> None:
        for t in self.tasks:
            t.cancel()
        for t in self.tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await t


@pytest.fixture
async def clean_policy(kube: Kube, controller):
    from tests.integration.conftest import wait_ready

    controller.stop()  # its own gate would act on the same policy and TrainJobs
    try:
        yield
    finally:
        await kube.delete(CM_PATH)
        controller.start()
        await wait_ready(controller)


def gpus(n: int) -> dict:
    return {GPU: Fraction(n), "cpu": Fraction(1)}


async def new_job(kube: Kube, ns: str, name: str) -> dict:
    return await submit(kube, trainjob(name, ns, nodes=1, gpus=8, run_for=None))


async def admission(kube: Kube, ns: str, name: str) -> dict | None:
    return ((await get_trainjob(kube, ns, name)).get("status") or {}).get("admission")


async def admitted_names(kube: Kube, ns: str, names) -> set[str]:
    return {n for n in names if await admission(kube, ns, n) is not None}


async def write_status_as_another_manager(kube: Kube, ns: str, name: str, condition: dict | None = None,
                                          copy_admission: bool = True, gang: dict | None = None) -> None:
    """What the (not yet wired) reconciler does: apply the WHOLE status it read, under its own manager.

    Copying status.admission back makes that manager co-own the field; the gate must still be able
    to remove it. With copy_admission=False: the reconciler once wired as proposed (it never sends it)."""
    tj = await get_trainjob(kube, ns, name)
    status = dict(tj.get("status") or {})
    if not copy_admission:
        status.pop("admission", None)
    if condition:
        now = datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
        status["conditions"] = [*(status.get("conditions") or []),
                                {"lastTransitionTime": now, "message": "", **condition}]
    if gang:
        status["gang"] = gang
    body = {"apiVersion": tj["apiVersion"], "kind": tj["kind"], "metadata": {"name": name, "namespace": ns},
            "status": status}
    await kube.apply(TRAINJOBS.path(ns, name, "status"), body, "test-reconciler")


WAITING = {"state": "Waiting", "reason": "WaitingForGang", "message": "0/1 pods of the gang are bound",
           "lastTransitionTime": "2026-01-01T00:00:00Z"}  # a status field of the reconciler's


async def finish(kube: Kube, ns: str, name: str) -> None:
    # The controller is stopped for these tests: the test marks the job Complete itself.
    await write_status_as_another_manager(kube, ns, name, {"type": "Complete", "status": "True",
                                                           "reason": "JobSucceeded"})


async def test_policy_apply_coscheduling_stores_the_policy_in_a_configmap(kube, namespace, clean_policy):
    text = policy_yaml(namespace)
    dry = await apply_policy_text(kube, text, dry_run=True)
    assert {(c.kind, c.action) for c in dry} >= {("ConfigMap", "create"), ("PriorityClass", "create")}
    with pytest.raises(ApiError):
        await kube.get(CM_PATH)   # a dry run changes nothing
    await apply_policy_text(kube, text)
    cm = await kube.get(CM_PATH)
    assert cm["data"][POLICY_KEY] == text
    assert (await kube.get("/apis/scheduling.k8s.io/v1/priorityclasses/high"))["value"] == 10
    again = await apply_policy_text(kube, text, dry_run=True)
    assert {c.action for c in again} == {"unchanged"}
    changed = await apply_policy_text(kube, policy_yaml(namespace, gpus=24), dry_run=True)
    [cm_change] = [c for c in changed if c.kind == "ConfigMap"]
    assert cm_change.action == "update" and any("gpu: 24" in line for line in cm_change.diff)


async def test_admission_preemption_release_and_restart(kube, namespace, clean_policy, caplog):
    ns = namespace
    await apply_policy_text(kube, policy_yaml(ns, gpus=16))
    names = ["j1", "j2", "j3"]
    jobs = {n: await new_job(kube, ns, n) for n in names}
    async with RunningGate(kube) as running:
        gate = running.gate
        await eventually(lambda: _true(gate.enabled), 10, "the policy to load")
        # All three ask at once: one round must admit two (16 GPUs), never three, while the writes
        # are in flight.
        for n in names:
            gate.wants(f"{ns}/{n}", jobs[n], gpus(8), gate.priority(ns, None))
        await eventually(lambda: _eq(admitted_names(kube, ns, names), {"j1", "j2"}), 15, "j1 and j2 admitted")
        record = await admission(kube, ns, "j1")
        assert record["team"] == "team-a" and record["requests"][GPU] == "8" and record["priority"] == 1
        assert gate.pending_reason(f"{ns}/j3") == "requests 8 GPUs, team team-a uses 16 of 16 nominal"
        assert gate.metrics.quota_admitted_gpus.labels("team-a")._value.get() == 16
        assert {f"{ns}/j1", f"{ns}/j2", f"{ns}/j3"} <= set(running.changed)
        tj1 = await get_trainjob(kube, ns, "j1")
        owners = {m["manager"] for m in tj1["metadata"]["managedFields"] if m.get("subresource") == "status"}
        assert owners == {FIELD_MANAGER}

        # The reconciler as written today sends the whole status back (co-owning status.admission).
        for n in ("j1", "j2"):
            await write_status_as_another_manager(kube, ns, n, gang=WAITING)

        # A high-priority job preempts the most recently admitted low one (j2).
        hi = await new_job(kube, ns, "urgent")
        gate.wants(f"{ns}/urgent", hi, gpus(8), gate.priority(ns, "high"))
        await eventually(lambda: _eq(admitted_names(kube, ns, [*names, "urgent"]), {"j1", "urgent"}), 15,
                         "urgent admitted after evicting j2")
        j2 = await get_trainjob(kube, ns, "j2")
        assert "admission" not in j2["status"], "the victim's admission must be gone on the server"
        assert j2["status"]["gang"] == WAITING, "other status fields stay"
        events = (await kube.get(CORE_EVENTS.path(ns), fieldSelector="involvedObject.name=j2"))["items"]
        preempted = [e for e in events if e["reason"] == "Preempted"]
        assert preempted and f"{ns}/urgent" in preempted[0]["message"]
        assert gate.metrics.quota_preemptions.labels("team-a")._value.get() == 1

        # The reconciler would now see j2 without admission and ask again; j2 (older) is ahead of j3.
        gate.wants(f"{ns}/j2", j2, gpus(8), gate.priority(ns, None))
        await asyncio.sleep(1)
        assert await admitted_names(kube, ns, names) == {"j1"}

        # A finished job stops counting at once: j2 takes its place (FIFO by creation), j3 waits.
        await finish(kube, ns, "j1")
        await eventually(lambda: _eq(admitted_names(kube, ns, ["j2", "j3"]), {"j2"}), 15, "j2 admitted again")
        assert gate.pending_reason(f"{ns}/j3").startswith("requests 8 GPUs, team team-a uses 16 of 16")
        before = {n: await admission(kube, ns, n) for n in ("j2", "urgent")}

    # Restart: a new gate with fresh caches counts what status.admission says, admits nothing twice.
    async with RunningGate(kube) as running:
        gate = running.gate
        await eventually(lambda: _true(gate.enabled), 10, "the policy to load again")
        for n in ("j2", "j3", "urgent"):   # the reconciler's resync asks for every unadmitted job
            tj = await get_trainjob(kube, ns, n)
            if gate.admission(tj) is None:
                gate.wants(f"{ns}/{n}", tj, gpus(8), gate.priority(ns, None))
        await eventually(lambda: _true(gate.rounds > 0), 10, "a round of the new gate")
        await asyncio.sleep(1)
        assert {n: await admission(kube, ns, n) for n in ("j2", "urgent")} == before
        assert await admission(kube, ns, "j3") is None
        assert gate.pending_reason(f"{ns}/j3").startswith("requests 8 GPUs, team team-a uses 16 of 16")

        # A job the user suspends releases its quota (its admission goes), and j3 gets in. Its other
        # status fields belong to another manager that never sent status.admission: server-side
        # apply alone (the gate applying a status without the field) must remove it.
        await write_status_as_another_manager(kube, ns, "urgent", gang=WAITING, copy_admission=False)
        caplog.clear()
        await kube.merge_patch(TRAINJOBS.path(ns, "urgent"), {"spec": {"suspend": True}})
        gate.forget(f"{ns}/urgent")
        await eventually(lambda: _eq(admitted_names(kube, ns, ["j3", "urgent"]), {"j3"}), 15,
                         "urgent's quota released, j3 admitted")
        urgent = await get_trainjob(kube, ns, "urgent")
        assert "admission" not in urgent["status"] and urgent["status"]["gang"] == WAITING
        assert "co-owned" not in caplog.text, "SSA alone should have removed the field"


async def test_invalid_policy_keeps_the_last_good_one_and_stray_namespaces_wait(kube, namespace, clean_policy):
    ns = namespace
    await apply_policy_text(kube, policy_yaml(ns, gpus=8))
    stray = await kube.create("/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace",
                                                     "metadata": {"name": f"{ns}-stray"}})
    stray_ns = stray["metadata"]["name"]
    try:
        async with RunningGate(kube) as running:
            gate = running.gate
            await eventually(lambda: _true(gate.enabled), 10, "the policy to load")
            # A broken edit: logged and counted, the previous policy (8 GPUs) stays in force.
            await kube.merge_patch(CM_PATH, {"data": {POLICY_KEY: "teams: [{name: x, nominal: {gpu: -1}}]"}})
            await eventually(lambda: _true(gate.metrics.quota_policy_errors._value.get() == 1), 10,
                             "the invalid policy to be noticed")
            assert gate.enabled and gate.policy_error and gate.metrics.quota_policy_valid._value.get() == 0
            a, b = await new_job(kube, ns, "a"), await new_job(kube, ns, "b")
            s = await new_job(kube, stray_ns, "s")
            for key, tj in ((f"{ns}/a", a), (f"{ns}/b", b), (f"{stray_ns}/s", s)):
                gate.wants(key, tj, gpus(8), 1)
            await eventually(lambda: _eq(admitted_names(kube, ns, ["a", "b"]), {"a"}), 15, "a admitted")
            await asyncio.sleep(0.5)
            assert await admission(kube, stray_ns, "s") is None
            assert gate.pending_reason(f"{stray_ns}/s") == f"namespace {stray_ns} is in no team of the quota policy"
            assert gate.pending_reason(f"{ns}/b") == "requests 8 GPUs, team team-a uses 8 of 8 nominal"

            # Deleting the ConfigMap turns gangctl's admission off (the reconciler then gates nothing).
            await kube.delete(CM_PATH)
            await eventually(lambda: _true(not gate.enabled), 10, "the gate to turn off")
            assert gate.pending_reason(f"{ns}/b") is None
    finally:
        await kube.delete(f"/api/v1/namespaces/{stray_ns}")


async def _true(value: bool) -> bool:
    return value


async def _eq(awaitable, expected) -> bool:
    return await awaitable == expected


# --- through the real controller, restarted on what was made while it was down --------------------

async def install_priority_runtimes(kube: Kube, ns: str) -> None:
    """TrainingRuntimes gang-low / gang-high in `ns`: coscheduling, pods of that PriorityClass."""
    for priority in ("low", "high"):
        await kube.create(TRAINING_RUNTIMES.path(ns), runtime("coscheduling", ns, priority))


def prio_job(name: str, ns: str, priority: str) -> dict:
    return trainjob(name, ns, nodes=1, gpus=8, run_for=None, runtime=runtime_name(priority),
                    runtime_kind="TrainingRuntime")


async def waits_with(kube: Kube, ns: str, name: str, reason: str, *fragments: str) -> bool:
    cond = gang_state(await get_trainjob(kube, ns, name))
    return cond.get("reason") == reason and all(f in cond.get("message", "") for f in fragments)


async def policy_valid_metric(controller) -> float:
    import aiohttp

    async with aiohttp.ClientSession() as session, session.get(controller.url + "/metrics") as resp:
        text = await resp.text()
    [line] = [ln for ln in text.splitlines() if ln.startswith("gangctl_quota_policy_valid ")]
    return float(line.split()[1])


async def test_a_restarted_controller_admits_by_priority_and_fifo_over_the_full_list(
        kube, namespace, controller, clean_policy):
    """Jobs created while the controller is down, listed so that the ones the policy admits come
    last: deciding from the jobs reconciled first would admit a00 and a01."""
    from tests.integration.conftest import wait_ready

    ns = namespace
    # 16 GPUs: two 8-GPU jobs; no preemption, so a wrong admission would stay.
    await apply_policy_text(kube, policy_yaml(ns, gpus=16, preemption="Never"))
    await install_priority_runtimes(kube, ns)
    await submit(kube, prio_job("z-first", ns, "low"))
    # creationTimestamp has whole seconds: the fillers must be strictly later than z-first.
    first = (await get_trainjob(kube, ns, "z-first"))["metadata"]["creationTimestamp"]
    await eventually(lambda: _later_than(kube, first), 5, "the next second")
    fillers = [f"a{i:02d}" for i in range(18)]
    await asyncio.gather(*(submit(kube, prio_job(n, ns, "low")) for n in fillers))
    await submit(kube, prio_job("z-urgent", ns, "high"))
    names = [*fillers, "z-first", "z-urgent"]

    log_start = controller.log_path.stat().st_size if controller.log_path.exists() else 0
    controller.start()
    try:
        await wait_ready(controller)
        # Quota holds two: once two are admitted, none can be any more (no over-commit, no preemption).
        await eventually(lambda: _count(admitted_names(kube, ns, names), 2), 30, "two jobs admitted")
        assert await admitted_names(kube, ns, names) == {"z-urgent", "z-first"}, \
            "the high-priority job and the earliest low one, as StrictFIFO with priorities orders them"
        await eventually(lambda: waits_with(kube, ns, "a00", "WaitingForQuota", "gangctl quota admission"), 30,
                         "a00 shown waiting for quota")
        log = controller.log_path.read_text()[log_start:]
        assert "quota gate: deciding" in log and "not reconciled after" not in log, log[-3000:]
    finally:
        controller.stop()


async def test_an_invalid_policy_at_start_holds_the_jobs_it_names_until_fixed(
        kube, namespace, controller, clean_policy):
    from tests.integration.conftest import wait_ready

    ns = namespace
    stray = (await kube.create("/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace",
                                                       "metadata": {"name": f"{ns}-free"}}))["metadata"]["name"]
    try:
        # Invalid (negative quota) and no valid policy before it: stored as `policy apply` would.
        await kube.apply(f"/api/v1/namespaces/{POLICY_NAMESPACE}",
                         {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": POLICY_NAMESPACE}}, "gangctl-tests")
        await kube.apply(CM_PATH, policy_configmap(policy_yaml(ns, gpus=-8)), "gangctl-tests")
        await submit(kube, trainjob("held", ns, nodes=1, gpus=8, run_for=None))
        await submit(kube, trainjob("free", stray, nodes=1, gpus=8, run_for=None))

        controller.start()
        try:
            await wait_ready(controller)
            await eventually(lambda: waits_with(kube, ns, "held", "QuotaPolicyInvalid", "teams[0].nominal.gpu",
                                                "gangctl policy validate", f"namespace {ns}:"), 30,
                             "the job held with QuotaPolicyInvalid and the validation error")
            # A namespace the invalid policy does not name is not gated.
            await eventually(lambda: running(kube, stray, "free"), 30, "the job of another namespace running")
            assert await policy_valid_metric(controller) == 0
            tj = await get_trainjob(kube, ns, "held")
            assert "admission" not in tj["status"]
            assert await pods_of(kube, ns, "held") == [], "a held job runs no pod"
            with pytest.raises(ApiError) as err:
                await kube.get(f"/apis/scheduling.x-k8s.io/v1alpha1/namespaces/{ns}/podgroups/held")
            assert err.value.not_found, "a held job has no PodGroup"

            # Fixed: admitted normally, and it runs.
            await apply_policy_text(kube, policy_yaml(ns, gpus=16))
            await eventually(lambda: running(kube, ns, "held"), 60, "the held job admitted and running")
            assert (await admission(kube, ns, "held"))["team"] == "team-a"
            assert len(bound(await pods_of(kube, ns, "held"))) == 1
            assert await policy_valid_metric(controller) == 1
        finally:
            controller.stop()
    finally:
        await kube.delete(f"/api/v1/namespaces/{stray}")


async def _later_than(kube: Kube, stamp: str) -> bool:
    from gangctl.model.quota_plan import timestamp
    return datetime.now(timezone.utc).timestamp() >= timestamp(stamp) + 1.05


async def _count(awaitable, n: int) -> bool:
    return len(await awaitable) >= n
