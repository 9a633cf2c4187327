"""Downloads into the store: SSRF-checked, resumable, verified, durable.

* Only ``http``/``https``. The host is resolved here and *every* address must be
  public (not loopback, private, link-local, CGNAT, multicast, reserved …) unless
  the host or address is in ``allow_private_pull_hosts``. The connection then goes
  to the address that was checked (the URL is pinned to it; Host header and TLS
  SNI keep the name), so a second DNS answer cannot swap in an internal address.
* Redirects are followed by hand, at most five, each hop checked the same way.
* Bytes go to ``<file>.partial`` (its validator and URL in ``<file>.partial.json``);
  a dropped connection resumes with ``Range`` + ``If-Range``, up to five times in
  a job, and a later pull of the same name resumes too. A server that ignores the
  range (200) or whose file changed restarts the file from zero.
* Free space is checked against ``Content-Length`` before the first byte;
  ENOSPC while writing deletes the partial file (a full disk would also stop
  SQLite) and raises InsufficientStorage at once, never a retry.
* The sha256 is computed while writing; on success the file is fsynced. The
  caller inspects it and renames it into place (``os.replace``) and fsyncs the
  folder.
"""

from __future__ import annotations

import errno
import hashlib
import ipaddress
import json
import os
import re
import shutil
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable
from urllib.parse import urljoin, urlsplit

import httpx

from appliance import __version__
from appliance.errors import ApplianceError, BadRequest, InsufficientStorage, PermissionDenied
from appliance.store.jobs import JobContext

CHUNK = 1 << 20
MAX_REDIRECTS = 5
MAX_RETRIES = 5
RETRY_BACKOFF_S = (0.5, 1.0, 2.0, 4.0, 8.0)
TIMEOUT = httpx.Timeout(connect=15.0, read=60.0, write=60.0, pool=15.0)


class PullNotAllowed(PermissionDenied):
    """The URL's scheme or host may not be pulled from (SSRF defence)."""

    code = "pull_not_allowed"


class UpstreamError(ApplianceError):
    """The server we download from failed or answered with an error."""

    status = 502
    type = "server_error"
    code = "upstream_error"


class ChecksumMismatch(BadRequest):
    """The downloaded bytes do not have the expected sha256."""

    code = "checksum_mismatch"


class _Retryable(Exception):
    """A connection-level failure worth resuming from."""


@dataclass(frozen=True)
class Fetched:
    sha256: str
    size: int
    url: str  # after redirects


@dataclass(frozen=True)
class _Target:
    url: str  # pinned to the checked address
    host_header: str
    sni: str | None


# ------------------------------------------------------------------ SSRF checks
def _allowed(host: str, address: ipaddress.IPv4Address | ipaddress.IPv6Address, allow: Iterable[str]) -> bool:
    for entry in allow:
        entry = entry.strip().lower().strip("[]")
        if not entry:
            continue
        if entry == host.lower().strip("[]"):
            return True
        try:
            if address in ipaddress.ip_network(entry, strict=False):
                return True
        except ValueError:
            continue
    return False


_NAT64 = (ipaddress.ip_network("64:ff9b::/96"), ipaddress.ip_network("64:ff9b:1::/48"))
_IPV4_COMPATIBLE = ipaddress.ip_network("::/96")


def embedded_ipv4(address: ipaddress.IPv4Address | ipaddress.IPv6Address) -> ipaddress.IPv4Address | None:
    """The IPv4 address an IPv6 address tunnels to, if it is one of the wrapping forms.

    IPv4-mapped (``::ffff:a.b.c.d``), IPv4-compatible (``::a.b.c.d``), 6to4
    (``2002:AABB:CCDD::/48``), Teredo (``2001:0::/32``; the client address is the
    last 32 bits XOR ``0xffffffff``) and NAT64 (``64:ff9b::/96``, and the low 32
    bits of the local-use ``64:ff9b:1::/48``).
    """
    if not isinstance(address, ipaddress.IPv6Address):
        return None
    if address.ipv4_mapped is not None:
        return address.ipv4_mapped
    if address.sixtofour is not None:
        return address.sixtofour
    if address.teredo is not None:
        return address.teredo[1]  # (server, client); the client is what a packet would reach
    low32 = ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)
    if any(address in net for net in _NAT64):
        return low32
    if address in _IPV4_COMPATIBLE and int(address) > 0xFFFF:  # not ::, ::1 and the like
        return low32
    return None


def _why_internal(address: ipaddress.IPv4Address | ipaddress.IPv6Address) -> str | None:
    inner = embedded_ipv4(address)
    if inner is not None:
        why = _why_plain(inner)
        if why is not None:
            return f"{why} (tunnelled to {inner})"
        if any(address in net for net in _NAT64):
            return None  # a NAT64 gateway's public prefix: the IPv4 address it translates to decides
    return _why_plain(address)


def _why_plain(address: ipaddress.IPv4Address | ipaddress.IPv6Address) -> str | None:
    if address.is_loopback:
        return "loopback"
    if address.is_link_local:
        return "link-local"
    if address.is_private:
        return "a private network"
    if address.is_multicast:
        return "multicast"
    if address.is_unspecified or address.is_reserved or not address.is_global or (
            isinstance(address, ipaddress.IPv6Address) and address.is_site_local):
        return "a non-public network"
    return None


def resolve_checked(host: str, port: int, allow: Iterable[str]) -> str:
    """The address to connect to, after checking every address the name resolves to."""
    allow = list(allow)
    try:
        infos = socket.getaddrinfo(host.strip("[]"), port, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError):
        raise UpstreamError(f"cannot resolve host {host!r}") from None
    addresses = []
    for info in infos:
        addr = ipaddress.ip_address(info[4][0].split("%", 1)[0])
        if isinstance(addr, ipaddress.IPv6Address) and addr.ipv4_mapped is not None:
            addr = addr.ipv4_mapped
        addresses.append(addr)
    if not addresses:
        raise UpstreamError(f"host {host!r} has no address")
    for addr in addresses:
        why = _why_internal(addr)
        if why is not None and not _allowed(host, addr, allow):
            raise PullNotAllowed(f"pulls may not reach {host} ({addr} is {why}); an admin can add the host to allow_private_pull_hosts")
    # Connect to a checked address; IPv4 first, as most model hosts and local mirrors serve it.
    return str(next((a for a in addresses if a.version == 4), addresses[0]))


def check_url(url: str, allow: Iterable[str]) -> _Target:
    """Validate a pull URL and pin it to a checked address."""
    if not isinstance(url, str) or len(url) > 4096 or any(ord(c) < 33 for c in url):
        raise BadRequest("invalid URL", param="url", code="invalid_url")
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:
        raise BadRequest("invalid URL", param="url", code="invalid_url") from None
    if parts.scheme not in ("http", "https"):
        raise PullNotAllowed("only http and https URLs can be pulled", param="url")
    host = parts.hostname
    if not host:
        raise BadRequest("the URL has no host", param="url", code="invalid_url")
    port = port or (443 if parts.scheme == "https" else 80)
    address = resolve_checked(host, port, allow)
    shown = f"[{address}]" if ":" in address else address
    pinned = parts._replace(netloc=f"{shown}:{port}").geturl()
    default_port = 443 if parts.scheme == "https" else 80
    host_header = (f"[{host}]" if ":" in host else host) + ("" if port == default_port else f":{port}")
    return _Target(url=pinned, host_header=host_header, sni=host if parts.scheme == "https" else None)


# ------------------------------------------------------------------ disk
def check_free_space(folder: Path, needed: int | None) -> None:
    """Refuse before writing when ``needed`` bytes would not fit (leaving room for the database)."""
    if needed is None:
        return
    usage = shutil.disk_usage(folder)
    reserve = min(64 << 20, usage.total // 100)
    if needed > usage.free - reserve:
        raise InsufficientStorage(f"not enough space in the model store: the download needs {human_size(needed)}, "
                                  f"{human_size(max(0, usage.free - reserve))} is free")


def human_size(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024  # type: ignore[assignment]
    return str(n)


def disk_full(exc: BaseException) -> bool:
    return isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT)


def remove_partial(partial: Path) -> None:
    for path in (partial, _meta_path(partial)):
        try:
            path.unlink()
        except FileNotFoundError:
            pass


def _meta_path(partial: Path) -> Path:
    return partial.with_name(partial.name + ".json")


def _read_meta(partial: Path, url: str) -> dict | None:
    try:
        meta = json.loads(_meta_path(partial).read_text())
    except (OSError, ValueError):
        return None
    return meta if isinstance(meta, dict) and meta.get("url") == url else None


def _write_meta(partial: Path, meta: dict) -> None:
    tmp = _meta_path(partial).with_suffix(".tmp")
    tmp.write_text(json.dumps(meta))
    os.replace(tmp, _meta_path(partial))


_CONTENT_RANGE = re.compile(r"^bytes (\d+)-(\d+)/(\d+|\*)$")


def _validator(response: httpx.Response) -> str | None:
    etag = response.headers.get("etag")
    if etag and not etag.startswith("W/"):
        return etag  # weak ETags may not be used with If-Range
    return response.headers.get("last-modified")


# ------------------------------------------------------------------ download
class Downloader:
    """One pull of one URL into one partial file."""

    def __init__(self, url: str, partial: Path, *, allow: Iterable[str], ctx: JobContext, expected_sha256: str | None = None):
        self.url = url
        self.partial = partial
        self.allow = list(allow)
        self.ctx = ctx
        self.expected = expected_sha256.lower() if expected_sha256 else None
        self._hasher = hashlib.sha256()
        self._hashed = 0  # bytes of the partial file already in _hasher

    def run(self) -> Fetched:
        try:
            return self._run()
        except OSError as exc:
            if not disk_full(exc):
                raise
            # Never retried: the partial file goes, so the disk (and the database on it) has room again.
            remove_partial(self.partial)
            raise InsufficientStorage("the model store's disk is full; the partial download was removed. "
                                      "Free some space (e.g. delete unused variants) and pull again.") from None

    def _run(self) -> Fetched:
        with httpx.Client(follow_redirects=False, timeout=TIMEOUT, trust_env=False) as client:
            failures = 0
            while True:
                self.ctx.check_cancelled()
                try:
                    final_url = self._attempt(client)
                    break
                except _Retryable as exc:
                    failures += 1
                    if failures > MAX_RETRIES:
                        raise UpstreamError(f"the download kept failing ({exc}); pull again to resume") from None
                    self.ctx.stage(f"connection lost ({exc}); resuming, try {failures} of {MAX_RETRIES}")
                    if self.ctx.cancel_event.wait(RETRY_BACKOFF_S[min(failures, len(RETRY_BACKOFF_S)) - 1]):
                        self.ctx.check_cancelled()
        digest = self._hasher.hexdigest()
        if self.expected and digest != self.expected:
            remove_partial(self.partial)
            raise ChecksumMismatch(f"sha256 mismatch: expected {self.expected}, got {digest}; the partial file was removed")
        return Fetched(sha256=digest, size=self._hashed, url=final_url)

    def _open(self, client: httpx.Client, headers: dict[str, str]) -> tuple[httpx.Response, str]:
        url = self.url
        for _hop in range(MAX_REDIRECTS + 1):
            target = check_url(url, self.allow)
            extensions = {"sni_hostname": target.sni} if target.sni else {}
            request = client.build_request("GET", target.url, headers={**headers, "Host": target.host_header}, extensions=extensions)
            try:
                response = client.send(request, stream=True)
            except httpx.TransportError as exc:
                raise _Retryable(type(exc).__name__) from None
            if response.status_code in (301, 302, 303, 307, 308):
                location = response.headers.get("location")
                response.close()
                if not location:
                    raise UpstreamError("redirect without a Location")
                url = urljoin(url, location)
                continue
            return response, url
        raise UpstreamError(f"more than {MAX_REDIRECTS} redirects")

    def _resume_point(self) -> tuple[int, str | None]:
        """Bytes already on disk that can be kept, and the validator to send with If-Range."""
        have = self.partial.stat().st_size if self.partial.exists() else 0
        meta = _read_meta(self.partial, self.url)
        if have and meta and meta.get("validator"):
            return have, meta["validator"]
        return 0, None

    def _attempt(self, client: httpx.Client) -> str:
        have, validator = self._resume_point()
        headers = {"Accept-Encoding": "identity", "User-Agent": f"llm-appliance/{__version__}"}
        if have:
            headers["Range"] = f"bytes={have}-"
            headers["If-Range"] = validator  # type: ignore[assignment]
        response, final_url = self._open(client, headers)
        try:
            total: int | None
            if response.status_code == 206 and have:
                match = _CONTENT_RANGE.match(response.headers.get("content-range", ""))
                if not match or int(match.group(1)) != have:
                    remove_partial(self.partial)  # a range we did not ask for: start over
                    raise _Retryable("unexpected Content-Range")
                total = int(match.group(3)) if match.group(3) != "*" else None
            elif response.status_code == 416 and have:
                match = re.match(r"^bytes \*/(\d+)$", response.headers.get("content-range", ""))
                if match and int(match.group(1)) == have:  # the partial file is already complete
                    self._catch_up(have)
                    return final_url
                remove_partial(self.partial)
                raise _Retryable("range not satisfiable")
            elif response.status_code == 200:
                have = 0
                length = response.headers.get("content-length")
                total = int(length) if length and length.isdigit() else None
            elif response.status_code >= 500 or response.status_code == 429:
                raise _Retryable(f"HTTP {response.status_code}")
            else:
                raise UpstreamError(f"the server answered HTTP {response.status_code}")
            _write_meta(self.partial, {"url": self.url, "validator": _validator(response), "total": total})
            check_free_space(self.partial.parent, None if total is None else total - have)
            self._catch_up(have)
            self._stream(response, have, total)
        finally:
            response.close()
        return final_url

    def _catch_up(self, have: int) -> None:
        """Make the hasher cover the first ``have`` bytes of the partial file."""
        if have < self._hashed or have == 0:
            self._hasher, self._hashed = hashlib.sha256(), 0
        if have > self._hashed:
            self.ctx.stage("hashing the partial download")
            with self.partial.open("rb") as f:
                f.seek(self._hashed)
                while self._hashed < have:
                    block = f.read(min(CHUNK, have - self._hashed))
                    if not block:
                        break
                    self._hasher.update(block)
                    self._hashed += len(block)

    def _stream(self, response: httpx.Response, have: int, total: int | None) -> None:
        done = have
        with self.partial.open("r+b" if have else "wb") as f:
            f.seek(have)
            f.truncate()
            try:
                for block in response.iter_raw():
                    self.ctx.check_cancelled()
                    f.write(block)
                    self._hasher.update(block)
                    done += len(block)
                    self._hashed = done
                    self.ctx.progress(done, total)
            except httpx.TransportError as exc:
                f.flush()
                os.fsync(f.fileno())
                raise _Retryable(type(exc).__name__) from None
            f.flush()
            os.fsync(f.fileno())
        self.ctx.progress(done, total, force=True)
        if total is not None and done != total:
            raise _Retryable(f"connection closed after {done} of {total} bytes")
