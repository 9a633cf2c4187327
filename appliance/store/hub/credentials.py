"""The hub token: read from ``hub_token_file`` when a request is made, sent to the hub's own origin only.

The token never enters argv, logs, errors, audit rows or the database: it lives in
a file the admin controls (mode 0600), is read per pull (so a new token needs no
restart), and its ``repr`` is redacted. It is added per request, by origin
(scheme, host, port): a redirect to a CDN or anywhere else never carries it.
"""

from __future__ import annotations

from pathlib import Path
from urllib.parse import urlsplit

from appliance.errors import ConfigError

MAX_TOKEN = 4096


def origin_of(url: str) -> tuple[str, str, int] | None:
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:
        return None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return None
    return parts.scheme, parts.hostname.lower(), port or (443 if parts.scheme == "https" else 80)


class HubCredentials:
    """``HubCredentials(hub_url, token)``: an ``Authorization`` header for URLs of the hub's origin, nothing for others."""

    def __init__(self, hub_url: str, token: str | None):
        self._origin = origin_of(hub_url)
        self._token = token

    @classmethod
    def from_file(cls, hub_url: str, token_file: Path | None) -> HubCredentials:
        return cls(hub_url, read_token(token_file) if token_file is not None else None)

    @property
    def has_token(self) -> bool:
        return self._token is not None

    def headers_for(self, url: str) -> dict[str, str]:
        if self._token is None or self._origin is None or origin_of(url) != self._origin:
            return {}
        return {"Authorization": f"Bearer {self._token}"}

    def __repr__(self) -> str:
        return f"HubCredentials(token={'<redacted>' if self._token else None})"


def read_token(path: Path) -> str:
    """The token in ``path`` (surrounding whitespace dropped); ConfigError without the path's content."""
    try:
        raw = path.read_bytes()[: MAX_TOKEN + 1]
    except OSError:
        raise ConfigError("the hub token file (setting hub_token_file) cannot be read") from None
    token = raw.decode("ascii", errors="replace").strip()
    if not token or len(token) > MAX_TOKEN or any(not (33 <= ord(c) < 127) for c in token):
        raise ConfigError("the hub token file (setting hub_token_file) does not hold one token of printable characters")
    return token
