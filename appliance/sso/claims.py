"""Pure checks of a verified ID token's claims, and the groups → role mapping.

Nothing here does I/O: every function takes the claims, what the console expects
and the time, and either returns or raises :class:`SignOnRefused` with a reason.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

from appliance.sso.refusals import SignOnForbidden, SignOnRefused

LEEWAY_SECONDS = 60
ROLE_ORDER = ("viewer", "operator", "admin")
_USERNAME = re.compile(r"^[A-Za-z0-9._@+-]{1,64}$")


@dataclass(frozen=True, slots=True)
class Expected:
    """What the console expects of one ID token."""

    issuer: str
    client_id: str
    nonce: str
    now: float
    leeway: int = LEEWAY_SECONDS


def _number(claims: Mapping[str, object], name: str) -> float:
    value = claims.get(name)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise SignOnRefused(f"id token has no numeric {name}")
    return float(value)


def check_claims(claims: Mapping[str, object], expected: Expected) -> None:
    """OpenID Connect Core 3.1.3.7: issuer, audience (and ``azp``), expiry, issue time and nonce."""
    if claims.get("iss") != expected.issuer:
        raise SignOnRefused("id token issuer mismatch")
    audience = claims.get("aud")
    audiences = [audience] if isinstance(audience, str) else audience if isinstance(audience, list) else []
    if expected.client_id not in audiences:
        raise SignOnRefused("id token audience mismatch")
    azp = claims.get("azp")
    if (len(audiences) > 1 or azp is not None) and azp != expected.client_id:
        raise SignOnRefused("id token authorized party mismatch")
    if _number(claims, "exp") + expected.leeway <= expected.now:
        raise SignOnRefused("id token expired")
    if _number(claims, "iat") - expected.leeway > expected.now:
        raise SignOnRefused("id token issued in the future")
    if "nbf" in claims and _number(claims, "nbf") - expected.leeway > expected.now:
        raise SignOnRefused("id token not yet valid")
    nonce = claims.get("nonce")
    if not isinstance(nonce, str) or nonce != expected.nonce:
        raise SignOnRefused("id token nonce mismatch")
    if not isinstance(claims.get("sub"), str) or not claims["sub"]:
        raise SignOnRefused("id token has no subject")


def username_from(claims: Mapping[str, object], claim: str) -> str:
    """The console user name: the configured claim, else ``email``, else ``sub``."""
    for name in (claim, "email", "sub"):
        value = claims.get(name)
        if isinstance(value, str) and value.strip():
            value = value.strip()
            if not _USERNAME.match(value):
                raise SignOnForbidden(
                    f"unusable user name in claim {name}",
                    "Your user name at the identity provider cannot be used as a console user name "
                    "(1-64 letters, digits and . _ @ + -). Ask an administrator.",
                )
            return value
    raise SignOnRefused("id token names no user")


def groups_from(claims: Mapping[str, object], claim: str) -> list[str]:
    """The user's groups: a list of strings, or one string; anything else is no groups."""
    value = claims.get(claim)
    if isinstance(value, str):
        return [value]
    if isinstance(value, list):
        return [g for g in value if isinstance(g, str)]
    return []


def role_for(groups: list[str], mapping: Mapping[str, str], default: str | None) -> str | None:
    """The highest console role any of ``groups`` maps to; ``default`` when none maps; None: refused."""
    found = [mapping[g] for g in groups if mapping.get(g) in ROLE_ORDER]
    if not found:
        return default
    return max(found, key=ROLE_ORDER.index)
