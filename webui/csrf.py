"""CSRF protection for every unsafe console request.

Tokens are bound to something the attacker cannot read or set: the session id
once signed in, or a random pre-session cookie on the sign-in form. A token is
``HMAC-SHA256(console secret, purpose + binding)``, so it is never stored and a
token from one session is worthless in another. htmx sends it in the
``X-CSRF-Token`` header (``hx-headers`` on ``<body>``); plain forms send the
``csrf_token`` field. A browser's ``Sec-Fetch-Site: cross-site`` or a foreign
``Origin`` (another scheme, host or port) is refused even with a token. SameSite=Strict cookies are the second
line of defence, not the first.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
from urllib.parse import urlsplit

from litestar import Request

from appliance.errors import PermissionDenied

HEADER = "x-csrf-token"
FIELD = "csrf_token"
PRE_COOKIE = "appliance_presession"
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})


class CsrfFailed(PermissionDenied):
    """The unsafe request carries no valid CSRF token, or comes from another site."""

    code = "csrf_failed"


def token(secret: bytes, purpose: str, binding: str) -> str:
    mac = hmac.new(secret, f"{purpose}\x00{binding}".encode(), hashlib.sha256).digest()
    return base64.urlsafe_b64encode(mac).rstrip(b"=").decode()


def valid(secret: bytes, purpose: str, binding: str | None, presented: str | None) -> bool:
    if not binding or not presented or len(presented) > 128:
        return False
    return hmac.compare_digest(token(secret, purpose, binding).encode(), presented.encode("utf-8", "replace"))


_DEFAULT_PORTS = {"http": 80, "https": 443}


def _origin_of(scheme: str, netloc: str) -> tuple[str, str, int] | None:
    """(scheme, host, port) of ``scheme://netloc``, the default port filled in; None when it does not parse."""
    try:
        parts = urlsplit(f"{scheme}://{netloc}")
        port = parts.port
    except ValueError:
        return None
    if parts.scheme not in _DEFAULT_PORTS or not parts.hostname or parts.username is not None or parts.password is not None:
        return None
    return parts.scheme, parts.hostname, port if port is not None else _DEFAULT_PORTS[parts.scheme]


def same_origin(request: Request) -> bool:
    """False when the browser says the request was made by another site: ``Sec-Fetch-Site``, or an ``Origin``
    whose scheme, host or port differs from this request's (``https://host`` is another origin than ``http://host``)."""
    if request.headers.get("sec-fetch-site", "same-origin") not in ("same-origin", "none"):
        return False
    origin = request.headers.get("origin")
    if origin and origin != "null":
        scheme, sep, netloc = origin.partition("://")
        theirs = _origin_of(scheme.lower(), netloc) if sep and "/" not in netloc else None
        ours = _origin_of(request.url.scheme, request.headers.get("host", ""))
        return theirs is not None and theirs == ours
    return origin != "null"


async def presented_token(request: Request) -> str | None:
    value = request.headers.get(HEADER)
    if value:
        return value
    content_type = request.headers.get("content-type", "")
    if content_type.startswith(("application/x-www-form-urlencoded", "multipart/form-data")):
        form = await request.form()
        field = form.get(FIELD)
        return field if isinstance(field, str) else None
    return None


async def check(request: Request, secret: bytes, purpose: str, binding: str | None) -> None:
    """Raise CsrfFailed (403) unless the unsafe request carries the right token from this origin."""
    if request.method in SAFE_METHODS:
        return
    if not same_origin(request):
        raise CsrfFailed("Cross-site request refused.")
    if not valid(secret, purpose, binding, await presented_token(request)):
        raise CsrfFailed("Missing or invalid CSRF token. Reload the page and try again.")
