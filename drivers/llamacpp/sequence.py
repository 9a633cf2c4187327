"""The state the decode loop shares with the HTTP side: requests (sequences) and KV slots.

A :class:`Sequence` is one generation request: the decode thread writes its counters
and queues ``(text, finish)`` events; the asyncio side reads them through
:meth:`Sequence.events` and may set :attr:`Sequence.cancelled`. A :class:`Slot` is one
``seq_id`` of the unified KV cache and belongs to the decode thread alone.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from concurrent.futures import Future
from typing import TYPE_CHECKING, TypeAlias

import numpy as np

from .logprobs import LogprobRecorder
from .sampling import free_chain
from .speculation import DraftGate
from .text import TextStream

if TYPE_CHECKING:
    from .constraint import Constraint

FINISH_STOP = "stop"
FINISH_LENGTH = "length"
FINISH_CANCELLED = "cancelled"
FINISH_ERROR = "error"


class Sequence:
    """One generation request, shared between the decode thread and asyncio.

    The decode thread writes the counters and pushes (text, finish) events;
    the asyncio side reads them through :meth:`events`.
    """

    __slots__ = (
        "prompt",
        "max_new",
        "chain",
        "grammar",
        "ban_first",
        "text",
        "cancelled",
        "n_gen",
        "cached",
        "finish",
        "error",
        "outbox",
        "waiter",
        "t_submit",
        "t_first",
        "spec",
        "drafting",
        "logprobs",
        "argmax",
        "bias",
        "ban_ids",
        "priority",
        "small",
    )

    def __init__(
        self,
        prompt: list[int],
        max_new: int,
        chain,
        stops: list[str],
        *,
        ban_first: bool = False,
        spec: bool = False,
        lstrip: bool = False,
    ) -> None:
        self.prompt = prompt
        self.max_new = max_new
        self.chain = chain
        self.grammar: Constraint | None = None  # the llguidance constraint of response_format or a forced tool call
        self.ban_first = ban_first
        self.text = TextStream(stops, lstrip=lstrip)
        self.cancelled = False
        self.n_gen = 0
        self.cached = 0
        self.finish: str | None = None
        self.error: str | None = None
        self.outbox: list[tuple[str, str | None]] = []
        self.waiter: asyncio.Future[None] | None = None
        self.t_submit = time.perf_counter()
        self.t_first = 0.0
        self.spec = spec
        self.drafting = DraftGate()  # how its drafts fared, and whether it drafts now (see .speculation)
        self.logprobs: LogprobRecorder | None = None  # only when the request asked for logprobs
        # Greedy without penalties or grammar: the token is the argmax of the logits row after ``bias``
        # (token ids, added values) and, for the first token, the ``ban_ids`` ban (see .token_sampler).
        self.argmax = False
        self.bias: tuple[np.ndarray, np.ndarray] | None = None
        self.ban_ids: np.ndarray | None = None
        self.priority = "interactive"  # the latency class (see .latency): orders admission and prompt reading
        self.small = False  # its whole work fits in a fraction of a second: run without others' prompts beside it

    @property
    def scores_prompt(self) -> bool:
        """Every prompt position's logits are wanted (echo with logprobs): no KV reuse, no skipped rows."""
        return self.logprobs is not None and self.logprobs.prompt

    def free_samplers(self) -> None:
        """Free the sampler chain and the grammar (the sequence samples no more)."""
        free_chain(self.chain)
        free_chain(self.grammar)
        self.chain = self.grammar = None

    # -- asyncio side -------------------------------------------------------
    def push(self, text: str, finish: str | None) -> None:
        """Queue one event for :meth:`events` (asyncio thread only)."""
        if self.finish is not None:
            return  # already over (e.g. the client left and the engine confirms it)
        if finish is not None:
            self.finish = finish
        self.outbox.append((text, finish))
        w = self.waiter
        if w is not None and not w.done():
            w.set_result(None)

    async def events(self) -> AsyncIterator[tuple[str, str | None]]:
        """Yield (text, finish_reason|None) until a finish reason arrives.

        Events that piled up while the consumer was busy are merged into one.
        """
        loop = asyncio.get_running_loop()
        while True:
            if not self.outbox:
                self.waiter = loop.create_future()
                await self.waiter
                self.waiter = None
            items, self.outbox = self.outbox, []
            if len(items) == 1:
                yield items[0]
                if items[0][1] is not None:
                    return
            else:
                finish = items[-1][1]
                yield "".join(t for t, _ in items), finish
                if finish is not None:
                    return


#: What one decode step hands to the asyncio side: (sequence, text, finish reason or None).
Event: TypeAlias = tuple[Sequence, str, str | None]


class Slot:
    """One ``seq_id`` of the KV cache and the sequence it serves (decode thread only)."""

    __slots__ = ("id", "tokens", "seq", "feed", "out_idx", "chunk_end", "last_used", "drafts", "job")

    def __init__(self, sid: int) -> None:
        self.id = sid
        self.tokens: list[int] = []  # exactly the tokens whose KV this seq_id holds, positions 0..n-1
        self.seq: Sequence | None = None
        self.feed = -1  # sampled token to decode next step (-1: none / prefilling)
        self.out_idx = -1
        self.chunk_end = 0
        self.last_used = 0.0
        self.drafts: list[int] = []
        self.job: Future[int] | None = None  # a token being sampled in a helper thread

    @property
    def serving(self) -> Sequence:
        """The sequence of a busy slot (the decode loop asks only for slots it knows are busy)."""
        seq = self.seq
        if seq is None:
            raise RuntimeError(f"slot {self.id} serves no sequence")
        return seq

    @property
    def prompt_left(self) -> int:
        """Prompt tokens of a busy slot's sequence not read into its KV yet."""
        return len(self.serving.prompt) - len(self.tokens)
