"""Per-sequence sampler chains built from OpenAI-style sampling parameters.

Every sequence owns one ``llama_sampler`` chain; ``llama_sampler_sample``
applies it to that sequence's logits row inside libllama, so no logits ever
cross into Python. Temperature 0 means greedy.

Defaults follow OpenAI (temperature 1, top_p 1) except top_k and min_p, which
follow llama.cpp's server (40 and 0.05): sampling from the full distribution
of a 262k-token vocabulary gains nothing and costs time per token.

A grammar (``response_format``, a forced tool call) is not a link of the chain:
llguidance masks the logits row before the chain samples (:mod:`.constraint`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import llama_cpp.llama_cpp as ll
import numpy as np

PENALTY_LAST_N = 64
#: What the first-token ban subtracts from a banned token's logit.
FIRST_TOKEN_BAN = 1000.0


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 40
    min_p: float = 0.05
    repeat_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    seed: int | None = None
    logit_bias: dict[int, float] = field(default_factory=dict)
    grammar: str | None = None  # a Lark grammar for llguidance (see .grammar), compiled when the request is prepared

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0.0


def _bias_sampler(n_vocab: int, bias: dict[int, float]):
    arr = (ll.llama_logit_bias * len(bias))()
    for i, (tok, b) in enumerate(bias.items()):
        arr[i].token = tok  # type: ignore[assignment]  # ctypes converts the int; llama_cpp types the field as c_int32
        arr[i].bias = float("-inf") if b <= -100 else b
    return ll.llama_sampler_init_logit_bias(n_vocab, len(bias), arr)


def bias_arrays(bias: dict[int, float]) -> tuple[np.ndarray, np.ndarray] | None:
    """``logit_bias`` as (token ids, values to add), -100 or less meaning never, as libllama's bias sampler does."""
    if not bias:
        return None
    ids = np.fromiter(bias.keys(), dtype=np.int64, count=len(bias))
    values = np.array([float("-inf") if b <= -100 else b for b in bias.values()], dtype=np.float32)
    return ids, values


def has_penalties(p: SamplingParams) -> bool:
    return p.repeat_penalty != 1.0 or bool(p.presence_penalty) or bool(p.frequency_penalty)


def build_chain(vocab, n_vocab: int, p: SamplingParams, *, ban_first: list[int] | None = None):
    """Return a new sampler chain (caller frees it with ``free_chain``).

    ``ban_first`` (token ids) are forbidden for the first sampled token only:
    the chain's first link is a ban the batcher removes after one token (see
    ``drop_first_link``). Chat uses it so a base model's answer is not empty.
    """
    cparams = ll.llama_sampler_chain_default_params()
    cparams.no_perf = True
    chain = ll.llama_sampler_chain_init(cparams)
    add = ll.llama_sampler_chain_add
    if ban_first:
        add(chain, _bias_sampler(n_vocab, {t: -FIRST_TOKEN_BAN for t in ban_first}))
    if p.logit_bias:
        add(chain, _bias_sampler(n_vocab, p.logit_bias))
    if has_penalties(p):
        add(
            chain,
            ll.llama_sampler_init_penalties(n_vocab, PENALTY_LAST_N, p.repeat_penalty, p.frequency_penalty, p.presence_penalty),
        )
    if p.greedy:
        add(chain, ll.llama_sampler_init_greedy())
        return chain
    if p.top_k > 0:
        add(chain, ll.llama_sampler_init_top_k(p.top_k))
    if p.top_p < 1.0:
        add(chain, ll.llama_sampler_init_top_p(p.top_p, 1))
    if p.min_p > 0.0:
        add(chain, ll.llama_sampler_init_min_p(p.min_p, 1))
    add(chain, ll.llama_sampler_init_temp(p.temperature))
    seed = ll.LLAMA_DEFAULT_SEED if p.seed is None else (p.seed & 0xFFFFFFFF)
    add(chain, ll.llama_sampler_init_dist(seed))
    return chain


def drop_first_link(chain) -> None:
    """Remove and free the chain's first sampler (the one-token ban)."""
    s = ll.llama_sampler_chain_remove(chain, 0)
    if s:
        ll.llama_sampler_free(s)


def free_chain(chain) -> None:
    """Free a sampler chain; a grammar constraint (anything with ``close``) is closed instead."""
    close = getattr(chain, "close", None)
    if close is not None:
        close()
    elif chain:
        ll.llama_sampler_free(chain)


__all__ = [
    "FIRST_TOKEN_BAN",
    "SamplingParams",
    "bias_arrays",
    "build_chain",
    "drop_first_link",
    "free_chain",
    "has_penalties",
]
