"""A local stand-in for the Hugging Face hub's HTTP API, on 127.0.0.1, with a "CDN" on another port.

``HubServer`` answers what the appliance asks a hub:

* ``GET /api/models/{org}/{repo}/tree/{revision}?recursive=true``: the repository's
  entries (``type``, ``path``, ``size``, ``oid``, and ``lfs`` with the sha256 for
  weight files), in pages of ``page_size`` linked by ``Link: <…>; rel="next"``;
* ``GET /api/models/{org}/{repo}[/revision/{revision}]``: the model info, whose
  ``siblings`` list every file (``rfilename``; with ``?blobs=true`` also ``size``
  and ``lfs.sha256``, unless ``sibling_sizes`` is off, as on some mirrors);
* ``GET /{org}/{repo}/resolve/{revision}/{path}``: 302 to the file on the CDN
  (a :class:`tests.storekit.RangeServer`: Range, ETag, dropped connections);
  ``HEAD`` answers as the hub does: the 302 with ``X-Linked-Size`` and
  ``X-Linked-Etag`` for weight files, 200 with ``Content-Length`` for others.

A mirror without one of the listings is made with ``tree_status`` or
``info_status`` (the status that endpoint answers instead, e.g. 404 or 501);
``head_location`` makes HEAD requests redirect there without naming a size.

A gated repository answers 401 without ``Authorization: Bearer <token>`` and 403
with a wrong one. Hostile listings are made with ``extra_entries`` (raw tree entries),
``extra_siblings`` (raw siblings of the model info) and ``listed_sha256`` (a listed hash that
does not match the bytes). Every request's path and Authorization header are recorded, on the
hub and on the CDN.
"""

from __future__ import annotations

import hashlib
import json
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

from tests.storekit import RangeServer

WEIGHT_SUFFIXES = (".gguf", ".safetensors")


@dataclass
class HubRepo:
    files: dict[str, Path]  # path in the repository -> file on disk
    gated: bool = False
    extra_entries: list[dict[str, Any]] = field(default_factory=list)
    listed_sha256: dict[str, str] = field(default_factory=dict)
    extra_siblings: list[dict[str, Any]] = field(default_factory=list)


@dataclass
class HubServer:
    cdn: RangeServer
    token: str | None = None
    page_size: int = 1000
    tree_status: int | None = None  # answered instead of the tree listing
    info_status: int | None = None  # answered instead of the model info
    sibling_sizes: bool = True  # whether ?blobs=true adds sizes and sha256 to the siblings
    head_location: str | None = None  # HEAD of a resolve URL redirects here, naming no size (a hostile mirror)
    repos: dict[str, HubRepo] = field(default_factory=dict)
    requests: list[dict[str, Any]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), _make_handler(self))
        self.httpd.daemon_threads = True
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}"

    def add_repo(self, repo: str, files: dict[str, Path], **options: Any) -> HubRepo:
        self.repos[repo] = HubRepo(dict(files), **options)
        for path, local in files.items():
            self.cdn.add(f"cdn/{repo}/{path}", local)
        return self.repos[repo]

    def entries(self, repo: HubRepo) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        folders = sorted({str(Path(p).parent) for p in repo.files if "/" in p})
        out += [{"type": "directory", "path": folder, "oid": "0" * 40, "size": 0} for folder in folders]
        for path, local in sorted(repo.files.items()):
            size = local.stat().st_size
            entry: dict[str, Any] = {"type": "file", "path": path, "size": size, "oid": hashlib.sha1(path.encode()).hexdigest()}
            if path.endswith(WEIGHT_SUFFIXES):
                sha = repo.listed_sha256.get(path) or hashlib.sha256(local.read_bytes()).hexdigest()
                entry["lfs"] = {"oid": sha, "size": size, "pointerSize": 134}
            out.append(entry)
        return out + repo.extra_entries

    def info(self, name: str, repo: HubRepo, blobs: bool) -> dict[str, Any]:
        siblings: list[dict[str, Any]] = []
        for entry in self.entries(repo):
            if entry["type"] != "file":
                continue
            sibling: dict[str, Any] = {"rfilename": entry["path"]}
            if blobs and self.sibling_sizes:
                sibling["size"] = entry["size"]
                if "lfs" in entry:
                    sibling["lfs"] = {"sha256": entry["lfs"]["oid"], "size": entry["size"], "pointerSize": 134}
            siblings.append(sibling)
        return {"id": name, "modelId": name, "sha": "0" * 40, "siblings": siblings + repo.extra_siblings}

    def __enter__(self) -> HubServer:
        self.thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def _make_handler(hub: HubServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args: Any) -> None:  # quiet
            pass

        def _answer(self, status: int, body: bytes = b"", headers: dict[str, str] | None = None) -> None:
            self.send_response(status)
            for key, value in (headers or {}).items():
                self.send_header(key, value)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def _allowed(self, repo: HubRepo) -> bool:
            if not repo.gated:
                return True
            given = self.headers.get("Authorization")
            if given is None:
                self._answer(401, b'{"error": "Access to this repository is restricted."}')
                return False
            if given != f"Bearer {hub.token}":
                self._answer(403, b'{"error": "Invalid credentials"}')
                return False
            return True

        def do_HEAD(self) -> None:  # noqa: N802
            path = unquote(urlsplit(self.path).path)
            hub.requests.append({"path": path, "method": "HEAD", "authorization": self.headers.get("Authorization")})
            segments = path.strip("/").split("/")
            name, file_path = "/".join(segments[:2]), "/".join(segments[4:])
            repo = hub.repos.get(name)
            if len(segments) < 5 or segments[2] != "resolve" or repo is None or file_path not in repo.files:
                self._head(404)
                return
            if repo.gated and self.headers.get("Authorization") != f"Bearer {hub.token}":
                self._head(401 if self.headers.get("Authorization") is None else 403)
                return
            local = repo.files[file_path]
            size = str(local.stat().st_size)
            if hub.head_location is not None:
                self._head(302, {"Location": hub.head_location})
            elif file_path.endswith(WEIGHT_SUFFIXES):
                sha = repo.listed_sha256.get(file_path) or hashlib.sha256(local.read_bytes()).hexdigest()
                self._head(
                    302, {"Location": hub.cdn.url(f"cdn/{name}/{file_path}"), "X-Linked-Size": size, "X-Linked-Etag": f'"{sha}"'}
                )
            else:
                self._head(200, {"Content-Length": size})

        def _head(self, status: int, headers: dict[str, str] | None = None) -> None:
            self.send_response(status)
            for key, value in (headers or {}).items():
                self.send_header(key, value)
            if "Content-Length" not in (headers or {}):
                self.send_header("Content-Length", "0")
            self.end_headers()

        def _served_repo(self, name: str, mirror_status: int | None) -> HubRepo | None:
            """The repo this listing endpoint may show, or None once the refusal is answered
            (the endpoint not served by this mirror, no such repo, or a credential missing)."""
            repo = hub.repos.get(name)
            if mirror_status is not None:
                self._answer(mirror_status, b'{"error": "Not served by this mirror"}')
                return None
            if repo is None:
                self._answer(404, b'{"error": "Repository not found"}')
                return None
            return repo if self._allowed(repo) else None

        def do_GET(self) -> None:  # noqa: N802
            parts = urlsplit(self.path)
            path = unquote(parts.path)
            hub.requests.append({"path": path, "method": "GET", "authorization": self.headers.get("Authorization")})
            segments = path.strip("/").split("/")
            if segments[:2] == ["api", "models"] and (len(segments) == 4 or (len(segments) == 6 and segments[4] == "revision")):
                repo = self._served_repo("/".join(segments[2:4]), hub.info_status)
                if repo is None:
                    return
                blobs = parse_qs(parts.query).get("blobs", ["false"])[0] == "true"
                body = json.dumps(hub.info("/".join(segments[2:4]), repo, blobs)).encode()
                self._answer(200, body, {"Content-Type": "application/json"})
                return
            if segments[:2] == ["api", "models"] and len(segments) >= 6 and segments[4] == "tree":
                repo = self._served_repo("/".join(segments[2:4]), hub.tree_status)
                if repo is None:
                    return
                entries = hub.entries(repo)
                start = int(parse_qs(parts.query).get("cursor", ["0"])[0])
                page = entries[start : start + hub.page_size]
                headers = {"Content-Type": "application/json"}
                if start + hub.page_size < len(entries):
                    headers["Link"] = f'<{parts.path}?recursive=true&cursor={start + hub.page_size}>; rel="next"'
                self._answer(200, json.dumps(page).encode(), headers)
                return
            if len(segments) >= 5 and segments[2] == "resolve":
                name = "/".join(segments[:2])
                repo = hub.repos.get(name)
                file_path = "/".join(segments[4:])
                if repo is None or file_path not in repo.files:
                    self._answer(404, b"Entry not found")
                    return
                if not self._allowed(repo):
                    return
                self._answer(302, b"", {"Location": hub.cdn.url(f"cdn/{name}/{file_path}")})
                return
            self._answer(404, b"not found")

    return Handler
