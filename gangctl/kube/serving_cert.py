"""The certificate gangctl serves the progress endpoint with, kept in a Secret it makes itself.

As Kubeflow Trainer's cert-controller does for its webhook, the controller needs no cert-manager: at
start it reads the Secret (`ca.crt`, `ca.key`, `tls.crt`, `tls.key`); if there is none it makes a CA
(10 years) and a serving certificate for the endpoint's host names (1 year) and creates it (two
replicas racing: the loser reads the winner's). A serving certificate that does not name the host,
or expires within 30 days, is re-issued from the same CA, so the `ca.crt` already given to running
trainer pods stays valid. Certificates are made with `cryptography` (pyca), not by hand.
"""
from __future__ import annotations

import base64
import ipaddress
import logging
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from gangctl.api.resources import SECRETS
from gangctl.kube.client import ApiError, Kube

log = logging.getLogger(__name__)
CA_YEARS, SERVING_DAYS, RENEW_DAYS = 10, 365, 30


@dataclass(frozen=True)
class ServingCert:
    cert_pem: str
    key_pem: str
    ca_pem: str


def _key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _pem_key(key) -> str:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption()).decode()


def _pem_cert(cert: x509.Certificate) -> str:
    return cert.public_bytes(serialization.Encoding.PEM).decode()


def new_ca(common_name: str, now: datetime) -> tuple[str, str]:
    key = _key()
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - timedelta(minutes=5))
            .not_valid_after(now + timedelta(days=365 * CA_YEARS))
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                         content_commitment=False, key_encipherment=False, data_encipherment=False,
                                         key_agreement=False, encipher_only=False, decipher_only=False), critical=True)
            .sign(key, hashes.SHA256()))
    return _pem_cert(cert), _pem_key(key)


def _san(host: str) -> x509.GeneralName:
    try:
        return x509.IPAddress(ipaddress.ip_address(host))
    except ValueError:
        return x509.DNSName(host)


def new_serving_cert(ca_pem: str, ca_key_pem: str, hosts: list[str], now: datetime) -> tuple[str, str]:
    ca = x509.load_pem_x509_certificate(ca_pem.encode())
    ca_key = serialization.load_pem_private_key(ca_key_pem.encode(), password=None)
    key = _key()
    cert = (x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, hosts[0])]))
            .issuer_name(ca.subject).public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - timedelta(minutes=5)).not_valid_after(now + timedelta(days=SERVING_DAYS))
            .add_extension(x509.SubjectAlternativeName([_san(h) for h in hosts]), critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
            .sign(ca_key, hashes.SHA256()))
    return _pem_cert(cert), _pem_key(key)


def serves(cert_pem: str, hosts: list[str], now: datetime) -> bool:
    """The certificate names every host and is good for more than RENEW_DAYS."""
    cert = x509.load_pem_x509_certificate(cert_pem.encode())
    if cert.not_valid_after_utc - now < timedelta(days=RENEW_DAYS):
        return False
    try:
        names = set(cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value)
    except x509.ExtensionNotFound:
        return False
    return all(_san(h) in names for h in hosts)


def _data(secret: dict) -> dict[str, str]:
    return {k: base64.b64decode(v).decode() for k, v in (secret.get("data") or {}).items()}


def _encode(data: dict[str, str]) -> dict[str, str]:
    return {k: base64.b64encode(v.encode()).decode() for k, v in data.items()}


async def ensure(kube: Kube, namespace: str, name: str, hosts: list[str]) -> ServingCert:
    """The Secret's certificate for `hosts`, made or re-issued as the module says."""
    for _ in range(5):
        now = datetime.now(timezone.utc)
        try:
            secret = await kube.get(SECRETS.path(namespace, name))
        except ApiError as err:
            if not err.not_found:
                raise
            ca_pem, ca_key = new_ca("gangctl-trainer-status-ca", now)
            cert, key = new_serving_cert(ca_pem, ca_key, hosts, now)
            data = {"ca.crt": ca_pem, "ca.key": ca_key, "tls.crt": cert, "tls.key": key}
            try:
                await kube.create(SECRETS.path(namespace), {"apiVersion": "v1", "kind": "Secret", "type": "Opaque",
                                         "metadata": {"name": name, "namespace": namespace,
                                                      "labels": {"app.kubernetes.io/name": "gangctl"}},
                                         "data": _encode(data)})
            except ApiError as err:
                if err.conflict:
                    continue  # another replica made it first: use theirs
                raise
            log.info("progress endpoint: made CA and certificate for %s in secret %s/%s", ", ".join(hosts),
                     namespace, name)
            return ServingCert(cert, key, ca_pem)
        data = _data(secret)
        if serves(data["tls.crt"], hosts, now):
            return ServingCert(data["tls.crt"], data["tls.key"], data["ca.crt"])
        data["tls.crt"], data["tls.key"] = new_serving_cert(data["ca.crt"], data["ca.key"], hosts, now)
        secret["data"] = _encode(data)
        try:
            await kube.request("PUT", SECRETS.path(namespace, name), body=secret)
        except ApiError as err:
            if err.conflict:
                continue
            raise
        log.info("progress endpoint: re-issued the certificate for %s (same CA)", ", ".join(hosts))
        return ServingCert(data["tls.crt"], data["tls.key"], data["ca.crt"])
    raise RuntimeError(f"secret {namespace}/{name} kept changing while gangctl made its certificate")
