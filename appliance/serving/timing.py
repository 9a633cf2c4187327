"""A request's id, and where its time goes: in the daemon, or waiting for the engine.

The HTTP edge starts a :class:`RequestTiming` when a request arrives and puts it
in the ASGI scope. It names the request (:attr:`RequestTiming.request_id`, the
``x-request-id`` of every answer, the ledger's and the request log's id); the gateway adds every wait on the engine (the answer's
headers, its body, each streamed chunk). What is left is the daemon's own cost:
authentication, admission, the cache, routing, metering and relaying bytes.
The edge reports it in ``x-appliance-overhead-ms`` on every response (up to the
response's first byte) and, for requests the gateway served, observes it in the
``appliance_gateway_overhead_seconds`` histogram at the response's last byte.
"""

from __future__ import annotations

import itertools
import secrets
import time
from collections.abc import Iterator
from contextlib import contextmanager

#: The ASGI scope key the edge stores a request's timing under.
SCOPE_KEY = "appliance.timing"
HEADER = b"x-appliance-overhead-ms"

#: Request ids: 48 random bits drawn once per process, then a counter (no system call per request).
_ID_PREFIX = "req_" + secrets.token_hex(6)
_ID_COUNTER = itertools.count(1)


def new_request_id() -> str:
    """``req_`` and 24 hex digits, unique within the process and, with its random half, across restarts."""
    return f"{_ID_PREFIX}{next(_ID_COUNTER):012x}"


class RequestTiming:
    __slots__ = ("request_id", "started", "engine_s", "endpoint")

    def __init__(self) -> None:
        self.request_id = new_request_id()
        self.started = time.perf_counter()
        self.engine_s = 0.0
        self.endpoint: str | None = None  # set by the gateway when it serves the request

    @contextmanager
    def waiting_for_engine(self) -> Iterator[None]:
        began = time.perf_counter()
        try:
            yield
        finally:
            self.engine_s += time.perf_counter() - began

    def overhead_s(self) -> float:
        """Time since the request arrived, less the time spent waiting for the engine."""
        return max(0.0, time.perf_counter() - self.started - self.engine_s)
