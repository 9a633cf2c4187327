"""reliability-table row 9: SSRF through download URLs.

Pulls to loopback, link-local (169.254.169.254), private ranges, IPv6 forms that
tunnel to them (IPv4-mapped and -compatible, 6to4, Teredo, NAT64), or through a
redirect to them are refused unless the host is in allow_private_pull_hosts.
Every address a name resolves to is checked, and the connection goes to the
address that was checked (a second DNS answer cannot swap in another).
"""

from __future__ import annotations

import socket
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from litestar.testing import TestClient

from appliance.store.jobs import JobRegistry
from appliance.store.pull import PullNotAllowed, check_url
from appliance.store.store import ModelStore
from tests.ggufkit import make_tiny_gguf
from tests.storekit import RangeServer, make_app, make_store

INTERNAL_URLS = [
    "http://127.0.0.1/m.gguf",
    "http://127.1.2.3:8080/m.gguf",
    "http://localhost/m.gguf",
    "http://[::1]/m.gguf",
    "http://169.254.169.254/latest/meta-data/",
    "http://[fe80::1]/m.gguf",
    "http://10.0.0.5/m.gguf",
    "http://172.16.3.4/m.gguf",
    "http://192.168.1.10/m.gguf",
    "http://100.64.0.1/m.gguf",
    "http://0.0.0.0/m.gguf",
    "http://[::ffff:127.0.0.1]/m.gguf",
    "http://[::ffff:169.254.169.254]/m.gguf",
    "http://2130706433/m.gguf",
    "http://0x7f000001/m.gguf",
    "http://[fd00::1]/m.gguf",
    "http://[fec0::1]/m.gguf",
    "http://224.0.0.1/m.gguf",
    "https://127.0.0.1/m.gguf",
]
# IPv6 forms that tunnel to an internal IPv4 address: 6to4, Teredo (client = last 32 bits XOR 0xffffffff),
# NAT64 (well-known and local-use prefixes), IPv4-compatible.
TUNNELLED_URLS = [
    "http://[2002:7f00:1::]:8080/m.gguf",
    "http://[2002:a9fe:a9fe::]/latest/meta-data/",
    "http://[2002:c0a8:10a::1]/m.gguf",
    "http://[2001:0:4136:e378:8000:63bf:80ff:fffe]/m.gguf",
    "http://[2001:0:4136:e378:8000:63bf:f5ff:fffa]/m.gguf",
    "http://[64:ff9b::7f00:1]/m.gguf",
    "http://[64:ff9b::a9fe:a9fe]/m.gguf",
    "http://[64:ff9b:1::a00:5]/m.gguf",
    "http://[::127.0.0.1]/m.gguf",
    "http://[::a9fe:a9fe]/m.gguf",
]
# The same wrappings around a public address (93.184.216.34) are not refused.
PUBLIC_TUNNELLED_URLS = ["http://[2002:5db8:d822::1]/m.gguf", "http://[64:ff9b::5db8:d822]/m.gguf"]
BAD_SCHEMES = [
    "file:///etc/passwd",
    "ftp://93.184.216.34/m.gguf",
    "gopher://127.0.0.1/",
    "dict://127.0.0.1:11211/",
    "http:///m.gguf",
    "http://exa mple.com/m.gguf",
    "javascript:alert(1)",
]


@pytest.fixture()
def store(tmp_path: Path) -> ModelStore:
    return make_store(tmp_path / "data")


@pytest.mark.parametrize("url", INTERNAL_URLS)
def test_internal_addresses_are_refused(url: str) -> None:
    with pytest.raises(PullNotAllowed, match="allow_private_pull_hosts"):
        check_url(url, [])


@pytest.mark.parametrize("url", TUNNELLED_URLS)
def test_tunnelled_internal_addresses_are_unwrapped_and_refused(url: str) -> None:
    with pytest.raises(PullNotAllowed, match="tunnelled to"):
        check_url(url, [])


@pytest.mark.parametrize("url", PUBLIC_TUNNELLED_URLS)
def test_tunnelled_public_addresses_pass(url: str) -> None:
    target = check_url(url, [])
    assert target.url.startswith("http://[") and target.url.endswith("/m.gguf")


def test_a_name_resolving_to_a_6to4_loopback_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    """DNS may answer the wrapped form (an AAAA record of 2002:7f00:1::): the check sees through it too."""

    def fake(host: str, port: int, *args: Any, **kwargs: Any) -> list:
        return [(socket.AF_INET6, socket.SOCK_STREAM, 6, "", ("2002:7f00:1::", port, 0, 0))]

    monkeypatch.setattr(socket, "getaddrinfo", fake)
    with pytest.raises(PullNotAllowed, match="127.0.0.1"):
        check_url("http://models.example/m.gguf", [])


@pytest.mark.parametrize("url", BAD_SCHEMES)
def test_other_schemes_and_malformed_urls_are_refused(url: str) -> None:
    from appliance.errors import ApplianceError

    with pytest.raises(ApplianceError) as info:
        check_url(url, [])
    assert info.value.status in (400, 403)


def test_a_name_with_any_internal_address_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    """DNS answering one public and one internal address: refused (rebinding with mixed records)."""

    def fake(host: str, port: int, *args: Any, **kwargs: Any) -> list:
        return [
            (socket.AF_INET, socket.SOCK_STREAM, 6, "", ("93.184.216.34", port)),
            (socket.AF_INET, socket.SOCK_STREAM, 6, "", ("127.0.0.1", port)),
        ]

    monkeypatch.setattr(socket, "getaddrinfo", fake)
    with pytest.raises(PullNotAllowed):
        check_url("http://models.example/m.gguf", [])


def test_the_connection_goes_to_the_checked_address(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """The allow-listed name resolves once; the request reaches that address with the original Host header."""
    real = socket.getaddrinfo
    lookups: list[str] = []

    def fake(host: str, port: Any, *args: Any, **kwargs: Any) -> list:
        if host == "models.example":
            lookups.append(sys._getframe(1).f_globals.get("__name__", "?"))  # who asked
            return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", ("127.0.0.1", port))]
        return real(host, port, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", fake)
    store = make_store(tmp_path / "data", allow_private_pull_hosts=["models.example"])
    src = make_tiny_gguf(tmp_path / "src.gguf")
    with RangeServer() as server:
        server.add("m.gguf", src)
        info = store.pull(f"http://models.example:{server.port}/m.gguf", name="m:f32")
    assert info.status == "ready"
    assert server.requests[0]["host"] == f"models.example:{server.port}"
    # Only the SSRF check resolved the name; the HTTP client connected to the checked address.
    assert lookups and set(lookups) == {"appliance.store.pull"}


def test_pull_api_refuses_internal_hosts_at_once(store: ModelStore) -> None:
    jobs = JobRegistry()
    with TestClient(make_app(store, jobs)) as client:
        for url in (
            "http://169.254.169.254/latest/meta-data/iam",
            "http://127.0.0.1:9/m.gguf",
            "http://[::1]/m.gguf",
            "http://[2002:7f00:1::]:9/m.gguf",
            "http://[64:ff9b::a9fe:a9fe]/latest/meta-data/iam",
        ):
            r = client.post("/admin/models/pull", json={"url": url, "name": "m:f32"})
            assert r.status_code == 403, (url, r.text)
            assert r.json()["error"]["code"] == "pull_not_allowed"
        assert client.get("/admin/jobs").json() == []
    assert store.list() == []


def test_allow_list_opens_only_the_named_host(tmp_path: Path) -> None:
    check_url("http://127.0.0.1:1/m.gguf", ["127.0.0.1"])
    check_url("http://10.1.2.3/m.gguf", ["10.0.0.0/8"])
    with pytest.raises(PullNotAllowed):
        check_url("http://169.254.169.254/", ["127.0.0.1", "10.0.0.0/8"])


def _wait(job: Any) -> Any:
    job.wait(30)
    return job


def test_redirects_to_internal_hosts_are_refused(tmp_path: Path) -> None:
    """``localhost`` is allowed by name; a redirect from it to 127.0.0.1 or the metadata address is not."""
    store = make_store(tmp_path / "data", allow_private_pull_hosts=["localhost"])
    src = make_tiny_gguf(tmp_path / "src.gguf")
    registry = JobRegistry()
    with RangeServer() as server:
        server.add("m.gguf", src)
        base = f"http://localhost:{server.port}"
        # Allowed name → allowed name: fine, and shows the redirect machinery works.
        ok = store.pull(f"{base}/redirect?to={base}/m.gguf", name="ok:f32")
        assert ok.status == "ready"
        for target in (
            f"http://127.0.0.1:{server.port}/m.gguf",
            "http://169.254.169.254/latest/meta-data/",
            f"http://[::1]:{server.port}/m.gguf",
            "file:///etc/passwd",
        ):
            seen = len(server.requests)
            job = _wait(
                registry.submit(
                    "pull", "bad:f32", lambda ctx, t=target: store.pull(f"{base}/redirect?to={t}", name="bad:f32", ctx=ctx)
                )
            )
            assert job.state == "failed" and job.error["code"] == "pull_not_allowed", (target, job.message)
            assert [r["path"] for r in server.requests[seen:]] == ["/redirect"]  # the target was never requested
    assert [i.name for i in store.list()] == ["ok:f32"]


def test_redirect_loops_end(tmp_path: Path) -> None:
    store = make_store(tmp_path / "data", allow_private_pull_hosts=["127.0.0.1"])
    with RangeServer() as server:
        loop = f"http://127.0.0.1:{server.port}/loop"
        started = time.monotonic()
        from appliance.store.pull import UpstreamError

        with pytest.raises(UpstreamError, match="redirects"):
            store.pull(loop, name="loop:f32")
        assert time.monotonic() - started < 10
    assert store.list() == []


# ---------------------------------------------------------------- hub_url and the hub's redirects
def test_a_hub_on_an_internal_address_is_refused_unless_allow_listed(tmp_path: Path) -> None:
    from tests.hubkit import HubServer

    with RangeServer() as cdn, HubServer(cdn) as hub:
        hub.add_repo("org/Tiny-GGUF", {"Tiny-F32.gguf": make_tiny_gguf(tmp_path / "src.gguf")})
        store = make_store(tmp_path / "data", hub_url=hub.url)
        with pytest.raises(PullNotAllowed):
            store.prepare_hub_pull("hf:org/Tiny-GGUF")
        assert hub.requests == []
        for metadata in ("http://169.254.169.254", "http://[::ffff:169.254.169.254]", "http://10.0.0.1"):
            with pytest.raises(PullNotAllowed):
                make_store(tmp_path / "meta", hub_url=metadata).prepare_hub_pull("hf:org/Tiny-GGUF")


def test_a_hub_redirect_to_an_internal_host_is_refused(tmp_path: Path) -> None:
    """The hub (allowed as ``localhost``) redirects its download to 127.0.0.1, which is not allowed."""
    from tests.hubkit import HubServer

    with RangeServer() as cdn, HubServer(cdn) as hub:
        hub.add_repo("org/Tiny-GGUF", {"Tiny-F32.gguf": make_tiny_gguf(tmp_path / "src.gguf")})
        store = make_store(
            tmp_path / "data", allow_private_pull_hosts=["localhost"], hub_url=hub.url.replace("127.0.0.1", "localhost")
        )
        pull = store.prepare_hub_pull("hf:org/Tiny-GGUF")
        with pytest.raises(PullNotAllowed):
            store.pull_hub(pull)
        assert cdn.requests == []  # the redirect target was never requested
