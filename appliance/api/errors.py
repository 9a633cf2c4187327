"""One exception handler: every error becomes OpenAI's envelope.

``{"error": {"message", "type", "param", "code"}}`` with the status carried by
the typed exception. htmx requests from the console get a small HTML partial
instead, which the console swaps into its error area. Routes of the Anthropic
Messages API declare :func:`anthropic_errors` in their ``opt``, and get the same
error, status and message in Anthropic's shape, ``{"type": "error", "error":
{"type", "message"}}``; routes of the Ollama API declare :func:`ollama_errors` and
get Ollama's ``{"error": "message"}``.
"""

from __future__ import annotations

import html
import logging
import re

import msgspec
from litestar import MediaType, Request, Response
from litestar.exceptions import HTTPException, ValidationException

from appliance.api.request_trace import HTTP_REASONS, note_reason
from appliance.errors import ApplianceError, BadRequest, error_envelope
from appliance.jsontypes import JsonObject
from appliance.openai_schema import REFUSED
from appliance.serving.anthropic.errors import error_body, error_type

log = logging.getLogger("appliance.errors")

_STATUS_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "invalid_request_error",
    405: "invalid_request_error",
    413: "invalid_request_error",
    429: "rate_limit_error",
}


ERROR_SHAPE = "error_shape"
_ANTHROPIC = "anthropic"
_OLLAMA = "ollama"


def anthropic_errors() -> dict[str, str]:
    """The ``opt`` of routes whose errors take Anthropic's shape."""
    return {ERROR_SHAPE: _ANTHROPIC}


def ollama_errors() -> dict[str, str]:
    """The ``opt`` of routes whose errors take Ollama's shape."""
    return {ERROR_SHAPE: _OLLAMA}


def _error_shape(request: Request) -> str | None:
    handler = request.scope.get("route_handler")  # set once the request is routed (before guards and validation)
    if handler is None:  # no route matched (404, 405): the path family is all there is to go by
        return _OLLAMA if request.url.path.startswith("/api/") else None
    return (handler.opt or {}).get(ERROR_SHAPE)


def _respond(request: Request, status: int, body: JsonObject, headers: dict[str, str] | None = None) -> Response:
    note_reason(request.scope, body["error"].get("code"), body["error"].get("type"))  # the request log's reason
    shape = _error_shape(request)
    if shape == _OLLAMA:
        return Response(
            content={"error": body["error"]["message"]}, status_code=status, media_type=MediaType.JSON, headers=headers
        )
    if shape == _ANTHROPIC:
        body = error_body(error_type(status), body["error"]["message"])
    if request.headers.get("hx-request") == "true":
        message = html.escape(body["error"]["message"])
        return Response(
            content=f'<div class="alert alert-error" role="alert">{message}</div>',
            status_code=status,
            media_type=MediaType.HTML,
            headers={**(headers or {}), "HX-Reswap": "innerHTML", "HX-Retarget": "#errors"},
        )
    return Response(content=body, status_code=status, media_type=MediaType.JSON, headers=headers)


def handle_appliance_error(request: Request, exc: ApplianceError) -> Response:
    if exc.status >= 500:
        log.warning("request failed: %s", exc.message, extra={"fields": {"path": request.url.path, "status": exc.status}})
    return _respond(request, exc.status, exc.envelope(), exc.headers)


_UNKNOWN_FIELD = re.compile(r"unknown field `([^`]{1,100})`")


def handle_validation_error(request: Request, exc: ValidationException) -> Response:
    param = None
    message = exc.detail or "Invalid request."
    extra = exc.extra
    if isinstance(extra, list) and extra:
        first = extra[0] if isinstance(extra[0], dict) else {}
        param = first.get("key") or None
        text = str(first.get("message") or "")
        if unknown := _UNKNOWN_FIELD.search(text):
            param = unknown.group(1)
            message = f"Unsupported parameter '{param}': this appliance does not serve it, and it is not ignored in silence."
        elif text:
            message = text + (f" (parameter '{param}')" if param else "")
    return _invalid_field(request, param, message)


def _invalid_field(request: Request, param: str | None, message: str) -> Response:
    """A 400 naming ``param``, with the field's own explanation when it has one (:data:`REFUSED`)."""
    return _respond(request, 400, error_envelope(REFUSED.get(param or "", message), BadRequest.type, param, "invalid_request"))


# A body field named like an injected collaborator (``store``) makes Litestar call its validation
# error a dependency failure (a bare 500); the cause still says the error is at ``$.data.<field>``.
_BODY_ERROR = re.compile(r"^(.*) - at `\$\.data\.([A-Za-z_][A-Za-z0-9_]{0,63})")


def handle_http_exception(request: Request, exc: HTTPException) -> Response:
    status = exc.status_code
    if status == 500 and isinstance(exc.__cause__, msgspec.ValidationError) and (found := _BODY_ERROR.match(str(exc.__cause__))):
        return _invalid_field(request, found.group(2), f"{found.group(1)} (parameter '{found.group(2)}')")
    type_ = _STATUS_TYPES.get(status, "server_error" if status >= 500 else "invalid_request_error")
    detail = exc.detail if status < 500 else "Internal server error."
    response = _respond(request, status, error_envelope(detail, type_, None, None), dict(exc.headers or {}))
    note_reason(request.scope, HTTP_REASONS.get(status), type_)
    return response


def handle_unexpected(request: Request, exc: Exception) -> Response:
    log.exception("unhandled error on %s", request.url.path)
    return _respond(request, 500, error_envelope("Internal server error.", "server_error", None, "internal_error"))


EXCEPTION_HANDLERS = {
    ApplianceError: handle_appliance_error,
    ValidationException: handle_validation_error,
    HTTPException: handle_http_exception,
    Exception: handle_unexpected,
}
