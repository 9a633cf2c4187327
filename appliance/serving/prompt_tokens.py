"""How many prompt tokens a request will cost, known before it is admitted.

For GGUF models the count is the engine's own: :class:`PromptCounts` keeps a
vocabulary-only copy of each model (no weights; its chat template and
tokenizer, see ``appliance.drivers.llamacpp.prompts``), so a quota reservation
holds exactly the prompt the engine will bill, in any language. Where no count
is possible (vLLM's Hugging Face folders, a model file that cannot be read, a
prompt past :data:`MAX_COUNTED_BYTES`) the reservation falls back to
:func:`prompt_bound`, an upper bound from the prompt's UTF-8 bytes.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import threading
from pathlib import Path

import msgspec

from appliance.drivers.llamacpp.prompts import PromptCounter
from appliance.openai_schema import ChatCompletionRequest, EmbeddingRequest, prompt_text
from appliance.serving.context import Body
from appliance.store.variants import ResolvedVariant

log = logging.getLogger("appliance.serving.prompt_tokens")
_encoder = msgspec.json.Encoder()

#: Prompts with more text than this are not tokenised in the daemon (the byte bound is used).
MAX_COUNTED_BYTES = 1 << 20
#: Prompts with more text than this are counted in a worker thread, off the event loop.
OFF_LOOP_BYTES = 16 << 10
#: Vocabularies kept loaded (each a few to a few tens of MiB; least recently used is closed first).
MAX_OPEN = 8

# A prompt's tokens never outnumber its UTF-8 bytes (every non-special token of a
# byte-level or byte-fallback vocabulary covers at least one byte); the chat template
# adds its own markers and text, bounded here per message and per request.
PROMPT_OVERHEAD_TOKENS = 64
MESSAGE_OVERHEAD_TOKENS = 16


def prompt_bound(body: Body) -> int:
    """An upper bound of the prompt tokens a request can be billed, from its bytes."""
    if isinstance(body, ChatCompletionRequest):
        size = 0
        for message in body.messages:
            size += MESSAGE_OVERHEAD_TOKENS + len(message.role) + len((message.name or "").encode())
            if message.content is not None:
                size += len(message.content.encode() if isinstance(message.content, str) else _encoder.encode(message.content))
            if message.tool_calls:
                size += len(_encoder.encode(message.tool_calls))
            size += len((message.tool_call_id or "").encode())
        if body.tools:
            size += len(_encoder.encode(body.tools))
        if body.response_format is not None:
            size += len(_encoder.encode(body.response_format))
        return size + PROMPT_OVERHEAD_TOKENS
    if isinstance(body, EmbeddingRequest):
        inputs = body.input if isinstance(body.input, list) else [body.input]
        return sum(len(text.encode()) + 2 for text in inputs)  # each input may get BOS and EOS
    return len(prompt_text(body).encode()) + PROMPT_OVERHEAD_TOKENS


class PromptCounts:
    """Exact prompt counts per GGUF model file, from vocabularies loaded on first use."""

    def __init__(self) -> None:
        self._open: collections.OrderedDict[Path, PromptCounter] = collections.OrderedDict()
        self._in_use: collections.Counter[Path] = collections.Counter()
        self._failed: set[Path] = set()
        self._lock = threading.Lock()

    async def count(self, target: ResolvedVariant, endpoint: str, body: Body) -> int | None:
        """The prompt tokens ``body`` will cost on ``target``, or ``None`` where they cannot be counted here."""
        path = target.file
        if path is None or path.suffix != ".gguf" or path in self._failed:
            return None
        bound = prompt_bound(body)
        if bound > MAX_COUNTED_BYTES:
            return None
        data = msgspec.to_builtins(body)
        if path not in self._open or bound > OFF_LOOP_BYTES:
            return await asyncio.to_thread(self._count, path, endpoint, data)
        return self._count(path, endpoint, data)

    async def warm(self, path: Path) -> None:
        """Load ``path``'s vocabulary now (about a second for a 262k-token one), not on its first request."""
        if path.suffix == ".gguf" and path not in self._open and path not in self._failed:
            await asyncio.to_thread(self._warm, path)

    def _warm(self, path: Path) -> None:
        if self._acquire(path) is not None:
            with self._lock:
                self._in_use[path] -= 1

    def _count(self, path: Path, endpoint: str, data: dict) -> int | None:
        counter = self._acquire(path)
        if counter is None:
            return None
        try:
            return counter.count(endpoint, data)
        finally:
            with self._lock:
                self._in_use[path] -= 1

    def _acquire(self, path: Path) -> PromptCounter | None:
        with self._lock:
            counter = self._open.get(path)
            if counter is None:
                try:
                    counter = PromptCounter(str(path))
                except Exception as exc:  # the engine reports an unreadable model; reservations use the bound
                    log.warning("cannot count prompt tokens for %s: %s", path.name, exc)
                    self._failed.add(path)
                    return None
                self._open[path] = counter
                self._evict()
            self._open.move_to_end(path)
            self._in_use[path] += 1
            return counter

    def _evict(self) -> None:
        for old in list(self._open):
            if len(self._open) <= MAX_OPEN:
                return
            if not self._in_use[old]:
                self._open.pop(old).close()

    def close(self) -> None:
        with self._lock:
            for counter in self._open.values():
                counter.close()
            self._open.clear()
