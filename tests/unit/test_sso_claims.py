"""Single sign-on's pure pieces: ID token claim checks, user names, groups → role, single-use state."""

from __future__ import annotations

import pytest

from appliance.sso.claims import Expected, check_claims, groups_from, role_for, username_from
from appliance.sso.idtoken import header_of
from appliance.sso.pending import PendingSignOns
from appliance.sso.refusals import SignOnForbidden, SignOnRefused, SignOnStateRefused

NOW = 1_800_000_000.0
EXPECTED = Expected(issuer="https://idp.example", client_id="console", nonce="n-123", now=NOW)


def claims(**changes: object) -> dict[str, object]:
    base: dict[str, object] = {
        "iss": "https://idp.example",
        "aud": "console",
        "sub": "u1",
        "exp": NOW + 300,
        "iat": NOW - 5,
        "nonce": "n-123",
    }
    base.update(changes)
    return {k: v for k, v in base.items() if v is not None}


def refused(call, kind: type[SignOnRefused] = SignOnRefused) -> str:
    """The audit reason of the refusal ``call()`` raises."""
    with pytest.raises(kind) as caught:
        call()
    return caught.value.reason


def reason(**changes: object) -> str:
    return refused(lambda: check_claims(claims(**changes), EXPECTED))


def test_a_good_token_passes():
    check_claims(claims(), EXPECTED)
    check_claims(claims(aud=["console", "other"], azp="console"), EXPECTED)
    check_claims(claims(exp=NOW - 30), EXPECTED)  # inside the leeway


def test_each_claim_is_checked():
    assert reason(iss="https://evil.example") == "id token issuer mismatch"
    assert reason(iss=None) == "id token issuer mismatch"
    assert reason(aud="other") == "id token audience mismatch"
    assert reason(aud=["other", "third"]) == "id token audience mismatch"
    assert reason(aud=None) == "id token audience mismatch"
    assert reason(aud=["console", "other"]) == "id token authorized party mismatch"  # several audiences need azp
    assert reason(aud=["console", "other"], azp="other") == "id token authorized party mismatch"
    assert reason(exp=NOW - 61) == "id token expired"
    assert reason(exp=None) == "id token has no numeric exp"
    assert reason(exp="9999999999") == "id token has no numeric exp"
    assert reason(iat=NOW + 120) == "id token issued in the future"
    assert reason(nbf=NOW + 120) == "id token not yet valid"
    assert reason(nonce="n-999") == "id token nonce mismatch"
    assert reason(nonce=None) == "id token nonce mismatch"
    assert reason(sub="") == "id token has no subject"


def test_only_asymmetric_signed_tokens_are_looked_at():
    import base64
    import json

    def token(header: dict[str, object]) -> str:
        encode = lambda d: base64.urlsafe_b64encode(json.dumps(d).encode()).rstrip(b"=").decode()  # noqa: E731
        return f"{encode(header)}.{encode({'sub': 'x'})}.c2ln"

    assert header_of(token({"alg": "RS256", "kid": "k"}))["kid"] == "k"
    assert header_of(token({"alg": "ES256"}))["alg"] == "ES256"
    for alg in ("none", "HS256", "HS512", "RS512", None):
        assert "algorithm" in refused(lambda alg=alg: header_of(token({"alg": alg})))
    assert "its own keys" in refused(lambda: header_of(token({"alg": "RS256", "jku": "https://evil.example/keys"})))
    for bad in ("a.b", "not-base64!.x.y", "a" * 20000):
        with pytest.raises(SignOnRefused):
            header_of(bad)


def test_user_name_comes_from_the_claim_then_email_then_sub():
    assert username_from({"preferred_username": "ada", "email": "a@x", "sub": "1"}, "preferred_username") == "ada"
    assert username_from({"email": "ada@example.com", "sub": "1"}, "preferred_username") == "ada@example.com"
    assert username_from({"sub": "abc-1"}, "preferred_username") == "abc-1"
    assert username_from({"upn": "bob", "sub": "1"}, "upn") == "bob"
    with pytest.raises(SignOnForbidden):
        username_from({"preferred_username": "ada <script>"}, "preferred_username")
    with pytest.raises(SignOnRefused):
        username_from({}, "preferred_username")


def test_groups_map_to_the_highest_role_or_the_default_or_none():
    mapping = {"llm-admins": "admin", "llm-ops": "operator", "staff": "viewer"}
    assert role_for(["staff", "llm-admins", "llm-ops"], mapping, None) == "admin"
    assert role_for(["staff", "llm-ops"], mapping, None) == "operator"
    assert role_for(["staff"], mapping, "operator") == "viewer"  # a matching group beats the default
    assert role_for(["sales"], mapping, None) is None
    assert role_for([], mapping, "viewer") == "viewer"
    assert role_for(["weird"], {"weird": "root"}, None) is None
    assert groups_from({"groups": ["a", 3, "b"]}, "groups") == ["a", "b"]
    assert groups_from({"groups": "a"}, "groups") == ["a"]
    assert groups_from({"groups": {"a": 1}}, "groups") == []
    assert groups_from({}, "roles") == []


def test_state_works_once_for_the_browser_that_started_it_and_expires():
    now = [100.0]
    table = PendingSignOns(ttl=600, clock=lambda: now[0])
    first = table.begin("/keys")
    assert table.take(first.state, first.browser).next_url == "/keys"
    assert "already used" in refused(lambda: table.take(first.state, first.browser), SignOnStateRefused)
    second = table.begin("/")
    assert "another browser" in refused(lambda: table.take(second.state, "someone-elses-cookie"), SignOnStateRefused)
    assert "already used" in refused(
        lambda: table.take(second.state, second.browser), SignOnStateRefused
    )  # a failed attempt uses it up too
    third = table.begin("/")
    now[0] += 601
    assert "expired" in refused(lambda: table.take(third.state, third.browser), SignOnStateRefused)
    assert "missing" in refused(lambda: table.take(None, "x"), SignOnStateRefused)


def test_state_table_is_bounded():
    table = PendingSignOns(limit=3)
    started = [table.begin("/") for _ in range(5)]
    with pytest.raises(SignOnStateRefused):
        table.take(started[0].state, started[0].browser)
    assert table.take(started[4].state, started[4].browser).next_url == "/"
