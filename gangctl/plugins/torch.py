"""The torchrun environment of a node pod (Kubeflow Trainer's PET_* contract), and the rendezvous
store of an elastic job.

torchrun reads PET_<FLAG> for each flag it is not given, so the user's `torchrun train.py` (or the
kubeflow SDK's generated script) gets the gang's topology without any command-line changes.

Elastic jobs (mlPolicy.torch.elasticPolicy, or spec.trainer.elasticPolicy over it) get
`PET_NNODES=min:max` and the c10d rendezvous on a store that is *not* on a worker: a small pod
`<trainjob>-rdzv` running torch's TCPStore server, kept off the workers' nodes by a preferred pod
anti-affinity (it shares a node with a worker only when the gang needs every node) and reached by
its DNS name in the job's headless Service. Losing a worker node therefore does not lose the
rendezvous state (with the default, the store lives in rank 0's torchrun agent and dies with that
node, which ends the whole job).
"""
from __future__ import annotations

import copy

from gangctl.model.names import (COMPLETION_INDEX_ANNOTATION, MANAGED_BY, MANAGER, MASTER_PORT, REPLICATED_JOB,
                                   TRAINJOB_NAME, master_addr)
from gangctl.model.resolve import ResolvedJob

RDZV_PORT = 29400
STORE_ROLE, STORE_ROLE_VALUE = "gangctl.io/role", "rendezvous-store"
# Rendezvous timeouts sized for fast recovery (torch defaults: join 600 s, last_call 30 s, close 30 s,
# keep-alive every 5 s x 3). A dead agent is dropped after keep_alive_interval x keep_alive_max_attempt
# = 3 s; survivors then wait last_call 2 s for late joiners before the new round closes.
RDZV_CONF = {
    "join_timeout": 600,
    "last_call_timeout": 2,
    "close_timeout": 10,
    "heartbeat_timeout": 10,
    "keep_alive_interval": 1,
    "keep_alive_max_attempt": 3,
    "read_timeout": 30,
}
DEFAULT_MAX_RESTARTS = 100
# torchrun (2.4+) by default shares the rendezvous TCPStore with the workers and caches the bootstrap
# address (rank 0's host and port) from the agent's *first* round: when rank 0's node is lost, the
# survivor that becomes rank 0 serves a new address but the other survivors keep connecting to the
# dead one and hang in init_process_group. With sharing disabled every round publishes the current
# rank 0's address (RendezvousStoreInfo.build) and rank 0's worker hosts the workers' store.
NO_SHARED_STORE = "TORCH_DISABLE_SHARE_RDZV_TCP_STORE"

STORE_SCRIPT = (
    "import signal, sys, threading, torch.distributed as d\n"
    f"s = d.TCPStore('0.0.0.0', {RDZV_PORT}, is_master=True, wait_for_workers=False)\n"
    f"print('rendezvous store listening on :{RDZV_PORT}', flush=True)\n"
    "signal.signal(signal.SIGTERM, lambda *a: sys.exit(0))\n"
    "threading.Event().wait()\n"
)


def store_name(trainjob: str) -> str:
    return f"{trainjob}-rdzv"


def rdzv_endpoint(trainjob: str) -> str:
    """The store pod's DNS name under the job's headless Service (hostname + subdomain)."""
    return f"{store_name(trainjob)}.{trainjob}:{RDZV_PORT}"


def torch_env(job: ResolvedJob) -> list[dict]:
    env = [
        {"name": "PET_NNODES", "value": nnodes(job)},
        {"name": "PET_NPROC_PER_NODE", "value": job.num_proc_per_node},
        {"name": "PET_NODE_RANK", "valueFrom": {"fieldRef": {
            "fieldPath": f"metadata.annotations['{COMPLETION_INDEX_ANNOTATION}']"}}},
        {"name": "PET_MASTER_ADDR", "value": master_addr(job.name)},
        {"name": "PET_MASTER_PORT", "value": str(MASTER_PORT)},
    ]
    if job.elastic:
        restarts = job.elastic.get("maxRestarts")
        env += [
            {"name": "PET_RDZV_BACKEND", "value": "c10d"},
            {"name": "PET_RDZV_ENDPOINT", "value": rdzv_endpoint(job.name)},
            {"name": "PET_RDZV_ID", "value": job.uid or job.name},
            {"name": "PET_RDZV_CONF", "value": ",".join(f"{k}={v}" for k, v in RDZV_CONF.items())},
            {"name": "PET_MAX_RESTARTS", "value": str(DEFAULT_MAX_RESTARTS if restarts is None else restarts)},
            {"name": NO_SHARED_STORE, "value": "1"},
        ]
    return env


def nnodes(job: ResolvedJob) -> str:
    if job.elastic:
        return f"{job.min_nodes or job.num_nodes}:{job.num_nodes}"
    return str(job.num_nodes)


def rendezvous_store(job: ResolvedJob, owner: dict, pod_labels: dict[str, str], *, name: str | None = None,
                     job_labels: dict[str, str] | None = None, workers: dict[str, str] | None = None,
                     container: str = "node") -> dict:
    """The store pod: the worker image (it has torch), the workers' node selection, off their nodes.

    The defaults are a TrainJob's (`<trainjob>-rdzv` under the job's headless Service, labelled with
    the TrainJob's name, off the pods of its `node` replicated job). Another kind passes its own
    `name` (also the pod's hostname; reached through a Service of that name), `job_labels` (what its
    reconciler observes the pod by) and `workers` (the labels of the pods to stay off)."""
    template = job.pod_template
    spec = template.get("spec") or {}
    worker = next((c for c in spec.get("containers") or [] if c.get("name") == container),
                  (spec.get("containers") or [{}])[0])
    labels = {MANAGED_BY: MANAGER, **(job_labels if job_labels is not None else {TRAINJOB_NAME: job.name}),
              STORE_ROLE: STORE_ROLE_VALUE}
    workers = workers if workers is not None else {TRAINJOB_NAME: job.name, REPLICATED_JOB: "node"}
    pod_spec: dict = {
        "hostname": name or store_name(job.name),
        **({} if name else {"subdomain": job.name}),
        "restartPolicy": "Never",
        "containers": [{
            "name": "store",
            "image": worker.get("image", ""),
            "command": ["python", "-c", STORE_SCRIPT],
            "ports": [{"containerPort": RDZV_PORT, "name": "rdzv"}],
            "resources": {"requests": {"cpu": "50m", "memory": "64Mi"}},
        }],
        # Preferred, not required: an anti-affinity is symmetric, and a required one would keep every
        # worker off the store's node, which may be the last host the gang needs (of a rack it requires).
        "affinity": {"podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [{
            "weight": 100, "podAffinityTerm": {"labelSelector": {"matchLabels": dict(workers)},
                                               "topologyKey": "kubernetes.io/hostname"}}]}},
    }
    for key in ("nodeSelector", "tolerations", "imagePullSecrets", "priorityClassName", "serviceAccountName"):
        if spec.get(key):
            pod_spec[key] = copy.deepcopy(spec[key])
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name or store_name(job.name), "namespace": job.namespace,
                     "labels": {**pod_labels, **labels}, "ownerReferences": [owner]},
        "spec": pod_spec,
    }
