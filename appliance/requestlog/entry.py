"""What the request log keeps of one request: who asked, for what, and how it ended. Never a body or a query string."""

from __future__ import annotations

from dataclasses import dataclass

#: Longest text kept in each column; longer values are cut (a model name is the client's to choose).
MAX_TEXT = 200


@dataclass(slots=True, frozen=True)
class RequestEntry:
    created_at: float  # epoch seconds, when the request arrived
    request_id: str
    method: str
    endpoint: str  # the route's path template (``/v1/batches/{batch_id:str}``), never the raw path
    status: int
    latency_ms: float  # arrival to last byte (or to the client leaving)
    reason: str | None = None  # the error's code (or type): invalid_api_key, model_not_found, ...; None when served
    key_id: int | None = None
    user: str | None = None  # the console user, for console requests
    address: str | None = None  # the client's address ("local" on the admin socket)
    model: str | None = None  # as the request's body named it

    def row(self) -> tuple[object, ...]:
        """The values of one ``request_log`` row, in :data:`COLUMNS` order."""
        return (
            self.created_at,
            self.request_id[:64],
            self.key_id,
            _cut(self.user),
            _cut(self.address),
            self.method[:8],
            self.endpoint[:MAX_TEXT],
            _cut(self.model),
            self.status,
            _cut(self.reason),
            round(self.latency_ms, 3),
        )


COLUMNS = (
    "created_at",
    "request_id",
    "key_id",
    "user",
    "address",
    "method",
    "endpoint",
    "model",
    "status",
    "reason",
    "latency_ms",
)


def _cut(value: str | None) -> str | None:
    return value[:MAX_TEXT] if value is not None else None
