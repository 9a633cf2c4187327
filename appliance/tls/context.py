"""The listener's one ``ssl.SSLContext``, and how a new certificate reaches it without a restart.

uvicorn is handed this context (``ssl_context_factory``); :meth:`TlsContext.reload` calls
``load_cert_chain`` on the same object again, so every handshake after it presents the new
certificate while connections already open keep theirs. Nothing is dropped. A reload whose files
fail the checks leaves the served certificate as it was and says why.
"""

from __future__ import annotations

import datetime as dt
import logging
import ssl
from dataclasses import dataclass
from pathlib import Path

from appliance.errors import ConfigError
from appliance.settings import Settings
from appliance.tls.certinfo import CertInfo, read_info
from appliance.tls.generate import TlsFiles, ensure_self_signed
from appliance.tls.mode import box_names, tls_mode
from appliance.tls.validate import check_files

log = logging.getLogger("appliance.tls")


@dataclass(frozen=True, slots=True)
class CertSource:
    """The certificate chain and key files the listener serves, and the CA clients may trust (self-signed only)."""

    cert: Path
    key: Path
    ca: Path | None


def cert_source(settings: Settings) -> CertSource | None:
    """Where the served certificate lives for these settings; None with TLS off."""
    mode = tls_mode(settings)
    if mode == "off":
        return None
    if mode == "files":
        if settings.tls_cert_file is None or settings.tls_key_file is None:
            raise ConfigError('tls = "files" needs tls_cert_file and tls_key_file', code="invalid_certificate")
        return CertSource(settings.tls_cert_file, settings.tls_key_file, None)
    files = TlsFiles.of(settings.data_dir)
    return CertSource(files.server_cert, files.server_key, files.ca_cert)


def served_certificate(settings: Settings) -> CertInfo | None:
    """The certificate the daemon serves (read from its file), or None with TLS off or no file yet."""
    try:
        source = cert_source(settings)
        return read_info(source.cert) if source is not None else None
    except ConfigError:
        return None


def prepare(settings: Settings, now: dt.datetime | None = None) -> tuple[CertSource, CertInfo]:
    """Make or check the certificate files for these settings; raises ConfigError with TLS off or bad files."""
    source = cert_source(settings)
    if source is None:
        raise ConfigError("TLS is off", code="invalid_certificate")
    if tls_mode(settings) == "self-signed":
        made = ensure_self_signed(TlsFiles.of(settings.data_dir), box_names(settings), now)
        if made:
            log.info("self-signed TLS: %s", made)
        return source, read_info(source.cert)
    return source, check_files(source.cert, source.key, settings.allowed_hosts, now)


def server_context() -> ssl.SSLContext:
    """TLS 1.2 and 1.3 only, with the ciphers and options of the standard library's server defaults."""
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.options |= ssl.OP_NO_RENEGOTIATION | ssl.OP_NO_COMPRESSION
    return context


class TlsContext:
    """The served certificate and the SSLContext presenting it."""

    def __init__(self, settings: Settings):
        self._settings = settings
        self.context = server_context()
        self.current: CertInfo | None = None

    def load(self) -> CertInfo:
        """Make or check the files and load them; raises ConfigError (used at start, where bad files stop the daemon)."""
        source, cert = prepare(self._settings)
        try:
            self.context.load_cert_chain(str(source.cert), str(source.key))
        except (ssl.SSLError, OSError) as exc:
            raise ConfigError(
                f"the TLS library refused {source.cert} with {source.key}: {exc}", code="invalid_certificate"
            ) from None
        self.current = cert
        return cert

    def reload(self) -> CertInfo | None:
        """Load the files again (SIGHUP). Returns the certificate now served, or None when the new files were refused
        and the previous certificate stays."""
        try:
            cert = self.load()
        except ConfigError as exc:
            log.error("TLS reload refused, still serving %s: %s", self.current.fingerprint if self.current else "-", exc.message)
            return None
        log.info(
            "TLS certificate loaded",
            extra={"fields": {"fingerprint_sha256": cert.fingerprint, "not_after": cert.not_after.isoformat()}},
        )
        return cert
