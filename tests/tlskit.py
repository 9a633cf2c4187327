"""The real daemon serving HTTPS (``tls = "self-signed"`` on 127.0.0.1), and openssl's view of it."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

from tests.daemon import RunningDaemon, daemon_env, free_port
from tests.ggufkit import make_tiny_gguf

TINY = "tiny:q8_0"


class TlsDaemon(RunningDaemon):
    """A RunningDaemon whose public listener speaks https, checked against the CA it made in its data dir."""

    def __init__(self, data_dir: Path, port: int, env: dict[str, str]):
        super().__init__(data_dir, port, env)
        self.url = f"https://127.0.0.1:{port}"

    @property
    def ca(self) -> Path:
        return self.data_dir / "tls" / "ca.crt"

    @property
    def verify(self) -> str:
        return str(self.ca)

    def ready(self) -> bool:
        return self.ca.exists() and super().ready()


def tls_daemon_env(base: Path, **extra: str) -> tuple[Path, int, dict[str, str]]:
    """Data dir, port and environment of a self-signed HTTPS daemon serving a tiny model from a read-only store."""
    port = free_port()
    data = base / f"data-{port}"
    (data / "models").mkdir(parents=True)
    make_tiny_gguf(data / "models" / "Tiny-Q8_0.gguf", vocab=1024)
    env = daemon_env(
        data,
        port,
        **{"APPLIANCE_TLS": "self-signed", "APPLIANCE_STORE_READ_ONLY": "true", "APPLIANCE_DEFAULT_MODEL": TINY, **extra},
    )
    return data, port, env


def start_tls_daemon(base: Path, **extra: str) -> TlsDaemon:
    data, port, env = tls_daemon_env(base, **extra)
    return TlsDaemon(data, port, env).start()


def s_client(port: int, *args: str) -> subprocess.CompletedProcess[str]:
    """``openssl s_client`` to 127.0.0.1:port (its stdin closed at once: handshake, then quit)."""
    return subprocess.run(
        ["openssl", "s_client", "-connect", f"127.0.0.1:{port}", "-servername", "localhost", *args],
        input="",
        capture_output=True,
        text=True,
        timeout=30,
    )


def negotiated(result: subprocess.CompletedProcess[str]) -> tuple[str, str] | None:
    """(protocol, cipher) of a finished handshake, or None when none was agreed."""
    found = re.search(r"New, (TLSv[\d.]+), Cipher is (\S+)", result.stdout)
    if not found or found.group(2) == "(NONE)":
        return None
    return found.group(1), found.group(2)


def openssl_fingerprint(result: subprocess.CompletedProcess[str]) -> str:
    """SHA-256 fingerprint (AA:BB:... upper case) of the certificate s_client was shown, as openssl computes it."""
    pem = re.search(r"-----BEGIN CERTIFICATE-----.+?-----END CERTIFICATE-----", result.stdout, re.S)
    assert pem, result.stdout[-2000:]
    out = subprocess.run(
        ["openssl", "x509", "-noout", "-fingerprint", "-sha256"], input=pem.group(0), capture_output=True, text=True, check=True
    )
    return out.stdout.strip().split("=", 1)[1]
