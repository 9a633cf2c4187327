"""The gateway's HTTP/1.1 client to an engine socket, against real Unix-socket servers.

A scripted server writes exactly the bytes each case needs (sized, chunked,
cut off, malformed, closing kept-alive connections), and a real uvicorn server
checks the client against the HTTP stack the engines run on.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest
import uvicorn

from appliance.serving.engine_client import EngineClient, EngineConnectionError

Handler = Callable[[bytes, asyncio.StreamReader, asyncio.StreamWriter], Awaitable[bool]]


class ScriptedEngine:
    """A Unix-socket server that reads each request and lets ``handler`` write the answer.

    The handler returns True to keep the connection for the next request."""

    def __init__(self, path: Path, handler: Handler):
        self.path = path
        self.handler = handler
        self.connections = 0
        self.requests: list[bytes] = []
        self.writers: set[asyncio.StreamWriter] = set()
        self.server: asyncio.AbstractServer | None = None

    async def __aenter__(self) -> ScriptedEngine:
        self.server = await asyncio.start_unix_server(self._serve, path=str(self.path))
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self.server is not None
        self.server.close()
        for writer in self.writers:  # a stopped engine's connections go with it
            writer.close()
        await self.server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        self.writers.add(writer)
        try:
            while True:
                try:
                    head = await reader.readuntil(b"\r\n\r\n")
                except (asyncio.IncompleteReadError, ConnectionError):
                    return
                length = 0
                for line in head.split(b"\r\n"):
                    if line.lower().startswith(b"content-length:"):
                        length = int(line.split(b":", 1)[1])
                body = await reader.readexactly(length) if length else b""
                self.requests.append(head + body)
                if not await self.handler(head + body, reader, writer):
                    return
        finally:
            writer.close()


def sized(body: bytes, status: str = "200 OK", extra: bytes = b"") -> bytes:
    return (
        b"HTTP/1.1 "
        + status.encode()
        + b"\r\ncontent-type: application/json\r\ncontent-length: %d\r\n" % len(body)
        + extra
        + b"\r\n"
        + body
    )


def chunk(data: bytes) -> bytes:
    return b"%x\r\n" % len(data) + data + b"\r\n"


@pytest.fixture
def sock(tmp_path: Path) -> Path:
    return tmp_path / "engine.sock"


async def test_sized_answers_reuse_one_connection(sock: Path):
    async def answer(request: bytes, reader, writer) -> bool:
        writer.write(sized(b'{"n":%d}' % len(request)))
        await writer.drain()
        return True

    async with ScriptedEngine(sock, answer) as engine:
        client = EngineClient(sock, {"Authorization": "Bearer k1"})
        for i in range(5):
            status, body = await client.post("/v1/chat/completions", b'{"i":%d}' % i)
            assert status == 200 and json.loads(body)["n"] > 0
        assert engine.connections == 1
        first = engine.requests[0]
        assert first.startswith(b"POST /v1/chat/completions HTTP/1.1\r\n")
        assert b"authorization: Bearer k1\r\n" in first and b"content-length: 7\r\n" in first and first.endswith(b'{"i":0}')
        await client.aclose()


async def test_chunked_stream_arrives_as_sent_and_frees_the_connection(sock: Path):
    events = [b'data: {"i":%d}\n\n' % i for i in range(50)]

    async def answer(request: bytes, reader, writer) -> bool:
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n")
        for i, event in enumerate(events):
            writer.write(chunk(event))
            if i % 7 == 0:
                await writer.drain()
                await asyncio.sleep(0.002)
        writer.write(b"0\r\n\r\n")
        await writer.drain()
        return True

    async with ScriptedEngine(sock, answer) as engine:
        client = EngineClient(sock)
        response = await client.request("POST", "/v1/completions", b"{}")
        assert response.status == 200 and response.headers["content-type"] == "text/event-stream"
        parts = [part async for part in response.iter_raw()]
        assert b"".join(parts) == b"".join(events)
        assert len(parts) < len(events)  # events already received are relayed together
        assert client.idle_connections == 1
        status, _ = await client.post("/v1/completions", b"{}")
        assert status == 200 and engine.connections == 1
        await client.aclose()


async def test_chunk_extensions_and_trailers_are_read_past(sock: Path):
    async def answer(request: bytes, reader, writer) -> bool:
        writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n5;name=value\r\nhello\r\n0\r\nx-trailer: 1\r\n\r\n")
        await writer.drain()
        return True

    async with ScriptedEngine(sock, answer):
        client = EngineClient(sock)
        assert await client.get("/health") == (200, b"hello")
        assert await client.get("/health") == (200, b"hello")
        await client.aclose()


async def test_engine_closing_mid_answer_is_a_connection_error(sock: Path):
    async def sized_cut(request: bytes, reader, writer) -> bool:
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\n" + b"x" * 10)
        await writer.drain()
        return False

    async with ScriptedEngine(sock, sized_cut):
        client = EngineClient(sock)
        response = await client.request("POST", "/v1/completions", b"{}")
        with pytest.raises(EngineConnectionError, match="before the end"):
            await response.read()
        assert client.idle_connections == 0
        await client.aclose()

    sock.unlink(missing_ok=True)

    async def chunked_cut(request: bytes, reader, writer) -> bool:
        writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n" + chunk(b"data: 1\n\n") + b"40\r\nonly")
        await writer.drain()
        return False

    async with ScriptedEngine(sock, chunked_cut):
        client = EngineClient(sock)
        response = await client.request("POST", "/v1/completions", b"{}")
        received = []
        with pytest.raises(EngineConnectionError):
            async for part in response.iter_raw():
                received.append(part)
        assert received == [b"data: 1\n\n"]
        await client.aclose()


@pytest.mark.parametrize(
    "answer_bytes, message",
    [
        (b"SPDY/3 200 OK\r\n\r\n", "status line"),
        (b"HTTP/1.1 abc OK\r\n\r\n", "status"),
        (b"HTTP/1.1 200 OK\r\nno colon here\r\n\r\n", "header line"),
        (b"HTTP/1.1 200 OK\r\ncontent-length: lots\r\n\r\n", "content-length"),
        (b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\nzz\r\n", "chunk size"),
        (b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n2\r\nabcd", "CRLF"),
    ],
)
async def test_malformed_answers_are_refused(sock: Path, answer_bytes: bytes, message: str):
    async def answer(request: bytes, reader, writer) -> bool:
        writer.write(answer_bytes)
        await writer.drain()
        await asyncio.sleep(0.05)
        return False

    async with ScriptedEngine(sock, answer):
        client = EngineClient(sock)
        with pytest.raises(EngineConnectionError, match=message):
            await client.post("/v1/completions", b"{}")
        assert client.idle_connections == 0
        await client.aclose()


async def test_an_error_answer_keeps_the_connection_for_the_next_request(sock: Path):
    statuses = iter(["400 Bad Request", "500 Internal Server Error", "200 OK"])

    async def answer(request: bytes, reader, writer) -> bool:
        writer.write(sized(b'{"error":{"message":"no"}}', next(statuses)))
        await writer.drain()
        return True

    async with ScriptedEngine(sock, answer) as engine:
        client = EngineClient(sock)
        assert (await client.post("/v1/completions", b"{}"))[0] == 400
        assert (await client.post("/v1/completions", b"{}"))[0] == 500
        assert (await client.post("/v1/completions", b"{}"))[0] == 200
        assert engine.connections == 1
        await client.aclose()


async def test_connection_close_answers_are_not_reused(sock: Path):
    async def answer(request: bytes, reader, writer) -> bool:
        writer.write(sized(b"{}", extra=b"connection: close\r\n"))
        await writer.drain()
        return False

    async with ScriptedEngine(sock, answer) as engine:
        client = EngineClient(sock)
        for _ in range(3):
            assert (await client.post("/v1/completions", b"{}"))[0] == 200
        assert engine.connections == 3 and client.idle_connections == 0
        await client.aclose()


async def test_a_connection_the_engine_dropped_while_idle_is_replaced_once(sock: Path):
    """The engine closes a kept-alive connection after answering (its idle timeout) without saying so."""

    async def answer(request: bytes, reader, writer) -> bool:
        writer.write(sized(b'{"ok":true}'))
        await writer.drain()
        return False  # closes without `connection: close`

    async with ScriptedEngine(sock, answer) as engine:
        client = EngineClient(sock)
        for _ in range(4):
            assert (await client.post("/v1/completions", b"{}")) == (200, b'{"ok":true}')
        assert engine.connections == 4


async def test_a_reused_connection_that_breaks_before_any_answer_is_retried_on_a_new_one(sock: Path):
    """The race the idle check cannot see: the close arrives after the request was written."""
    served = 0

    async def answer(request: bytes, reader, writer) -> bool:
        nonlocal served
        served += 1
        if served == 2:
            return False  # read the request, close without a byte of answer
        writer.write(sized(b"{}"))
        await writer.drain()
        return True

    async with ScriptedEngine(sock, answer) as engine:
        client = EngineClient(sock)
        assert (await client.post("/v1/completions", b"{}"))[0] == 200
        assert (await client.post("/v1/completions", b"{}"))[0] == 200  # first try on the kept connection failed
        assert engine.connections == 2 and len(engine.requests) == 3
        await client.aclose()


async def test_a_new_connection_that_breaks_before_any_answer_is_not_retried(sock: Path):
    async def answer(request: bytes, reader, writer) -> bool:
        return False

    async with ScriptedEngine(sock, answer) as engine:
        client = EngineClient(sock)
        with pytest.raises(EngineConnectionError, match="without answering"):
            await client.post("/v1/completions", b"{}")
        assert len(engine.requests) == 1


async def test_leaving_a_stream_early_closes_its_connection_so_the_engine_stops(sock: Path):
    disconnected = asyncio.Event()

    async def answer(request: bytes, reader, writer) -> bool:
        writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n")
        try:
            for i in range(10_000):
                writer.write(chunk(b"data: %d\n\n" % i))
                await writer.drain()
                await asyncio.sleep(0.001)
        except ConnectionError:
            disconnected.set()
            return False
        return False

    async with ScriptedEngine(sock, answer):
        client = EngineClient(sock)
        response = await client.request("POST", "/v1/completions", b"{}")
        parts = response.iter_raw()
        await anext(parts)
        await parts.aclose()
        await response.aclose()
        await asyncio.wait_for(disconnected.wait(), 5)
        assert client.idle_connections == 0
        await client.aclose()


async def test_a_cancelled_request_closes_its_connection(sock: Path):
    async def answer(request: bytes, reader, writer) -> bool:
        await asyncio.sleep(30)
        return False

    async with ScriptedEngine(sock, answer):
        client = EngineClient(sock)
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(0.2):
                await client.post("/v1/completions", b"{}")
        assert client.idle_connections == 0
        await client.aclose()


async def test_engine_gone_and_back_after_a_restart(sock: Path):
    async def answer(request: bytes, reader, writer) -> bool:
        writer.write(sized(b"{}"))
        await writer.drain()
        return True

    client = EngineClient(sock, connect_timeout=1.0)
    async with ScriptedEngine(sock, answer):
        assert (await client.get("/health"))[0] == 200
        assert client.idle_connections == 1
    sock.unlink(missing_ok=True)
    with pytest.raises(EngineConnectionError, match="refused"):
        await client.get("/health")
    async with ScriptedEngine(sock, answer) as restarted:
        assert (await client.get("/health"))[0] == 200
        assert restarted.connections == 1
    await client.aclose()
    with pytest.raises(EngineConnectionError, match="closed"):
        await client.get("/health")


async def test_large_bodies_both_ways(sock: Path):
    big = b'{"prompt":"' + b"a" * (3 << 20) + b'"}'

    async def answer(request: bytes, reader, writer) -> bool:
        body = request.split(b"\r\n\r\n", 1)[1]
        writer.write(sized(body[::-1]))
        await writer.drain()
        return True

    async with ScriptedEngine(sock, answer):
        client = EngineClient(sock)
        status, body = await client.post("/v1/completions", big)
        assert status == 200 and body == big[::-1]
        await client.aclose()


async def test_against_a_real_uvicorn_engine(sock: Path):
    """The HTTP stack the engines run (uvicorn + httptools): sized, chunked and keep-alive."""

    async def app(scope, receive, send):
        if scope["type"] != "http":
            return
        body = b""
        more = True
        while more:
            message = await receive()
            body += message.get("body", b"")
            more = message.get("more_body", False)
        if scope["path"] == "/stream":
            await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/event-stream")]})
            for i in range(20):
                await send({"type": "http.response.body", "body": b"data: %d\n\n" % i, "more_body": True})
            await send({"type": "http.response.body", "body": b""})
        else:
            await send({"type": "http.response.start", "status": 201, "headers": [(b"content-type", b"application/json")]})
            await send({"type": "http.response.body", "body": body})

    server = uvicorn.Server(uvicorn.Config(app, uds=str(sock), http="httptools", lifespan="off", log_level="warning"))
    task = asyncio.create_task(server.serve())
    while not server.started:
        await asyncio.sleep(0.01)
    try:
        client = EngineClient(sock)
        assert await client.post("/echo", b'{"a":1}') == (201, b'{"a":1}')
        response = await client.request("POST", "/stream", b"{}")
        assert b"".join([p async for p in response.iter_raw()]) == b"".join(b"data: %d\n\n" % i for i in range(20))
        assert await client.post("/echo", b"{}") == (201, b"{}")
        assert client.idle_connections == 1
        await client.aclose()
    finally:
        server.should_exit = True
        await task


async def test_a_huge_chunk_is_relayed_in_parts_and_a_huge_answer_read_whole_is_refused(sock: Path):
    """A broken or hostile engine cannot make the daemon hold an answer of any size it names."""
    piece = b"x" * (1 << 20)

    async def answer(request: bytes, reader, writer) -> bool:
        writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n" + b"%x\r\n" % (5 << 20))
        for _ in range(5):
            writer.write(piece)
            await writer.drain()
        writer.write(b"\r\n0\r\n\r\n")
        await writer.drain()
        return True

    async with ScriptedEngine(sock, answer):
        client = EngineClient(sock)
        response = await client.request("POST", "/v1/completions", b"{}")
        sizes = [len(part) async for part in response.iter_raw()]
        assert sum(sizes) == 5 << 20 and max(sizes) <= 1 << 20
        assert client.idle_connections == 1
        response = await client.request("POST", "/v1/completions", b"{}")
        with pytest.raises(EngineConnectionError, match="over 2 MiB"):
            await response.read(limit=2 << 20)
        assert client.idle_connections == 0
        await client.aclose()
