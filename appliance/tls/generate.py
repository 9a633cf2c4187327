"""The box's own CA and server certificate, generated once into ``<data dir>/tls``.

``ca.crt``/``ca.key`` are made on first use and kept (clients trust ``ca.crt`` once);
``server.crt``/``server.key`` are issued by that CA for the box's names and addresses, and
issued again when the box gains a name the certificate lacks or the certificate has less
than :data:`RENEW_DAYS` days left. Keys are EC P-256, written 0600 through a temporary file
and an atomic rename, so a crash never leaves a half-written key in place.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import os
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from appliance.tls.certinfo import covers, pem, san_names

CA_DAYS = 3650
SERVER_DAYS = 397  # the longest life browsers accept for a server certificate
RENEW_DAYS = 30


@dataclass(frozen=True, slots=True)
class TlsFiles:
    """Where the self-signed mode keeps its files."""

    directory: Path

    @classmethod
    def of(cls, data_dir: Path) -> TlsFiles:
        return cls(data_dir / "tls")

    @property
    def ca_cert(self) -> Path:
        return self.directory / "ca.crt"

    @property
    def ca_key(self) -> Path:
        return self.directory / "ca.key"

    @property
    def server_cert(self) -> Path:
        return self.directory / "server.crt"

    @property
    def server_key(self) -> Path:
        return self.directory / "server.key"


def _write(path: Path, data: bytes, mode: int) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    try:
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
    os.chmod(tmp, mode)  # the umask may have narrowed it; never widened past `mode`
    os.replace(tmp, path)


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())


def _name(common_name: str) -> x509.Name:
    return x509.Name(
        [x509.NameAttribute(NameOID.ORGANIZATION_NAME, "LLM appliance"), x509.NameAttribute(NameOID.COMMON_NAME, common_name)]
    )


def _san(names: list[str]) -> x509.SubjectAlternativeName:
    general: list[x509.GeneralName] = []
    for name in names:
        try:
            general.append(x509.IPAddress(ipaddress.ip_address(name)))
        except ValueError:
            general.append(x509.DNSName(name))
    return x509.SubjectAlternativeName(general)


def make_ca(hostname: str, now: dt.datetime) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    key = ec.generate_private_key(ec.SECP256R1())
    name = _name(f"LLM appliance CA ({hostname})"[:64])
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=CA_DAYS))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(False, False, False, False, False, True, True, False, False), critical=True
        )  # keyCertSign, cRLSign
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    return cert, key


def issue_server(
    ca: x509.Certificate, ca_key: ec.EllipticCurvePrivateKey, names: list[str], now: dt.datetime, days: int = SERVER_DAYS
) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    """A server certificate for ``names`` (DNS names and IP addresses), signed by the CA."""
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name(names[0][:64]))
        .issuer_name(ca.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.KeyUsage(True, False, False, False, False, False, False, False, False), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(_san(names), critical=False)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    return cert, key


def _needs_new_server(files: TlsFiles, ca: x509.Certificate, names: list[str], now: dt.datetime) -> str | None:
    """Why the server certificate must be issued again, or None when it is fine."""
    if not files.server_cert.exists() or not files.server_key.exists():
        return "none yet"
    try:
        cert = x509.load_pem_x509_certificate(files.server_cert.read_bytes())
    except ValueError:
        return "unreadable"
    if cert.issuer != ca.subject:
        return "issued by another CA"
    have = san_names(cert)
    missing = [n for n in names if not covers(have, n)]
    if missing:
        return "lacks " + ", ".join(missing)
    if cert.not_valid_after_utc - now < dt.timedelta(days=RENEW_DAYS):
        return f"expires {cert.not_valid_after_utc:%Y-%m-%d}"
    return None


def ensure_self_signed(files: TlsFiles, names: list[str], now: dt.datetime | None = None) -> str | None:
    """Make the CA (once) and a server certificate covering ``names``. Returns why a certificate was
    made (for the log), or None when the existing ones were kept."""
    now = now or dt.datetime.now(dt.UTC)
    files.directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    made = None
    if files.ca_cert.exists() and files.ca_key.exists():
        ca = x509.load_pem_x509_certificate(files.ca_cert.read_bytes())
        loaded = serialization.load_pem_private_key(files.ca_key.read_bytes(), password=None)
        assert isinstance(loaded, ec.EllipticCurvePrivateKey), "ca.key is not the EC key this module writes"
        ca_key = loaded
    else:
        ca, ca_key = make_ca(names[0], now)
        _write(files.ca_key, _key_pem(ca_key), 0o600)
        _write(files.ca_cert, pem(ca), 0o644)
        made = "new CA"
    why = _needs_new_server(files, ca, names, now)
    if why is not None:
        cert, key = issue_server(ca, ca_key, names, now)
        _write(files.server_key, _key_pem(key), 0o600)
        _write(files.server_cert, pem(cert), 0o644)
        made = ", ".join(filter(None, [made, f"server certificate issued ({why})"]))
    return made
