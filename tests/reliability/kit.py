"""Helpers for the reliability and security suites: a real daemon serving the tiny model.

Everything here talks to the daemon the way an operator would (HTTP, the admin
socket, signals, ``psutil``) or reads its data dir from outside (the SQLite file,
read-only, and the logs). Nothing reaches into the daemon's memory.
"""

from __future__ import annotations

import contextlib
import json
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import httpx
import psutil

from tests.daemon import RunningDaemon, start_daemon

TINY = "tiny:f32"
NO_EOS = {"2": -100}  # the tiny model's </s>: generation runs to max_tokens
TERMINAL_JOB_STATES = ("done", "failed", "cancelled")
T = TypeVar("T")


def wait_until(predicate: Callable[[], T], timeout: float, interval: float = 0.05, what: str = "condition") -> T:
    """Poll ``predicate`` until it returns something truthy; fail with ``what`` after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} did not happen within {timeout} s (last value: {value!r})")
        time.sleep(interval)


def import_model(daemon: RunningDaemon, path: Path, name: str, timeout: float = 120.0) -> dict[str, Any]:
    """Import a GGUF through the admin API and wait for its job; returns the finished job."""
    with daemon.admin() as admin:
        response = admin.post("/admin/models/import", json={"path": str(path), "name": name})
        assert response.status_code == 202, response.text
        job_id = response.json()["id"]
        job = wait_until(
            lambda: (j := admin.get(f"/admin/jobs/{job_id}").json())["state"] in TERMINAL_JOB_STATES and j,
            timeout,
            0.1,
            f"import of {name}",
        )
    assert job["state"] == "done", job
    return job


def start_tiny_daemon(base: Path, tiny_gguf: Path, **env: str) -> RunningDaemon:
    """A daemon (default model seeded, for readiness) with the tiny model imported as ``tiny:f32``."""
    daemon = start_daemon(base, **env)
    try:
        import_model(daemon, tiny_gguf, TINY)
    except BaseException:
        daemon.kill()
        raise
    return daemon


def restart(daemon: RunningDaemon, timeout: float = 120.0) -> RunningDaemon:
    """A new daemon process on the same data dir, port and settings."""
    return RunningDaemon(daemon.data_dir, daemon.port, daemon.env).start(timeout)


def instances(daemon: RunningDaemon) -> dict[str, dict[str, Any]]:
    with daemon.admin(timeout=30) as admin:
        return {i["model"]: i for i in admin.get("/admin/instances/").json()}


def load(daemon: RunningDaemon, model: str = TINY) -> dict[str, Any]:
    with daemon.admin() as admin:
        response = admin.post(f"/admin/instances/{model}/load")
        assert response.status_code == 200, response.text
        return response.json()


def engine_pid(daemon: RunningDaemon, model: str = TINY) -> int:
    return int(instances(daemon)[model]["pid"])


def engine_socket(pid: int) -> Path:
    """The Unix socket an engine serves on, read from its command line."""
    argv = psutil.Process(pid).cmdline()
    return Path(argv[argv.index("--socket") + 1])


def engine_get(socket: Path, path: str) -> httpx.Response:
    """A request straight to an engine over its private socket (as root on the box)."""
    with httpx.Client(transport=httpx.HTTPTransport(uds=str(socket)), base_url="http://engine", timeout=10) as client:
        return client.get(path)


def chat_body(
    content: str = "hi", *, model: str = TINY, max_tokens: int = 8, stream: bool = False, **extra: Any
) -> dict[str, Any]:
    body: dict[str, Any] = {
        "model": model,
        "messages": [{"role": "user", "content": content}],
        "max_tokens": max_tokens,
        "temperature": 0,
        **extra,
    }
    if stream:
        body["stream"] = True
    return body


def sse_events(lines: Iterator[str]) -> Iterator[Any]:
    """Decoded ``data:`` payloads of an SSE response (``"[DONE]"`` as a string)."""
    for line in lines:
        if line.startswith("data: "):
            data = line[6:]
            yield data if data == "[DONE]" else json.loads(data)


def db_rows(data_dir: Path, sql: str, *args: Any) -> list[tuple]:
    """Rows from the daemon's database, opened read-only from outside the daemon."""
    conn = sqlite3.connect(f"file:{data_dir / 'appliance.db'}?mode=ro", uri=True, timeout=30)
    try:
        return conn.execute(sql, args).fetchall()
    finally:
        conn.close()


def tree_pids(pid: int) -> list[int]:
    try:
        root = psutil.Process(pid)
        return [root.pid] + [c.pid for c in root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def tree_rss(pid: int) -> int:
    total = 0
    for p in tree_pids(pid):
        with contextlib.suppress(psutil.NoSuchProcess):
            total += psutil.Process(p).memory_info().rss
    return total


def tree_fds(pid: int) -> int:
    total = 0
    for p in tree_pids(pid):
        with contextlib.suppress(psutil.NoSuchProcess):
            total += psutil.Process(p).num_fds()
    return total


# ------------------------------------------------------------------ mixed load
@dataclass
class Outcome:
    """One request as the client saw it."""

    op: str
    status: int | None  # None: the connection failed
    request_id: str | None
    acknowledged: bool  # a 200 whose whole answer arrived (for streams: [DONE] after no error event)
    cache: str | None = None
    error: str | None = None
    seconds: float = 0.0
    prompt_tokens: int = 0  # as the response's usage said
    completion_tokens: int = 0


def _plain(client: httpx.Client, op: str, path: str, body: dict[str, Any]) -> Outcome:
    response = client.post(path, json=body)
    ok = response.status_code == 200
    usage: dict[str, Any] = {}
    if ok:
        payload = response.json()
        ok = bool(payload.get("choices") or payload.get("data"))
        usage = payload.get("usage") or {}
    return Outcome(
        op,
        response.status_code,
        response.headers.get("x-request-id"),
        ok,
        response.headers.get("x-cache"),
        None if ok else response.text[:300],
        prompt_tokens=int(usage.get("prompt_tokens") or 0),
        completion_tokens=int(usage.get("completion_tokens") or 0),
    )


def _stream(client: httpx.Client, op: str, body: dict[str, Any]) -> Outcome:
    with client.stream("POST", "/v1/chat/completions", json=body) as response:
        if response.status_code != 200:
            response.read()
            return Outcome(op, response.status_code, response.headers.get("x-request-id"), False, None, response.text[:300])
        done, error, usage = False, None, {}
        for event in sse_events(response.iter_lines()):
            if event == "[DONE]":
                done = True
            elif "error" in event:
                error = json.dumps(event)[:300]
            elif event.get("usage"):
                usage = event["usage"]
        return Outcome(
            op,
            200,
            response.headers.get("x-request-id"),
            done and error is None,
            response.headers.get("x-cache"),
            error,
            prompt_tokens=int(usage.get("prompt_tokens") or 0),
            completion_tokens=int(usage.get("completion_tokens") or 0),
        )


def run_op(client: httpx.Client, op: str, n: int, model: str = TINY) -> Outcome:
    """One request of kind ``op``; ``n`` makes prompts distinct (except for ``cached``)."""
    started = time.monotonic()
    try:
        if op == "chat":
            out = _plain(
                client, op, "/v1/chat/completions", chat_body(f"hello number {n}", model=model, max_tokens=24, logit_bias=NO_EOS)
            )
        elif op == "cached":  # the same deterministic request again and again: cache hits where the cache is on
            out = _plain(
                client, op, "/v1/chat/completions", chat_body("what is the capital of france", model=model, max_tokens=12)
            )
        elif op == "stream":
            out = _stream(
                client,
                op,
                chat_body(
                    f"tell me a story {n}",
                    model=model,
                    max_tokens=48,
                    logit_bias=NO_EOS,
                    stream=True,
                    stream_options={"include_usage": True},
                ),
            )
        elif op == "completion":
            out = _plain(
                client,
                op,
                "/v1/completions",
                {
                    "model": model,
                    "prompt": f"once upon a time {n}",
                    "max_tokens": 24,
                    "temperature": 0.7,
                    "seed": n,
                    "logit_bias": NO_EOS,
                },
            )
        elif op == "embedding":
            out = _plain(client, op, "/v1/embeddings", {"model": model, "input": [f"sentence {n}", "another sentence"]})
        else:
            raise ValueError(op)
    except httpx.HTTPError as exc:
        out = Outcome(op, None, None, False, None, f"{type(exc).__name__}: {exc}")
    out.seconds = time.monotonic() - started
    return out


class MixedLoad:
    """``threads`` clients, each cycling through ``ops`` as fast as the daemon answers, until stopped."""

    def __init__(self, url: str, key: str, ops: list[str], threads: int = 4, model: str = TINY, timeout: float = 60.0):
        self.url, self.key, self.ops, self.model, self.timeout = url, key, ops, model, timeout
        self.outcomes: list[Outcome] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._run, args=(i,), daemon=True) for i in range(threads)]

    def _run(self, index: int) -> None:
        n = index * 1_000_000
        with httpx.Client(base_url=self.url, headers={"Authorization": f"Bearer {self.key}"}, timeout=self.timeout) as client:
            while not self._stop.is_set():
                n += 1
                out = run_op(client, self.ops[(n + index) % len(self.ops)], n, self.model)
                with self._lock:
                    self.outcomes.append(out)

    def start(self) -> MixedLoad:
        for thread in self._threads:
            thread.start()
        return self

    def acknowledged(self) -> int:
        with self._lock:
            return sum(o.acknowledged for o in self.outcomes)

    def stop(self, timeout: float = 60.0) -> list[Outcome]:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout)
        with self._lock:
            return list(self.outcomes)
