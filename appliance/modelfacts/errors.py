"""Errors of model inspection."""

from __future__ import annotations

from appliance.errors import BadRequest


class InvalidModelFile(BadRequest):
    """The model file or folder is malformed, hostile, or not a format we accept.

    Raised before anything large is allocated; the message says what was wrong
    (never an absolute path).
    """

    code = "invalid_model_file"
