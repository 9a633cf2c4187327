"""Token log-probabilities for the requests that ask for them (``logprobs``, ``top_logprobs``, ``echo``).

Values are of the model's own distribution: the log-softmax of the raw logits row
(``llama_get_logits_ith``), before any sampling filter (temperature, top-k/p,
min-p, penalties, ``logit_bias``, grammars), as OpenAI reports them and as
llama-server does with ``post_sampling_probs: false``. Only sequences whose
request asked carry a :class:`LogprobRecorder`; the decode loop does no numpy
work for the others.

Token text: a token's bytes decoded as UTF-8; bytes that are not valid UTF-8
on their own (one piece of a character split across tokens) are written as
``\\xNN`` escapes, so the text stays lossless. Chat's ``bytes`` carries the raw
bytes: joining the ``bytes`` of consecutive tokens gives the exact UTF-8 text.

Threads: the decode thread (or the grammar helper thread, for a token sampled
there) computes entries; the asyncio side reads them up to the count the last
delivered event carried (:attr:`LogprobRecorder.visible`).
"""

from __future__ import annotations

import codecs
import math
from collections.abc import Callable
from dataclasses import dataclass

import llama_cpp.llama_cpp as ll
import numpy as np

from appliance.jsontypes import JsonObject, JsonValue

#: Most ``top_logprobs`` a chat request may ask for (OpenAI's bound).
MAX_CHAT_TOP = 20
#: Most ``logprobs`` a completion request may ask for (OpenAI's bound).
MAX_COMPLETION_TOP = 5
#: Most prompt positions whose logits one decode step keeps for ``echo`` with ``logprobs``: each is a
#: row of n_vocab floats in libllama's output buffer (1 MiB for a 262k vocabulary).
PROMPT_ROWS_PER_STEP = 16

Piece = Callable[[int], bytes]


@dataclass(frozen=True, slots=True)
class TokenLogprob:
    """One position: the token there, its log-probability (None for a prompt's first token), and the top ones."""

    token: int
    logprob: float | None
    top: tuple[tuple[int, float], ...] = ()


def logits_row(ctx: ll.llama_context_p, idx: int, n_vocab: int) -> np.ndarray:
    """A view (no copy) of batch entry ``idx``'s logits; valid until the context's next decode."""
    return np.ctypeslib.as_array(ll.llama_get_logits_ith(ctx, idx), shape=(n_vocab,))


def log_softmax_at(row: np.ndarray, token: int, n_top: int, scratch: np.ndarray | None = None) -> TokenLogprob:
    """``token``'s log-probability under the logits ``row``, and the ``n_top`` most likely tokens, best first.

    ``scratch`` (a float32 array of the row's size) saves allocating one per call. Equal
    log-probabilities are listed by token id, so equal rows always give equal answers.
    """
    peak = float(row.max())
    shifted = np.subtract(row, peak, out=scratch, dtype=np.float32)
    lse = peak + math.log(float(np.exp(shifted, out=shifted).sum(dtype=np.float64)))
    top: tuple[tuple[int, float], ...] = ()
    if n_top > 0:
        ids = _top_ids(row, min(n_top, row.shape[0]))
        top = tuple((int(i), float(row[i]) - lse) for i in ids)
    return TokenLogprob(token, float(row[token]) - lse, top)


#: The top list is looked for among the tokens at least as likely as the k-th most likely of every
#: ``TOP_STRIDE``-th token: at least k tokens qualify (those k), and about k × stride do, so the
#: full partition runs on a few thousand values instead of the whole vocabulary.
TOP_STRIDE = 64


def _top_ids(row: np.ndarray, k: int) -> np.ndarray:
    """The ``k`` largest entries of ``row``, largest first (ties by id)."""
    n = row.shape[0]
    sample = row[::TOP_STRIDE]
    if sample.size >= k:
        floor = np.partition(sample, sample.size - k)[sample.size - k]
        ids = np.flatnonzero(row >= floor)
    else:
        ids = np.arange(n)
    return ids[np.lexsort((ids, -row[ids]))[:k]]


def token_text(piece: bytes) -> str:
    """A token's text: its UTF-8, with bytes that do not decode on their own as ``\\xNN``."""
    return piece.decode("utf-8", "backslashreplace")


class LogprobRecorder:
    """The log-probabilities of one sequence's tokens (and of its prompt, for ``echo``).

    Decode side: :meth:`stage` when a token is sampled from a row, :meth:`commit` when
    the token is kept as output (an end-of-generation token is not), :meth:`mark` when an
    event carries the text so far. Asyncio side: entries ``[0, visible)`` may be read.
    """

    __slots__ = ("n_top", "prompt", "prompt_entries", "entries", "visible", "_staged", "_scratch")

    def __init__(self, n_top: int, *, prompt: bool = False) -> None:
        self.n_top = n_top
        self.prompt = prompt  # the prompt's positions are wanted too (echo)
        self.prompt_entries: list[TokenLogprob] = []
        self.entries: list[TokenLogprob] = []
        self.visible = 0
        self._staged: TokenLogprob | None = None
        self._scratch: np.ndarray | None = None  # one row, reused (a single thread computes at a time)

    def _buffer(self, row: np.ndarray) -> np.ndarray:
        if self._scratch is None or self._scratch.shape != row.shape:
            self._scratch = np.empty(row.shape, dtype=np.float32)
        return self._scratch

    def stage(self, row: np.ndarray, token: int) -> None:
        self._staged = log_softmax_at(row, token, self.n_top, self._buffer(row))

    def commit(self) -> None:
        if self._staged is not None:
            self.entries.append(self._staged)
            self._staged = None

    def mark(self) -> int:
        return len(self.entries)

    def add_prompt(self, first: int, rows: list[tuple[np.ndarray, int]]) -> None:
        """Record prompt positions: ``rows`` are (logits at position p, token at p + 1); ``first`` opens the prompt."""
        if not self.prompt_entries:
            self.prompt_entries.append(TokenLogprob(first, None))
        n_top = self.n_top
        self.prompt_entries.extend(log_softmax_at(row, token, n_top, self._buffer(row)) for row, token in rows)


# -- OpenAI shapes ---------------------------------------------------------------


def chat_logprobs(entries: list[TokenLogprob], piece: Piece) -> JsonObject:
    """``choices[].logprobs`` of a chat completion: ``{"content": [{token, logprob, bytes, top_logprobs}]}``."""

    def one(token: int, logprob: float) -> JsonObject:
        raw = piece(token)
        return {"token": token_text(raw), "logprob": logprob, "bytes": list(raw)}

    content: list[JsonValue] = []
    for e in entries:
        item = one(e.token, e.logprob if e.logprob is not None else 0.0)
        item["top_logprobs"] = [one(t, lp) for t, lp in e.top]
        content.append(item)
    return {"content": content}


class CompletionLogprobs:
    """``choices[].logprobs`` of a text completion, built in order (``text_offset`` runs on across calls).

    ``top_logprobs`` maps token text to log-probability for the most likely tokens and the
    chosen one (so up to ``logprobs + 1`` keys, as OpenAI's legacy API); a prompt's first
    position has ``null`` in ``token_logprobs`` and ``top_logprobs``.
    """

    def __init__(self, piece: Piece) -> None:
        self._piece = piece
        self._offset = 0
        self._decoder = codecs.getincrementaldecoder("utf-8")("replace")

    def restart_at(self, offset: int) -> None:
        """Continue at character ``offset`` of the text (after an echoed prompt, say)."""
        self._decoder.reset()
        self._offset = offset

    def shape(self, entries: list[TokenLogprob]) -> JsonObject:
        tokens: list[JsonValue] = []
        logprobs: list[JsonValue] = []
        tops: list[JsonValue] = []
        offsets: list[JsonValue] = []
        piece, decoder = self._piece, self._decoder
        for e in entries:
            raw = piece(e.token)
            text = token_text(raw)
            tokens.append(text)
            logprobs.append(e.logprob)
            if e.logprob is None:
                tops.append(None)
            else:
                top: JsonObject = {}
                for t, lp in e.top:
                    top.setdefault(token_text(piece(t)), lp)
                top.setdefault(text, e.logprob)
                tops.append(top)
            offsets.append(self._offset + _held_chars(decoder, raw))
            self._offset += len(decoder.decode(raw))
        return {"tokens": tokens, "token_logprobs": logprobs, "top_logprobs": tops, "text_offset": offsets}


def _held_chars(decoder: codecs.IncrementalDecoder, raw: bytes) -> int:
    """Characters that bytes held from earlier tokens become in front of ``raw``'s own text.

    A token that continues a character starts where that character does (0); one that
    starts a new character follows the replacement characters of the bytes left incomplete.
    """
    held = decoder.getstate()[0]
    if not held or not raw or 0x80 <= raw[0] <= 0xBF:
        return 0
    return len(held.decode("utf-8", "replace"))


def joined(first: JsonObject, second: JsonObject) -> JsonObject:
    """Two consecutive parts of one completion's logprobs as one."""
    return {name: [*first[name], *second[name]] for name in first}


class LogprobView:
    """What one request's responses carry from its :class:`LogprobRecorder`, shaped for its endpoint."""

    def __init__(self, kind: str, recorder: LogprobRecorder, piece: Piece) -> None:
        self.kind = kind
        self._recorder = recorder
        self._piece = piece
        self._sent = 0
        self._completion = CompletionLogprobs(piece) if kind != "chat" else None

    def prompt(self, echoed: str) -> JsonObject:
        """The prompt's positions (echo), then text offsets continue after ``echoed``.

        A tokenizer that adds a space before the text (SentencePiece's prefix space) gives a
        first piece with a space the prompt does not have: offsets are then counted without it.
        """
        entries = self._recorder.prompt_entries
        shaped = self._shape(entries)
        if self._completion is not None:
            read = b"".join(self._piece(e.token) for e in entries).decode("utf-8", "replace")
            if read == " " + echoed:
                shaped["text_offset"] = [max(0, o - 1) for o in shaped["text_offset"]]
            self._completion.restart_at(len(echoed))
        return shaped

    def next(self) -> JsonObject:
        """The generated tokens delivered since the last call."""
        rec = self._recorder
        upto = rec.visible
        entries = rec.entries[self._sent : upto]
        self._sent = upto
        return self._shape(entries)

    def pending(self) -> bool:
        return self._recorder.visible > self._sent

    def _shape(self, entries: list[TokenLogprob]) -> JsonObject:
        if self._completion is None:
            return chat_logprobs(entries, self._piece)
        return self._completion.shape(entries)
