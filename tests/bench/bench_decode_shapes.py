"""What one ``llama_decode`` of the worker's context costs, by the shape of its batch.

    python tests/bench/bench_decode_shapes.py [--model PATH] [--rounds 12] [--context 150]

On the default model (a fresh copy), 2 threads, the worker's own decode context
(``drivers/llamacpp/context.py``), every measurement the median of ``--rounds``
decodes, the shapes of a round in shuffled order:

- generating steps: 1 to 16 sequences, each holding ``--context`` tokens, one new
  token each, every logits row kept (the rows count of a step of that many streams);
- one sequence reading a prompt: tokens × rows kept (8 × 7 against 8 × 8, ...), the
  shape of a step where a prompt chunk rides beside generating tokens;
- the KV layout, two contexts of each kind: the unified cache the worker uses
  against one KV stream per sequence (``kv_unified`` off, as ``llama-server -np N`` runs), with 8 sequences
  busy, 7 with a gap at sequence 3 (libllama splits a per-stream batch into
  micro-batches of consecutive sequence ids), the gap filled with a padding token,
  and 7 generating beside a 29-token prompt chunk.

These are the measurements behind the worker's even output rows
(``drivers/llamacpp/output_parity.py``) and its unified KV cache.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import llama_cpp.llama_cpp as ll  # noqa: E402

from appliance.drivers.llamacpp.context import DecodeContext  # noqa: E402
from appliance.drivers.llamacpp.model import LoadedModel, quiet_llama_logs  # noqa: E402
from tests.bench.compare_servers import fresh_model_copy  # noqa: E402

Entry = tuple[int, int, int, int]  # token, position, sequence, logits kept


def fill(c: DecodeContext, sequences: int, length: int, rng: random.Random) -> None:
    """Read ``length`` random tokens into each of ``sequences`` sequences."""
    for sid in range(sequences):
        for start in range(0, length, c.n_batch):
            end = min(length, start + c.n_batch)
            for k, p in enumerate(range(start, end)):
                c.tok[k], c.pos[k], c.sid[k][0], c.lg[k] = rng.randrange(1000, 20000), p, sid, 0
            c.decode(end - start)


def timed(c: DecodeContext, entries: list[Entry]) -> float:
    """Seconds of one decode of ``entries``; their KV is dropped after."""
    for k, (token, pos, sid, keep) in enumerate(entries):
        c.tok[k], c.pos[k], c.sid[k][0], c.lg[k] = token, pos, sid, keep
    t0 = time.perf_counter()
    c.decode(len(entries))
    dt = time.perf_counter() - t0
    for sid in {e[2] for e in entries}:
        c.drop(sid, min(e[1] for e in entries if e[2] == sid))
    return dt


def generating(sids: list[int], at: int) -> list[Entry]:
    return [(500, at, sid, 1) for sid in sids]


def medians(cases: dict[str, tuple[DecodeContext, list[Entry]]], rounds: int, rng: random.Random) -> dict[str, float]:
    times: dict[str, list[float]] = {name: [] for name in cases}
    for _ in range(rounds):
        names = list(cases)
        rng.shuffle(names)
        for name in names:
            c, entries = cases[name]
            times[name].append(timed(c, entries))
    return {name: statistics.median(v) * 1000 for name, v in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", type=Path)
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument("--context", type=int, default=150, help="tokens each sequence holds")
    args = parser.parse_args()
    quiet_llama_logs()
    rng = random.Random(0)
    L = args.context
    with tempfile.TemporaryDirectory() as tmp:
        model = LoadedModel(str(args.model or fresh_model_copy(Path(tmp))))
    shape = dict(ctx_per_slot=max(2048, 2 * L), threads=2, n_batch=256)
    wide = DecodeContext(model, parallel=16, **shape)
    # two contexts of each layout: two contexts of the same kind have differed by ~10% on this box
    layouts_of = {
        "unified": [DecodeContext(model, parallel=8, **shape) for _ in range(2)],
        "per-stream": [DecodeContext(model, parallel=8, unified=False, **shape) for _ in range(2)],
    }
    wide.warm_up()
    fill(wide, 16, L, rng)
    for c in layouts_of["unified"] + layouts_of["per-stream"]:
        c.warm_up()
        fill(c, 8, L, rng)
    lone = DecodeContext(model, parallel=1, **shape)
    lone.warm_up()

    steps = medians({str(n): (wide, generating(list(range(n)), L)) for n in range(1, 17)}, args.rounds, rng)
    print(f"generating steps, {L} tokens per sequence, every row kept:")
    for n in range(1, 17):
        print(f"  {n:2d} sequences {steps[str(n)]:7.1f} ms {n / steps[str(n)] * 1000:7.1f} tokens/s")

    chunks = [(1, 1), (3, 3), (4, 4), (7, 7), (8, 8), (8, 7), (16, 15), (16, 16), (40, 3), (40, 4)]
    cases = {f"{t}x{r}": (lone, [(500 + i, i, 0, int(i >= t - r)) for i in range(t)]) for t, r in chunks}
    chunk = medians(cases, args.rounds, rng)
    print("one sequence, tokens x rows kept:")
    for t, r in chunks:
        print(f"  {t:3d} tokens {r:3d} rows {chunk[f'{t}x{r}']:7.1f} ms")

    gap = [0, 1, 2, 4, 5, 6, 7]
    prompt = [(600 + i, L + i, 3, 0) for i in range(29)]
    layouts = {
        "8 generating": list(range(8)),
        "7, gap at 3": gap,
        "7, gap filled by a padding token": list(range(8)),
        "7 generating + 29-token prompt chunk": gap,
    }
    cases = {}
    for name, sids in layouts.items():
        for label, contexts in layouts_of.items():
            if name.startswith("7, gap filled") and label == "unified":
                continue
            entries = generating(sids, L) + (prompt if "prompt" in name else [])
            for i, c in enumerate(contexts):
                cases[f"{name}|{label}|{i}"] = (c, entries)
    layout = medians(cases, args.rounds, rng)
    print(f"KV layout, {L} tokens per sequence (two contexts of each layout):")
    for name in layouts:
        cells = [
            f"{label} {layout[f'{name}|{label}|0']:6.1f} / {layout[f'{name}|{label}|1']:6.1f} ms"
            for label in layouts_of
            if f"{name}|{label}|0" in layout
        ]
        print(f"  {name:38s} " + "  ".join(cells))
    for c in [wide, lone, *layouts_of["unified"], *layouts_of["per-stream"]]:
        c.close()
    ll.llama_backend_free()


if __name__ == "__main__":
    main()
