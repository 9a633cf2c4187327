"""The checks of a batch input file, line by line, before anything is stored.

Each line must be a JSON object with a unique ``custom_id``, ``method`` POST, a ``url`` this appliance runs in a batch
and a ``body`` object naming a ``model`` that decodes as that endpoint's request. Errors name the line (1-based).
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import msgspec

from appliance.errors import BadRequest
from appliance.openai_schema import ChatCompletionRequest, CompletionRequest, EmbeddingRequest

#: The endpoints a batch may run: url -> (the gateway's endpoint name, the request type).
ENDPOINTS: dict[str, tuple[str, type]] = {
    "/v1/chat/completions": ("chat", ChatCompletionRequest),
    "/v1/completions": ("completions", CompletionRequest),
    "/v1/embeddings": ("embeddings", EmbeddingRequest),
}
MAX_REPORTED_ERRORS = 10


@dataclass(frozen=True)
class RequestLine:
    """One request of a batch: its 0-based line index in the file, ``custom_id``, ``url`` and ``body``."""

    index: int
    custom_id: str
    url: str
    body: dict


@dataclass(frozen=True)
class CheckedFile:
    lines: list[RequestLine]
    endpoints: frozenset[str]


def decode_body(url: str, raw: bytes | dict) -> object:
    """The body as the endpoint's request struct (what the HTTP route would decode); msgspec errors pass through."""
    _, kind = ENDPOINTS[url]
    if isinstance(raw, dict):
        raw = json.dumps(raw).encode()
    return msgspec.json.decode(raw, type=kind)


def _check_line(number: int, text: bytes, seen: dict[str, int]) -> RequestLine:
    try:
        item = json.loads(text)
    except (ValueError, UnicodeDecodeError) as exc:
        raise ValueError(f"line {number}: not valid JSON ({exc.__class__.__name__})") from None
    if not isinstance(item, dict):
        raise ValueError(f"line {number}: must be a JSON object")
    custom_id = item.get("custom_id")
    if not isinstance(custom_id, str) or not custom_id or len(custom_id) > 512:
        raise ValueError(f"line {number}: `custom_id` must be a non-empty string of at most 512 characters")
    if custom_id in seen:
        raise ValueError(f"line {number}: `custom_id` {custom_id!r} repeats line {seen[custom_id]}")
    if item.get("method") != "POST":
        raise ValueError(f'line {number}: `method` must be "POST"')
    url = item.get("url")
    if url not in ENDPOINTS:
        raise ValueError(f"line {number}: `url` must be one of {', '.join(ENDPOINTS)}")
    body = item.get("body")
    if not isinstance(body, dict):
        raise ValueError(f"line {number}: `body` must be a JSON object")
    if not isinstance(body.get("model"), str) or not body["model"]:
        raise ValueError(f"line {number}: `body.model` must name a model")
    if body.get("stream"):
        raise ValueError(f"line {number}: `body.stream` is not supported in a batch")
    try:
        decode_body(url, body)
    except msgspec.ValidationError as exc:
        raise ValueError(f"line {number}: `body` is not a valid {url} request: {exc}") from None
    seen[custom_id] = number
    return RequestLine(number - 1, custom_id, url, body)


def check_file(content: bytes, max_lines: int) -> CheckedFile:
    """Every request line of ``content``, or :class:`BadRequest` naming the first bad lines (blank lines are skipped)."""
    lines: list[RequestLine] = []
    errors: list[str] = []
    seen: dict[str, int] = {}
    for number, text in enumerate(content.split(b"\n"), start=1):
        if not text.strip():
            continue
        if len(lines) >= max_lines:
            raise BadRequest(f"The file holds more than batch_max_lines ({max_lines}) request lines.", param="file")
        try:
            lines.append(_check_line(number, text, seen))
        except ValueError as exc:
            errors.append(str(exc))
            if len(errors) >= MAX_REPORTED_ERRORS:
                break
    if errors:
        raise BadRequest("Invalid batch input: " + "; ".join(errors), param="file", code="invalid_batch_line")
    if not lines:
        raise BadRequest("The file holds no request lines.", param="file", code="invalid_batch_line")
    return CheckedFile(lines, frozenset(line.url for line in lines))
