"""What the client is told when the engine fails it: the engine's own error passed through, a stopped engine, a deadline."""

from __future__ import annotations

import json

from appliance.errors import ApplianceError, EngineTimeout, EngineUnavailable


class EngineAnswerError(ApplianceError):
    """An error the engine answered with, passed through with its status."""

    def __init__(self, status: int, body: bytes):
        try:
            error = json.loads(body)["error"]
            message, type_, param, code = (
                error.get("message", ""),
                error.get("type", "invalid_request_error"),
                error.get("param"),
                error.get("code"),
            )
        except (ValueError, KeyError, TypeError):
            message, type_, param, code = body[:300].decode("utf-8", "replace") or "engine error", "server_error", None, None
        super().__init__(message, param=param, code=code)
        self.status = status
        self.type = type_


def engine_stopped(model: str) -> EngineUnavailable:
    """The engine serving ``model`` went away before it answered: a 503 the client may retry shortly."""
    return EngineUnavailable(
        f"The engine serving `{model}` stopped; it is being restarted. Retry shortly.", headers={"Retry-After": "2"}
    )


def timed_out(model: str, timeout_seconds: float) -> EngineTimeout:
    """The request for ``model`` passed its deadline (``request_timeout_seconds``)."""
    return EngineTimeout(f"The model `{model}` did not finish within request_timeout_seconds ({timeout_seconds:g} s).")
