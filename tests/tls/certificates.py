"""Certificates made in the test, with the ``cryptography`` package: a CA, a server certificate for 127.0.0.1 and
localhost, a client certificate; EC P-256 keys, which take milliseconds to make. Each is valid from five minutes ago
for a day, unless ``valid`` gives other dates (an expired certificate, one not valid yet, one close to its end)."""

from __future__ import annotations

import datetime
import ipaddress
import os
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

PrivateKey = ec.EllipticCurvePrivateKey


Validity = tuple[datetime.datetime, datetime.datetime]
"""notBefore and notAfter."""


def validity(*, starts: datetime.timedelta, ends: datetime.timedelta) -> Validity:
    """Dates relative to now: ``validity(starts=-days(30), ends=-days(1))`` expired yesterday."""
    now = datetime.datetime.now(datetime.UTC)
    return now + starts, now + ends


def days(count: float) -> datetime.timedelta:
    return datetime.timedelta(days=count)


@dataclass(frozen=True)
class Issued:
    cert_file: Path
    key_file: Path
    serial: int


@dataclass(frozen=True)
class Authority:
    cert: x509.Certificate
    key: PrivateKey
    cert_file: Path

    def issue(self, folder: Path, name: str, *, server: bool, serial: int | None = None,
              key: PrivateKey | None = None, valid: Validity | None = None) -> Issued:
        """A certificate signed by this CA, written as ``name.pem`` and ``name.key`` in ``folder`` (replaced
        atomically, as a deployment swaps them). ``server``: for 127.0.0.1 and localhost; else a client's."""
        key = key or ec.generate_private_key(ec.SECP256R1())
        serial = serial or x509.random_serial_number()
        usage = ExtendedKeyUsageOID.SERVER_AUTH if server else ExtendedKeyUsageOID.CLIENT_AUTH
        builder = _builder(name, self.cert.subject, key, serial, valid=valid).add_extension(
            x509.ExtendedKeyUsage([usage]), critical=False
        )
        if server:
            names = [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
            builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=False)
        cert = builder.sign(self.key, hashes.SHA256())
        key_file, cert_file = folder / f"{name}.key", folder / f"{name}.pem"
        _replace(key_file, _key_pem(key))
        _replace(cert_file, cert.public_bytes(serialization.Encoding.PEM))
        return Issued(cert_file, key_file, serial)


def make_authority(folder: Path, name: str = "ca", *, valid: Validity | None = None) -> Authority:
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"switchyard test {name}")])
    cert = (
        _builder(name, subject, key, x509.random_serial_number(), subject=subject, valid=valid)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(x509.KeyUsage(False, False, False, False, False, True, True, False, False), critical=True)
        .sign(key, hashes.SHA256())
    )
    cert_file = folder / f"{name}.pem"
    _replace(cert_file, cert.public_bytes(serialization.Encoding.PEM))
    return Authority(cert, key, cert_file)


def not_after_of(cert_file: Path) -> float:
    """The notAfter of the (first) certificate in a PEM file, as a unix time: what the expiry gauge shows."""
    return x509.load_pem_x509_certificate(cert_file.read_bytes()).not_valid_after_utc.timestamp()


def serial_of(der: bytes) -> int:
    """The serial number of a DER certificate (``SSLSocket.getpeercert(binary_form=True)``)."""
    return x509.load_der_x509_certificate(der).serial_number


def _builder(name: str, issuer: x509.Name, key: PrivateKey, serial: int,
             subject: x509.Name | None = None, valid: Validity | None = None) -> x509.CertificateBuilder:
    not_before, not_after = valid or validity(starts=-datetime.timedelta(minutes=5), ends=days(1))
    return (
        x509.CertificateBuilder()
        .subject_name(subject or x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)]))
        .issuer_name(issuer)
        .public_key(key.public_key())
        .serial_number(serial)
        .not_valid_before(not_before)
        .not_valid_after(not_after)
    )


def _key_pem(key: PrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def _replace(path: Path, data: bytes) -> None:
    partial = path.with_name(f".{path.name}.partial")
    partial.write_bytes(data)
    os.replace(partial, path)
