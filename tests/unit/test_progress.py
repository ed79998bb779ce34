"""status.trainerStatus (Trainer KEP-2779) without a cluster: what trainer pods are given, which
reports are taken, who may send them, the rate limit and the endpoint's certificate. The endpoint
itself, with real tokens from real pods, is tests/integration/test_trainer_status.py."""
from __future__ import annotations

import base64
import copy
import socket
import ssl
from datetime import datetime, timedelta, timezone

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization

from gangctl.api.resources import CONFIGMAPS, JOBS
from gangctl.kube import serving_cert
from gangctl.model.names import MANAGED_BY, MANAGER, TRAINJOB_NAME
from gangctl.model import progress
from gangctl.policy.decide import Apply, Create, decide
from gangctl.runtime import progress_server
from gangctl.sim import objects
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


TRAINJOB = objects.trainjob(uid="tj-1")


def owned_by(obj: dict, uid: str, *, kind: str, name: str, api_version: str = "batch/v1") -> dict:
    out = copy.deepcopy(obj)
    out["metadata"]["ownerReferences"] = [{"apiVersion": api_version, "kind": kind, "name": name, "uid": uid,
                                           "controller": True, "blockOwnerDeletion": True}]
    return out


JOB = owned_by({"metadata": {"name": "llm-node-0", "namespace": "team-a", "uid": "job-1"}}, "tj-1", kind="TrainJob",
               name="llm", api_version="trainer.kubeflow.org/v1alpha1")


def a_pod(*, uid="pod-1", namespace="team-a", trainjob="llm", job_uid="job-1", phase="Running") -> dict:
    """A trainer pod as the Job controller makes it (its labels copied from gangctl's template)."""
    pod = objects.pod("llm-node-0-0-abcde", namespace=namespace, uid=uid,
                      labels={MANAGED_BY: MANAGER, TRAINJOB_NAME: trainjob}, phase=phase)
    return owned_by(pod, job_uid, kind="Job", name="llm-node-0")


def jobs(*known: dict):
    by_name = {(j["metadata"]["namespace"], j["metadata"]["name"]): j for j in known}
    return lambda namespace, kind, name: by_name.get((namespace, name)) if kind == "Job" else None


def refusal(pod, *, trainjob=TRAINJOB, owners=(JOB,), namespace="team-a", name="llm", token=None):
    return progress.refusal(progress.sender(token or review()), pod, trainjob, jobs(*owners), namespace, name)


def test_a_live_pod_made_by_the_trainjobs_job_may_report():
    who = progress.sender(review())
    assert who == progress.Sender("system:serviceaccount:team-a:default", "team-a", "llm-node-0-0-abcde", "pod-1")
    assert refusal(a_pod()) is None
    assert refusal(a_pod(phase="Pending")) is None, "a pod whose container runs before the kubelet says Running"


@pytest.mark.parametrize("status", [
    review(authenticated=False), review(audiences=()), review(audiences=("https://kubernetes.default.svc",)),
    review(pod=None), review(username="alice")])
def test_a_token_not_bound_to_a_pod_for_the_trainer_audience_is_nobody(status):
    assert progress.sender(status) is None


def hand_made() -> dict:
    """A pod someone allowed to create pods made with the TrainJob's labels: no owner."""
    pod = a_pod()
    del pod["metadata"]["ownerReferences"]
    return pod


def not_blocking() -> dict:
    """A pod that names the Job as its controller without blockOwnerDeletion, which the Job controller
    always sets (and hardened API servers let only those allowed to update the Job's finalizers set)."""
    pod = a_pod()
    pod["metadata"]["ownerReferences"][0]["blockOwnerDeletion"] = False
    return pod


def deleting() -> dict:
    pod = a_pod()
    pod["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    return pod


@pytest.mark.parametrize("pod, kwargs, why", [
    (None, {}, "not a pod gangctl knows"),                                   # the pod is gone (or not cached)
    (a_pod(uid="pod-2"), {}, "not a pod gangctl knows"),                     # same name, another pod
    (a_pod(), {"namespace": "team-b"}, "namespace team-b"),                  # same name in another namespace
    (a_pod(phase="Succeeded"), {}, "finished (Succeeded)"),
    (a_pod(phase="Failed"), {}, "finished (Failed)"),
    (deleting(), {}, "being deleted"),
    (hand_made(), {}, "not made for TrainJob team-a/llm"),                   # labels prove nothing
    (not_blocking(), {}, "not made for"),
    (a_pod(), {"owners": ()}, "not made for"),                               # its Job is not gangctl's (not cached)
    (a_pod(job_uid="job-2"), {}, "not made for"),                            # a Job of that name, not its maker
    (a_pod(), {"owners": (owned_by(JOB, "tj-0", kind="TrainJob", name="llm",
                                    api_version="trainer.kubeflow.org/v1alpha1"),)}, "not made for"),  # an earlier llm
    (a_pod(), {"owners": (owned_by(JOB, "tj-1", kind="TrainJob", name="llm", api_version="example.com/v1"),)},
     "not made for"),                                                        # a look-alike kind of another group
    (a_pod(), {"trainjob": None}, "not made for"),                           # no such TrainJob (not told apart)
    (a_pod(trainjob="other"), {"name": "other", "trainjob": {"metadata": {"name": "other", "uid": "tj-9"}}},
     "not made for"),                                                         # relabelled pod of another TrainJob
])
def test_only_a_live_pod_whose_owners_lead_to_the_trainjob_may_report(pod, kwargs, why):
    assert why in (refusal(pod, **kwargs) or "")


def test_an_owner_chain_that_loops_ends():
    loop = owned_by({"metadata": {"name": "llm-node-0", "namespace": "team-a", "uid": "job-1"}}, "job-1",
                    kind="Job", name="llm-node-0")
    assert "not made for" in refusal(a_pod(), owners=(loop,))


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


def pem_secret(**override: str | None) -> dict:
    """A Secret as gangctl makes it, with some keys replaced (None: removed); values given as text."""
    now = datetime.now(timezone.utc)
    ca_pem, ca_key = serving_cert.new_ca("test-ca", now)
    cert_pem, key_pem = serving_cert.new_serving_cert(ca_pem, ca_key, ["127.0.0.1"], now)
    data = {"ca.crt": ca_pem, "ca.key": ca_key, "tls.crt": cert_pem, "tls.key": key_pem}
    for key, value in override.items():
        if value is None:
            data.pop(key.replace("_", "."))
        else:
            data[key.replace("_", ".")] = value
    return {"data": {k: base64.b64encode(v.encode()).decode() for k, v in data.items()}}


OTHER_CA, OTHER_KEY = serving_cert.new_ca("someone-else", datetime.now(timezone.utc))


@pytest.mark.parametrize("override, message", [
    ({"tls_crt": None}, "data.tls.crt is missing"),
    ({"ca_crt": None}, "data.ca.crt is missing"),
    ({"tls_crt": "not a certificate"}, "data.tls.crt is not a PEM certificate"),
    ({"tls_key": "-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n"}, "data.tls.key is not an unencrypted"),
    ({"tls_key": OTHER_KEY}, "data.tls.key is not the key of data.tls.crt"),
    ({"ca_key": OTHER_KEY}, "data.ca.key is not the key of data.ca.crt"),
    ({"ca_crt": OTHER_CA, "ca_key": OTHER_KEY}, "data.tls.crt is not signed by data.ca.crt"),
])
def test_a_malformed_secret_is_named_key_by_key(override, message):
    with pytest.raises(serving_cert.MalformedSecret, match=message.replace(".", r"\.")) as err:
        serving_cert.read_secret(pem_secret(**override), "gangctl-system/tls")
    assert "gangctl-system/tls" in str(err.value)


def test_a_value_that_is_not_base64_is_named():
    secret = pem_secret()
    secret["data"]["tls.key"] = "%%% not base64 %%%"
    with pytest.raises(serving_cert.MalformedSecret, match=r"data\.tls\.key is not base64"):
        serving_cert.read_secret(secret, "ns/tls")
    secret["data"]["tls.key"] = base64.b64encode(b"\xff\xfe").decode()
    with pytest.raises(serving_cert.MalformedSecret, match=r"data\.tls\.key is not base64-encoded text"):
        serving_cert.read_secret(secret, "ns/tls")


def test_a_secret_without_the_ca_key_serves_as_it_is():
    data = serving_cert.read_secret(pem_secret(ca_key=None), "ns/tls")
    assert set(data) == {"ca.crt", "tls.crt", "tls.key"}


def handshake(port: int, ca_pem: str) -> bytes:
    """The certificate a TLS client verifying with `ca_pem` is shown on 127.0.0.1:`port` (DER)."""
    context = ssl.create_default_context(cadata=ca_pem)
    with socket.create_connection(("127.0.0.1", port), timeout=5) as raw:
        with context.wrap_socket(raw, server_hostname="127.0.0.1") as tls:
            return tls.getpeercert(binary_form=True)


async def test_a_certificate_loaded_into_the_serving_context_is_shown_from_the_next_handshake():
    """The reload the endpoint relies on: `load_cert` on the context a listening server already has
    (no restart); the connection made before it keeps the certificate it was shown."""
    import asyncio

    now = datetime.now(timezone.utc)
    ca_pem, ca_key = serving_cert.new_ca("test-ca", now)
    first = serving_cert.ServingCert(*serving_cert.new_serving_cert(ca_pem, ca_key, ["127.0.0.1"], now), ca_pem)
    second = serving_cert.ServingCert(*serving_cert.new_serving_cert(ca_pem, ca_key, ["127.0.0.1"], now), ca_pem)
    context = progress_server.server_context()
    progress_server.load_cert(context, first)

    async def echo(reader, writer):
        writer.close()
    server = await asyncio.start_server(echo, "127.0.0.1", 0, ssl=context)
    port = server.sockets[0].getsockname()[1]
    der = lambda pem: x509.load_pem_x509_certificate(pem.encode()).public_bytes(serialization.Encoding.DER)  # noqa: E731
    try:
        assert await asyncio.to_thread(handshake, port, ca_pem) == der(first.cert_pem)
        progress_server.load_cert(context, second)
        assert await asyncio.to_thread(handshake, port, ca_pem) == der(second.cert_pem)
    finally:
        server.close()
        await server.wait_closed()


def test_a_pytorchjobs_own_pod_may_report_for_it_and_no_other():
    job = objects.pytorchjob("ddp", uid="pj-1")
    pod = owned_by(objects.pod("ddp-worker-0", namespace="team-a", uid="pod-1", phase="Running"), "pj-1",
                   kind="PyTorchJob", name="ddp", api_version="kubeflow.org/v1")
    who = progress.sender(review(pod="ddp-worker-0"))
    assert progress.refusal(who, pod, job, jobs(), "team-a", "ddp", "PyTorchJob") is None
    other = objects.pytorchjob("ddp", uid="pj-2")   # a PyTorchJob of the same name made again
    assert "was not made for PyTorchJob team-a/ddp" in progress.refusal(who, pod, other, jobs(), "team-a", "ddp",
                                                                         "PyTorchJob")
    # a TrainJob's pod may not report for a PyTorchJob, nor a PyTorchJob's pod for a TrainJob named alike
    assert "was not made for PyTorchJob" in progress.refusal(progress.sender(review()), a_pod(), job, jobs(JOB),
                                                             "team-a", "ddp", "PyTorchJob")
    assert "was not made for TrainJob" in progress.refusal(who, pod, objects.trainjob("ddp", uid="pj-1"), jobs(),
                                                           "team-a", "ddp")


def test_a_pytorchjobs_report_is_read_from_its_annotation():
    job = objects.pytorchjob("ddp", uid="pj-1", metadata={"annotations": {
        progress.REPORT_ANNOTATION: '{"lastUpdatedTime":"2026-11-23T11:00:00Z","progressPercentage":5}'}})
    assert progress.reported(job) == {"lastUpdatedTime": "2026-11-23T11:00:00Z", "progressPercentage": 5}
    for bad in ("not json", "[1]", '{"lastUpdatedTime": "yesterday"}'):
        job["metadata"]["annotations"][progress.REPORT_ANNOTATION] = bad
        assert progress.silent_for(progress.reported(job), NOW, NOW) is None, bad
