"""One request's context, carried from authentication to settlement.

The gateway builds a :class:`RequestContext` once, after the access guard has
named the caller and :class:`~appliance.serving.names.ModelNames` has resolved
the model; admission, the cache, routing, forwarding and settlement all read
it instead of passing the pieces along one by one.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass, field

from litestar.datastructures import Headers

from appliance.accounts.keys import Principal
from appliance.hardware.energy import EnergyMark
from appliance.metering.meter import Admission
from appliance.openai_schema import ChatCompletionRequest, CompletionRequest, EmbeddingRequest
from appliance.serving.timing import RequestTiming
from appliance.store.store import ResolvedVariant

#: A decoded body of one of the OpenAI-compatible endpoints.
Body = ChatCompletionRequest | CompletionRequest | EmbeddingRequest


@dataclass
class RequestContext:
    principal: Principal
    endpoint: str  # "chat", "completions" or "embeddings"
    target: ResolvedVariant  # the installed variant the request's `model` names, resolved once
    body: Body  # as the client sent it, with max_tokens capped by admission
    headers: Headers  # the client's request headers (cache-control, cache policy overrides)
    stream: bool
    ledger_endpoint: str  # the endpoint's name in the usage ledger (the API the client spoke)
    started: float = field(default_factory=time.perf_counter)
    admission: Admission | None = None  # set once the meter has admitted it
    energy: EnergyMark | None = None
    timing: RequestTiming = field(default_factory=RequestTiming)  # the edge's, when the request came through it
    prompt_charge: int = 0  # the prompt tokens charged if the request ends before the engine reports usage
    engine_took: bool = False  # the request was handed to the engine: from here on its prompt is charged

    @property
    def request_id(self) -> str:
        """The request's id: the edge's (:class:`RequestTiming`), made when the request arrived."""
        return self.timing.request_id

    @property
    def model(self) -> str:
        """The canonical ``family:variant`` name."""
        return self.target.name

    def admitted(self) -> Admission:
        assert self.admission is not None, "the request was not admitted"
        return self.admission

    def waiting_for_engine(self) -> contextlib.AbstractContextManager[None]:
        return self.timing.waiting_for_engine()

    def elapsed_ms(self) -> float:
        return (time.perf_counter() - self.started) * 1000
