"""What a cached answer is keyed by, who may share it, and which requests may be cached.

The exact key is the sha256 of a canonical JSON document: the cache partition
(who may share the entry), the endpoint, the canonical model name, and the
request with everything that cannot change the answer removed (``stream``,
``stream_options``, ``user`` and the other ignored fields; sampling knobs that greedy decoding ignores) and
equivalent spellings folded (``max_completion_tokens`` → ``max_tokens``,
``n: 1`` dropped, a lone text part → a plain string).

The semantic scope key is the same document without the text that is embedded
(the final user message, or the completion prompt): two requests can only
share a semantic answer when model, system prompt, earlier turns, tools,
response format and sampling parameters are identical.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TypeAlias

import msgspec

from appliance.accounts.keys import Principal
from appliance.jsontypes import JsonObject
from appliance.openai_schema import NOT_FORWARDED, ChatCompletionRequest, CompletionRequest

KEY_VERSION = 1
EXCLUDED = ("model", "stream", "stream_options", *NOT_FORWARDED)
# With temperature 0 llama.cpp and vLLM decode greedily: these knobs cannot change the answer.
GREEDY_IGNORED = ("seed", "top_p", "top_k", "min_p")
SHARE_MODES = ("team", "key", "global")
_encode = msgspec.json.Encoder(order="sorted").encode

#: The request bodies the cache answers: chat and text completions.
CacheableRequest: TypeAlias = ChatCompletionRequest | CompletionRequest


@dataclass(frozen=True, slots=True)
class Policy:
    """The effective cache policy for one request (defaults ← global ← team ← key)."""

    enabled: bool = True
    cache_nondeterministic: bool = False
    semantic: bool = True
    semantic_threshold: float = 0.95
    share: str = "team"  # team | key | global


POLICY_FIELDS = {"enabled": bool, "cache_nondeterministic": bool, "semantic": bool, "semantic_threshold": float, "share": str}


@dataclass(slots=True)
class Prepared:
    """A cacheable request as the cache sees it: its keys, partition, policy and what the client allows."""

    endpoint: str
    model: str
    key: str
    policy: Policy
    doc: JsonObject
    part: str
    key_id: int | None
    may_read: bool
    may_write: bool
    text: str | None = None  # for the semantic tier, when it applies
    scope: str | None = None


def validate_policy(raw: JsonObject) -> JsonObject:
    """Check a policy document (as stored or as sent to the admin API); returns a clean copy."""
    clean: JsonObject = {}
    for name, value in raw.items():
        kind = POLICY_FIELDS.get(name)
        if kind is None:
            raise ValueError(f"unknown cache policy field `{name}`; known: {', '.join(POLICY_FIELDS)}")
        if kind is float and isinstance(value, (int, float)) and not isinstance(value, bool):
            value = float(value)
            if not 0.0 < value <= 1.0:
                raise ValueError("semantic_threshold must be in (0, 1]")
        elif not isinstance(value, kind):
            raise ValueError(f"cache policy field `{name}` must be a {kind.__name__}")
        if name == "share" and value not in SHARE_MODES:
            raise ValueError(f"share must be one of {', '.join(SHARE_MODES)}")
        clean[name] = value
    return clean


def merge_policy(base: Policy, *layers: JsonObject | None) -> Policy:
    """Apply policy layers in order; ``enabled: false`` at any layer wins (a team opt-out binds its keys).

    Fields that do not validate are ignored (policies are validated when written)."""
    values = {f: getattr(base, f) for f in POLICY_FIELDS}
    enabled = base.enabled
    for layer in layers:
        if not layer:
            continue
        for name, value in layer.items():
            try:
                values.update(validate_policy({name: value}))
            except ValueError:
                continue
        if layer.get("enabled") is False:
            enabled = False
    values["enabled"] = enabled
    return Policy(**values)


def is_deterministic(body: CacheableRequest) -> bool:
    """Greedy (temperature 0) or seeded sampling. OpenAI's default temperature is 1."""
    return (body.temperature is not None and body.temperature == 0) or body.seed is not None


def partition(principal: Principal, share: str) -> str:
    """Who may share an entry. Default `team`: a hit reveals that someone asked the same
    thing before, so entries are not shared across teams unless policy says so."""
    if share == "global":
        return "global"
    if share == "team" and principal.team_id is not None:
        return f"team:{principal.team_id}"
    return f"key:{principal.id}" if principal.id is not None else f"{principal.kind}:{principal.name}"


def _message(m: JsonObject) -> JsonObject:
    content = m.get("content")
    if isinstance(content, list) and len(content) == 1 and isinstance(content[0], dict) and content[0].get("type") == "text":
        m = {**m, "content": content[0].get("text", "")}
    return m


def normalized(body: CacheableRequest) -> JsonObject:
    """The request fields that determine the answer, in one canonical spelling."""
    doc = msgspec.to_builtins(body)  # omit_defaults: unset fields are absent
    for name in EXCLUDED:
        doc.pop(name, None)
    doc = {k: v for k, v in doc.items() if v is not None}
    if "max_completion_tokens" in doc:
        doc["max_tokens"] = doc.pop("max_completion_tokens")
    if doc.get("n") == 1:
        del doc["n"]
    if doc.get("temperature") is not None:
        doc["temperature"] = float(doc["temperature"])
        if doc["temperature"] == 0.0:
            for name in GREEDY_IGNORED:
                doc.pop(name, None)
    if isinstance(body, ChatCompletionRequest):
        doc["messages"] = [_message(m) for m in doc["messages"]]
    elif isinstance(body, CompletionRequest) and isinstance(doc.get("prompt"), list):
        doc["prompt"] = doc["prompt"][0]
    for name in ("frequency_penalty", "presence_penalty"):
        if doc.get(name) == 0:
            del doc[name]
    if isinstance(body, ChatCompletionRequest) and not doc.get("logprobs"):
        doc.pop("logprobs", None)  # top_logprobs without logprobs is refused; logprobs: false asks for nothing
    if doc.get("top_logprobs") == 0:
        del doc["top_logprobs"]
    if doc.get("echo") is False:
        del doc["echo"]
    return doc


def _digest(doc: list[object]) -> str:
    return hashlib.sha256(_encode(doc)).hexdigest()


def cache_key(part: str, endpoint: str, model: str, doc: JsonObject) -> str:
    return _digest([KEY_VERSION, part, endpoint, model, doc])


def semantic_text(endpoint: str, doc: JsonObject) -> str | None:
    """The text the semantic tier embeds: the last user message, or the prompt.

    None for answers that describe the exact tokens of their own request (``logprobs``,
    ``echo``): a similar request's answer would describe another text.
    """
    if "logprobs" in doc or doc.get("echo"):
        return None
    if endpoint == "completions":
        prompt = doc.get("prompt")
        return prompt if isinstance(prompt, str) else None
    messages = doc.get("messages") or []
    if not messages or messages[-1].get("role") != "user" or not isinstance(messages[-1].get("content"), str):
        return None
    return messages[-1]["content"]


def scope_key(part: str, endpoint: str, model: str, doc: JsonObject) -> str:
    """Everything but the embedded text: model, system prompt, earlier turns, tools, sampling."""
    rest = dict(doc)
    if endpoint == "completions":
        rest.pop("prompt", None)
    else:
        rest["messages"] = doc["messages"][:-1]
    return _digest([KEY_VERSION, "scope", part, endpoint, model, rest])


def cache_control(headers: Mapping[str, str] | None) -> tuple[bool, bool]:
    """(may_read, may_write) from the request's Cache-Control header."""
    if not headers:
        return True, True
    value = headers.get("cache-control") or ""
    if not value:
        return True, True
    tokens = {t.strip().split("=", 1)[0].lower() for t in value.split(",")}
    if "no-store" in tokens:
        return False, False
    if "no-cache" in tokens:
        return False, True
    return True, True
