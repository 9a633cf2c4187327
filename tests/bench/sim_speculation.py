"""Prompt-lookup drafting policies replayed on real token streams, on measured step costs, without the box's noise.

    python -m tests.bench.sim_speculation [--tokens 192]

Generates each ``bench_speculative.py`` workload's tokens once with the default model
(greedy, or seeded samples at the workload's temperature: two seeds a prompt), and
times one decode of the worker's context per count of kept logits rows (1 to 10 rows
in one sequence, 12 to 18 in two; an odd count of three or more costs the next even
one, as the worker pads it, ``drivers/llamacpp/output_parity.py``). Then replays
every stream step by step: a step decodes each generating sequence's fed token and
its draft and costs the measured time of its rows; a draft keeps the tokens that
match the stream (what verification keeps, greedy or seeded). Decode rate per
sequence as in ``bench_speculative.py``, as a ratio to not drafting, at 1 stream
(each stream alone) and 2 (two streams together), for these policies:

- ``8 always``: the lookup's draft of up to 8 tokens at every step, as the worker
  drafted before its draft policy (with the daemon's n-gram size);
- ``7 always``: the same, drafts of up to 7 (an even count of rows with the fed token);
- ``worker``: the worker's own ``draft()`` and ``DraftGate`` (``drivers/llamacpp/speculation.py``);
- ``worker, shrinking``: the same, but after a draft that kept fewer than 3 tokens the
  next one proposes 3 instead of 7.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from appliance.drivers.llamacpp.driver import SPEC_NGRAM  # noqa: E402
from appliance.drivers.llamacpp.sequence import Sequence, Slot  # noqa: E402
from appliance.drivers.llamacpp.speculation import draft  # noqa: E402
from tests.bench.bench_speculative import SAMPLED, WORKLOADS  # noqa: E402
from tests.fixtures_models import ensure_default_gguf  # noqa: E402

SPEC_DRAFT = 8  # the batcher's spec_draft
EOG = (1, 106)  # Gemma 3: <eos>, <end_of_turn>, banned as the benchmark bans them

Stream = tuple[list[int], list[int]]  # prompt tokens, generated tokens
#: (sequence's record, history with the fed token, generated so far) -> the draft
Drafter = Callable[["Replayed", list[int], int], list[int]]


def generate(tokens: int) -> dict[str, list[Stream]]:
    """Every workload's streams: each prompt greedy, or at its temperature with seeds 0 and 1."""
    import numpy as np
    from llama_cpp import Llama

    llm = Llama(str(ensure_default_gguf()), n_ctx=2048, n_threads=2, verbose=False)

    def ban(_ids, logits):
        logits[list(EOG)] = -np.inf
        return logits

    out: dict[str, list[Stream]] = {}
    for name, prompts in WORKLOADS.items():
        temperature = SAMPLED.get(name, 0.0)
        for prompt in prompts:
            for seed in (0, 1) if temperature else (0,):
                llm.set_seed(seed)
                ids = llm.tokenize(prompt.encode(), add_bos=True)
                greedy = dict(top_k=1, top_p=1.0, temp=0.0)
                sampled = dict(top_k=40, top_p=1.0, min_p=0.05, temp=temperature)  # the worker's defaults
                gen: list[int] = []
                for t in llm.generate(ids, logits_processor=[ban], reset=True, **(sampled if temperature else greedy)):
                    gen.append(t)
                    if len(gen) == tokens:
                        break
                out.setdefault(name, []).append((ids, gen))
    llm.close()
    return out


def step_costs() -> dict[int, float]:
    """Milliseconds of one decode by kept rows (even counts, and one), on the worker's context."""
    from appliance.drivers.llamacpp.context import DecodeContext
    from appliance.drivers.llamacpp.model import LoadedModel, quiet_llama_logs
    from tests.bench.bench_decode_shapes import fill, medians

    quiet_llama_logs()
    rng = random.Random(0)
    model = LoadedModel(str(ensure_default_gguf()))
    c = DecodeContext(model, parallel=2, ctx_per_slot=2048, threads=2, n_batch=256)
    c.warm_up()
    fill(c, 2, 400, rng)

    def rows(n: int) -> list[tuple[int, int, int, int]]:
        per = [n] if n <= 10 else [n // 2, n - n // 2]
        return [(500 + i, 400 + i, sid, 1) for sid, k in enumerate(per) for i in range(k)]

    counts = [1, *range(2, 19, 2)]
    times = medians({str(n): (c, rows(n)) for n in counts}, 15, rng)
    c.close()
    model.close()
    return {n: times[str(n)] for n in counts}


class Replayed:
    """One stream being replayed: how far it is, its worker-side sequence and slot."""

    def __init__(self, stream: Stream, tokens: int) -> None:
        self.prompt, self.gen = stream
        self.n = 1  # the first token comes from reading the prompt (TTFT, not decode)
        self.seq = Sequence(self.prompt, tokens, None, [], spec=True)
        self.slot = Slot(0)
        self.slot.seq = self.seq
        self.last_kept: int | None = None
        self.done_ms: float | None = None


def lookup(hist: list[int], most: int) -> list[int]:
    key = hist[-SPEC_NGRAM:]
    for i in range(len(hist) - SPEC_NGRAM - 1, -1, -1):
        if hist[i : i + SPEC_NGRAM] == key:
            return hist[i + SPEC_NGRAM : i + SPEC_NGRAM + most]
    return []


def always(most: int) -> Drafter:
    return lambda r, hist, tokens: lookup(hist, min(most, tokens - r.n - 1))


def worker(shrink: bool) -> Drafter:
    def propose(r: Replayed, hist: list[int], tokens: int) -> list[int]:
        r.slot.tokens, r.slot.feed, r.seq.n_gen = hist[:-1], hist[-1], r.n
        most = 3 if shrink and r.last_kept is not None and r.last_kept < 3 else SPEC_DRAFT
        return draft(r.slot, SPEC_NGRAM, most, 4096)

    return propose


def replay(streams: list[Stream], drafter: Drafter | None, costs: dict[int, float], tokens: int) -> float:
    """The mean decode rate (tokens/s after the first) of ``streams`` generated together."""
    live = [Replayed(s, tokens) for s in streams]
    clock = 0.0
    while any(r.done_ms is None for r in live):
        going = [r for r in live if r.done_ms is None]
        plans = []
        for r in going:
            hist = r.prompt + r.gen[: r.n]
            plans.append((r, drafter(r, hist, tokens) if drafter is not None else []))
        rows = sum(1 + len(d) for _, d in plans)
        clock += costs[rows + 1 if rows >= 3 and rows % 2 else rows]
        for r, d in plans:
            kept = next((k for k, t in enumerate(d) if t != r.gen[r.n + k]), len(d))
            r.n += 1 + kept
            if d:
                r.seq.drafting.record(len(d), kept, r.n)
                r.last_kept = kept
            if r.n >= tokens:
                r.done_ms = clock
    return statistics.mean((tokens - 1) / r.done_ms * 1000 for r in live if r.done_ms)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokens", type=int, default=192)
    args = ap.parse_args()
    streams = generate(args.tokens)
    costs = step_costs()
    print("step ms by rows: " + json.dumps({n: round(ms, 1) for n, ms in costs.items()}))
    policies: dict[str, Drafter] = {
        "8 always": always(8),
        "7 always": always(7),
        "worker": worker(shrink=False),
        "worker, shrinking": worker(shrink=True),
    }
    print("| workload | streams | " + " | ".join(policies) + " |")
    print("|---|---|" + "---|" * len(policies))
    for name, items in streams.items():
        for n in (1, 2):
            groups = [items[i : i + n] for i in range(0, len(items), n)]
            base = statistics.mean(replay(g, None, costs, args.tokens) for g in groups)
            cells = [statistics.mean(replay(g, p, costs, args.tokens) for g in groups) / base for p in policies.values()]
            print(f"| {name} | {n} | " + " | ".join(f"{c:.2f}×" for c in cells) + " |", flush=True)


if __name__ == "__main__":
    main()
