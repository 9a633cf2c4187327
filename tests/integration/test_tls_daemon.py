"""HTTPS served by the real daemon (``tls = "self-signed"`` on 127.0.0.1): what openssl, the `openai` SDK,
appliancectl and a browser-like client see; a SIGHUP that swaps the certificate under a running daemon.

All through one daemon process with a tiny llama.cpp model; the refusal of bad certificate files at start
uses short-lived daemons that exit before serving.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import re
import signal
import socket
import ssl
import subprocess
import sys
import time
from pathlib import Path

import httpx
import openai
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization

from appliance.tls.certinfo import fingerprint, pem
from appliance.tls.generate import issue_server
from tests.daemon import free_port
from tests.tlskit import TINY, TlsDaemon, negotiated, openssl_fingerprint, s_client, start_tls_daemon, tls_daemon_env

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def box(tmp_path_factory: pytest.TempPathFactory):
    running = start_tls_daemon(tmp_path_factory.mktemp("tls"), APPLIANCE_TLS_REDIRECT_PORT=str(free_port()))
    try:
        yield running
    finally:
        running.stop()


@pytest.fixture(scope="module")
def admin_key(box: TlsDaemon) -> str:
    return box.create_key("tls-admin", role="admin")


def ctl(box: TlsDaemon, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    """appliancectl as an admin on the box runs it: the daemon's settings in the environment."""
    environ = {k: v for k, v in box.env.items() if k.startswith("APPLIANCE_") or k in ("PATH", "HOME", "LANG")}
    environ.update(COLUMNS="250", **env)  # rich tables at full width
    return subprocess.run(
        [sys.executable, "-m", "appliance.cli", *args], env=environ, capture_output=True, text=True, timeout=120
    )


def served_fingerprint(box: TlsDaemon) -> str:
    result = s_client(box.port)
    assert negotiated(result), result.stdout[-2000:] + result.stderr[-2000:]
    return openssl_fingerprint(result)


def test_openssl_negotiates_tls13_and_tls12_and_sees_the_reported_certificate(box: TlsDaemon) -> None:
    default = s_client(box.port, "-CAfile", str(box.ca), "-verify_return_error")
    assert negotiated(default) is not None and negotiated(default)[0] == "TLSv1.3", default.stdout[-1500:]
    assert "Verify return code: 0 (ok)" in default.stdout  # the box's CA vouches for it, name and all
    tls12 = s_client(box.port, "-tls1_2")
    assert negotiated(tls12) is not None and negotiated(tls12)[0] == "TLSv1.2"
    assert re.match(r"ECDHE-(ECDSA|RSA)-(AES\d+-GCM|CHACHA20-POLY1305)", negotiated(tls12)[1]), negotiated(tls12)

    seen = openssl_fingerprint(default)
    shown = json.loads(ctl(box, "tls", "show", "--json").stdout)
    assert shown["certificate"]["fingerprint_sha256"] == seen
    assert shown["mode"] == "self-signed"
    doctor = ctl(box, "doctor", "--json")
    assert json.loads(doctor.stdout)["tls"]["certificate"]["fingerprint_sha256"] == seen
    assert seen in ctl(box, "doctor").stdout
    logged = [json.loads(line) for line in box.log().splitlines() if '"fingerprint_sha256"' in line]
    assert logged and logged[-1]["fingerprint_sha256"] == seen, box.log()[-2000:]


@pytest.mark.parametrize("version", ["-tls1_1", "-tls1"])
def test_tls_before_1_2_is_refused(box: TlsDaemon, version: str) -> None:
    # SECLEVEL=0 lets openssl's client offer the old protocol at all: the refusal must come from the daemon.
    result = s_client(box.port, version, "-cipher", "DEFAULT@SECLEVEL=0")
    assert result.returncode != 0
    assert negotiated(result) is None, result.stdout[-1500:]


def test_plain_http_on_the_tls_port_gets_no_page(box: TlsDaemon) -> None:
    with pytest.raises(httpx.HTTPError):
        httpx.get(f"http://127.0.0.1:{box.port}/healthz", timeout=5)


def _usage_rows(box: TlsDaemon) -> int:
    import sqlite3

    with sqlite3.connect(box.data_dir / "appliance.db") as conn:
        return conn.execute("SELECT count(*) FROM usage").fetchone()[0]


def test_the_plain_port_only_redirects_and_accepts_no_credential(box: TlsDaemon) -> None:
    plain = f"http://127.0.0.1:{box.env['APPLIANCE_TLS_REDIRECT_PORT']}"
    key = box.create_key("tls-plain")
    before = _usage_rows(box)
    with httpx.Client(base_url=plain, headers={"Authorization": f"Bearer {key}"}, timeout=30) as web:
        r = web.get("/v1/models?limit=5&x=%2F")
        assert r.status_code == 301 and r.content == b""
        assert r.headers["location"] == f"{box.url}/v1/models?limit=5&x=%2F"
        assert r.headers.get("connection") == "close"
        body = {"model": TINY, "messages": [{"role": "user", "content": "on the plain port"}], "max_tokens": 3}
        chat = web.post("/v1/chat/completions", json=body)
        assert chat.status_code == 301 and chat.content == b""
        assert chat.headers["location"] == f"{box.url}/v1/chat/completions"
        for path in ("/admin/keys/", "/login", "/metrics"):
            assert web.get(path).status_code == 301
        assert web.get("/", headers={"Host": "evil.example"}).status_code == 403
        assert "location" not in web.get("/", headers={"Host": "evil.example:80"}).headers
    assert _usage_rows(box) == before  # nothing ran: no request was served or metered there
    with httpx.Client(verify=str(box.ca), follow_redirects=True, timeout=30) as browser_like:
        landed = browser_like.get(plain + "/healthz")
        assert landed.status_code == 200 and str(landed.url) == box.url + "/healthz"


def test_openai_sdk_chats_over_https_trusting_the_box_ca(box: TlsDaemon) -> None:
    key = box.create_key("tls-sdk")
    client = openai.OpenAI(
        base_url=box.url + "/v1", api_key=key, max_retries=0, timeout=120, http_client=httpx.Client(verify=str(box.ca))
    )
    reply = client.chat.completions.create(model=TINY, messages=[{"role": "user", "content": "Hello over TLS"}], max_tokens=5)
    assert reply.choices[0].finish_reason in ("stop", "length")
    assert reply.usage.completion_tokens > 0

    untrusting = openai.OpenAI(base_url=box.url + "/v1", api_key=key, max_retries=0, timeout=30)  # the system CAs only
    with pytest.raises(openai.APIConnectionError):
        untrusting.models.list()


def test_hsts_on_every_https_answer_and_console_cookies_secure(box: TlsDaemon) -> None:
    from appliance.accounts.users import create_user
    from appliance.db.engine import make_engine

    engine = make_engine(box.data_dir / "appliance.db")
    create_user(engine, "tina", "tina-password-1", role="admin")
    engine.dispose()
    with httpx.Client(base_url=box.url, verify=str(box.ca), timeout=30) as web:
        form = web.get("/login")
        pre = form.headers.get_list("set-cookie")
        assert pre and all("; secure" in c.lower() for c in pre), pre
        token = re.search(r'name="csrf_token" value="([^"]+)"', form.text).group(1)
        signed = web.post(
            "/login",
            data={"username": "tina", "password": "tina-password-1", "csrf_token": token, "next": "/"},
            headers={"Origin": box.url},
        )
        assert signed.status_code == 303, signed.text[:500]
        cookies = signed.headers.get_list("set-cookie")
        session = [c for c in cookies if c.startswith("appliance_session=")]
        assert session and "; secure" in session[0].lower() and "httponly" in session[0].lower()
        assert all("; secure" in c.lower() for c in cookies), cookies
        for path in ("/healthz", "/v1/models", "/login", "/no/such/page", "/"):
            r = web.get(path)
            assert r.headers.get("strict-transport-security") == "max-age=31536000", (path, r.status_code, r.headers)
        # The origin check knows the scheme: the same host and port over http is another origin.
        page = web.get("/keys")
        csrf = re.search(r'"X-CSRF-Token":\s*"([^"]+)"', page.text).group(1)
        foreign = web.post("/logout", headers={"X-CSRF-Token": csrf, "Origin": f"http://127.0.0.1:{box.port}"})
        assert foreign.status_code == 403
        ours = web.post("/logout", headers={"X-CSRF-Token": csrf, "Origin": box.url})
        assert ours.status_code in (200, 303), ours.text[:300]


def test_cli_url_verifies_against_the_box_ca(box: TlsDaemon, admin_key: str, tmp_path: Path) -> None:
    remote = ("--url", box.url, "--api-key", admin_key)
    ok = ctl(box, *remote, "keys", "ls")  # the data dir's tls/ca.crt is the default trust
    assert ok.returncode == 0, ok.stderr
    assert "tls-admin" in ok.stdout
    named = ctl(box, *remote, "--ca-file", str(box.ca), "keys", "ls", APPLIANCE_DATA_DIR=str(tmp_path / "elsewhere"))
    assert named.returncode == 0, named.stderr
    other_ca = tmp_path / "other-ca.pem"
    from appliance.tls.generate import make_ca

    other, _ = make_ca("elsewhere", dt.datetime.now(dt.UTC))
    other_ca.write_bytes(pem(other))
    refused = ctl(box, *remote, "--ca-file", str(other_ca), "keys", "ls")
    assert refused.returncode != 0
    assert "certificate verify failed" in refused.stderr, refused.stderr
    env_named = ctl(box, *remote, "keys", "ls", APPLIANCE_CA_FILE=str(other_ca))
    assert env_named.returncode != 0 and "certificate verify failed" in env_named.stderr


def _replace_server_certificate(box: TlsDaemon, names: list[str]) -> str:
    """Issue a new server certificate from the box's CA into the served files; returns its fingerprint."""
    tls = box.data_dir / "tls"
    ca = x509.load_pem_x509_certificate((tls / "ca.crt").read_bytes())
    ca_key = serialization.load_pem_private_key((tls / "ca.key").read_bytes(), password=None)
    cert, key = issue_server(ca, ca_key, names, dt.datetime.now(dt.UTC), days=200)  # type: ignore[arg-type]
    key_pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    (tls / "server.key").write_bytes(key_pem)
    (tls / "server.crt").write_bytes(pem(cert))
    return fingerprint(cert)


def _open_tls(box: TlsDaemon) -> ssl.SSLSocket:
    context = ssl.create_default_context(cafile=str(box.ca))
    return context.wrap_socket(socket.create_connection(("127.0.0.1", box.port), timeout=30), server_hostname="localhost")


def _get_healthz(conn: ssl.SSLSocket) -> bytes:
    conn.sendall(b"GET /healthz HTTP/1.1\r\nHost: localhost\r\n\r\n")
    data = b""
    while b"\r\n\r\n" not in data:
        data += conn.recv(4096)
    return data


def test_sighup_serves_a_new_certificate_without_restart_or_dropping_connections(box: TlsDaemon) -> None:
    pid = box.proc.pid
    before = served_fingerprint(box)
    kept = _open_tls(box)  # a connection made before the swap
    kept_fp = fingerprint(x509.load_der_x509_certificate(kept.getpeercert(binary_form=True)))
    assert kept_fp == before
    new = _replace_server_certificate(box, ["localhost", "127.0.0.1", "::1", socket.gethostname().lower()])
    assert new != before
    reload = ctl(box, "tls", "reload")
    assert reload.returncode == 0, reload.stderr
    deadline = time.monotonic() + 20
    while served_fingerprint(box) != new and time.monotonic() < deadline:
        time.sleep(0.2)
    assert served_fingerprint(box) == new
    assert box.proc.poll() is None and box.proc.pid == pid  # same process, no restart
    assert _get_healthz(kept).startswith(b"HTTP/1.1 200")  # the old connection still answers
    kept.close()
    with httpx.Client(verify=str(box.ca), timeout=30) as web:
        assert web.get(box.url + "/healthz").status_code == 200
    assert json.loads(ctl(box, "tls", "show", "--json").stdout)["certificate"]["fingerprint_sha256"] == new

    # Files that fail the checks are refused by a reload: the certificate served stays.
    tls = box.data_dir / "tls"
    good_key = (tls / "server.key").read_bytes()
    (tls / "server.key").write_bytes((tls / "ca.key").read_bytes())  # a key that is not the certificate's
    os.kill(pid, signal.SIGHUP)
    deadline = time.monotonic() + 20
    while "TLS reload refused" not in box.log() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert "TLS reload refused" in box.log()
    assert served_fingerprint(box) == new
    (tls / "server.key").write_bytes(good_key)


def _expired_files(folder: Path) -> tuple[Path, Path]:
    from appliance.tls.generate import make_ca

    long_ago = dt.datetime.now(dt.UTC) - dt.timedelta(days=400)
    ca, ca_key = make_ca("old", long_ago)
    cert, key = issue_server(ca, ca_key, ["localhost", "127.0.0.1"], long_ago, days=30)
    cert_path, key_path = folder / "old.crt", folder / "old.key"
    cert_path.write_bytes(pem(cert))
    key_path.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    key_path.chmod(0o600)
    return cert_path, key_path


def test_daemon_refuses_to_start_on_an_expired_certificate(tmp_path: Path) -> None:
    cert, key = _expired_files(tmp_path)
    data, port, env = tls_daemon_env(
        tmp_path, APPLIANCE_TLS="files", APPLIANCE_TLS_CERT_FILE=str(cert), APPLIANCE_TLS_KEY_FILE=str(key)
    )
    result = subprocess.run([sys.executable, "-m", "appliance.daemon"], env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 2
    assert "expired on" in result.stderr and str(cert) in result.stderr, result.stderr[-1500:]
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", port), timeout=2).close()
