"""What the backend tests share: one quota policy, TrainJobs that differ only in their runtime, and a
sampler of the GPUs each team holds.

The same TrainJobs run under coscheduling and native gangs (gangctl's own admission), Kueue, Volcano and KAI: each team
namespace gets a TrainingRuntime per priority whose podGroupPolicy names the backend, and nothing
else about the jobs changes. The policy (tests/integration/data/two-teams.yaml) is applied with the
CLI, the way an admin does it.
"""
from __future__ import annotations

import asyncio
import copy
import json
import random
import time
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from gangctl.api.quantity import parse_quantity
from gangctl.api.resources import PODS, PYTORCHJOBS, TRAINING_RUNTIMES
from gangctl.config import REPO_ROOT
from gangctl.kube.client import ApiError, Kube
from gangctl.kube.informer import Informer
from gangctl.policy import pytorchjob as pj
from gangctl.model.quota import QuotaPolicy
from gangctl.policy.quota_gate import ADMISSION_ANNOTATION
from tests.integration.helpers import KWOK_COMPLETE_DELAY, KWOK_COMPLETE_JITTER, on_kwok_nodes

POLICY_FILE = REPO_ROOT / "tests/integration/data/two-teams.yaml"
POLICY = QuotaPolicy.model_validate(yaml.safe_load(POLICY_FILE.read_text()))
TEAMS = {t.name: t.namespaces[0] for t in POLICY.teams}   # team -> its namespace
RUNTIME = yaml.safe_load((REPO_ROOT / "deploy/runtimes/torch-kwok-gpu.yaml").read_text())  # KWOK GPU gangs
GPU = "nvidia.com/gpu"


def team_limit(team: str) -> float:
    """What the policy lets a team hold at most: nominal plus its borrowing limit (or the cohort's rest)."""
    t = next(t for t in POLICY.teams if t.name == team)
    borrow = t.borrowing_limit.gpu if t.borrowing_limit and t.borrowing_limit.gpu is not None else None
    if borrow is None:
        borrow = sum(o.nominal.gpu or 0 for o in POLICY.teams if o.cohort == t.cohort and o.name != team)
    return (t.nominal.gpu or 0) + borrow


def runtime_name(priority: str) -> str:
    return f"gang-{priority}"


def runtime(backend: str, namespace: str, priority: str) -> dict:
    """A TrainingRuntime in a team namespace: torch-kwok-gpu with this backend and priority."""
    rt = copy.deepcopy(RUNTIME)
    rt["kind"] = "TrainingRuntime"
    rt["metadata"] = {"name": runtime_name(priority), "namespace": namespace,
                      "labels": rt["metadata"].get("labels", {})}
    policy: dict = {"priorityClassName": priority}
    if backend == "coscheduling":
        policy = {"scheduleTimeoutSeconds": 60}
        pod = rt["spec"]["template"]["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
        pod["priorityClassName"] = priority
    elif backend == "native":
        from gangctl.cluster.native import NATIVE_SCHEDULER

        policy = {"schedulerName": NATIVE_SCHEDULER}
        pod = rt["spec"]["template"]["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
        pod["priorityClassName"] = priority  # gangctl's quota gate orders and preempts by it
    elif backend in ("volcano", "kai"):
        policy["queue"] = next(t.name for t in POLICY.teams if namespace in t.namespaces)
        pod = rt["spec"]["template"]["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
        pod["priorityClassName"] = priority  # Volcano and KAI preempt pods by their priority
    rt["spec"]["podGroupPolicy"] = {backend: policy}
    return rt


async def install_runtimes(kube: Kube, backend: str) -> None:
    for ns in TEAMS.values():
        for priority in POLICY.priorities:
            rt = runtime(backend, ns, priority)
            try:
                await kube.create(TRAINING_RUNTIMES.path(ns), rt)
            except ApiError as err:
                if not err.conflict:
                    raise
                await kube.apply(TRAINING_RUNTIMES.path(ns, rt["metadata"]["name"]), rt, "gangctl-tests")


def apply_policy_cli(kubeconfig: Path, backend: str, cluster_name: str, policy: Path = POLICY_FILE) -> str:
    from tests.integration.helpers import gangctl_cli

    done = gangctl_cli("policy", "apply", str(policy), "--backend", backend, kubeconfig=kubeconfig,
                       cluster_name=cluster_name)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout + done.stderr


def pod_gpus(pod: dict) -> float:
    total = 0.0
    for c in (pod.get("spec") or {}).get("containers") or []:
        res = c.get("resources") or {}
        amount = (res.get("requests") or {}).get(GPU) or (res.get("limits") or {}).get(GPU)
        if amount:
            total += float(parse_quantity(amount))
    return total


@dataclass
class UsageSampler:
    """Samples every `interval`, per team, the GPUs its pods hold (`holds_gpus`) and, where gangctl
    admits (coscheduling), the GPUs its unfinished TrainJobs were admitted with; records every sample
    above the team's limit."""

    kube: Kube
    limits: dict[str, float] = field(default_factory=lambda: {t: team_limit(t) for t in TEAMS})
    namespaces: dict[str, str] = field(default_factory=lambda: {ns: t for t, ns in TEAMS.items()})
    interval: float = 0.1
    samples: int = 0
    peak: dict[str, float] = field(default_factory=dict)
    peak_admitted: dict[str, float] = field(default_factory=dict)
    over: list[tuple[float, str, str, float]] = field(default_factory=list)
    first_over: list[str] = field(default_factory=list)  # the pods a team held at its first sample over

    async def run(self, stop: asyncio.Event) -> None:
        from gangctl.api.resources import TRAINJOBS
        from gangctl.policy.status import finished

        pods, trainjobs = Informer(self.kube, PODS), Informer(self.kube, TRAINJOBS)
        watches = [asyncio.create_task(pods.run()), asyncio.create_task(trainjobs.run())]
        try:
            await pods.synced.wait()
            await trainjobs.synced.wait()
            start = time.monotonic()
            while not stop.is_set():
                held = {team: 0.0 for team in self.limits}
                admitted = {team: 0.0 for team in self.limits}
                for pod in pods.cache.values():
                    team = self.namespaces.get(pod["metadata"]["namespace"])
                    if team and holds_gpus(pod):
                        held[team] += pod_gpus(pod)
                for tj in trainjobs.cache.values():
                    team = self.namespaces.get(tj["metadata"]["namespace"])
                    adm = (tj.get("status") or {}).get("admission")
                    if team and adm and not finished(tj.get("status")):
                        admitted[team] += float(parse_quantity(str((adm.get("requests") or {}).get(GPU, 0))))
                now = round(time.monotonic() - start, 1)
                for team, limit in self.limits.items():
                    self.peak[team] = max(self.peak.get(team, 0.0), held[team])
                    self.peak_admitted[team] = max(self.peak_admitted.get(team, 0.0), admitted[team])
                    for what, gpus in (("held", held[team]), ("admitted", admitted[team])):
                        if gpus > limit:
                            if not self.over:
                                self.first_over = holders(pods.cache.values(), self.namespaces, team)
                            self.over.append((now, team, what, gpus))
                self.samples += 1
                try:
                    await asyncio.wait_for(stop.wait(), self.interval)
                except asyncio.TimeoutError:
                    pass
        finally:
            for w in watches:
                w.cancel()


def holds_gpus(pod: dict) -> bool:
    """A pod counts against its team's quota from its binding until it finishes or its deletion begins:
    the quota systems release it then (Kueue's and the Job controller's active pods, KAI's releasing
    pods: KAI may give the GPUs of an evicted pod to another gang of the same queue while the evicted
    one is still stopping, and the team then holds both for the grace period)."""
    return bool((pod.get("spec") or {}).get("nodeName")) and not pod["metadata"].get("deletionTimestamp") and (
        (pod.get("status") or {}).get("phase") not in ("Succeeded", "Failed"))


def holders(pods, namespaces: dict[str, str], team: str) -> list[str]:
    """The pods holding the team's GPUs: name, GPUs, node, phase."""
    out = []
    for pod in pods:
        meta, spec, status = pod["metadata"], pod.get("spec") or {}, pod.get("status") or {}
        if namespaces.get(meta["namespace"]) == team and holds_gpus(pod):
            out.append(f"{meta['name']} {pod_gpus(pod):g} on {spec['nodeName']} {status.get('phase')}")
    return sorted(out)


@dataclass
class SameJobsResult:
    over: list[tuple[float, str, str, float]]
    samples: int
    peak: dict[str, float]
    phases: dict[str, str]
    first_over: list[str] = field(default_factory=list)


def same_jobs(count: int = 24, seed: int = 7) -> list[tuple[str, str, int, int, str]]:
    """(name, namespace, nodes, GPUs per node, run time): the mix every backend runs, identical."""
    rng = random.Random(seed)
    out = []
    for i in range(count):
        team = list(TEAMS)[i % len(TEAMS)]
        # Runs of 1-3 s: the quota is contended all the same (the sizes decide that), in less time.
        out.append((f"same-{i:02d}", TEAMS[team], rng.choice((1, 1, 2, 3)), rng.choice((2, 4, 8)),
                    f"{rng.randint(1, 3)}s"))
    return out


async def empty_teams(kube: Kube, *namespaces: str) -> None:
    """Start from empty team namespaces, whatever earlier tests left (a failed test skips its cleanup)."""
    from gangctl.api.resources import TRAINJOBS
    from tests.integration.helpers import eventually

    for ns in namespaces:
        await kube.request("DELETE", TRAINJOBS.path(ns), body={"propagationPolicy": "Background"})
        # Their pods go now, not after KWOK's 30 s termination grace (kubelet's SIGKILL).
        await kube.request("DELETE", PODS.path(ns), body={"gracePeriodSeconds": 0})

    async def idle() -> bool:
        for ns in namespaces:
            pods = (await kube.get(PODS.path(ns)))["items"]
            if any((p.get("status") or {}).get("phase") not in ("Succeeded", "Failed") for p in pods):
                return False
        return True
    await eventually(idle, 120, f"namespaces {', '.join(namespaces)} idle")


async def run_same_jobs(kube: Kube, count: int = 24, timeout: float = 300) -> SameJobsResult:
    """Submit the same mix at once under the `gang-low` runtimes, sample team usage until all finish."""
    from tests.integration.helpers import eventually, get_trainjob, submit, trainjob
    from gangctl.api.resources import TRAINJOBS
    from gangctl.policy.status import phase

    await empty_teams(kube, *TEAMS.values())
    sampler = UsageSampler(kube)
    stop = asyncio.Event()
    task = asyncio.create_task(sampler.run(stop))
    jobs = same_jobs(count)
    phases: dict[str, str] = {}
    try:
        for name, ns, nodes, gpus, run_for in jobs:
            await submit(kube, trainjob(name, ns, nodes=nodes, gpus=gpus, run_for=run_for,
                                        runtime=runtime_name("batch"), runtime_kind="TrainingRuntime"))

        async def all_done() -> bool:
            for name, ns, *_ in jobs:
                if phases.get(name) not in ("Complete", "Failed"):
                    phases[name] = phase((await get_trainjob(kube, ns, name)).get("status"))
            return all(p in ("Complete", "Failed") for p in phases.values()) and len(phases) == len(jobs)
        await eventually(all_done, timeout, f"all {count} jobs finished", interval=1.0)
    finally:
        stop.set()
        await task
        for name, ns, *_ in jobs:
            await kube.delete(TRAINJOBS.path(ns, name))
    return SameJobsResult(sampler.over, sampler.samples, sampler.peak, phases, sampler.first_over)


async def assert_same_jobs_within_policy(kube: Kube, count: int = 24) -> SameJobsResult:
    """Run the shared mix (its first `count` jobs) and check what a platform admin checks: no team
    ever held more than the policy lets it (nominal plus what it may borrow), sampled every 100 ms,
    and every job finished."""
    result = await run_same_jobs(kube, count)
    assert result.over == [], (f"a team held more than its quota plus what it may borrow: {result.over[:5]}; "
                               f"its pods then: {result.first_over}")
    assert result.samples > 50
    # Without this, a sampler that saw none of the jobs' pods would pass the check above.
    assert all(result.peak.get(team, 0) > 0 for team in TEAMS), f"the sampler saw a team hold no GPU: {result.peak}"
    assert all(p == "Complete" for p in result.phases.values()), result.phases
    return result


async def preempt_low_with_high(kube: Kube, wait_reasons: tuple[str, ...]) -> dict:
    """In team-a (preemption withinTeam LowerPriority): a batch job takes all 24 GPUs the team may
    hold, then an urgent job arrives. Checks the urgent job runs, the batch job goes back to waiting
    (Running=False with one of `wait_reasons`), is not failed, is not charged, and holds no node;
    returns the batch TrainJob as it was then. Both are deleted afterwards."""
    from gangctl.api.resources import TRAINJOBS
    from tests.integration.helpers import (eventually, gang_state, get_trainjob, holds_no_node, is_true, running,
                                           submit, trainjob)

    ns = TEAMS["team-a"]
    await empty_teams(kube, ns)
    rt = dict(runtime_kind="TrainingRuntime")
    await submit(kube, trainjob("low", ns, nodes=3, runtime=runtime_name("batch"), **rt))
    await eventually(lambda: running(kube, ns, "low"), 60, "the low-priority job running on 24 GPUs")
    await submit(kube, trainjob("high", ns, nodes=2, runtime=runtime_name("urgent"), **rt))
    await eventually(lambda: running(kube, ns, "high"), 90, "the high-priority job running after preempting")

    async def low_waits_again() -> bool:
        state = gang_state(await get_trainjob(kube, ns, "low"))
        return state.get("state") == "Waiting" and state.get("reason") in wait_reasons
    await eventually(low_waits_again, 60, "the preempted job waiting again")
    low = await get_trainjob(kube, ns, "low")
    assert not is_true(low, "Failed")
    assert (low["status"].get("restarts") or {}).get("user", 0) == 0, "a preemption is not the user's failure"
    await holds_no_node(kube, ns, "low")
    for name in ("low", "high"):
        await kube.delete(TRAINJOBS.path(ns, name))
    return low


async def assert_preempted_event(kube: Kube, victim: str = "low", preemptor: str = "high") -> None:
    """gangctl told the victim's owner, on the TrainJob, who preempted it."""
    events = (await kube.get(f"/api/v1/namespaces/{TEAMS['team-a']}/events",
                             fieldSelector=f"involvedObject.name={victim},reason=Preempted"))["items"]
    assert events and preemptor in events[0]["message"], events


# --- PyTorchJobs (kubeflow.org/v1) in the same teams ----------------------------------------------
def pytorchjob(name: str, namespace: str, *, masters: int = 1, workers: int = 0, priority: str = "batch",
               elastic: dict | None = None) -> dict:
    """A v1 PyTorchJob of 8-GPU replicas on KWOK's GPU nodes, kept Running for an hour."""
    template = {"metadata": {"annotations": {KWOK_COMPLETE_DELAY: "3600s", KWOK_COMPLETE_JITTER: "3600s"}},
                "spec": on_kwok_nodes({"containers": [{"name": "pytorch", "image": "pytorch/pytorch:2.7.1",
                                                       "command": ["torchrun", "t.py"],
                                                       "resources": {"limits": {GPU: "8"}}}]})}
    specs = {}
    if masters:
        specs["Master"] = {"replicas": masters, "restartPolicy": "OnFailure", "template": copy.deepcopy(template)}
    if workers:
        specs["Worker"] = {"replicas": workers, "restartPolicy": "OnFailure", "template": copy.deepcopy(template)}
    spec: dict = {"pytorchReplicaSpecs": specs,
                  "runPolicy": {"schedulingPolicy": {"priorityClass": priority, "scheduleTimeoutSeconds": 60}}}
    if elastic:
        spec["elasticPolicy"] = elastic
    return {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob",
            "metadata": {"name": name, "namespace": namespace}, "spec": spec}


async def get_pytorchjob(kube: Kube, namespace: str, name: str) -> dict:
    return await kube.get(PYTORCHJOBS.path(namespace, name))


def v1_condition(job: dict, ctype: str) -> dict:
    return next((c for c in (job.get("status") or {}).get("conditions") or [] if c["type"] == ctype), {})


async def pj_pods(kube: Kube, namespace: str, name: str) -> list[dict]:
    """The PyTorchJob's unfinished pods (v1's job-name label)."""
    listing = await kube.get(PODS.path(namespace), labelSelector=f"{pj.JOB_NAME}={name}")
    return [p for p in listing["items"] if (p.get("status") or {}).get("phase") not in ("Succeeded", "Failed")
            and not p["metadata"].get("deletionTimestamp")]


def admission_of(job: dict) -> dict | None:
    text = (job["metadata"].get("annotations") or {}).get(ADMISSION_ANNOTATION)
    return json.loads(text) if text else None
