"""CSRF tokens: bound to a session (or pre-session), a purpose and the console secret."""

from __future__ import annotations

from types import SimpleNamespace

from appliance.webui import csrf

SECRET = b"s" * 32


def test_token_is_valid_only_for_its_binding_purpose_and_secret():
    token = csrf.token(SECRET, "session", "sid-1")
    assert csrf.valid(SECRET, "session", "sid-1", token)
    assert not csrf.valid(SECRET, "session", "sid-2", token)
    assert not csrf.valid(SECRET, "pre", "sid-1", token)
    assert not csrf.valid(b"t" * 32, "session", "sid-1", token)
    assert not csrf.valid(SECRET, "session", "sid-1", token[:-1] + ("A" if token[-1] != "A" else "B"))


def test_missing_or_absurd_values_are_refused():
    token = csrf.token(SECRET, "session", "sid-1")
    assert not csrf.valid(SECRET, "session", None, token)
    assert not csrf.valid(SECRET, "session", "", token)
    assert not csrf.valid(SECRET, "session", "sid-1", None)
    assert not csrf.valid(SECRET, "session", "sid-1", "")
    assert not csrf.valid(SECRET, "session", "sid-1", "x" * 10_000)
    assert not csrf.valid(SECRET, "session", "sid-1", "\udcff" + token)


def _request(**headers: str) -> SimpleNamespace:
    return SimpleNamespace(headers={"host": "appliance.local:8080", **headers}, url=SimpleNamespace(scheme="http"))


def test_same_origin_checks_fetch_metadata_and_origin():
    assert csrf.same_origin(_request())
    assert csrf.same_origin(_request(**{"sec-fetch-site": "same-origin", "origin": "http://appliance.local:8080"}))
    assert not csrf.same_origin(_request(**{"sec-fetch-site": "cross-site"}))
    assert not csrf.same_origin(_request(**{"sec-fetch-site": "same-site"}))
    assert not csrf.same_origin(_request(origin="http://evil.example"))
    assert not csrf.same_origin(_request(origin="http://appliance.local:9999"))
    assert not csrf.same_origin(_request(origin="null"))
    assert not csrf.same_origin(_request(origin="https://appliance.local:8080"))  # another scheme is another origin
