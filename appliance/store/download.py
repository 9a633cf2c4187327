"""The resumable download of one pull into the store: verified and durable.

* Every hop goes through :func:`appliance.store.pull.check_url` (the SSRF checks,
  the connection pinned to the checked address). Redirects are followed by hand,
  at most five; credentials (a hub token) are added per hop, so a redirect to
  another origin (a CDN) never carries them.
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

import contextlib
import hashlib
import json
import os
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol
from urllib.parse import urljoin

import httpx

from appliance import __version__
from appliance.errors import InsufficientStorage
from appliance.jsontypes import JsonObject
from appliance.store.disk import check_free_space, disk_full
from appliance.store.errors import ChecksumMismatch, RetryableDownloadError, UpstreamError
from appliance.store.jobs import JobContext
from appliance.store.pull import check_url

CHUNK = 1 << 20
MAX_REDIRECTS = 5
MAX_RETRIES = 5
RETRY_BACKOFF_S = (0.5, 1.0, 2.0, 4.0, 8.0)
TIMEOUT = httpx.Timeout(connect=15.0, read=60.0, write=60.0, pool=15.0)


@dataclass(frozen=True)
class Fetched:
    sha256: str
    size: int
    url: str  # after redirects


def remove_partial(partial: Path) -> None:
    """Delete a partial download and its sidecar, whichever exist."""
    for path in (partial, _meta_path(partial)):
        with contextlib.suppress(FileNotFoundError):
            path.unlink()


def _meta_path(partial: Path) -> Path:
    return partial.with_name(partial.name + ".json")


def _read_meta(partial: Path, url: str) -> JsonObject | None:
    try:
        meta = json.loads(_meta_path(partial).read_text())
    except (OSError, ValueError):
        return None
    return meta if isinstance(meta, dict) and meta.get("url") == url else None


def _write_meta(partial: Path, meta: JsonObject) -> None:
    tmp = _meta_path(partial).with_suffix(".tmp")
    tmp.write_text(json.dumps(meta))
    os.replace(tmp, _meta_path(partial))


_CONTENT_RANGE = re.compile(r"^bytes (\d+)-(\d+)/(\d+|\*)$")


def _validator(response: httpx.Response) -> str | None:
    etag = response.headers.get("etag")
    if etag and not etag.startswith("W/"):
        return etag  # weak ETags may not be used with If-Range
    return response.headers.get("last-modified")


class Credentials(Protocol):
    """Headers that authenticate a request to one origin, and only to it (a hub token)."""

    def headers_for(self, url: str) -> dict[str, str]: ...


def open_checked(
    client: httpx.Client,
    url: str,
    headers: dict[str, str],
    *,
    allow: Iterable[str],
    credentials: Credentials | None = None,
    method: str = "GET",
    keep_redirect: Callable[[httpx.Response], bool] | None = None,
) -> tuple[httpx.Response, str]:
    """GET (or HEAD) ``url`` as a stream, following redirects by hand: every hop passes the SSRF checks, and the
    credentials' headers go to each hop only as ``credentials`` decide (never to another origin). A redirect for
    which ``keep_redirect(response)`` is true is answered instead of followed."""
    allow = list(allow)
    for _hop in range(MAX_REDIRECTS + 1):
        target = check_url(url, allow)
        extensions = {"sni_hostname": target.sni} if target.sni else {}
        hop_headers = {**headers, **(credentials.headers_for(url) if credentials is not None else {}), "Host": target.host_header}
        request = client.build_request(method, target.url, headers=hop_headers, extensions=extensions)
        try:
            response = client.send(request, stream=True)
        except httpx.TransportError as exc:
            raise RetryableDownloadError(type(exc).__name__) from None
        if response.status_code in (301, 302, 303, 307, 308) and not (keep_redirect and keep_redirect(response)):
            location = response.headers.get("location")
            response.close()
            if not location:
                raise UpstreamError("redirect without a Location")
            url = urljoin(url, location)
            continue
        return response, url
    raise UpstreamError(f"more than {MAX_REDIRECTS} redirects")


class Downloader:
    """One pull of one URL into one partial file."""

    def __init__(
        self,
        url: str,
        partial: Path,
        *,
        allow: Iterable[str],
        ctx: JobContext,
        expected_sha256: str | None = None,
        credentials: Credentials | None = None,
    ):
        self.url = url
        self.partial = partial
        self.allow = list(allow)
        self.ctx = ctx
        self.credentials = credentials
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
            raise InsufficientStorage(
                "the model store's disk is full; the partial download was removed. "
                "Free some space (e.g. delete unused variants) and pull again."
            ) from None

    def _run(self) -> Fetched:
        with httpx.Client(follow_redirects=False, timeout=TIMEOUT, trust_env=False) as client:
            failures = 0
            while True:
                self.ctx.check_cancelled()
                try:
                    final_url = self._attempt(client)
                    break
                except RetryableDownloadError as exc:
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
        if have and validator:  # _resume_point keeps bytes only with a validator
            headers["Range"] = f"bytes={have}-"
            headers["If-Range"] = validator
        response, final_url = open_checked(client, self.url, headers, allow=self.allow, credentials=self.credentials)
        try:
            total: int | None
            if response.status_code == 206 and have:
                match = _CONTENT_RANGE.match(response.headers.get("content-range", ""))
                if not match or int(match.group(1)) != have:
                    remove_partial(self.partial)  # a range we did not ask for: start over
                    raise RetryableDownloadError("unexpected Content-Range")
                total = int(match.group(3)) if match.group(3) != "*" else None
            elif response.status_code == 416 and have:
                match = re.match(r"^bytes \*/(\d+)$", response.headers.get("content-range", ""))
                if match and int(match.group(1)) == have:  # the partial file is already complete
                    self._catch_up(have)
                    return final_url
                remove_partial(self.partial)
                raise RetryableDownloadError("range not satisfiable")
            elif response.status_code == 200:
                have = 0
                length = response.headers.get("content-length")
                total = int(length) if length and length.isdigit() else None
            elif response.status_code >= 500 or response.status_code == 429:
                raise RetryableDownloadError(f"HTTP {response.status_code}")
            elif response.status_code in (401, 403):
                sent = self.credentials is not None and bool(self.credentials.headers_for(self.url))
                raise UpstreamError(
                    f"the server refused the download (HTTP {response.status_code}): "
                    + ("it did not accept the token" if sent else "it needs a token")
                )
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
                raise RetryableDownloadError(type(exc).__name__) from None
            f.flush()
            os.fsync(f.fileno())
        self.ctx.progress(done, total, force=True)
        if total is not None and done != total:
            raise RetryableDownloadError(f"connection closed after {done} of {total} bytes")
