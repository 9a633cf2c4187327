"""The ID token's signature, checked against the identity provider's published keys.

Only asymmetric signatures are accepted (RS256, ES256): ``none`` and the HMAC
algorithms are refused before any key is touched, so a token "signed" with the
provider's public key as an HMAC secret, or not signed at all, never passes.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Awaitable, Callable

from joserfc import jwt
from joserfc.errors import JoseError
from joserfc.jwk import KeySet

from appliance.jsontypes import JsonObject
from appliance.sso.refusals import SignOnRefused

ALGORITHMS = ("RS256", "ES256")
MAX_TOKEN_BYTES = 16 * 1024


def _b64decode(part: str) -> bytes:
    return base64.urlsafe_b64decode(part + "=" * (-len(part) % 4))


def header_of(token: str) -> JsonObject:
    """The JOSE header of a compact JWS, refused unless it is a plain signed token with an accepted algorithm."""
    if len(token) > MAX_TOKEN_BYTES or token.count(".") != 2:
        raise SignOnRefused("id token is not a compact JWS")
    try:
        header = json.loads(_b64decode(token.split(".", 1)[0]))
    except (ValueError, UnicodeDecodeError):
        raise SignOnRefused("id token header unreadable") from None
    if not isinstance(header, dict):
        raise SignOnRefused("id token header unreadable")
    alg = header.get("alg")
    if alg not in ALGORITHMS:
        raise SignOnRefused(f"id token algorithm {str(alg)[:16]!r} not accepted")
    if "crit" in header or "jku" in header or "x5u" in header or "jwk" in header:
        raise SignOnRefused("id token header names its own keys")
    return header


async def verified_claims(token: str, keys_for: Callable[[str | None], Awaitable[KeySet]]) -> JsonObject:
    """The token's claims once its signature checks out with the provider's key for its ``kid``."""
    header = header_of(token)
    kid = header.get("kid")
    keys = await keys_for(kid if isinstance(kid, str) else None)
    try:
        decoded = jwt.decode(token, keys, algorithms=list(ALGORITHMS))
    except (JoseError, ValueError):
        raise SignOnRefused("id token signature invalid") from None
    return dict(decoded.claims)
