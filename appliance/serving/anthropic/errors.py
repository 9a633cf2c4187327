"""Anthropic's error body, ``{"type": "error", "error": {"type", "message"}}``, and its types by HTTP status."""

from __future__ import annotations

from appliance.jsontypes import JsonObject

_BY_STATUS = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    408: "invalid_request_error",
    409: "invalid_request_error",
    413: "request_too_large",
    422: "invalid_request_error",
    429: "rate_limit_error",
    503: "overloaded_error",
    529: "overloaded_error",
}

#: OpenAI error types (the engines' and the appliance's) that have an Anthropic twin of the same name.
_SAME = frozenset({"invalid_request_error", "authentication_error", "permission_error", "rate_limit_error"})


def error_type(status: int) -> str:
    """Anthropic's error ``type`` for an HTTP status (``api_error`` for any other 5xx or 4xx)."""
    return _BY_STATUS.get(status, "api_error" if status >= 500 else "invalid_request_error")


def error_body(type_: str, message: str) -> JsonObject:
    """Anthropic's error body: the only place it is built."""
    return {"type": "error", "error": {"type": type_, "message": message}}


def from_openai(envelope: JsonObject) -> JsonObject:
    """An OpenAI error envelope (an engine's error event mid-stream) as Anthropic's error body."""
    found = envelope.get("error")
    error = found if isinstance(found, dict) else {}
    type_ = error.get("type")
    return error_body(type_ if type_ in _SAME else "api_error", str(error.get("message") or "The engine failed."))
