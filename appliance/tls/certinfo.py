"""What one X.509 certificate says: SHA-256 fingerprint, validity and the names it covers."""

from __future__ import annotations

import datetime as dt
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization

from appliance.errors import ConfigError


@dataclass(frozen=True, slots=True)
class CertInfo:
    """The served certificate, as the installer, ``appliancectl doctor`` and the console show it."""

    fingerprint: str  # SHA-256 of the DER certificate, upper-case hex pairs joined by ':' (as browsers and openssl show it)
    subject: str
    issuer: str
    not_before: dt.datetime
    not_after: dt.datetime
    names: tuple[str, ...]

    def days_left(self, now: dt.datetime | None = None) -> float:
        now = now or dt.datetime.now(dt.UTC)
        return (self.not_after - now).total_seconds() / 86400

    def as_json(self) -> dict[str, object]:
        return {
            "fingerprint_sha256": self.fingerprint,
            "subject": self.subject,
            "issuer": self.issuer,
            "not_before": self.not_before.isoformat(),
            "not_after": self.not_after.isoformat(),
            "days_left": round(self.days_left(), 1),
            "names": list(self.names),
        }


def fingerprint(cert: x509.Certificate) -> str:
    return cert.fingerprint(hashes.SHA256()).hex(":").upper()


def san_names(cert: x509.Certificate) -> tuple[str, ...]:
    """DNS names (lower case) and IP addresses of the certificate's subjectAltName; empty without one."""
    try:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return ()
    dns = [n.lower() for n in san.get_values_for_type(x509.DNSName)]
    ips = [str(a) for a in san.get_values_for_type(x509.IPAddress)]
    return tuple(dns + ips)


def info(cert: x509.Certificate) -> CertInfo:
    return CertInfo(
        fingerprint=fingerprint(cert),
        subject=cert.subject.rfc4514_string(),
        issuer=cert.issuer.rfc4514_string(),
        not_before=cert.not_valid_before_utc,
        not_after=cert.not_valid_after_utc,
        names=san_names(cert),
    )


def read_chain(path: Path) -> list[x509.Certificate]:
    """Every certificate of a PEM file, in file order; a ConfigError naming the file when there is none."""
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise ConfigError(f"cannot read certificate file {path}: {exc.strerror}", code="invalid_certificate") from None
    try:
        chain = x509.load_pem_x509_certificates(data)
    except ValueError:
        chain = []
    if not chain:
        raise ConfigError(f"{path} holds no PEM certificate (-----BEGIN CERTIFICATE-----)", code="invalid_certificate")
    return chain


def read_info(path: Path) -> CertInfo:
    """The first (server) certificate of a PEM file."""
    return info(read_chain(path)[0])


def covers(names: tuple[str, ...], host: str) -> bool:
    """True when a certificate naming ``names`` is valid for ``host`` (one-label wildcards as RFC 6125 allows)."""
    host = host.strip("[]").lower().rstrip(".")
    try:
        return str(ipaddress.ip_address(host)) in names
    except ValueError:
        pass
    for name in names:
        if name == host:
            return True
        if name.startswith("*.") and "." in host and host.split(".", 1)[1] == name[2:]:
            return True
    return False


def pem(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)
