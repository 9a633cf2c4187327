"""Engines behind the gateway, against the real daemon.

* Row 3 — engines reachable only through the gateway: the engine process has no
  TCP/UDP socket at all, serves on a private Unix socket in the run dir, and the
  gateway forwards only the OpenAI routes it knows (the engine's ``/stats``,
  ``/health`` and tokenizer routes are not reachable through it).
* Row 5 — chat templates cannot run code: a GGUF whose ``tokenizer.chat_template``
  reaches ``os.popen`` (through ``lipsum.__globals__`` and kin) imports, and a
  chat with it is a clear 4xx while no marker file appears.
* Row 6 — the daemon survives its engine crashing (SIGSEGV in native code): it
  keeps answering, restarts the engine and serves the next request.
"""

from __future__ import annotations

import http.client
import os
import signal
import stat
import time

import psutil
import pytest

from tests.ggufkit import make_tiny_gguf
from tests.reliability.kit import (
    TINY,
    chat_body,
    engine_get,
    engine_socket,
    import_model,
    instances,
    load,
    start_tiny_daemon,
    tree_pids,
    wait_until,
)

pytestmark = pytest.mark.slow

ENGINE_ONLY_PATHS = [
    "/stats",
    "/health",
    "/tokenize",
    "/detokenize",
    "/v1/tokenize",
    "/v1/detokenize",
    "/v1/stats",
    "/v1/health",
    "/slots",
    "/props",
    "/invocations",
    "/v1/load_lora_adapter",
    "/v1/engine/stats",
]
TRAVERSALS = [
    "/v1/../stats",
    "/v1/chat/completions/../../stats",
    "/v1/%2e%2e/stats",
    "/v1/..%2fstats",
    "//stats",
    "/v1//stats",
    "/v1/models/../../health",
]


@pytest.fixture(scope="module")
def box(tmp_path_factory, tiny_gguf):
    daemon = start_tiny_daemon(tmp_path_factory.mktemp("isolation"), tiny_gguf)
    yield daemon
    daemon.stop()


@pytest.fixture(scope="module")
def keys(box):
    return {"user": box.create_key("isolation"), "admin": box.create_key("isolation-admin", role="admin")}


# ------------------------------------------------------------------------ row 3
def test_engine_has_no_network_socket_and_a_private_unix_socket(box):
    pid = int(load(box)["pid"])
    engine_tree = [psutil.Process(p) for p in tree_pids(pid)]
    inet = [(p.pid, c.laddr, c.status) for p in engine_tree for c in p.net_connections(kind="inet")]
    assert inet == [], "an engine process has a TCP/UDP socket"

    socket_path = engine_socket(pid)
    assert socket_path.parent == box.data_dir / "run"
    mode = os.stat(socket_path).st_mode
    assert stat.S_ISSOCK(mode) and stat.S_IMODE(mode) & 0o077 == 0, oct(mode)  # owner only
    unix = {c.laddr for p in engine_tree for c in p.net_connections(kind="unix")}
    assert str(socket_path) in unix
    assert engine_get(socket_path, "/health").status_code == 200  # the socket checked is the engine's, and it is live


def test_the_daemon_listens_on_its_configured_address_only(box):
    load(box)
    listening = sorted(
        {
            (p, c.laddr.ip, c.laddr.port)
            for p in tree_pids(box.proc.pid)
            for c in psutil.Process(p).net_connections(kind="inet")
            if c.status == psutil.CONN_LISTEN
        }
    )
    assert listening == [(box.proc.pid, "127.0.0.1", box.port)]


@pytest.mark.parametrize("role", ["user", "admin"])
def test_engine_routes_are_not_reachable_through_the_gateway(box, keys, role):
    socket_path = engine_socket(int(load(box)["pid"]))
    served_before = engine_get(socket_path, "/stats").json()
    headers = {"Authorization": f"Bearer {keys[role]}"}
    reached = []
    for path in ENGINE_ONLY_PATHS:
        for method in ("GET", "POST"):
            response = _raw(box.port, method, path, headers)
            if (
                response[0] < 400
                or b"slots_total" in response[1]
                or b'"status": "ok"' in response[1]
                or b'"tokens"' in response[1]
            ):
                reached.append((method, path, response[0]))
    for path in TRAVERSALS:
        status, body = _raw(box.port, "GET", path, headers)
        if status < 400 or b"slots_total" in body:
            reached.append(("GET", path, status))
    assert reached == []
    served_after = engine_get(socket_path, "/stats").json()
    assert served_after["prompt_tokens_total"] == served_before["prompt_tokens_total"]


def _raw(port: int, method: str, path: str, headers: dict[str, str]) -> tuple[int, bytes]:
    """Send ``path`` byte for byte (no client-side normalisation of dots or slashes)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        conn.putrequest(method, path, skip_accept_encoding=True)
        body_headers = {"Content-Type": "application/json", "Content-Length": "2"} if method == "POST" else {}
        for name, value in {**headers, **body_headers}.items():
            conn.putheader(name, value)
        conn.endheaders(b"{}" if method == "POST" else None)
        response = conn.getresponse()
        return response.status, response.read()
    finally:
        conn.close()


# ------------------------------------------------------------------------ row 5
PAYLOADS = {
    "lipsum": "{{ lipsum.__globals__['os'].popen('touch MARKER').read() }}",
    "cycler": "{{ cycler.__init__.__globals__.os.popen('touch MARKER').read() }}",
    "joiner": "{{ joiner.__init__.__globals__['os'].popen('touch MARKER').read() }}",
    "subclasses": "{% for c in ().__class__.__base__.__subclasses__() %}{% if c.__name__ == 'Popen' %}"
    "{{ c(['touch', 'MARKER']) }}{% endif %}{% endfor %}",
    "attr_filter": "{{ (lipsum|attr('__globals__'))['os'].popen('touch MARKER').read() }}",
}


@pytest.mark.parametrize("payload", sorted(PAYLOADS))
def test_chat_template_that_calls_popen_is_imported_but_never_runs(box, keys, tmp_path, payload):
    marker = tmp_path / f"pwned-{payload}"
    template = PAYLOADS[payload].replace("MARKER", str(marker)) + "{% for m in messages %}{{ m.content }}{% endfor %}"
    name = f"evil-{payload.replace('_', '-')}:f32"
    job = import_model(box, make_tiny_gguf(tmp_path / "evil.gguf", chat_template=template), name)
    assert job["result"]["status"] == "ready" and job["result"]["facts"]["chat_template_flags"]  # imported, and flagged
    with box.client(keys["user"]) as client:
        plain = client.post("/v1/chat/completions", json=chat_body(model=name))
        streamed = client.post("/v1/chat/completions", json=chat_body(model=name, stream=True))
        completion = client.post("/v1/completions", json={"model": name, "prompt": "hello", "max_tokens": 4})
    for response in (plain, streamed):
        assert 400 <= response.status_code < 500, response.text
        error = response.json()["error"]
        assert error["code"] == "chat_template_error", error
        assert "template" in error["message"] and str(tmp_path) not in error["message"]
    assert completion.status_code == 200  # the model itself loaded and serves: only the template is refused
    time.sleep(0.2)
    assert not marker.exists()
    assert instances(box)[name]["state"] == "ready"
    with box.admin() as admin:  # keep the box to its instance limit for the next case
        admin.post(f"/admin/instances/{name}/unload")


# ------------------------------------------------------------------------ row 6
def test_daemon_survives_its_engine_segfaulting(box, keys):
    pid = int(load(box)["pid"])
    os.kill(pid, signal.SIGSEGV)
    restarted = wait_until(
        lambda: (i := instances(box).get(TINY)) and i["state"] == "ready" and i["pid"] != pid and i,
        60,
        0.2,
        "the engine's restart",
    )
    assert box.proc.poll() is None
    with box.client(keys["user"]) as client:
        assert client.get("/v1/models").status_code == 200
        response = client.post("/v1/chat/completions", json=chat_body("still alive?"))
    assert response.status_code == 200, response.text
    assert psutil.Process(restarted["pid"]).ppid() == box.proc.pid
    assert f"exited with code -{int(signal.SIGSEGV)}" in box.log()


def test_a_model_file_the_engine_cannot_load_fails_in_the_child_not_the_daemon(box, keys, tmp_path):
    """Bytes changed on disk after import (same size, so only a full verify would notice): llama.cpp refuses
    the file in the engine process; the daemon answers a clear 503 without paths and keeps serving."""
    import_model(box, make_tiny_gguf(tmp_path / "rot.gguf", seed=3), "rot:f32")
    path = next((box.data_dir / "models" / "rot").rglob("*.gguf"))
    data = bytearray(path.read_bytes())
    data[8:16] = b"\xff" * 8  # the tensor count: far past anything the file holds
    path.write_bytes(bytes(data))
    with box.client(keys["user"]) as client:
        response = client.post("/v1/chat/completions", json=chat_body(model="rot:f32"))
        assert response.status_code == 503, response.text
        message = response.json()["error"]["message"]
        assert "rot:f32" in message and str(box.data_dir) not in message and "/models/" not in message
        assert client.post("/v1/chat/completions", json=chat_body("and the others?")).status_code == 200
    assert box.proc.poll() is None
    assert "rot:f32" not in instances(box)
