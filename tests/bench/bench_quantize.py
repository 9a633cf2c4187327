"""Quantization ladder benchmark: size, speed and perplexity of each variant the store makes.

Two source models, each quantized through the store's own pipeline
(``ModelStore.quantize``: libllama's quantizer in a child process, then hash,
inspect, atomic install):

* ``gemma`` — the default model (Gemma 3 270M). Its published file is Q4_K_M, so
  it is first expanded to F16 with libllama (``allow_requantize``); that F16 holds
  exactly the Q4_K_M model's weights, and is the reference every lower variant
  is compared with. Perplexity is meaningful here (a real model on real text).
* ``synthetic`` — a random-weight llama made with ``tests.ggufkit`` (F32, about
  25M parameters, rows a multiple of 256 so k-quants apply): sizes and speeds
  only; perplexity of random weights says nothing about quality.

For each variant: file size, bits per weight, quantization time, load time,
prompt processing (tokens/s over the perplexity text, one batch), generation
(tokens/s, 64 greedy tokens, one ``llama_decode`` each on the worker's own decode
context, as the engine decodes one stream; the median of three runs), the planner's estimate of
that generation speed on this box (one stream, the file's own context; no
calibration from earlier loads) and its error, and perplexity over the text. Speeds are given per wall second and
per CPU second of this process: on a shared, busy machine the second is the steadier one.

    python tests/bench/bench_quantize.py [--model gemma|synthetic|both] [--threads 2]
"""

from __future__ import annotations

import argparse
import ctypes
import gc
import math
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

LADDER = ["q8_0", "q6_k", "q5_k_m", "q4_k_m", "q3_k_m", "q2_k"]

TEXT = (
    "It was the best of times, it was the worst of times, it was the age of wisdom, it was the age of foolishness, "
    "it was the epoch of belief, it was the epoch of incredulity, it was the season of Light, it was the season of "
    "Darkness, it was the spring of hope, it was the winter of despair.\n\n"
    "Water moves through the environment in a continuous cycle. Heat from the sun evaporates water from oceans, lakes "
    "and rivers, and plants release more of it through their leaves. As the moist air rises it cools, and the vapour "
    "condenses into tiny droplets that form clouds. When the droplets grow heavy enough they fall back to the ground as "
    "rain or snow. Some of this water soaks into the soil and refills underground stores, while the rest runs off into "
    "streams that carry it back to the sea, where the cycle begins again. Engineers who plan cities study these flows "
    "carefully, because a single heavy storm can overwhelm drains that were built for an average year.\n"
)


def quiet_llama() -> None:
    import llama_cpp

    @llama_cpp.llama_log_callback
    def _silence(level: int, text: bytes, user: ctypes.c_void_p) -> None:
        return None

    quiet_llama.cb = _silence  # keep a reference
    llama_cpp.llama_log_set(_silence, ctypes.c_void_p(0))


def measure(path: Path, threads: int) -> dict[str, float]:
    from llama_cpp import Llama

    started = time.perf_counter()
    llm = Llama(model_path=str(path), n_ctx=512, n_batch=512, n_threads=threads, logits_all=True, verbose=False)
    load_s = time.perf_counter() - started
    tokens = llm.tokenize(TEXT.encode(), add_bos=True)
    started, cpu = time.perf_counter(), time.process_time()
    llm.eval(tokens)
    pp_s, pp_cpu = time.perf_counter() - started, time.process_time() - cpu
    logits = np.asarray(llm.scores[: len(tokens)], dtype=np.float64)
    shifted = logits - logits.max(axis=1, keepdims=True)
    logprobs = shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True))
    nll = -logprobs[np.arange(len(tokens) - 1), tokens[1:]].mean()
    del llm, logits, shifted, logprobs
    gc.collect()

    runs = sorted(generate(path, threads) for _ in range(3))  # the median of three: one second is a noisy sample here
    tg_s, tg_cpu, n_gen = runs[1]
    return {
        "load_s": load_s,
        "pp_tps": len(tokens) / pp_s,
        "tg_tps": n_gen / tg_s,
        "pp_cpu": len(tokens) / pp_cpu,
        "tg_cpu": n_gen / tg_cpu,
        "ppl": math.exp(nll),
        "n_tokens": len(tokens),
    }


def generate(path: Path, threads: int, n_gen: int = 64) -> tuple[float, float, int]:
    """(seconds, CPU seconds, tokens) of greedy generation as the engine's worker decodes: one ``llama_decode``
    of one token per step on the worker's own context, the token the argmax of its logits row."""
    import llama_cpp.llama_cpp as ll

    from appliance.drivers.llamacpp.context import DecodeContext
    from appliance.drivers.llamacpp.model import LoadedModel

    model = LoadedModel(str(path))
    context = DecodeContext(model, ctx_per_slot=512, parallel=1, threads=threads, n_batch=64)
    try:
        prompt = model.tokenize("Water moves through the environment", add_special=True, parse_special=False)
        for i, token in enumerate(prompt):
            context.tok[i], context.pos[i], context.sid[i][0], context.lg[i] = token, i, 0, int(i == len(prompt) - 1)
        context.decode(len(prompt))
        n_vocab, idx, pos = model.info.n_vocab, len(prompt) - 1, len(prompt)
        started, cpu = time.perf_counter(), time.process_time()
        for _ in range(n_gen):  # never stopping early at an end token
            row = np.ctypeslib.as_array(ll.llama_get_logits_ith(context.ctx, idx), shape=(n_vocab,))
            context.tok[0], context.pos[0], context.sid[0][0], context.lg[0] = int(row.argmax()), pos, 0, 1
            context.decode(1)
            idx, pos = 0, pos + 1
        return time.perf_counter() - started, time.process_time() - cpu, n_gen
    finally:
        context.close()
        model.close()


def expand_to_f16(src: Path, dst: Path, threads: int) -> None:
    """Q4_K_M → F16 with libllama (the same weights, in a precision the store quantizes from)."""
    import llama_cpp

    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = llama_cpp.LLAMA_FTYPE_MOSTLY_F16
    params.allow_requantize = True
    params.nthread = threads
    if llama_cpp.llama_model_quantize(str(src).encode(), str(dst).encode(), ctypes.byref(params)) != 0:
        raise SystemExit("could not expand the default model to F16")


def run(model: str, threads: int, work: Path) -> list[dict]:
    from tests.ggufkit import make_tiny_gguf
    from tests.storekit import make_store

    store = make_store(work / f"data-{model}", engine_threads=threads)
    if model == "gemma":
        from tests.fixtures_models import ensure_default_gguf

        source = work / "gemma-3-270m-f16.gguf"
        expand_to_f16(ensure_default_gguf(), source, threads)
        base = store.import_path(str(source), name="gemma-3-270m-deq:f16")
    else:
        source = make_tiny_gguf(work / "synthetic-f32.gguf", n_layer=8, n_embd=512, n_head=8, n_kv_head=4, vocab=8192, ctx=512)
        base = store.import_path(str(source), name="synthetic:f32")
    params = base.facts.get("parameter_count") or 0
    rows = [
        {
            "variant": base.variant,
            "bytes": base.size_bytes,
            "quantize_s": None,
            "path": store.settings.store_dir / base.path,
            **measure(store.settings.store_dir / base.path, threads),
        }
    ]
    for target in LADDER:
        started = time.perf_counter()
        info = store.quantize(base.name, target)
        quantize_s = time.perf_counter() - started
        rows.append(
            {
                "variant": info.variant,
                "bytes": info.size_bytes,
                "quantize_s": quantize_s,
                "path": store.settings.store_dir / info.path,
                **measure(store.settings.store_dir / info.path, threads),
            }
        )
    for row in rows:
        row["bpw"] = row["bytes"] * 8 / params if params else float("nan")
        row["predicted_tps"] = predicted_decode_tps(row["path"], threads)
        row["error"] = row["predicted_tps"] / row["tg_tps"] - 1 if row["predicted_tps"] else float("nan")
    return rows


def predicted_decode_tps(path: Path, threads: int) -> float | None:
    """The planner's one-stream decode estimate for ``path`` on this box (what ``appliancectl plan`` shows)."""
    from appliance.hardware.detect import detect_hardware
    from appliance.planner.plan import plan_all
    from appliance.planner.service import variants_from_path
    from appliance.planner.types import Preferences

    rows = plan_all(
        detect_hardware(), variants_from_path(path), Preferences(min_context=512, parallel=1, threads=threads, backend="llamacpp")
    )
    fitting = [r for r in rows if r.fits and r.decode_tps]
    return float(fitting[0].decode_tps) if fitting else None


def table(model: str, rows: list[dict], threads: int) -> str:
    """Speeds per wall second and per CPU second (the latter is steadier on a shared, busy box)."""
    ref = rows[0]["ppl"]
    lines = [
        f"### {model} ({threads} threads, {rows[0]['n_tokens']}-token text)",
        "",
        "| variant | size MiB | bits/weight | quantize s | load s | prompt tok/s | prompt tok/CPU-s | gen tok/s | "
        "gen tok/CPU-s | planner's gen tok/s | error | perplexity | vs source |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        q = "-" if r["quantize_s"] is None else f"{r['quantize_s']:.1f}"
        ppl = "n/a (random weights)" if model == "synthetic" else f"{r['ppl']:.2f}"
        delta = "" if model == "synthetic" else f"{100 * (r['ppl'] / ref - 1):+.1f}%"
        lines.append(
            f"| {r['variant']} | {r['bytes'] / 2**20:.1f} | {r['bpw']:.2f} | {q} | {r['load_s']:.2f} | "
            f"{r['pp_tps']:.0f} | {r['pp_cpu']:.0f} | {r['tg_tps']:.1f} | {r['tg_cpu']:.1f} | "
            f"{r['predicted_tps'] or 0:.1f} | {100 * r['error']:+.0f}% | {ppl} | {delta} |"
        )
    errors = sorted(abs(r["error"]) for r in rows if r["predicted_tps"])
    if errors:
        lines += [
            "",
            f"Planner's generation estimate vs measured: median |error| {100 * errors[len(errors) // 2]:.0f}%, "
            f"largest {100 * errors[-1]:.0f}% over {len(errors)} variants.",
        ]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", choices=["gemma", "synthetic", "both"], default="both")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    quiet_llama()
    models = ["gemma", "synthetic"] if args.model == "both" else [args.model]
    with tempfile.TemporaryDirectory(prefix="bench-quantize-") as tmp:
        for model in models:
            print(table(model, run(model, args.threads, Path(tmp)), args.threads), flush=True)
            print()


if __name__ == "__main__":
    main()
