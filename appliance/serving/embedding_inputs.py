"""A per-key cap on embedding inputs in flight.

An embeddings request with hundreds of inputs holds the engine for the whole group,
and one key sending several at once can stall everyone else on a busy box. The
gateway holds each request's input count here from before its admission until its
answer; a request that would take a key past ``embedding_inputs_in_flight_per_key``
is refused at once (429) before any work: with ``Retry-After`` when the key's other
requests will free room, and with a plain "split it" when the request alone is
larger than the cap. One daemon process serves the API, so the counts live in
memory: nothing survives a restart, and nothing needs to.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from appliance.errors import RateLimited


class EmbeddingInputs:
    """Embedding inputs in flight, per caller (an API key, or a console user)."""

    def __init__(self, cap: int):
        self.cap = cap
        self._held: dict[str, int] = {}

    def in_flight(self, owner: str) -> int:
        """Inputs ``owner``'s embeddings requests hold now."""
        return self._held.get(owner, 0)

    @contextlib.contextmanager
    def hold(self, owner: str, inputs: int) -> Iterator[None]:
        """Hold ``inputs`` for ``owner`` while the block runs, or raise 429 if that would pass the cap."""
        if inputs > self.cap:
            raise RateLimited(
                f"This embeddings request has {inputs} inputs; a key may have at most {self.cap} embedding inputs "
                f"in flight (embedding_inputs_in_flight_per_key). Send them in requests of at most {self.cap}.",
                param="input",
                code="embedding_inputs_over_cap",
            )
        held = self._held.get(owner, 0)
        if held + inputs > self.cap:
            raise RateLimited(
                f"This key has {held} embedding inputs in flight; {inputs} more would pass its cap of {self.cap} "
                "(embedding_inputs_in_flight_per_key). Retry when its other embeddings requests have answered.",
                param="input",
                code="embedding_inputs_in_flight",
                headers={"Retry-After": "1"},
            )
        self._held[owner] = held + inputs
        try:
            yield
        finally:
            left = self._held[owner] - inputs
            if left:
                self._held[owner] = left
            else:
                del self._held[owner]
