"""The request log's side of the edge: each request's id on its answer, and one log entry when it ends.

The edge (:mod:`appliance.api.edge`) wraps every HTTP request's ``send`` in a :class:`RequestTrace`. The trace
puts the request's id (made at arrival, :class:`appliance.serving.timing.RequestTiming`) on the answer as
``x-request-id`` unless the gateway already did (it sends the same id), notes the status, and at the answer's
last byte hands one :class:`~appliance.requestlog.entry.RequestEntry` to the log. An answer that never reaches
its last byte (a stream the client left) is logged as a 499, ``client_disconnected``.

What each entry holds comes from what is known by then, never from the body or the query string: the route's
path template, the caller (the access guard's principal, the console's user), the reason the one error handler
noted (:func:`note_reason`), and the model the JSON body named (:func:`note_model`, read once by the API's
request class). Not logged: health probes and static assets (``Access.PUBLIC``), and console pages, the manual
and ``/metrics`` when they answer without an error; a console action (any unsafe method) is logged.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from litestar.types import Message, Scope, Send

from appliance.accounts.keys import Principal
from appliance.api.access import ACCESS, LOCAL_MARK, PRINCIPAL, Access
from appliance.requestlog.entry import MAX_TEXT, RequestEntry
from appliance.serving.timing import RequestTiming
from appliance.webui.context import SCOPE_USER, ConsoleUser

#: Called with each finished request's entry; must not block (the log queues it).
RequestRecorder = Callable[[RequestEntry], None]

REASON_KEY = "appliance.reason"
MODEL_KEY = "appliance.model"
REQUEST_ID_HEADER = b"x-request-id"
DISCONNECTED = 499
#: The reason logged for an error Litestar raised itself, which carries no code (its envelope's ``code`` stays null).
HTTP_REASONS = {
    401: "authentication_error",
    403: "permission_error",
    404: "not_found",
    405: "method_not_allowed",
    413: "payload_too_large",
}
_SAFE = frozenset({"GET", "HEAD", "OPTIONS"})


def note_reason(scope: Scope, code: str | None, type_: str | None = None) -> None:
    """Record why a request was refused or failed: the error's ``code``, else its ``type``."""
    scope[REASON_KEY] = code or type_  # type: ignore[literal-required]  # Scope's TypedDict lists only ASGI's keys


def note_model(scope: Scope, body: object) -> None:
    """Record the model a decoded JSON body names, when it names one as text."""
    model = body.get("model") if isinstance(body, dict) else None
    if isinstance(model, str):
        scope[MODEL_KEY] = model[:MAX_TEXT]  # type: ignore[literal-required]  # Scope's TypedDict lists only ASGI's keys


def logged(scope: Scope, method: str, status: int) -> bool:
    """Whether a request is worth a row: every API request; a probe, an asset, a page view or a scrape only when
    it was refused or failed (public routes never)."""
    handler = scope.get("route_handler")
    access = (handler.opt or {}).get(ACCESS) if handler is not None else None
    if access is Access.PUBLIC:
        return False
    if access in (Access.CONSOLE, Access.METRICS):
        return status >= 400 or method not in _SAFE
    return True


def _caller(scope: Scope) -> tuple[int | None, str | None, str | None]:
    """The key id, console user and address a request came from."""
    principal = scope.get(PRINCIPAL)
    key_id = principal.id if isinstance(principal, Principal) and principal.kind == "key" else None
    user = scope.get(SCOPE_USER)
    username = user.username if isinstance(user, ConsoleUser) else None
    if scope.get(LOCAL_MARK):
        return key_id, username, "local"
    client = scope.get("client")
    return key_id, username, str(client[0]) if client else None


def _text(value: object) -> str | None:
    return value if isinstance(value, str) else None


class RequestTrace:
    """One request's trace: wraps its ``send`` and hands the log its entry once, when the answer ends."""

    __slots__ = ("_scope", "_timing", "_record", "_status", "_done", "_arrived")

    def __init__(self, scope: Scope, timing: RequestTiming, record: RequestRecorder):
        self._scope = scope
        self._timing = timing
        self._record = record
        self._status: int | None = None
        self._done = False
        self._arrived = time.time()

    def wrap(self, send: Send) -> Send:
        async def traced(message: Message) -> None:
            if message["type"] == "http.response.start":
                self._status = message["status"]
                headers = list(message.get("headers", ()))
                if not any(name.lower() == REQUEST_ID_HEADER for name, _ in headers):
                    headers.append((REQUEST_ID_HEADER, self._timing.request_id.encode()))
                    message["headers"] = headers
            await send(message)
            if message["type"] == "http.response.body" and not message.get("more_body"):
                self.finish(answered=True)

        return traced

    def finish(self, *, answered: bool = False) -> None:
        """Log the request once: at its last byte (``answered``), or when the app returned without sending it."""
        if self._done:
            return
        self._done = True
        scope = self._scope
        status, reason = self._status, _text(scope.get(REASON_KEY))
        if status is None or not answered:
            status, reason = DISCONNECTED, "client_disconnected"
        method = _text(scope.get("method")) or "GET"
        if not logged(scope, method, status):
            return
        key_id, user, address = _caller(scope)
        self._record(
            RequestEntry(
                created_at=self._arrived,
                request_id=self._timing.request_id,
                method=method,
                endpoint=_text(scope.get("path_template")) or "(no route)",
                status=status,
                reason=reason if status >= 400 else None,
                latency_ms=(time.perf_counter() - self._timing.started) * 1000,
                key_id=key_id,
                user=user,
                address=address,
                model=_text(scope.get(MODEL_KEY)),
            )
        )
