"""The gateway's HTTP/1.1 client to an engine's Unix socket, on asyncio streams.

The engines speak plain OpenAI-shaped HTTP/1.1 on a private socket, and the
gateway needs little of HTTP: a POST or GET with a body it already encoded, a
status, a few headers, and a body that is either sized (``content-length``),
chunked (streams) or closed. A general client does much more per request
(timeouts per phase, pool housekeeping that looks at every idle connection,
header models, events). This one does only what the gateway needs:

- **Connections** are kept in a last-in-first-out idle list and reused. Nothing
  polls them: a connection is looked at only when it is taken, and dropped then
  if the engine has closed it. A request that fails on a reused connection
  before any byte of the answer arrived (the engine closed it while idle) is
  sent once more on a new connection; any later failure is the caller's.
- **A response** not read to its end (the client left, a deadline) closes its
  connection, so the engine sees the disconnect and stops generating. Only a
  connection whose answer was read completely, and that the engine did not mark
  ``connection: close``, goes back to the idle list.
- **Chunked bodies** are relayed chunk by chunk as they arrive, joined with any
  further chunks already received, so a burst of events costs one write onward.

Transport failures (refused, reset, closed mid-answer, malformed HTTP) raise
:class:`EngineConnectionError`; deadlines are the caller's (``asyncio.timeout``).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping
from pathlib import Path

MAX_HEADER_BYTES = 64 * 1024
MAX_CHUNK_LINE = 1024
STREAM_LIMIT = 1 << 20  # the reader's buffer; a bigger body or chunk is read in parts
MAX_BODY_BYTES = 256 << 20  # an answer read whole (not streamed) is at most this
#: The request header naming the priority class a llama.cpp worker schedules a request by (``interactive`` or ``batch``).
PRIORITY_HEADER = "x-appliance-priority"


class EngineConnectionError(ConnectionError):
    """The engine's socket refused, closed or garbled the exchange."""


class _Connection:
    __slots__ = ("reader", "writer")

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter):
        self.reader = reader
        self.writer = writer

    def usable(self) -> bool:
        return not self.writer.is_closing() and not self.reader.at_eof() and self.reader.exception() is None

    def close(self) -> None:
        self.writer.close()


class EngineResponse:
    """One answer from the engine: its status and headers, and a body read once (whole or streamed)."""

    __slots__ = ("status", "headers", "_conn", "_client", "_length", "_chunked", "_done")

    def __init__(self, client: EngineClient, conn: _Connection, status: int, headers: dict[str, str]):
        self.status = status
        self.headers = headers
        self._client = client
        self._conn: _Connection | None = conn
        self._chunked = "chunked" in headers.get("transfer-encoding", "").lower()
        length = headers.get("content-length")
        try:
            self._length = None if self._chunked or length is None else int(length)
        except ValueError:
            self._fail(f"a malformed content-length: {length!r}")
        if self._length is not None and self._length < 0:
            self._fail(f"a negative content-length: {length!r}")
        self._done = status in (204, 304) or self._length == 0
        if self._done:
            self._release()

    def _fail(self, what: str) -> None:
        self.aclose_now()
        raise EngineConnectionError(f"The engine answered with {what}.")

    def _release(self) -> None:
        conn, self._conn = self._conn, None
        if conn is None:
            return
        if self.headers.get("connection", "").lower() == "close" or (self._length is None and not self._chunked):
            conn.close()
        else:
            self._client._give_back(conn)

    def aclose_now(self) -> None:
        """Drop the connection unless the body was read to its end (then it was already handed back)."""
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.close()

    async def aclose(self) -> None:
        self.aclose_now()

    async def read(self, limit: int = MAX_BODY_BYTES) -> bytes:
        """The whole body (an answer over ``limit`` bytes is refused, and its connection closed)."""
        parts, size = [], 0
        async for part in self.iter_raw():
            size += len(part)
            if size > limit:
                self.aclose_now()
                raise EngineConnectionError(f"The engine's answer is over {limit >> 20} MiB.")
            parts.append(part)
        return b"".join(parts)

    async def iter_raw(self) -> AsyncIterator[bytes]:
        """The body as it arrives: sized parts, or the data of the chunks received so far, joined."""
        if self._done:
            return
        conn = self._conn
        assert conn is not None, "the body was already read or closed"
        reader = conn.reader
        try:
            if self._chunked:
                async for part in self._chunks(reader):
                    yield part
            elif self._length is not None:
                async for part in _sized(reader, self._length):
                    yield part
            else:  # no length and not chunked: the body ends when the engine closes the connection
                while part := await reader.read(STREAM_LIMIT):
                    yield part
        except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ValueError) as exc:
            self.aclose_now()
            if isinstance(exc, EngineConnectionError):
                raise
            raise EngineConnectionError(f"The engine's answer broke off: {exc!r}") from None
        except BaseException:
            self.aclose_now()
            raise
        self._done = True
        self._release()

    @staticmethod
    async def _chunks(reader: asyncio.StreamReader) -> AsyncIterator[bytes]:
        """Chunk data as it arrives; chunks already received go out together (one write onward, not one per event)."""
        parts: list[bytes] = []
        while True:
            if parts and not _buffered(reader):
                yield _joined(parts)
                parts = []
            try:
                size = await _chunk_size(reader)
                if size == 0:
                    await _trailers(reader)
                    break
                if size > STREAM_LIMIT:  # a big chunk goes on in parts, never whole in memory
                    if parts:
                        yield _joined(parts)
                        parts = []
                    async for data in _sized(reader, size):
                        yield data
                    if await reader.readexactly(2) != b"\r\n":
                        raise EngineConnectionError("The engine sent a chunk without its closing CRLF.")
                    continue
                data = await reader.readexactly(size + 2)
                if data[-2:] != b"\r\n":
                    raise EngineConnectionError("The engine sent a chunk without its closing CRLF.")
                parts.append(data[:-2])
            except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ValueError):
                if parts:  # what arrived whole still goes out first
                    yield _joined(parts)
                raise
        if parts:
            yield _joined(parts)


async def _sized(reader: asyncio.StreamReader, size: int) -> AsyncIterator[bytes]:
    """``size`` bytes of the body, in parts of at most the reader's buffer."""
    left = size
    while left:
        part = await reader.read(min(left, STREAM_LIMIT))
        if not part:
            raise EngineConnectionError("The engine closed the connection before the end of its answer.")
        left -= len(part)
        yield part


def _joined(parts: list[bytes]) -> bytes:
    return parts[0] if len(parts) == 1 else b"".join(parts)


def _buffered(reader: asyncio.StreamReader) -> bool:
    """Whether the reader holds unread bytes (a further chunk can be parsed without waiting, or nearly)."""
    return bool(getattr(reader, "_buffer", b""))


async def _chunk_size(reader: asyncio.StreamReader) -> int:
    line = await reader.readuntil(b"\r\n")
    if len(line) > MAX_CHUNK_LINE:
        raise EngineConnectionError("The engine sent an oversized chunk header.")
    text = line[:-2].split(b";", 1)[0].strip()
    try:
        size = int(text, 16)
    except ValueError:
        raise EngineConnectionError(f"The engine sent a malformed chunk size: {text[:20]!r}.") from None
    if size < 0:
        raise EngineConnectionError("The engine sent a negative chunk size.")
    return size


async def _trailers(reader: asyncio.StreamReader) -> None:
    while (await reader.readuntil(b"\r\n")) != b"\r\n":
        pass


def _parse_head(head: bytes) -> tuple[int, dict[str, str]]:
    lines = head.decode("latin-1").split("\r\n")
    status_line = lines[0].split(" ", 2)
    if len(status_line) < 2 or not status_line[0].startswith("HTTP/1."):
        raise EngineConnectionError(f"The engine sent a malformed status line: {lines[0][:80]!r}.")
    try:
        status = int(status_line[1])
    except ValueError:
        raise EngineConnectionError(f"The engine sent a malformed status: {status_line[1][:20]!r}.") from None
    headers: dict[str, str] = {}
    for line in lines[1:]:
        if not line:
            continue
        name, sep, value = line.partition(":")
        if not sep:
            raise EngineConnectionError(f"The engine sent a malformed header line: {line[:80]!r}.")
        headers[name.strip().lower()] = value.strip()
    return status, headers


class EngineClient:
    """Requests to one engine socket over a small pool of kept-alive connections."""

    def __init__(
        self,
        socket_path: Path | str,
        headers: Mapping[str, str] | None = None,
        *,
        max_idle: int = 16,
        connect_timeout: float = 5.0,
    ):
        self.socket_path = str(socket_path)
        self.headers = {k.lower(): v for k, v in (headers or {}).items()}
        self.max_idle = max_idle
        self.connect_timeout = connect_timeout
        self._idle: list[_Connection] = []
        self._closed = False
        extra = "".join(f"{k}: {v}\r\n" for k, v in self.headers.items() if k not in ("host", "content-length"))
        self._fixed = f"host: engine\r\n{extra}".encode("latin-1")

    # ----------------------------------------------------------- connections
    async def _connect(self) -> _Connection:
        try:
            async with asyncio.timeout(self.connect_timeout):
                reader, writer = await asyncio.open_unix_connection(self.socket_path, limit=STREAM_LIMIT)
        except TimeoutError:
            raise EngineConnectionError(f"The engine socket did not accept within {self.connect_timeout:g} s.") from None
        except OSError as exc:
            raise EngineConnectionError(f"The engine socket refused the connection: {exc.strerror or exc}.") from None
        return _Connection(reader, writer)

    def _take_idle(self) -> _Connection | None:
        while self._idle:
            conn = self._idle.pop()
            if conn.usable():
                return conn
            conn.close()
        return None

    def _give_back(self, conn: _Connection) -> None:
        if self._closed or not conn.usable() or len(self._idle) >= self.max_idle:
            conn.close()
        else:
            self._idle.append(conn)

    @property
    def idle_connections(self) -> int:
        return len(self._idle)

    # -------------------------------------------------------------- requests
    def _head(
        self, method: str, path: str, body: bytes, content_type: str | None, headers: Mapping[str, str] | None = None
    ) -> bytes:
        head = f"{method} {path} HTTP/1.1\r\n".encode("latin-1") + self._fixed
        for name, value in (headers or {}).items():
            if "\r" in value or "\n" in value or "\r" in name or "\n" in name or ":" in name:
                raise ValueError(f"not a header: {name!r}")
            head += f"{name}: {value}\r\n".encode("latin-1")
        if body or method in ("POST", "PUT", "PATCH"):
            head += b"content-length: %d\r\n" % len(body)
            if content_type:
                head += f"content-type: {content_type}\r\n".encode("latin-1")
        return head + b"\r\n"

    async def request(
        self,
        method: str,
        path: str,
        body: bytes = b"",
        *,
        content_type: str | None = "application/json",
        headers: Mapping[str, str] | None = None,
    ) -> EngineResponse:
        """Send one request and read the answer's status and headers; the body is read from the response.

        ``headers`` are added to this request only (the request's priority class, :data:`PRIORITY_HEADER`).
        """
        if self._closed:
            raise EngineConnectionError("The engine client is closed.")
        message = self._head(method, path, body, content_type, headers)
        conn = self._take_idle()
        if conn is not None:
            try:
                return await self._exchange(conn, message, body)
            except _NothingReceived:
                pass  # the engine closed this kept-alive connection while it sat idle: once more on a new one
        conn = await self._connect()
        try:
            return await self._exchange(conn, message, body)
        except _NothingReceived as exc:
            raise EngineConnectionError(str(exc)) from None

    async def _exchange(self, conn: _Connection, message: bytes, body: bytes) -> EngineResponse:
        received = False
        try:
            writer = conn.writer
            if len(body) <= 65536:
                writer.write(message + body)
            else:
                writer.write(message)
                writer.write(body)
            if writer.transport.get_write_buffer_size():
                await writer.drain()
            try:
                head = await conn.reader.readuntil(b"\r\n\r\n")
            except asyncio.IncompleteReadError as exc:
                received = bool(exc.partial)
                raise
            received = True
            if len(head) > MAX_HEADER_BYTES:
                raise EngineConnectionError("The engine sent oversized headers.")
            status, headers = _parse_head(head[:-4])
            while status == 100:  # an interim answer: the real one follows
                head = await conn.reader.readuntil(b"\r\n\r\n")
                status, headers = _parse_head(head[:-4])
        except EngineConnectionError:
            conn.close()
            raise
        except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ValueError) as exc:
            conn.close()
            if not received:
                raise _NothingReceived(f"The engine closed the connection without answering: {exc!r}") from None
            raise EngineConnectionError(f"The engine's answer broke off: {exc!r}") from None
        except BaseException:
            conn.close()
            raise
        return EngineResponse(self, conn, status, headers)

    async def get(self, path: str) -> tuple[int, bytes]:
        """A GET read to its end: (status, body)."""
        response = await self.request("GET", path, content_type=None)
        return response.status, await response.read()

    async def post(self, path: str, body: bytes) -> tuple[int, bytes]:
        """A POST of a JSON body read to its end: (status, body)."""
        response = await self.request("POST", path, body)
        return response.status, await response.read()

    async def aclose(self) -> None:
        self._closed = True
        idle, self._idle = self._idle, []
        for conn in idle:
            conn.close()


class _NothingReceived(EngineConnectionError):
    """The connection failed before any byte of the answer: safe to send the request again."""
