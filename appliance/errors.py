"""The appliance's error tree.

Each class carries the HTTP status and the OpenAI error ``type`` it maps to; one
exception handler (``appliance.api.errors``) turns any of them into OpenAI's
envelope ``{"error": {"message", "type", "param", "code"}}``. Messages are for
users: they never carry secrets or absolute paths.
"""

from __future__ import annotations

from appliance.jsontypes import JsonObject


def error_envelope(message: str, type_: str, param: str | None = None, code: str | None = None) -> JsonObject:
    """OpenAI's error body, ``{"error": {"message", "type", "param", "code"}}``: the only place it is built."""
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}


class ApplianceError(Exception):
    """Base of every error the appliance reports to a client."""

    status: int = 500
    type: str = "server_error"
    code: str | None = None

    def __init__(self, message: str, *, param: str | None = None, code: str | None = None, headers: dict[str, str] | None = None):
        super().__init__(message)
        self.message = message
        self.param = param
        if code is not None:
            self.code = code
        self.headers = headers or {}

    def envelope(self) -> JsonObject:
        """This error in OpenAI's envelope."""
        return error_envelope(self.message, self.type, self.param, self.code)


class ConfigError(ApplianceError):
    """A setting has a value the appliance cannot use."""

    code = "invalid_config"


class BadRequest(ApplianceError):
    """The request is malformed or asks for something impossible."""

    status = 400
    type = "invalid_request_error"


class AuthenticationFailed(ApplianceError):
    """No API key, or one that is unknown, revoked or expired."""

    status = 401
    type = "authentication_error"
    code = "invalid_api_key"


class PermissionDenied(ApplianceError):
    """The key is valid but may not do this (role or model allow-list)."""

    status = 403
    type = "permission_error"
    code = "permission_denied"


class HostNotAllowed(PermissionDenied):
    """The Host header is not one of the allowed names (DNS rebinding)."""

    code = "host_not_allowed"


class RequestTimeout(ApplianceError):
    """The client did not send its request (headers or body) in time."""

    status = 408
    type = "invalid_request_error"
    code = "request_timeout"


class NotFound(ApplianceError):
    """The thing named does not exist."""

    status = 404
    type = "invalid_request_error"
    code = "not_found"


class ModelNotFound(NotFound):
    """No installed model or alias has this name."""

    code = "model_not_found"


class Conflict(ApplianceError):
    """The request clashes with the current state (e.g. deleting a loaded model)."""

    status = 409
    type = "invalid_request_error"
    code = "conflict"


class RateLimited(ApplianceError):
    """A quota or the admission queue said no; retry after the given delay."""

    status = 429
    type = "rate_limit_error"
    code = "rate_limit_exceeded"


class QuotaExceeded(RateLimited):
    """A budget (tokens or cost for the period) is spent."""

    code = "insufficient_quota"


class EngineUnavailable(ApplianceError):
    """The engine crashed, is restarting, or the box is saturated."""

    status = 503
    type = "server_error"
    code = "engine_unavailable"


class EngineTimeout(ApplianceError):
    """The request did not finish within its timeout."""

    status = 504
    type = "server_error"
    code = "timeout"


class InsufficientStorage(ApplianceError):
    """The model store's disk is full or too small for the download."""

    status = 507
    type = "server_error"
    code = "insufficient_storage"


class DoesNotFit(ApplianceError):
    """The planner found no variant and placement that fits this box."""

    status = 422
    type = "invalid_request_error"
    code = "model_does_not_fit"


class PayloadTooLarge(ApplianceError):
    """An upload is larger than a configured limit, or would take its key past its storage quota."""

    status = 413
    type = "invalid_request_error"
    code = "payload_too_large"
