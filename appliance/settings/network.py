"""Settings of the HTTP listener: proxies, connection and header limits, timeouts and TLS."""

from __future__ import annotations

from pathlib import Path
from typing import Literal, Self

from pydantic import BaseModel, Field, model_validator


class NetworkFields(BaseModel):
    """Trusted proxies, the listener's limits and timeouts, and HTTPS."""

    trusted_proxies: list[str] = Field(
        default_factory=list,
        description=(
            "Addresses or CIDR ranges of reverse proxies whose X-Forwarded-For and X-Forwarded-Proto are believed. Empty: none; "
            "the peer address is the client."
        ),
    )
    max_connections: int = Field(
        default=512, ge=1, description="Most concurrent connections and requests the HTTP listener holds; more get 503 at once."
    )
    header_timeout_seconds: float = Field(
        default=10.0, gt=0, description="Longest a client may take to send a request's headers before the connection is closed."
    )
    body_timeout_seconds: float = Field(
        default=60.0,
        gt=0,
        description=(
            "Longest a client may take to send a whole request body, counted from the end of its headers; past it the daemon "
            "answers 408 and closes the connection."
        ),
    )
    max_header_bytes: int = Field(
        default=65536,
        ge=1024,
        description="Most bytes a request line and its headers may take together; more get 431 and the connection is closed.",
    )
    max_header_count: int = Field(
        default=100, ge=8, description="Most header lines one request may carry; more get 431 and the connection is closed."
    )
    anonymous_connections_per_address: int = Field(
        default=64,
        ge=1,
        description=(
            "Most connections one client address may hold open on the HTTP listener before any request on them has shown a "
            "valid API key or console session. One more closes that address's oldest such connection that is waiting for the "
            "client, so a client sending a whole request is always served. Addresses in `trusted_proxies` are not capped."
        ),
    )
    tls: Literal["auto", "off", "self-signed", "files"] = Field(
        default="auto",
        description=(
            "HTTPS on the API and console port. `self-signed`: a CA and a server certificate for the box's names and addresses, "
            "made once in `<data dir>/tls` (clients trust `tls/ca.crt`). `files`: the admin's `tls_cert_file` and "
            "`tls_key_file`, checked before use. `off`: plain HTTP. `auto`: `self-signed` when `host` reaches beyond loopback "
            "(system installs), `off` on loopback. TLS 1.2 and 1.3 only; SIGHUP or `appliancectl tls reload` loads new files "
            "without dropping connections."
        ),
    )
    tls_cert_file: Path | None = Field(
        default=None,
        description=(
            'PEM file with the server certificate first, then each intermediate (`tls = "files"`). Refused with a reason '
            "when expired, out of order, not matching the key, or naming none of `allowed_hosts`."
        ),
    )
    tls_key_file: Path | None = Field(
        default=None, description="PEM private key of `tls_cert_file`, without a passphrase (keep it mode 0600)."
    )
    tls_hsts_seconds: int = Field(
        default=31536000,
        ge=0,
        description="max-age of the Strict-Transport-Security header sent on every HTTPS response. 0 sends none.",
    )
    tls_redirect_port: int | None = Field(
        default=None,
        ge=1,
        le=65535,
        description=(
            "With TLS on, a plain-HTTP port on the same address that only answers 301 to the same path on https (e.g. 80; "
            "ports below 1024 need the service's CAP_NET_BIND_SERVICE). Nothing is served and no credential accepted there. "
            "Unset: no plain port."
        ),
    )

    @model_validator(mode="after")
    def _tls_files_given(self) -> Self:
        if self.tls == "files" and (self.tls_cert_file is None or self.tls_key_file is None):
            raise ValueError('tls = "files" needs tls_cert_file and tls_key_file')
        return self
