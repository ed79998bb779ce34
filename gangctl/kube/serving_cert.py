"""The certificate gangctl serves the progress endpoint with, kept in a Secret it makes itself.

As Kubeflow Trainer's cert-controller does for its webhook, the controller needs no cert-manager: at
start it reads the Secret (`ca.crt`, `ca.key`, `tls.crt`, `tls.key`); if there is none it makes a CA
(10 years) and a serving certificate for the endpoint's host names (1 year) and creates it (two
replicas racing: the loser reads the winner's). A serving certificate that does not name the host,
or expires within 30 days, is re-issued from the same CA, so the `ca.crt` already given to running
trainer pods stays valid. The controller calls `ensure` again every few minutes and serves what it
returns (gangctl.runtime.progress_server), so a re-issued certificate is in use without a restart.

A Secret that exists but cannot serve (a key missing, not PEM, a certificate and key that do not
match, a certificate not signed by its CA, or one due for re-issue without `ca.key`) raises
`MalformedSecret` naming the key: it is not gangctl's to overwrite, so the endpoint stays off until
it is fixed. Certificates are made with `cryptography` (pyca), not by hand.
"""
from __future__ import annotations

import base64
import binascii
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
REQUIRED = ("ca.crt", "tls.crt", "tls.key")


class MalformedSecret(ValueError):
    """The Secret exists but its certificate cannot be served; the message names the Secret and key."""


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


def read_secret(secret: dict, where: str) -> dict[str, str]:
    """The Secret's PEM texts (`ca.crt`, `tls.crt`, `tls.key`, and `ca.key` when there), checked to fit
    together; `MalformedSecret` naming the first key that does not."""
    raw = secret.get("data") or {}
    data: dict[str, str] = {}
    for key in (*REQUIRED, "ca.key"):
        if key not in raw:
            if key in REQUIRED:
                raise MalformedSecret(f"secret {where}: data.{key} is missing")
            continue
        try:
            data[key] = base64.b64decode(raw[key], validate=True).decode()
        except (binascii.Error, ValueError, TypeError):
            raise MalformedSecret(f"secret {where}: data.{key} is not base64-encoded text") from None
    certs, keys = {}, {}
    for key in ("ca.crt", "tls.crt"):
        try:
            certs[key] = x509.load_pem_x509_certificate(data[key].encode())
        except ValueError:
            raise MalformedSecret(f"secret {where}: data.{key} is not a PEM certificate") from None
    for key in ("ca.key", "tls.key"):
        if key in data:
            try:
                keys[key] = serialization.load_pem_private_key(data[key].encode(), password=None)
            except (ValueError, TypeError):
                raise MalformedSecret(f"secret {where}: data.{key} is not an unencrypted PEM private key") from None
    for key, cert in (("tls.key", "tls.crt"), ("ca.key", "ca.crt")):
        if key in keys and keys[key].public_key() != certs[cert].public_key():
            raise MalformedSecret(f"secret {where}: data.{key} is not the key of data.{cert}")
    try:
        certs["tls.crt"].verify_directly_issued_by(certs["ca.crt"])
    except Exception:  # noqa: BLE001 - ValueError, TypeError or InvalidSignature: all mean "not signed by it"
        raise MalformedSecret(f"secret {where}: data.tls.crt is not signed by data.ca.crt") from None
    return data


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
        data = read_secret(secret, f"{namespace}/{name}")
        if serves(data["tls.crt"], hosts, now):
            return ServingCert(data["tls.crt"], data["tls.key"], data["ca.crt"])
        if "ca.key" not in data:
            raise MalformedSecret(f"secret {namespace}/{name}: data.tls.crt must be re-issued (it expires within "
                                  f"{RENEW_DAYS} days or does not name {', '.join(hosts)}) and there is no data.ca.key")
        data["tls.crt"], data["tls.key"] = new_serving_cert(data["ca.crt"], data["ca.key"], hosts, now)
        secret["data"] = {**secret["data"], **_encode({k: data[k] for k in ("tls.crt", "tls.key")})}
        try:
            await kube.request("PUT", SECRETS.path(namespace, name), body=secret)
        except ApiError as err:
            if err.conflict:
                continue
            raise
        log.info("progress endpoint: re-issued the certificate for %s (same CA)", ", ".join(hosts))
        return ServingCert(data["tls.crt"], data["tls.key"], data["ca.crt"])
    raise RuntimeError(f"secret {namespace}/{name} kept changing while gangctl made its certificate")
