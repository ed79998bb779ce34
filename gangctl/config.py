"""Settings for every gangctl command, read from flags and GANGCTL_* environment variables.

Built once in the entry point and passed down; nothing reads settings from module globals.
"""
from __future__ import annotations

from pathlib import Path

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

REPO_ROOT = Path(__file__).resolve().parent.parent


def _default_cache_dir() -> Path:
    return Path.home() / ".cache" / "gangctl"


class ClusterSettings(BaseSettings):
    """Where the local control plane keeps its binaries and state."""

    model_config = SettingsConfigDict(env_prefix="GANGCTL_", extra="ignore")

    cache_dir: Path = Field(default_factory=_default_cache_dir, description="binaries and cluster state (outside the repo)")
    cluster_name: str = "gangctl"
    integrations_dir: Path = REPO_ROOT / "integrations"
    deploy_dir: Path = REPO_ROOT / "deploy"

    @property
    def bin_root(self) -> Path:
        return self.cache_dir / "bin"

    @property
    def kwok_workdir(self) -> Path:
        return self.cache_dir / "kwok"

    @property
    def kubeconfig(self) -> Path:
        return self.kwok_workdir / "clusters" / self.cluster_name / "kubeconfig.yaml"


class ControllerSettings(BaseSettings):
    """How `gangctl controller` runs."""

    model_config = SettingsConfigDict(env_prefix="GANGCTL_", extra="ignore")

    kubeconfig: Path | None = None
    namespace: str | None = Field(None, description="watch one namespace; all namespaces when unset")
    metrics_host: str = "127.0.0.1"
    metrics_port: int = 8080
    metrics_auth: bool = Field(False, description="/metrics only for bearer tokens that a TokenReview and a "
                                                   "SubjectAccessReview (get on /metrics) accept")
    leader_elect: bool = Field(False, description="run workers only while holding the Lease")
    leader_elect_namespace: str = "gangctl-system"
    leader_elect_lease_name: str = "gangctl-controller"
    leader_elect_identity: str | None = Field(None, description="holderIdentity (default: POD_NAME or host name, "
                                                                 "plus a random suffix)")
    lease_duration_seconds: float = 15.0
    renew_deadline_seconds: float = 10.0
    retry_period_seconds: float = 2.0
    shutdown_grace_seconds: float = Field(10.0, description="on SIGTERM, how long in-flight reconciles may finish")
    workers: int = Field(16, description="concurrent reconciles (each waits on the apiserver, not the CPU)")
    field_manager: str = "gangctl"
    scheduler_name: str = Field("scheduler-plugins-scheduler", description="scheduler profile with Coscheduling")
    pytorchjob_gang_scheduler: str | None = Field("coscheduling", description="gang backend of PyTorchJobs (v1's "
                                                  "--gang-scheduler-name); a kueue.x-k8s.io/queue-name label means Kueue")
    pytorchjob_scheduler_name: str | None = Field(None, description="the schedulerName of PyTorchJob gangs' pods on "
                                                  "the native backend: the kube-scheduler profile with GangScheduling "
                                                  "(unset: scheduler_name)")
    resync_seconds: float = 300.0
    gang_retry_seconds: float = Field(20.0, description="how often waiting gangs are handed back to the scheduler")
    lost_pod_seconds: float | None = Field(None, description="force-finish gangctl's pods Terminating that long on a "
                                                             "node NotReady that long (unset: off; PodGC's rule)")
    backoff_base_seconds: float = 0.005
    backoff_max_seconds: float = 1000.0
    trainer_status_url: str | None = Field(None, description="base URL trainer pods report status.trainerStatus "
                                           "to (https://<Service>.<namespace>.svc:<port>); unset: the local "
                                           "cluster's host Service if it has one, else progress reporting off")
    trainer_status_host: str = Field("127.0.0.1", description="address the progress endpoint listens on")
    trainer_status_port: int = Field(8443, description="port the progress endpoint listens on (HTTPS)")
    trainer_status_secret: str = Field("gangctl-system/gangctl-trainer-status-tls",
                                       description="namespace/name of the Secret holding its CA and certificate "
                                                   "(made at start when absent)")
    trainer_status_rate: float = Field(1.0, description="progress reports a second per ServiceAccount (burst 10)")
    trainer_status_check_seconds: float = Field(300.0, description="how often the Secret's certificate is checked "
                                                "(re-issued before expiry, reloaded when it changed)")
    qps: float = Field(100.0, description="API requests per second, shared by every loop (0: unlimited)")
    burst: int = Field(200, description="API requests allowed in a burst above qps")
