"""The llama.cpp worker's errors.

The :class:`~appliance.errors.ApplianceError` subclasses are answered to the daemon in
OpenAI's envelope; the others are failures of libllama that the worker turns into one
of those (or, while loading, into its exit status).
"""

from __future__ import annotations

from appliance.errors import ApplianceError, BadRequest


class ModelLoadError(RuntimeError):
    """libllama refused the model file (missing, corrupt or unsupported)."""


class DecodeFailure(RuntimeError):
    """The decode context could not be created or a decode failed."""


class EmbeddingError(RuntimeError):
    """The embedding context could not be created or a decode failed."""


class ContextLengthExceeded(BadRequest):
    """The prompt does not fit in one slot's context."""

    code = "context_length_exceeded"


class ChatTemplateError(BadRequest):
    """The model's chat template failed, or tried something the sandbox forbids."""

    code = "chat_template_error"


class MethodNotAllowed(ApplianceError):
    """The route exists but not for this HTTP method."""

    status = 405
    type = "invalid_request_error"
    code = "method_not_allowed"


class PayloadTooLarge(ApplianceError):
    """The request body is larger than the worker reads."""

    status = 413
    type = "invalid_request_error"
    code = "payload_too_large"


class WorkerError(ApplianceError):
    """Generation or embedding failed inside the worker (or a bug): a 500 in OpenAI's shape."""

    status = 500
    type = "server_error"
    code = "engine_error"
