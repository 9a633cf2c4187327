"""Checks of the admin's certificate and key files (``tls = "files"``) before the daemon uses them.

Each failure is a ConfigError (code ``invalid_certificate``) whose message names the problem and
the file: a key that does not belong to the certificate, a chain out of order, a certificate
expired or not yet valid, one that names none of the box's allowed host names, or one not meant
for servers. The daemon refuses to start on such files, and a reload keeps the certificate it serves.
"""

from __future__ import annotations

import datetime as dt
from pathlib import Path

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.types import PrivateKeyTypes, PublicKeyTypes
from cryptography.x509.oid import ExtendedKeyUsageOID

from appliance.errors import ConfigError
from appliance.tls.certinfo import CertInfo, covers, info, read_chain, san_names
from appliance.tls.mode import is_loopback


def _fail(message: str) -> ConfigError:
    return ConfigError(message, code="invalid_certificate")


def _public(key: PublicKeyTypes) -> bytes:
    return key.public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)


def read_key(path: Path) -> PrivateKeyTypes:
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise _fail(f"cannot read key file {path}: {exc.strerror}") from None
    try:
        return serialization.load_pem_private_key(data, password=None)
    except TypeError:
        raise _fail(f"key file {path} is encrypted; give the key without a passphrase (kept 0600)") from None
    except ValueError:
        raise _fail(f"{path} holds no PEM private key the daemon can read") from None


def _check_key(chain: list[x509.Certificate], key: PrivateKeyTypes, cert_path: Path, key_path: Path) -> None:
    ours = _public(key.public_key())
    if _public(chain[0].public_key()) == ours:
        return
    if any(_public(c.public_key()) == ours for c in chain[1:]):
        raise _fail(f"chain order in {cert_path}: the server certificate (the one {key_path} belongs to) must come first")
    raise _fail(f"the key in {key_path} does not match the certificate in {cert_path}")


def _check_order(chain: list[x509.Certificate], cert_path: Path) -> None:
    for position, (cert, issuer) in enumerate(zip(chain, chain[1:], strict=False), start=1):
        try:
            cert.verify_directly_issued_by(issuer)
        except (ValueError, TypeError, InvalidSignature):
            raise _fail(
                f"chain order in {cert_path}: certificate {position + 1} ({issuer.subject.rfc4514_string()}) did not issue "
                f"certificate {position} ({cert.subject.rfc4514_string()}); list the server certificate, then each issuer"
            ) from None


def _check_dates(chain: list[x509.Certificate], cert_path: Path, now: dt.datetime) -> None:
    for position, cert in enumerate(chain, start=1):
        what = "the server certificate" if position == 1 else f"certificate {position} ({cert.subject.rfc4514_string()})"
        if cert.not_valid_after_utc <= now:
            raise _fail(f"{what} in {cert_path} expired on {cert.not_valid_after_utc:%Y-%m-%d %H:%M} UTC")
        if cert.not_valid_before_utc > now:
            raise _fail(f"{what} in {cert_path} is not valid before {cert.not_valid_before_utc:%Y-%m-%d %H:%M} UTC")


def _check_use(leaf: x509.Certificate, cert_path: Path) -> None:
    try:
        usages = leaf.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    except x509.ExtensionNotFound:
        return
    if ExtendedKeyUsageOID.SERVER_AUTH not in usages:
        raise _fail(f"the certificate in {cert_path} is not for TLS servers (its extended key usage lacks serverAuth)")


def _check_names(leaf: x509.Certificate, cert_path: Path, allowed_hosts: list[str]) -> None:
    names = san_names(leaf)
    if not names:
        raise _fail(f"the certificate in {cert_path} has no subjectAltName; clients check names only there")
    if "*" in allowed_hosts:
        return
    public = [h for h in allowed_hosts if not is_loopback(_host_part(h))]
    wanted = public or allowed_hosts
    if not any(covers(names, _host_part(h)) for h in wanted):
        raise _fail(
            f"the certificate in {cert_path} names {', '.join(names)}, none of allowed_hosts ({', '.join(wanted)}); "
            "clients reach the box by those names, so add the certificate's name to allowed_hosts or use one that names the box"
        )


def _host_part(host: str) -> str:
    if host.startswith("["):
        return host[1 : host.find("]")] if "]" in host else host
    return host.rsplit(":", 1)[0] if host.count(":") == 1 else host


def check_files(cert_path: Path, key_path: Path, allowed_hosts: list[str], now: dt.datetime | None = None) -> CertInfo:
    """Validate the admin's PEM chain and key; returns the server certificate's facts or raises ConfigError."""
    now = now or dt.datetime.now(dt.UTC)
    chain = read_chain(cert_path)
    key = read_key(key_path)
    _check_key(chain, key, cert_path, key_path)
    _check_order(chain, cert_path)
    _check_dates(chain, cert_path, now)
    _check_use(chain[0], cert_path)
    _check_names(chain[0], cert_path, allowed_hosts)
    return info(chain[0])
