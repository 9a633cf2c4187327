"""The daemon's certificates, without a daemon: what the self-signed mode generates, what the checks of an
admin's files refuse (each refusal naming its problem), which listen addresses turn HTTPS on by default,
the TLS context's protocol floor, and the expiry alert with a real database and a real webhook receiver."""

from __future__ import annotations

import asyncio
import datetime as dt
import ipaddress
import json
import socket
import ssl
import stat
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from appliance.errors import ConfigError
from appliance.settings import Settings
from appliance.tls.certinfo import fingerprint, info, pem, read_info
from appliance.tls.context import TlsContext, server_context
from appliance.tls.expiry import ExpiryWatch
from appliance.tls.generate import RENEW_DAYS, TlsFiles, ensure_self_signed, issue_server, make_ca
from appliance.tls.mode import box_names, tls_mode
from appliance.tls.validate import check_files
from tests.webhookkit import Receiver

NOW = dt.datetime.now(dt.UTC)


def _key_pem(key: object, password: bytes | None = None) -> bytes:
    encryption = serialization.BestAvailableEncryption(password) if password else serialization.NoEncryption()
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, encryption)  # type: ignore[attr-defined]


def _cert(
    subject: str,
    issuer_cert: x509.Certificate | None,
    issuer_key: object,
    *,
    ca: bool = False,
    names: list[str] | None = None,
    start: dt.datetime = NOW - dt.timedelta(days=1),
    days: int = 90,
    usage: list[x509.ObjectIdentifier] | None = None,
) -> tuple[x509.Certificate, object]:
    """A certificate signed by ``issuer_key`` (itself when ``issuer_cert`` is None), with an RSA key: admins bring RSA too."""
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)])
    builder = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(issuer_cert.subject if issuer_cert is not None else name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(start + dt.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
    )
    if names:
        general = []
        for n in names:
            try:
                general.append(x509.IPAddress(ipaddress.ip_address(n)))
            except ValueError:
                general.append(x509.DNSName(n))
        builder = builder.add_extension(x509.SubjectAlternativeName(general), critical=False)
    if usage is not None:
        builder = builder.add_extension(x509.ExtendedKeyUsage(usage), critical=False)
    signer = issuer_key if issuer_cert is not None else key
    return builder.sign(signer, hashes.SHA256()), key  # type: ignore[arg-type]


@pytest.fixture
def company(tmp_path: Path):
    """A company PKI: root → intermediate → server certificate for llm.example.com."""
    root, root_key = _cert("Example Root", None, None, ca=True, days=3650)
    inter, inter_key = _cert("Example Issuing CA", root, root_key, ca=True, days=1000)
    leaf, leaf_key = _cert("llm.example.com", inter, inter_key, names=["llm.example.com", "10.0.0.7"])
    return {"root": root, "inter": inter, "inter_key": inter_key, "leaf": leaf, "leaf_key": leaf_key, "dir": tmp_path}


def _write(folder: Path, certs: list[x509.Certificate], key: object, name: str = "server") -> tuple[Path, Path]:
    cert_path, key_path = folder / f"{name}.crt", folder / f"{name}.key"
    cert_path.write_bytes(b"".join(pem(c) for c in certs))
    key_path.write_bytes(_key_pem(key))
    return cert_path, key_path


ALLOWED = ["llm.example.com", "localhost", "127.0.0.1"]


# ------------------------------------------------------------------ admin's files
def test_a_good_chain_with_its_intermediate_is_accepted(company) -> None:
    cert, key = _write(company["dir"], [company["leaf"], company["inter"]], company["leaf_key"])
    found = check_files(cert, key, ALLOWED)
    assert found.fingerprint == fingerprint(company["leaf"])
    assert found.names == ("llm.example.com", "10.0.0.7")
    assert check_files(cert, key, ["10.0.0.7:8443"]).fingerprint == found.fingerprint  # an address with a port
    assert check_files(cert, key, ["*"]) == found


def test_a_key_of_another_certificate_is_refused(company) -> None:
    _, other_key = _cert("other", None, None)
    cert, key = _write(company["dir"], [company["leaf"], company["inter"]], other_key)
    with pytest.raises(ConfigError, match=r"the key in .*server\.key does not match the certificate in .*server\.crt") as err:
        check_files(cert, key, ALLOWED)
    assert err.value.code == "invalid_certificate"


def test_the_intermediate_first_is_refused_as_chain_order(company) -> None:
    cert, key = _write(company["dir"], [company["inter"], company["leaf"]], company["leaf_key"])
    with pytest.raises(ConfigError, match="chain order .* the server certificate .* must come first"):
        check_files(cert, key, ALLOWED)


def test_an_issuer_that_did_not_sign_the_one_before_is_refused(company) -> None:
    cert, key = _write(company["dir"], [company["leaf"], company["root"]], company["leaf_key"])  # intermediate left out
    with pytest.raises(ConfigError, match=r"chain order .*certificate 2 \(CN=Example Root\) did not issue certificate 1"):
        check_files(cert, key, ALLOWED)


def test_an_expired_server_certificate_is_refused_with_its_date(company) -> None:
    old, old_key = _cert(
        "llm.example.com",
        company["inter"],
        company["inter_key"],
        names=["llm.example.com"],
        start=NOW - dt.timedelta(days=100),
        days=30,
    )
    cert, key = _write(company["dir"], [old, company["inter"]], old_key)
    expired_on = (NOW - dt.timedelta(days=70)).strftime("%Y-%m-%d")
    with pytest.raises(ConfigError, match=f"the server certificate in .* expired on {expired_on}"):
        check_files(cert, key, ALLOWED)


def test_an_expired_intermediate_is_refused_naming_it(company, tmp_path: Path) -> None:
    root, root_key = _cert("Old Root", None, None, ca=True, days=3650)
    inter, inter_key = _cert("Lapsed CA", root, root_key, ca=True, start=NOW - dt.timedelta(days=40), days=20)
    leaf, leaf_key = _cert("llm.example.com", inter, inter_key, names=["llm.example.com"], start=NOW - dt.timedelta(days=30))
    cert, key = _write(tmp_path, [leaf, inter], leaf_key)
    with pytest.raises(ConfigError, match=r"certificate 2 \(CN=Lapsed CA\) in .* expired on"):
        check_files(cert, key, ALLOWED)


def test_a_certificate_not_yet_valid_is_refused(company) -> None:
    future, future_key = _cert(
        "llm.example.com", company["inter"], company["inter_key"], names=["llm.example.com"], start=NOW + dt.timedelta(days=2)
    )
    cert, key = _write(company["dir"], [future, company["inter"]], future_key)
    with pytest.raises(ConfigError, match="is not valid before"):
        check_files(cert, key, ALLOWED)


@pytest.mark.parametrize(
    "allowed",
    [["llm.other.com"], ["sub.llm.example.com"], ["example.com"], ["10.0.0.8"], ["localhost", "127.0.0.1", "[::1]"]],
)
def test_a_certificate_naming_none_of_the_allowed_hosts_is_refused(company, allowed: list[str]) -> None:
    cert, key = _write(company["dir"], [company["leaf"], company["inter"]], company["leaf_key"])
    with pytest.raises(ConfigError, match=r"names llm\.example\.com, 10\.0\.0\.7, none of allowed_hosts"):
        check_files(cert, key, allowed)


def test_a_wildcard_certificate_covers_one_label_only(company) -> None:
    wild, wild_key = _cert("*.example.com", company["inter"], company["inter_key"], names=["*.example.com"])
    cert, key = _write(company["dir"], [wild, company["inter"]], wild_key)
    assert check_files(cert, key, ["llm.example.com"]).names == ("*.example.com",)
    with pytest.raises(ConfigError, match="none of allowed_hosts"):
        check_files(cert, key, ["a.llm.example.com"])


def test_no_subject_alt_name_and_client_only_usage_are_refused(company) -> None:
    bare, bare_key = _cert("llm.example.com", company["inter"], company["inter_key"])
    cert, key = _write(company["dir"], [bare, company["inter"]], bare_key)
    with pytest.raises(ConfigError, match="has no subjectAltName"):
        check_files(cert, key, ALLOWED)
    client, client_key = _cert(
        "llm.example.com",
        company["inter"],
        company["inter_key"],
        names=["llm.example.com"],
        usage=[ExtendedKeyUsageOID.CLIENT_AUTH],
    )
    cert, key = _write(company["dir"], [client, company["inter"]], client_key)
    with pytest.raises(ConfigError, match="lacks serverAuth"):
        check_files(cert, key, ALLOWED)


def test_unreadable_encrypted_or_empty_files_are_refused_by_name(company) -> None:
    cert, key = _write(company["dir"], [company["leaf"], company["inter"]], company["leaf_key"])
    key.write_bytes(_key_pem(company["leaf_key"], password=b"secret"))
    with pytest.raises(ConfigError, match="is encrypted"):
        check_files(cert, key, ALLOWED)
    key.write_bytes(b"-----BEGIN PRIVATE KEY-----\nnot base64\n-----END PRIVATE KEY-----\n")
    with pytest.raises(ConfigError, match="holds no PEM private key"):
        check_files(cert, key, ALLOWED)
    cert.write_bytes(b"just text\n")
    with pytest.raises(ConfigError, match="holds no PEM certificate"):
        check_files(cert, key, ALLOWED)
    with pytest.raises(ConfigError, match="cannot read certificate file"):
        check_files(company["dir"] / "missing.crt", key, ALLOWED)


# ------------------------------------------------------------------ self-signed
def test_self_signed_makes_a_ca_and_a_server_certificate_for_the_box(tmp_path: Path) -> None:
    settings = Settings(data_dir=tmp_path, host="0.0.0.0", allowed_hosts=["llm.corp.example", "127.0.0.1"])
    names = box_names(settings)
    for expected in (socket.gethostname().lower(), "localhost", "127.0.0.1", "::1", "llm.corp.example"):
        assert expected in names
    files = TlsFiles.of(tmp_path)
    assert ensure_self_signed(files, names) == "new CA, server certificate issued (none yet)"
    for key in (files.ca_key, files.server_key):
        assert stat.S_IMODE(key.stat().st_mode) == 0o600
    assert stat.S_IMODE(files.directory.stat().st_mode) == 0o700
    ca = x509.load_pem_x509_certificate(files.ca_cert.read_bytes())
    server = x509.load_pem_x509_certificate(files.server_cert.read_bytes())
    assert ca.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    assert not server.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    server.verify_directly_issued_by(ca)
    assert ExtendedKeyUsageOID.SERVER_AUTH in server.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert set(names) <= set(info(server).names)
    # The checks of admin's files accept what the box makes for itself.
    assert check_files(files.server_cert, files.server_key, settings.allowed_hosts).fingerprint == fingerprint(server)


def test_self_signed_files_are_kept_then_reissued_for_a_new_name_or_near_expiry(tmp_path: Path) -> None:
    files = TlsFiles.of(tmp_path)
    ensure_self_signed(files, ["box", "localhost", "127.0.0.1"])
    ca_before, first = files.ca_cert.read_bytes(), read_info(files.server_cert)
    assert ensure_self_signed(files, ["box", "localhost", "127.0.0.1"]) is None
    assert read_info(files.server_cert) == first
    assert ensure_self_signed(files, ["box", "localhost", "127.0.0.1", "llm.corp.example"]) == (
        "server certificate issued (lacks llm.corp.example)"
    )
    second = read_info(files.server_cert)
    assert "llm.corp.example" in second.names and second.fingerprint != first.fingerprint
    later = second.not_after - dt.timedelta(days=RENEW_DAYS - 1)
    made = ensure_self_signed(files, ["box", "localhost", "127.0.0.1", "llm.corp.example"], now=later)
    assert made is not None and made.startswith("server certificate issued (expires ")
    assert files.ca_cert.read_bytes() == ca_before  # clients keep trusting the same CA


@pytest.mark.parametrize(
    ("host", "mode"),
    [
        ("127.0.0.1", "off"),
        ("localhost", "off"),
        ("::1", "off"),
        ("127.0.0.2", "off"),
        ("0.0.0.0", "self-signed"),
        ("::", "self-signed"),
        ("10.1.2.3", "self-signed"),
        ("llm.corp.example", "self-signed"),
    ],
)
def test_auto_is_https_beyond_loopback(tmp_path: Path, host: str, mode: str) -> None:
    assert tls_mode(Settings(data_dir=tmp_path, host=host)) == mode
    assert tls_mode(Settings(data_dir=tmp_path, host=host, tls="off")) == "off"


def test_files_mode_needs_both_files(tmp_path: Path) -> None:
    from appliance.settings import load_settings

    with pytest.raises(ConfigError, match="needs tls_cert_file and tls_key_file"):
        load_settings(data_dir=tmp_path, tls="files", tls_cert_file=tmp_path / "a.crt")


# ------------------------------------------------------------------ context
def test_the_context_refuses_tls_before_1_2_and_reload_swaps_the_chain(tmp_path: Path) -> None:
    context = server_context()
    assert context.minimum_version == ssl.TLSVersion.TLSv1_2
    settings = Settings(data_dir=tmp_path, host="127.0.0.1", tls="self-signed")
    tls = TlsContext(settings)
    first = tls.load()
    assert tls.context.minimum_version == ssl.TLSVersion.TLSv1_2
    files = TlsFiles.of(tmp_path)
    files.server_cert.unlink()  # the next load issues a new certificate from the same CA
    second = tls.reload()
    assert second is not None and second.fingerprint != first.fingerprint
    files.server_key.write_bytes(files.ca_key.read_bytes())  # a key that is not the certificate's
    (tmp_path / "tls" / "server.crt").write_bytes(files.server_cert.read_bytes())
    settings_files = Settings(
        data_dir=tmp_path, host="127.0.0.1", tls="files", tls_cert_file=files.server_cert, tls_key_file=files.server_key
    )
    strict = TlsContext(settings_files)
    assert strict.reload() is None  # refused: nothing loaded, the caller keeps what it served
    with pytest.raises(ConfigError, match="does not match"):
        strict.load()


# ------------------------------------------------------------------ expiry alert
def test_a_certificate_near_expiry_raises_one_audit_row_and_one_signed_webhook(tmp_path: Path) -> None:
    from appliance.db import engine as dbmod

    dbmod.migrate(tmp_path / "appliance.db")
    db = dbmod.make_engine(tmp_path / "appliance.db")
    receiver = Receiver()
    try:
        settings = Settings(data_dir=tmp_path, alert_webhook_url=receiver.url, alert_webhook_secret="s3cret")
        ca, ca_key = make_ca("box", NOW - dt.timedelta(days=300))
        soon, _ = issue_server(ca, ca_key, ["box"], NOW - dt.timedelta(days=380), days=397)  # 17 days left
        later, _ = issue_server(ca, ca_key, ["box"], NOW, days=397)
        watch = ExpiryWatch(settings, db)
        assert asyncio.run(watch.check(info(later))) is False
        assert asyncio.run(watch.check(info(soon))) is True
        assert asyncio.run(watch.check(info(soon))) is True  # checked again: no second row, no second POST
        with db.connect() as conn:
            rows = conn.exec_driver_sql("SELECT actor, action, detail FROM audit_log WHERE action = 'tls.expiry'").all()
        assert len(rows) == 1 and rows[0][0] == "system" and fingerprint(soon) in rows[0][2]
        assert len(receiver.received) == 1
        headers, body = receiver.received[0]
        assert receiver.signature_ok(headers, body, "s3cret")
        payload = json.loads(body)
        assert payload["type"] == "tls.expiry" and payload["fingerprint_sha256"] == fingerprint(soon)
        assert 16 <= payload["days_left"] <= 18
    finally:
        receiver.close()
        db.dispose()


def test_an_undelivered_expiry_alert_is_tried_again_at_the_next_check(tmp_path: Path) -> None:
    from appliance.db import engine as dbmod

    dbmod.migrate(tmp_path / "appliance.db")
    db = dbmod.make_engine(tmp_path / "appliance.db")
    receiver = Receiver(status=500)
    try:
        settings = Settings(data_dir=tmp_path, alert_webhook_url=receiver.url, alert_webhook_secret="s3cret")
        key = ec.generate_private_key(ec.SECP256R1())
        ca, _ = make_ca("box", NOW)
        soon, _ = issue_server(ca, key, ["box"], NOW - dt.timedelta(days=390), days=397)
        watch = ExpiryWatch(settings, db)
        asyncio.run(watch.check(info(soon)))
        receiver.status = 204
        asyncio.run(watch.check(info(soon)))
        asyncio.run(watch.check(info(soon)))
        assert len(receiver.received) == 2  # one refused, one delivered, then no more
    finally:
        receiver.close()
        db.dispose()
