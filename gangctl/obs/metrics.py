"""Prometheus metrics of the controller, on a registry the caller passes in."""
from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from gangctl.policy.status import STATES

PHASES = STATES  # status.gang.state


class Metrics:
    def __init__(self, registry: CollectorRegistry):
        self.registry = registry
        self.trainjobs = Gauge("gangctl_trainjobs", "TrainJobs by phase", ["phase"], registry=registry)
        self.reconcile_seconds = Histogram(
            "gangctl_reconcile_duration_seconds", "Time to reconcile one TrainJob", registry=registry,
            buckets=(0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10))
        self.reconcile_errors = Counter("gangctl_reconcile_errors_total", "Reconciles that raised", ["reason"],
                                        registry=registry)
        self.queue_depth = Gauge("gangctl_workqueue_depth", "Keys waiting in the work queue", registry=registry)
        self.gang_wait = Histogram(
            "gangctl_gang_wait_seconds", "From the gang's pods being created to all of them bound to nodes",
            registry=registry, buckets=(0.5, 1, 2, 5, 10, 30, 60, 120, 300, 600, 1800, 3600))
        self.invalid = Counter("gangctl_trainjobs_invalid_total", "TrainJobs marked Failed for an invalid spec",
                               registry=registry)
        self.restarts = Counter("gangctl_trainjob_restarts_total",
                                "Child Job restarts by cause (user, infrastructure, ignored)", ["cause"],
                                registry=registry)
        self.policy_failures = Counter("gangctl_trainjob_policy_failures_total",
                                       "TrainJobs failed by the failure policy, by reason", ["reason"],
                                       registry=registry)
        self.last_progress = Gauge(
            "gangctl_trainjob_last_progress_timestamp_seconds",
            "When a running TrainJob whose runtime sets a stall timeout last reported progress (unix seconds; "
            "time() minus it is the silence the stall timeout is compared with)", ["namespace", "name"],
            registry=registry)
        self.pytorchjob_last_progress = Gauge(
            "gangctl_pytorchjob_last_progress_timestamp_seconds",
            "When a running PyTorchJob with a stall timeout (annotation gangctl.io/stall-timeout) last reported "
            "progress (unix seconds)", ["namespace", "name"], registry=registry)
        self.world_size = Gauge("gangctl_elastic_world_size", "Current node count of an elastic TrainJob",
                                ["namespace", "trainjob"], registry=registry)
        self.resizes = Counter("gangctl_elastic_resizes_total", "Elastic resizes by direction and cause",
                               ["direction", "cause"], registry=registry)
        # gangctl's own quota admission (coscheduling backend; gangctl.runtime.quota_gate)
        self.quota_admitted_gpus = Gauge("gangctl_quota_admitted_gpus",
                                         "GPUs (gang floors) of admitted, unfinished TrainJobs, by team", ["team"],
                                         registry=registry)
        self.quota_pending = Gauge("gangctl_quota_pending_trainjobs", "TrainJobs waiting for quota, by team",
                                   ["team"], registry=registry)
        self.quota_admissions = Counter("gangctl_quota_admissions_total", "TrainJobs admitted by the quota gate",
                                        ["team"], registry=registry)
        self.quota_preemptions = Counter("gangctl_quota_preemptions_total",
                                         "Admitted TrainJobs evicted for a higher-priority or reclaiming one, "
                                         "by the victim's team", ["team"], registry=registry)
        self.quota_policy_valid = Gauge("gangctl_quota_policy_valid",
                                        "1 when the quota policy ConfigMap is valid (0: invalid, the last valid "
                                        "policy stays in force, or with none before it the TrainJobs of the "
                                        "namespaces it names are held, QuotaPolicyInvalid; absent ConfigMap: 1 "
                                        "and no quota)", registry=registry)
        self.quota_policy_errors = Counter("gangctl_quota_policy_errors_total",
                                           "Quota policy ConfigMap versions rejected as invalid", registry=registry)
        self.api_throttled = Counter("gangctl_api_throttled_total",
                                     "API requests the apiserver answered 429 (Priority and Fairness): retried "
                                     "after its Retry-After", registry=registry)
        self.trainer_status_reports = Counter("gangctl_trainer_status_reports_total",
                                              "Progress reports (status.trainerStatus) from trainer pods, by "
                                              "HTTP answer", ["code"], registry=registry)
        self.access_reviews = Counter("gangctl_access_reviews_total",
                                      "TokenReviews and SubjectAccessReviews sent to check bearer tokens (/metrics "
                                      "and the progress endpoint), by kind", ["kind"], registry=registry)
        self.access_reviews_refused = Counter("gangctl_access_reviews_refused_total",
                                              "Requests answered 429 without a review: a token not seen before "
                                              "when its source's budget (limit=source) or the process's "
                                              "(limit=total) was spent, or a known token's re-review past its own "
                                              "budget (limit=known)", ["limit"], registry=registry)
        self.quota_policy_valid.set(1)
        for phase in PHASES:
            self.trainjobs.labels(phase).set(0)
        for cause in ("user", "infrastructure", "ignored"):
            self.restarts.labels(cause)
        for kind in ("TokenReview", "SubjectAccessReview"):
            self.access_reviews.labels(kind)
        for limit in ("source", "total", "known"):
            self.access_reviews_refused.labels(limit)

    def set_phases(self, counts: dict[str, int]) -> None:
        for phase in PHASES:
            self.trainjobs.labels(phase).set(counts.get(phase, 0))
