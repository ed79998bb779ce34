"""The API resources gangctl reads and writes, and how to build their URL paths (pure data)."""
from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import quote


@dataclass(frozen=True)
class Resource:
    """One API resource (group/version/plural) and how to build its paths."""

    group: str
    version: str
    plural: str
    kind: str
    namespaced: bool = True

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    def path(self, namespace: str | None = None, name: str | None = None, sub: str | None = None) -> str:
        base = f"/apis/{self.group}/{self.version}" if self.group else f"/api/{self.version}"
        if self.namespaced and namespace:
            base += f"/namespaces/{quote(namespace)}"
        base += f"/{self.plural}"
        if name:
            base += f"/{quote(name)}"
        if sub:
            base += f"/{sub}"
        return base


TRAINER_GROUP = "trainer.kubeflow.org"
TRAINJOBS = Resource(TRAINER_GROUP, "v1alpha1", "trainjobs", "TrainJob")
TRAINING_RUNTIMES = Resource(TRAINER_GROUP, "v1alpha1", "trainingruntimes", "TrainingRuntime")
CLUSTER_TRAINING_RUNTIMES = Resource(TRAINER_GROUP, "v1alpha1", "clustertrainingruntimes", "ClusterTrainingRuntime", namespaced=False)
PYTORCHJOBS = Resource("kubeflow.org", "v1", "pytorchjobs", "PyTorchJob")
JOBS = Resource("batch", "v1", "jobs", "Job")
PODS = Resource("", "v1", "pods", "Pod")
SERVICES = Resource("", "v1", "services", "Service")
NODES = Resource("", "v1", "nodes", "Node", namespaced=False)
NAMESPACES = Resource("", "v1", "namespaces", "Namespace", namespaced=False)
EVENTS = Resource("events.k8s.io", "v1", "events", "Event")
CRDS = Resource("apiextensions.k8s.io", "v1", "customresourcedefinitions", "CustomResourceDefinition", namespaced=False)
POD_GROUPS = Resource("scheduling.x-k8s.io", "v1alpha1", "podgroups", "PodGroup")
# Kubernetes' own PodGroup (KEP-4671, 1.36: GenericWorkload + GangScheduling feature gates).
NATIVE_POD_GROUPS = Resource("scheduling.k8s.io", "v1alpha2", "podgroups", "PodGroup")
CONFIGMAPS = Resource("", "v1", "configmaps", "ConfigMap")
SECRETS = Resource("", "v1", "secrets", "Secret")
PERSISTENT_VOLUME_CLAIMS = Resource("", "v1", "persistentvolumeclaims", "PersistentVolumeClaim")

PRIORITY_CLASSES = Resource("scheduling.k8s.io", "v1", "priorityclasses", "PriorityClass", namespaced=False)

# The kinds gangctl server-side applies from manifests it holds as plain objects (quota policies'
# objects, the install's kubeflow-system ConfigMap and its RBAC), by (apiVersion, kind).
APPLIED_KINDS = {(r.api_version, r.kind): r for r in (
    NAMESPACES, CONFIGMAPS,
    PRIORITY_CLASSES,
    Resource("rbac.authorization.k8s.io", "v1", "roles", "Role"),
    Resource("rbac.authorization.k8s.io", "v1", "rolebindings", "RoleBinding"),
    Resource("kueue.x-k8s.io", "v1beta2", "resourceflavors", "ResourceFlavor", namespaced=False),
    Resource("kueue.x-k8s.io", "v1beta2", "clusterqueues", "ClusterQueue", namespaced=False),
    Resource("kueue.x-k8s.io", "v1beta2", "localqueues", "LocalQueue"),
    Resource("kueue.x-k8s.io", "v1beta2", "workloadpriorityclasses", "WorkloadPriorityClass", namespaced=False),
    Resource("kueue.x-k8s.io", "v1beta2", "cohorts", "Cohort", namespaced=False),
    Resource("scheduling.volcano.sh", "v1beta1", "queues", "Queue", namespaced=False),
    Resource("scheduling.run.ai", "v2", "queues", "Queue", namespaced=False),
    # the policy's topology (`gangctl policy apply`, docs/topology.md)
    Resource("kueue.x-k8s.io", "v1beta2", "topologies", "Topology", namespaced=False),
    Resource("topology.volcano.sh", "v1alpha1", "hypernodes", "HyperNode", namespaced=False),
    Resource("kai.scheduler", "v1alpha1", "topologies", "Topology", namespaced=False),
)}


def resource_of(obj: dict) -> Resource:
    """The resource of a manifest of one of `APPLIED_KINDS`."""
    return APPLIED_KINDS[(obj["apiVersion"], obj["kind"])]


def object_path(obj: dict) -> str:
    meta = obj["metadata"]
    return resource_of(obj).path(meta.get("namespace"), meta["name"])
