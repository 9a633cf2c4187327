"""Requests to the hub: the file listing, and the first bytes of a GGUF file for its facts.

The files come from the tree listing; where a mirror has no tree endpoint (it answers
404, 405 or 501), from the model info's ``siblings``, and the other way round. Sizes
the listing leaves out are asked with a HEAD request of the file's resolve URL (the
hub's ``X-Linked-Size`` and ``X-Linked-Etag`` on its redirect, or the answer's
``Content-Length``). Every request goes through :func:`appliance.store.download.open_checked`: the SSRF
checks of the hub's address and of every redirect hop (``allow_private_pull_hosts``
is the admin's allow-list), the token only to the hub's origin. Answers are read up
to a bound; the listing follows the hub's ``Link: <…>; rel="next"`` pages.
"""

from __future__ import annotations

import json
import re
import tempfile
from collections.abc import Iterable
from pathlib import Path
from urllib.parse import quote, urljoin

import httpx

from appliance import __version__
from appliance.errors import NotFound
from appliance.jsontypes import JsonValue
from appliance.modelfacts import ModelFacts, inspect_gguf
from appliance.modelfacts.errors import InvalidModelFile
from appliance.store.download import TIMEOUT, open_checked
from appliance.store.errors import HubAccessDenied, RetryableDownloadError, UpstreamError
from appliance.store.hub.credentials import HubCredentials, origin_of
from appliance.store.hub.listing import HubFile, files_from_tree, siblings_from_info, wanted
from appliance.store.hub.spec import HubSpec

MAX_LISTING_BYTES = 32 << 20
MAX_PAGES = 100
HEADER_PROBES = (8 << 20, 64 << 20)  # bytes asked for to read a GGUF header: most fit the first
_NEXT = re.compile(r'<([^>]+)>\s*;\s*rel="?next"?')
_SHA256 = re.compile(r"^[0-9a-f]{64}$")
LISTING_UNAVAILABLE = (404, 405, 501)  # what a mirror without one of the listing endpoints answers


class _Unavailable(Exception):
    """One way of listing a repository is not served by this hub (or lists nothing)."""

    def __init__(self, why: str, *, not_found: bool = False):
        super().__init__(why)
        self.why = why
        self.not_found = not_found


class HubClient:
    """``HubClient(hub_url, allow=..., credentials=...)``: lists repositories and reads GGUF headers of one hub."""

    def __init__(self, hub_url: str, *, allow: Iterable[str], credentials: HubCredentials):
        self.base = hub_url.rstrip("/")
        self.allow = list(allow)
        self.credentials = credentials

    def resolve_url(self, spec: HubSpec, path: str) -> str:
        return f"{self.base}/{spec.repo}/resolve/{quote(spec.revision, safe='')}/{quote(path)}"

    def list_files(self, spec: HubSpec) -> list[HubFile]:
        """The repository's files: the tree listing, else the model info's siblings; NotFound when neither has it."""
        missing: list[_Unavailable] = []
        for listing in (self._tree_files, self._sibling_files):
            try:
                return listing(spec)
            except _Unavailable as gone:
                missing.append(gone)
        if all(gone.not_found for gone in missing):
            raise NotFound(
                f"the hub has no repository {spec.repo} at revision {spec.revision}", param="url", code="hub_not_found"
            )
        raise UpstreamError(
            f"the hub lists the files of {spec.repo} neither in a tree nor in its model info ("
            + "; ".join(gone.why for gone in missing)
            + ")"
        )

    def _tree_files(self, spec: HubSpec) -> list[HubFile]:
        url: str | None = f"{self.base}/api/models/{spec.repo}/tree/{quote(spec.revision, safe='')}?recursive=true"
        payload: list[JsonValue] = []
        for _page in range(MAX_PAGES):
            if url is None:
                break
            page, url = self._get_json(url, spec, listing="tree")
            if not isinstance(page, list):
                raise UpstreamError("the hub's file listing is not a list")
            payload.extend(page)
        return files_from_tree(payload)

    def _sibling_files(self, spec: HubSpec) -> list[HubFile]:
        revision = "" if spec.revision == "main" else f"/revision/{quote(spec.revision, safe='')}"
        payload, _next = self._get_json(f"{self.base}/api/models/{spec.repo}{revision}?blobs=true", spec, listing="model info")
        siblings = siblings_from_info(payload)
        if siblings is None:
            raise _Unavailable("the model info lists no siblings")
        files = []
        for sibling in siblings:
            if sibling.size is not None:
                files.append(HubFile(sibling.path, sibling.size, sibling.sha256))
            elif wanted(sibling.path):  # files no pull takes need no size
                size, sha256 = self._head(spec, sibling.path)
                files.append(HubFile(sibling.path, size, sibling.sha256 or sha256))
        return files

    def probe_facts(self, spec: HubSpec, file: HubFile) -> ModelFacts | None:
        """The facts in a GGUF file's header, from its first bytes (a sparse copy of the file's size); None if unreadable."""
        for want in HEADER_PROBES:
            with tempfile.TemporaryDirectory(prefix="hub-probe-") as tmp:
                probe = Path(tmp) / "probe.gguf"
                got = self._read_head(spec, file, min(want, file.size), probe)
                if got is None:
                    return None
                try:
                    return inspect_gguf(probe)
                except InvalidModelFile:
                    if got >= file.size:
                        return None
        return None

    # ------------------------------------------------------------ requests
    def _headers(self) -> dict[str, str]:
        return {"Accept-Encoding": "identity", "User-Agent": f"llm-appliance/{__version__}"}

    def _head(self, spec: HubSpec, path: str) -> tuple[int, str | None]:
        """A file's size (and sha256, when the hub names it) from a HEAD request of its resolve URL."""

        def hub_told(response: httpx.Response) -> bool:
            return "x-linked-size" in response.headers

        with httpx.Client(follow_redirects=False, timeout=TIMEOUT, trust_env=False) as client:
            try:
                response, _final = open_checked(
                    client,
                    self.resolve_url(spec, path),
                    self._headers(),
                    allow=self.allow,
                    credentials=self.credentials,
                    method="HEAD",
                    keep_redirect=hub_told,
                )
            except RetryableDownloadError as exc:
                raise UpstreamError(f"cannot reach the hub ({exc})") from None
            try:
                self._check_status(response, spec)
                size_text = response.headers.get("x-linked-size") or response.headers.get("content-length")
                etag = response.headers.get("x-linked-etag", "").strip().strip('"').lower()
            finally:
                response.close()
        if size_text is None or not size_text.isdigit():
            raise UpstreamError(f"the hub gives {path} no size")
        return int(size_text), etag if _SHA256.fullmatch(etag) else None

    def _get_json(self, url: str, spec: HubSpec, *, listing: str | None = None) -> tuple[JsonValue, str | None]:
        """The JSON at ``url``, and the next page's URL; for a ``listing``, _Unavailable when the hub does not serve it."""
        with httpx.Client(follow_redirects=False, timeout=TIMEOUT, trust_env=False) as client:
            try:
                response, final = open_checked(
                    client, url, {**self._headers(), "Accept": "application/json"}, allow=self.allow, credentials=self.credentials
                )
            except RetryableDownloadError as exc:
                raise UpstreamError(f"cannot reach the hub ({exc})") from None
            try:
                if listing is not None and response.status_code in LISTING_UNAVAILABLE:
                    raise _Unavailable(f"{listing}: HTTP {response.status_code}", not_found=response.status_code == 404)
                self._check_status(response, spec)
                body = bytearray()
                for block in response.iter_raw():
                    body += block
                    if len(body) > MAX_LISTING_BYTES:
                        raise UpstreamError("the hub's file listing is too large")
                link = response.headers.get("link", "")
            except httpx.TransportError as exc:
                raise UpstreamError(f"cannot reach the hub ({type(exc).__name__})") from None
            finally:
                response.close()
        try:
            payload = json.loads(bytes(body))
        except ValueError:
            raise UpstreamError("the hub's answer is not JSON; is hub_url a Hugging Face hub or a mirror of it?") from None
        match = _NEXT.search(link)
        following = urljoin(final, match.group(1)) if match else None
        if following is not None and origin_of(following) != origin_of(self.base):
            raise UpstreamError("the hub's listing continues on another host")
        return payload, following

    def _read_head(self, spec: HubSpec, file: HubFile, length: int, dest: Path) -> int | None:
        headers = {**self._headers(), "Range": f"bytes=0-{max(0, length - 1)}"}
        with httpx.Client(follow_redirects=False, timeout=TIMEOUT, trust_env=False) as client:
            try:
                response, _final = open_checked(
                    client, self.resolve_url(spec, file.path), headers, allow=self.allow, credentials=self.credentials
                )
            except RetryableDownloadError:
                return None
            try:
                self._check_status(response, spec)
                if response.status_code not in (200, 206):
                    return None
                got = 0
                with dest.open("wb") as f:
                    for block in response.iter_raw():
                        block = block[: length - got]
                        f.write(block)
                        got += len(block)
                        if got >= length:
                            break
                    f.truncate(file.size)  # sparse: the header's offsets are checked against the real size
                return got
            except httpx.TransportError:
                return None
            finally:
                response.close()

    def _check_status(self, response: httpx.Response, spec: HubSpec) -> None:
        status = response.status_code
        if status in (401, 403):
            if self.credentials.has_token:
                raise HubAccessDenied(
                    f"the hub refused access to {spec.repo} (HTTP {status}): the token in hub_token_file was not accepted for it"
                )
            raise HubAccessDenied(
                f"the hub refused access to {spec.repo} (HTTP {status}): the repository is gated or "
                "private; set hub_token_file to a file holding a token with access"
            )
        if status == 404:
            raise NotFound(
                f"the hub has no repository {spec.repo} at revision {spec.revision}", param="url", code="hub_not_found"
            )
        if status >= 400:
            raise UpstreamError(f"the hub answered HTTP {status}")
