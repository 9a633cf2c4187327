"""Helpers for the model-store tests: a store in a tmp dir and a local HTTP server with Range support.

``RangeServer`` serves files on 127.0.0.1 only. Per file it can drop the
connection after N bytes (a given number of times), ignore Range, omit
Content-Length, change its ETag, or send slowly; ``/redirect?to=URL`` answers
302 and ``/loop`` redirects to itself. Every request's Range/If-Range headers are recorded for assertions.
"""

from __future__ import annotations

import hashlib
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import SimpleNamespace
from typing import Any
from urllib.parse import parse_qs, urlsplit

from litestar import Litestar

from appliance.api.errors import EXCEPTION_HANDLERS
from appliance.api.models import JobsController, ModelsController
from appliance.db import engine as dbmod
from appliance.db.audit import AuditTrail
from appliance.serving.names import ModelNames
from appliance.settings import Settings
from appliance.store.jobs import JobRegistry
from appliance.store.store import ModelStore
from tests.appkit import local_admin_app


def make_settings(data_dir: Path, **overrides: Any) -> Settings:
    return Settings(**{"data_dir": data_dir, "seed_default_model": False, **overrides})


def make_store(data_dir: Path, *, is_loaded: Any = None, migrate: bool = True, **overrides: Any) -> ModelStore:
    settings = make_settings(data_dir, **overrides)
    data_dir.mkdir(parents=True, exist_ok=True)
    if migrate:
        dbmod.migrate(settings.db_path)
    return ModelStore(settings, dbmod.make_engine(settings.db_path), is_loaded=is_loaded)


def make_app(store: ModelStore, jobs: JobRegistry) -> Litestar:
    """Just the store's controllers, with the app's exception handlers, called as the local admin."""
    names = ModelNames(store.settings, store.db, store)
    services = SimpleNamespace(store=store, jobs=jobs, names=names, audit=AuditTrail(store.db))
    return local_admin_app([ModelsController, JobsController], services, exception_handlers=EXCEPTION_HANDLERS)


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def files_under(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*")}


@dataclass
class Served:
    path: Path
    etag: str = '"v1"'
    drop_after: int | None = None  # close the connection after this many body bytes ...
    drops_left: int = 0  # ... this many times
    ignore_range: bool = False
    no_length: bool = False
    delay_per_chunk: float = 0.0
    chunk: int = 1 << 16


@dataclass
class RangeServer:
    files: dict[str, Served] = field(default_factory=dict)
    requests: list[dict[str, Any]] = field(default_factory=list)

    def __post_init__(self) -> None:
        handler = _make_handler(self)
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.httpd.daemon_threads = True
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    @property
    def port(self) -> int:
        return self.httpd.server_address[1]

    def url(self, name: str) -> str:
        return f"http://127.0.0.1:{self.port}/{name}"

    def add(self, name: str, path: Path, **options: Any) -> str:
        self.files[name] = Served(path, **options)
        return self.url(name)

    def __enter__(self) -> RangeServer:
        self.thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def _make_handler(server: RangeServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args: Any) -> None:  # quiet
            pass

        def do_GET(self) -> None:  # noqa: N802
            parts = urlsplit(self.path)
            server.requests.append(
                {
                    "path": parts.path,
                    "range": self.headers.get("Range"),
                    "if_range": self.headers.get("If-Range"),
                    "host": self.headers.get("Host"),
                    "authorization": self.headers.get("Authorization"),
                }
            )
            if parts.path in ("/redirect", "/loop"):
                self.send_response(302)
                self.send_header("Location", parse_qs(parts.query)["to"][0] if parts.path == "/redirect" else "/loop")
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            served = server.files.get(parts.path.lstrip("/"))
            if served is None:
                self.send_error(404)
                return
            size = served.path.stat().st_size
            start = 0
            rng = self.headers.get("Range")
            if_range = self.headers.get("If-Range")
            if rng and not served.ignore_range and (if_range is None or if_range == served.etag):
                start = int(rng.removeprefix("bytes=").split("-")[0])
                if start >= size:
                    self.send_response(416)
                    self.send_header("Content-Range", f"bytes */{size}")
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                self.send_response(206)
                self.send_header("Content-Range", f"bytes {start}-{size - 1}/{size}")
            else:
                self.send_response(200)
            self.send_header("ETag", served.etag)
            self.send_header("Accept-Ranges", "bytes")
            if served.no_length:
                self.send_header("Connection", "close")
                self.close_connection = True
            else:
                self.send_header("Content-Length", str(size - start))
            self.end_headers()
            sent = 0
            drop = served.drop_after if served.drops_left > 0 else None
            with served.path.open("rb") as f:
                f.seek(start)
                while block := f.read(served.chunk):
                    if drop is not None and sent + len(block) > drop:
                        block = block[: drop - sent]
                        self.wfile.write(block)
                        self.wfile.flush()
                        served.drops_left -= 1
                        self.close_connection = True
                        self.connection.shutdown(2)
                        return
                    try:
                        self.wfile.write(block)
                    except (BrokenPipeError, ConnectionResetError):
                        return
                    sent += len(block)
                    if served.delay_per_chunk:
                        time.sleep(served.delay_per_chunk)

    return Handler


def make_hf_folder(folder: Path, *, config: dict[str, Any] | None = None, files: dict[str, bytes] | None = None) -> Path:
    """A tiny Hugging Face llama folder: config.json + one hand-written safetensors shard + tokenizer files."""
    import json
    import struct

    folder.mkdir(parents=True, exist_ok=True)
    cfg = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "num_hidden_layers": 2,
        "hidden_size": 64,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "intermediate_size": 128,
        "vocab_size": 128,
        "max_position_embeddings": 256,
        "torch_dtype": "bfloat16",
        **(config or {}),
    }
    (folder / "config.json").write_text(json.dumps(cfg))
    data = bytes(range(256)) * 64  # 128 x 64 bf16
    header = json.dumps(
        {"model.embed_tokens.weight": {"dtype": "BF16", "shape": [128, 64], "data_offsets": [0, len(data)]}}
    ).encode()
    (folder / "model.safetensors").write_bytes(struct.pack("<Q", len(header)) + header + data)
    (folder / "tokenizer_config.json").write_text(json.dumps({"chat_template": "{{ messages }}"}))
    (folder / "tokenizer.json").write_text("{}")
    (folder / "README.md").write_text("tiny")
    for name, content in (files or {}).items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_bytes(content)
    return folder


def random_file(path: Path, size: int, seed: int = 1) -> Path:
    """``size`` pseudo-random bytes (fast: numpy's generator, 8 MiB at a time)."""
    import numpy as np

    rng = np.random.default_rng(seed)
    with path.open("wb") as f:
        left = size
        while left:
            n = min(left, 8 << 20)
            f.write(rng.integers(0, 256, n, dtype=np.uint8).tobytes())
            left -= n
    return path
