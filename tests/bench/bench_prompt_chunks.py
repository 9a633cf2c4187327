"""How fast a prompt is read in chunks of each size: the cost of short steps.

    python tests/bench/bench_prompt_chunks.py [--tokens 1024] [--rounds 3] [--others 1000]

On the default model (a fresh copy), 2 threads, the worker's own decode context
(``drivers/llamacpp/context.py``, 8 sequences of 2,048 tokens, batches of 256),
one sequence reads a ``--tokens``-token prompt in chunks of 32, 64, 128 and 256
tokens, one decode per chunk, the last token of each chunk keeping its logits as a
step's would. Two contexts: one empty, one where the 7 other sequences hold
``--others`` tokens each (the unified KV cache of a worker whose slots keep earlier
prompts for reuse). Medians over ``--rounds``; prints tokens/s and the time of one
step per chunk size: why the step planner reads a prompt that would miss its TTFT
target in short steps a whole batch a step (``FULL_BATCH_GAIN`` in
``drivers/llamacpp/step_planner.py``; ``bench_documents.py`` measures the result).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from appliance.drivers.llamacpp.context import DecodeContext  # noqa: E402
from appliance.drivers.llamacpp.model import LoadedModel, quiet_llama_logs  # noqa: E402
from tests.bench.compare_servers import fresh_model_copy  # noqa: E402

CHUNKS = (32, 64, 128, 256)


def read(c: DecodeContext, sid: int, length: int, chunk: int, salt: int = 0) -> None:
    """Read ``length`` tokens into sequence ``sid`` in decodes of ``chunk`` tokens."""
    for start in range(0, length, chunk):
        end = min(length, start + chunk)
        for k, p in enumerate(range(start, end)):
            c.tok[k], c.pos[k], c.sid[k][0], c.lg[k] = 1000 + ((p + salt) * 7919) % 20000, p, sid, int(p == end - 1)
        c.decode(end - start)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokens", type=int, default=1024)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--others", type=int, default=1000, help="tokens each other sequence holds in the second context")
    args = ap.parse_args()
    quiet_llama_logs()
    with tempfile.TemporaryDirectory() as tmp:
        model = LoadedModel(str(fresh_model_copy(Path(tmp))))
    contexts: dict[str, DecodeContext] = {}
    for name, others in (("empty cache", 0), (f"7 others x {args.others}", args.others)):
        c = DecodeContext(model, parallel=8, ctx_per_slot=2048, threads=2, n_batch=256)
        c.warm_up()
        for sid in range(1, 8):
            if others:
                read(c, sid, others, 256, salt=sid * 1000)
        contexts[name] = c
    times: dict[tuple[str, int], list[float]] = {}
    for _ in range(args.rounds):
        for name, c in contexts.items():
            for chunk in CHUNKS:
                t0 = time.perf_counter()
                read(c, 0, args.tokens, chunk)
                times.setdefault((name, chunk), []).append(time.perf_counter() - t0)
                c.drop(0, 0)
    print(f"{args.tokens}-token prompt, medians of {args.rounds} rounds, 2 threads\n")
    print("| cache | chunk | tokens/s | one step |")
    print("|---|---|---|---|")
    for (name, chunk), v in times.items():
        m = statistics.median(v)
        print(f"| {name} | {chunk} | {args.tokens / m:.0f} | {m / -(-args.tokens // chunk) * 1000:.1f} ms |")


if __name__ == "__main__":
    main()
