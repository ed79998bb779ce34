"""status.trainerStatus (Trainer KEP-2779) without a cluster: what trainer pods are given, which
reports are taken, who may send them, the rate limit and the endpoint's certificate. The endpoint
itself, with real tokens from real pods, is tests/integration/test_trainer_status.py."""
from __future__ import annotations

import copy
from datetime import datetime, timedelta, timezone

import pytest
from cryptography import x509

from gangctl.api.resources import CONFIGMAPS, JOBS
from gangctl.kube import serving_cert
from gangctl.plugins.names import TRAINJOB_NAME
from gangctl.policy import progress
from gangctl.policy.decide import Apply, Create, decide
from gangctl.runtime.progress_server import TokenBuckets
from tests.unit.test_decide import NOW, child, snap, trainjob

ENDPOINT = progress.Endpoint("https://gangctl-controller.gangctl-system.svc:8443", "-----CA-----")
URL = ENDPOINT.base_url + "/apis/trainer.kubeflow.org/v1alpha1/namespaces/team-a/trainjobs/llm/status"


def job_of(plan) -> dict:
    return next(s.obj for s in plan.steps if isinstance(s, (Apply, Create)) and s.resource == JOBS)


def env_of(container: dict) -> dict[str, str]:
    return {e["name"]: e.get("value") for e in container.get("env") or []}


# --- what pods are given ----------------------------------------------------------------------------
def test_a_new_trainjob_gets_its_ca_configmap_before_its_job_and_every_container_the_contract():
    plan = decide(snap(trainjob(), progress=ENDPOINT))
    steps = [s for s in plan.steps if isinstance(s, (Apply, Create))]
    cm = next(i for i, s in enumerate(steps) if s.resource == CONFIGMAPS)
    assert cm < next(i for i, s in enumerate(steps) if s.resource == JOBS)
    configmap = steps[cm].obj
    assert configmap["metadata"]["name"] == "llm-tls-config" and configmap["data"] == {"ca.crt": "-----CA-----"}
    assert configmap["metadata"]["ownerReferences"][0]["uid"] == "tj-1"
    spec = job_of(plan)["spec"]["template"]["spec"]
    volume = next(v for v in spec["volumes"] if v["name"] == progress.VOLUME)
    token, ca = volume["projected"]["sources"]
    assert token["serviceAccountToken"]["audience"] == "trainer.kubeflow.org"
    assert ca["configMap"]["name"] == "llm-tls-config"
    for container in spec["containers"]:
        assert env_of(container)[progress.ENV_URL] == URL
        assert env_of(container)[progress.ENV_CA_CERT] == "/var/run/secrets/kubeflow/trainer/ca.crt"
        assert env_of(container)[progress.ENV_TOKEN] == "/var/run/secrets/kubeflow/trainer/token"
        assert {"name": progress.VOLUME, "mountPath": progress.MOUNT_PATH, "readOnly": True} in container["volumeMounts"]
    assert progress.injected_url(job_of(plan)) == URL


def test_without_an_endpoint_pods_get_nothing_of_it():
    plan = decide(snap(trainjob()))
    assert not any(s.resource == CONFIGMAPS for s in plan.steps if isinstance(s, (Apply, Create)))
    spec = job_of(plan)["spec"]["template"]["spec"]
    assert progress.VOLUME not in [v["name"] for v in spec.get("volumes") or []]
    assert all(progress.ENV_URL not in env_of(c) for c in spec["containers"])


def test_an_existing_job_keeps_the_template_it_was_made_with():
    """A Job's pod template is immutable: turning the endpoint on or off must not change it."""
    made_without = job_of(decide(snap(trainjob())))
    made_with = job_of(decide(snap(trainjob(), progress=ENDPOINT)))
    for existing, endpoint in ((made_without, ENDPOINT), (made_with, None)):
        observed = copy.deepcopy(existing)
        observed["metadata"]["uid"] = "job-1"
        observed["status"] = {}
        plan = decide(snap(trainjob(), node_job=observed, jobs=(observed,), progress=endpoint))
        writes = [s for s in plan.steps if isinstance(s, (Apply, Create)) and s.resource in (JOBS, CONFIGMAPS)]
        assert writes == [], "the same template: nothing to apply"


def test_a_containers_own_value_wins():
    spec = {"containers": [{"name": "node", "env": [{"name": progress.ENV_URL, "value": "https://mine"}]},
                           {"name": "sidecar"}]}
    progress.inject(spec, ENDPOINT.base_url, "team-a", "llm")
    assert env_of(spec["containers"][0])[progress.ENV_URL] == "https://mine"
    assert env_of(spec["containers"][1])[progress.ENV_URL] == URL
    progress.inject(spec, ENDPOINT.base_url, "team-a", "llm")  # idempotent: one volume, one mount
    assert [v["name"] for v in spec["volumes"]] == [progress.VOLUME]
    assert len(spec["containers"][1]["volumeMounts"]) == 1
    assert progress.base_of(URL, "team-a", "llm") == ENDPOINT.base_url


# --- which reports are taken ------------------------------------------------------------------------
def test_a_full_report_is_taken_as_sent():
    body = {"trainerStatus": {"progressPercentage": 45, "estimatedRemainingSeconds": 795649,
                              "metrics": [{"name": "loss", "value": "0.2347"}], "lastUpdatedTime": "2025-01-23T10:30:45Z"}}
    assert progress.parse_report(body, NOW) == body["trainerStatus"]


def test_lastupdatedtime_defaults_to_when_it_was_received():
    assert progress.parse_report({"trainerStatus": {"progressPercentage": 0}}, NOW) == {
        "progressPercentage": 0, "lastUpdatedTime": "2026-11-23T12:00:00Z"}


@pytest.mark.parametrize("body, field", [
    ([], "body"), ({"trainerStatus": {}, "extra": 1}, "body"), ({"trainerStatus": 5}, "trainerStatus"),
    ({"trainerStatus": {"progressPercentage": 101}}, "progressPercentage"),
    ({"trainerStatus": {"progressPercentage": -1}}, "progressPercentage"),
    ({"trainerStatus": {"progressPercentage": True}}, "progressPercentage"),
    ({"trainerStatus": {"progressPercentage": 4.5}}, "progressPercentage"),
    ({"trainerStatus": {"estimatedRemainingSeconds": 2**31}}, "estimatedRemainingSeconds"),
    ({"trainerStatus": {"metrics": [{"name": "loss", "value": 0.2}]}}, "metrics[0]"),
    ({"trainerStatus": {"metrics": [{"name": "", "value": "1"}]}}, "metrics[0]"),
    ({"trainerStatus": {"metrics": [{"name": "a", "value": "1"}] * 257}}, "metrics"),
    ({"trainerStatus": {"lastUpdatedTime": "yesterday"}}, "lastUpdatedTime"),
    ({"trainerStatus": {"progress": 5}}, "trainerStatus.progress"),
])
def test_a_bad_report_is_refused_naming_the_field(body, field):
    with pytest.raises(progress.ReportError, match=field.replace("[", r"\[").replace("]", r"\]")):
        progress.parse_report(body, NOW)


# --- who may send it --------------------------------------------------------------------------------
def review(*, audiences=("trainer.kubeflow.org",), username="system:serviceaccount:team-a:default",
           pod="llm-node-0-0-abcde", uid="pod-1", authenticated=True) -> dict:
    extra = {progress.POD_NAME_EXTRA: [pod], progress.POD_UID_EXTRA: [uid]} if pod else {}
    return {"authenticated": authenticated, "audiences": list(audiences),
            "user": {"username": username, "extra": extra}}


def a_pod(*, uid="pod-1", namespace="team-a", trainjob="llm") -> dict:
    return {"metadata": {"name": "llm-node-0-0-abcde", "namespace": namespace, "uid": uid,
                         "labels": {TRAINJOB_NAME: trainjob}}}


def test_a_pod_of_the_trainjob_may_report():
    who = progress.sender(review())
    assert who == progress.Sender("system:serviceaccount:team-a:default", "team-a", "llm-node-0-0-abcde", "pod-1")
    assert progress.may_report(who, a_pod(), "team-a", "llm")


@pytest.mark.parametrize("status", [
    review(authenticated=False), review(audiences=()), review(audiences=("https://kubernetes.default.svc",)),
    review(pod=None), review(username="alice")])
def test_a_token_not_bound_to_a_pod_for_the_trainer_audience_is_nobody(status):
    assert progress.sender(status) is None


@pytest.mark.parametrize("pod, namespace, name", [
    (None, "team-a", "llm"),                       # the pod is gone
    (a_pod(uid="pod-2"), "team-a", "llm"),         # same name, another pod (the token's pod is gone)
    (a_pod(trainjob="other"), "team-a", "llm"),    # a pod of another TrainJob
    (a_pod(), "team-b", "llm"),                    # a TrainJob of the same name in another namespace
])
def test_no_pod_reports_for_a_trainjob_it_is_not_part_of(pod, namespace, name):
    assert not progress.may_report(progress.sender(review()), pod, namespace, name)


def test_token_buckets_allow_a_burst_then_the_rate_per_key():
    now = [0.0]
    limits = TokenBuckets(rate=1.0, burst=3, clock=lambda: now[0])
    assert [limits.take("a") for _ in range(3)] == [0, 0, 0]
    assert limits.take("a") == pytest.approx(1.0)
    assert limits.take("b") == 0, "keys do not share a bucket"
    now[0] = 2.5
    assert limits.take("a") == 0


# --- the endpoint's certificate ---------------------------------------------------------------------
def test_the_serving_certificate_names_the_service_and_is_signed_by_the_ca():
    now = datetime.now(timezone.utc)
    hosts = progress.url_hosts(ENDPOINT.base_url)
    assert hosts == ["gangctl-controller.gangctl-system.svc", "gangctl-controller.gangctl-system.svc.cluster.local"]
    ca_pem, ca_key = serving_cert.new_ca("test-ca", now)
    cert_pem, _ = serving_cert.new_serving_cert(ca_pem, ca_key, hosts + ["127.0.0.1"], now)
    x509.load_pem_x509_certificate(cert_pem.encode()).verify_directly_issued_by(
        x509.load_pem_x509_certificate(ca_pem.encode()))
    assert serving_cert.serves(cert_pem, hosts, now)
    assert not serving_cert.serves(cert_pem, ["host-controller.gangctl-local.svc"], now), "another name: re-issue"
    assert not serving_cert.serves(cert_pem, hosts, now + timedelta(days=340)), "within 30 days of expiry: re-issue"
