"""OpenAI request parsing and response shaping for the llama.cpp worker.

Parsing turns a JSON body into a :class:`GenRequest` (or raises
:class:`appliance.errors.BadRequest` naming the offending ``param``).
Shaping produces the exact bytes of SSE chunks: a chunk's constant head and
tail are serialized once per request, so each token costs one ``json.dumps``
of its text delta.
"""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass, field

from appliance.errors import BadRequest
from appliance.jsontypes import JsonObject, JsonValue
from appliance.serving.schema_limits import check_logit_bias

from .grammar import grammar_for
from .logprobs import MAX_CHAT_TOP, MAX_COMPLETION_TOP
from .sampling import SamplingParams
from .tool_choice import ToolChoice, check_tools, parse_tool_choice

MAX_STOP = 16
#: A grammar's answer must end where the grammar ends: generating past it is impossible.
_IGNORE_EOS_WITH_GRAMMAR = "ignore_eos cannot be combined with response_format or a forced tool_choice"


@dataclass
class GenRequest:
    kind: str  # "completion" | "chat"
    model: str
    stream: bool = False
    include_usage: bool = False
    max_tokens: int | None = None
    stop: list[str] = field(default_factory=list)
    sampling: SamplingParams = field(default_factory=SamplingParams)
    prompt_text: str | None = None
    prompt_tokens: list[int] | None = None
    messages: list[JsonObject] | None = None
    tools: JsonValue = None
    template_kwargs: JsonObject | None = None
    ignore_eos: bool = False  # generate max_tokens, never stopping at an end-of-generation token
    tool_choice: ToolChoice = field(default_factory=ToolChoice)
    logprobs: int | None = None  # how many most likely tokens to report beside each token (None: no logprobs)
    echo: bool = False  # a completion's answer starts with its prompt


# -- parsing -------------------------------------------------------------------


def _num(body: JsonObject, name: str, default, *, lo=None, hi=None, integer=False):
    v = body.get(name)
    if v is None:
        return default
    if isinstance(v, bool) or not isinstance(v, (int, float)) or (integer and not isinstance(v, int)):
        raise BadRequest(f"{name} must be {'an integer' if integer else 'a number'}", param=name)
    if (lo is not None and v < lo) or (hi is not None and v > hi):
        raise BadRequest(f"{name} must be between {lo} and {hi}", param=name)
    return v


def _stop(body: JsonObject) -> list[str]:
    s = body.get("stop")
    if s is None:
        return []
    if isinstance(s, str):
        s = [s]
    if not isinstance(s, list) or not all(isinstance(x, str) for x in s) or len(s) > MAX_STOP:
        raise BadRequest(f"stop must be a string or a list of at most {MAX_STOP} strings", param="stop")
    return [x for x in s if x]


def _logit_bias(body: JsonObject, n_vocab: int) -> dict[int, float]:
    lb = body.get("logit_bias")
    if lb is None:
        return {}
    if not isinstance(lb, dict):
        raise BadRequest("logit_bias must be an object of token id → bias", param="logit_bias")
    check_logit_bias(lb)
    out: dict[int, float] = {}
    for k, v in lb.items():
        try:
            tok = int(k)
        except (TypeError, ValueError):
            raise BadRequest(f"logit_bias key {k!r} is not a token id", param="logit_bias") from None
        if not 0 <= tok < n_vocab:
            raise BadRequest(f"logit_bias token {tok} is outside the vocabulary", param="logit_bias")
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not -100 <= v <= 100:
            raise BadRequest("logit_bias values must be numbers between -100 and 100", param="logit_bias")
        out[tok] = float(v)
    return out


def _common(body: JsonValue, kind: str, n_vocab: int) -> GenRequest:
    if not isinstance(body, dict):
        raise BadRequest("the request body must be a JSON object")
    n = _num(body, "n", 1, integer=True)
    if n != 1:
        raise BadRequest("only n=1 is supported", param="n")
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise BadRequest("stream must be a boolean", param="stream")
    ignore_eos = body.get("ignore_eos", False)
    if not isinstance(ignore_eos, bool):
        raise BadRequest("ignore_eos must be a boolean", param="ignore_eos")
    so = body.get("stream_options")
    include_usage = False
    if so is not None:
        if not isinstance(so, dict):
            raise BadRequest("stream_options must be an object", param="stream_options")
        include_usage = bool(so.get("include_usage", False))
    max_tokens = _num(body, "max_completion_tokens", None, lo=0, integer=True)
    if max_tokens is None:
        max_tokens = _num(body, "max_tokens", None, lo=0, integer=True)
    seed = _num(body, "seed", None, integer=True)
    sampling = SamplingParams(
        temperature=float(_num(body, "temperature", 1.0, lo=0, hi=2)),
        top_p=float(_num(body, "top_p", 1.0, lo=0, hi=1)),
        top_k=int(_num(body, "top_k", 40, lo=0, integer=True)),
        min_p=float(_num(body, "min_p", 0.05, lo=0, hi=1)),
        repeat_penalty=float(_num(body, "repeat_penalty", 1.0, lo=0, hi=10)),
        presence_penalty=float(_num(body, "presence_penalty", 0.0, lo=-2, hi=2)),
        frequency_penalty=float(_num(body, "frequency_penalty", 0.0, lo=-2, hi=2)),
        seed=seed,
        logit_bias=_logit_bias(body, n_vocab),
        grammar=grammar_for(body.get("response_format")),
    )
    if ignore_eos and sampling.grammar is not None:
        raise BadRequest(_IGNORE_EOS_WITH_GRAMMAR, param="ignore_eos")
    model = body.get("model")
    return GenRequest(
        kind=kind,
        model=model if isinstance(model, str) else "",
        stream=stream,
        include_usage=include_usage,
        max_tokens=max_tokens,
        stop=_stop(body),
        sampling=sampling,
        ignore_eos=ignore_eos,
    )


def parse_completion(body: JsonValue, n_vocab: int) -> GenRequest:
    req = _common(body, "completion", n_vocab)
    req.logprobs = _num(body, "logprobs", None, lo=0, hi=MAX_COMPLETION_TOP, integer=True)
    echo = body.get("echo", False)
    if not isinstance(echo, bool):
        raise BadRequest("echo must be a boolean", param="echo")
    req.echo = echo
    completion_prompt(req, body, n_vocab)
    return req


def completion_prompt(req: GenRequest, body: JsonObject, n_vocab: int) -> None:
    """Set ``req``'s prompt from a completion body (text, or token ids inside the vocabulary)."""
    p = body.get("prompt")
    if isinstance(p, list) and len(p) == 1 and isinstance(p[0], (str, list)):
        p = p[0]  # a batch of one
    if isinstance(p, str):
        req.prompt_text = p
    elif isinstance(p, list) and p and all(isinstance(t, int) and not isinstance(t, bool) for t in p):
        if not all(0 <= t < n_vocab for t in p):
            raise BadRequest("prompt token ids must be inside the vocabulary", param="prompt")
        req.prompt_tokens = list(p)
    elif isinstance(p, list) and len(p) > 1:
        raise BadRequest("only one prompt per request is supported", param="prompt")
    else:
        raise BadRequest("prompt must be a string or a list of token ids", param="prompt")


def parse_chat(body: JsonValue, n_vocab: int) -> GenRequest:
    req = _common(body, "chat", n_vocab)
    if body.get("echo"):
        raise BadRequest("echo is a field of /v1/completions only", param="echo")
    wanted = body.get("logprobs", False)
    if wanted is None:
        wanted = False
    if not isinstance(wanted, bool):
        raise BadRequest("logprobs must be a boolean", param="logprobs")
    top = _num(body, "top_logprobs", 0, lo=0, hi=MAX_CHAT_TOP, integer=True)
    if top and not wanted:
        raise BadRequest("top_logprobs needs logprobs: true", param="top_logprobs")
    req.logprobs = top if wanted else None
    chat_prompt(req, body)
    return req


def chat_prompt(req: GenRequest, body: JsonObject) -> None:
    """Set ``req``'s conversation, tools and template arguments from a chat body."""
    from .chat import normalize_messages

    req.messages = normalize_messages(body.get("messages"))
    tools = check_tools(body.get("tools"))
    req.tool_choice = parse_tool_choice(body.get("tool_choice"), tools)
    if req.tool_choice.forced and req.sampling.grammar is not None:
        raise BadRequest("a forced tool_choice cannot be combined with response_format", param="tool_choice")
    if req.tool_choice.forced and req.ignore_eos:
        raise BadRequest(_IGNORE_EOS_WITH_GRAMMAR, param="ignore_eos")
    req.tools = None if req.tool_choice.mode == "none" else tools
    ctk = body.get("chat_template_kwargs")
    if ctk is not None and not isinstance(ctk, dict):
        raise BadRequest("chat_template_kwargs must be an object", param="chat_template_kwargs")
    req.template_kwargs = ctk


# -- shaping -------------------------------------------------------------------


def usage_dict(prompt: int, completion: int, cached: int, reasoning: int | None = None) -> JsonObject:
    usage: JsonObject = {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "prompt_tokens_details": {"cached_tokens": cached},
    }
    if reasoning is not None:
        usage["completion_tokens_details"] = {"reasoning_tokens": reasoning}
    return usage


def _dumps(obj: JsonValue) -> bytes:
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":")).encode()


DONE = b"data: [DONE]\n\n"
_CLOSE = b"}]}\n\n"  # how a chunk ends, after its choice's "logprobs" value


def sse(obj: JsonObject) -> bytes:
    return b"data: " + _dumps(obj) + b"\n\n"


class Shaper:
    """Builds the responses of one request (ids and heads computed once)."""

    def __init__(self, kind: str, model: str) -> None:
        self.kind = kind
        self.model = model
        self.created = int(time.time())
        if kind == "chat":
            self.id = "chatcmpl-" + uuid.uuid4().hex
            self.object = "chat.completion"
            chunk_obj = "chat.completion.chunk"
        else:
            self.id = "cmpl-" + uuid.uuid4().hex
            self.object = "text_completion"
            chunk_obj = "text_completion"
        self._base = {"id": self.id, "object": chunk_obj, "created": self.created, "model": model}
        head = _dumps(self._base)[:-1]  # drop the closing brace
        if kind == "chat":
            self._head = b"data: " + head + b',"choices":[{"index":0,"delta":{"content":'
            self._tail = b'},"finish_reason":null,"logprobs":null}]}\n\n'
        else:
            self._head = b"data: " + head + b',"choices":[{"index":0,"text":'
            self._tail = b',"finish_reason":null,"logprobs":null}]}\n\n'

    def chunk(self, text: str, logprobs: JsonObject | None = None) -> bytes:
        if logprobs is None:
            return self._head + json.dumps(text, ensure_ascii=False).encode() + self._tail
        return (
            self._head
            + json.dumps(text, ensure_ascii=False).encode()
            + self._tail[: -len(b"null" + _CLOSE)]
            + _dumps(logprobs)
            + _CLOSE
        )

    def delta_chunk(self, delta: JsonObject, logprobs: JsonObject | None = None) -> bytes:
        """A chat chunk with any delta (reasoning, tool calls)."""
        return sse({**self._base, "choices": [{"index": 0, "delta": delta, "finish_reason": None, "logprobs": logprobs}]})

    def role_chunk(self) -> bytes:
        return sse(
            {
                **self._base,
                "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None, "logprobs": None}],
            }
        )

    def final_chunk(self, finish_reason: str, stop_reason: str | None = None) -> bytes:
        """The last chunk; ``stop_reason`` names the stop string that ended the answer, as vLLM does."""
        choice: JsonObject = {"index": 0, "finish_reason": finish_reason, "logprobs": None}
        if stop_reason is not None:
            choice["stop_reason"] = stop_reason
        if self.kind == "chat":
            choice["delta"] = {}
        else:
            choice["text"] = ""
        return sse({**self._base, "choices": [choice]})

    def usage_chunk(self, usage: JsonObject) -> bytes:
        return sse({**self._base, "choices": [], "usage": usage})

    def full(
        self,
        text: str,
        finish_reason: str,
        usage: JsonObject,
        *,
        message: JsonObject | None = None,
        logprobs: JsonObject | None = None,
        stop_reason: str | None = None,
    ) -> bytes:
        """The whole response; ``message`` replaces the plain chat message (tool calls, reasoning);
        ``stop_reason`` names the stop string that ended the answer."""
        choice: JsonObject = {"index": 0, "finish_reason": finish_reason, "logprobs": logprobs}
        if stop_reason is not None:
            choice["stop_reason"] = stop_reason
        if self.kind == "chat":
            choice["message"] = message if message is not None else {"role": "assistant", "content": text}
        else:
            choice["text"] = text
        return _dumps(
            {
                "id": self.id,
                "object": self.object,
                "created": self.created,
                "model": self.model,
                "choices": [choice],
                "usage": usage,
            }
        )
