"""Constrained-decoding engines on the default model's 262k vocabulary: compile time, mask time per token, memory.

Each (engine, schema) pair runs in a fresh process with a time limit, so a schema
that explodes in one engine costs only its own row. Per case: the grammar's
compile time, the first token mask (where lazy engines build their lexer), the
mean mask time over a walk of up to ``--steps`` tokens (each step picks a random
allowed token, seed 0, and feeds it back), and the process's resident memory
growth over the case (VmRSS after minus before, and the peak VmHWM growth).

llguidance runs in the project's environment (its tokenizer is built from the
llama.cpp vocabulary). xgrammar needs torch and transformers at import: give it
an interpreter that has them (``--xgrammar-python``); its tokenizer gets the same
token bytes, dumped from llama.cpp.

    .venv/bin/python -m tests.bench.bench_grammar_engines [--steps 48] [--timeout 120] [--xgrammar-python /path/to/python]
"""

from __future__ import annotations

import argparse
import json
import pickle
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

TOOL_PARAMS = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "description": "City name"},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
        "days": {"type": "integer", "minimum": 1, "maximum": 14},
    },
    "required": ["city"],
}

CASES: dict[str, dict] = {
    "json_object": {"type": "object"},
    "nested": {
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 64},
            "age": {"type": "integer"},
            "address": {
                "type": "object",
                "properties": {"street": {"type": "string"}, "zip": {"type": "string", "pattern": "^[0-9]{5}$"}},
                "required": ["street", "zip"],
            },
        },
        "required": ["name", "age", "address"],
    },
    "enum_20": {"type": "object", "properties": {"c": {"enum": [f"colour-{i}" for i in range(20)]}}, "required": ["c"]},
    "array_items": {
        "type": "object",
        "properties": {
            "items": {
                "type": "array",
                "maxItems": 10,
                "items": {"type": "object", "properties": {"sku": {"type": "string"}, "qty": {"type": "integer"}}},
            }
        },
        "required": ["items"],
    },
    "tool_call": {
        "anyOf": [
            {
                "type": "object",
                "properties": {"name": {"const": "get_weather"}, "arguments": TOOL_PARAMS},
                "required": ["name", "arguments"],
            }
        ]
    },
    "enum_256": {"type": "object", "properties": {"c": {"enum": [f"value-{i}" for i in range(256)]}}, "required": ["c"]},
    "bomb_minLength_2e8": {"type": "object", "properties": {"a": {"type": "string", "minLength": 200000000}}, "required": ["a"]},
    "bomb_maxItems_1e6": {"type": "object", "properties": {"a": {"type": "array", "maxItems": 1000000}}, "required": ["a"]},
    "bomb_pattern_a{100000}": {"type": "object", "properties": {"a": {"type": "string", "pattern": "^a{100000}$"}}},
    "bomb_pattern_6500_alts": {
        "type": "object",
        "properties": {"a": {"type": "string", "pattern": "^(" + "|".join(f"w{i:04d}x" for i in range(6500)) + ")$"}},
        "required": ["a"],
    },
    "bomb_enum_5000": {"type": "object", "properties": {"c": {"enum": [f"value-{i}" for i in range(5000)]}}, "required": ["c"]},
}


def _mem() -> tuple[int, int]:
    """(VmRSS, VmHWM) of this process in kB."""
    out = {}
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(("VmRSS:", "VmHWM:")):
            out[line.split(":")[0]] = int(line.split()[1])
    return out["VmRSS"], out["VmHWM"]


def _allowed(words, n_vocab: int):
    import numpy as np

    bits = np.unpackbits(np.ascontiguousarray(words).view(np.uint8), bitorder="little")[:n_vocab]
    return np.flatnonzero(bits)


def _run_llguidance(schema: dict, steps: int, model_path: str) -> dict:
    import numpy as np
    from llguidance import LLMatcher
    from llguidance.llamacpp import lltokenizer_from_vocab

    from appliance.drivers.llamacpp.model import LoadedModel

    model = LoadedModel(model_path)
    tok = lltokenizer_from_vocab(model.vocab, eos_token=model.eog_tokens())
    n_vocab = model.info.n_vocab
    rss0, hwm0 = _mem()
    t0 = time.perf_counter()
    matcher = LLMatcher(tok, LLMatcher.grammar_from_json_schema(schema), log_level=0)
    compile_s = time.perf_counter() - t0
    if matcher.is_error():
        return {"compile_s": compile_s, "error": matcher.get_error()[:80], **_mem_delta(rss0, hwm0)}
    words = np.zeros((n_vocab + 31) // 32, dtype=np.int32)
    rng = random.Random(0)
    times = []
    for _ in range(steps):
        if matcher.is_stopped():
            break
        t0 = time.perf_counter()
        matcher.unsafe_compute_mask_ptr(words.ctypes.data, words.nbytes)
        times.append(time.perf_counter() - t0)
        if matcher.is_error():
            return {"compile_s": compile_s, "error": matcher.get_error()[:80], **_mem_delta(rss0, hwm0)}
        allowed = _allowed(words, n_vocab)
        matcher.consume_token(int(allowed[rng.randrange(len(allowed))]))
    return _walk_result(compile_s, times, rss0, hwm0)


def _run_xgrammar(schema: dict, steps: int, vocab_file: str) -> dict:
    import numpy as np
    import xgrammar as xgr

    with open(vocab_file, "rb") as f:
        pieces, eog = pickle.load(f)
    n_vocab = len(pieces)
    info = xgr.TokenizerInfo(pieces, xgr.VocabType.RAW, vocab_size=n_vocab, stop_token_ids=eog)
    compiler = xgr.GrammarCompiler(info, max_threads=1, cache_enabled=False)
    rss0, hwm0 = _mem()
    t0 = time.perf_counter()
    try:
        compiled = compiler.compile_json_schema(json.dumps(schema))
        matcher = xgr.GrammarMatcher(compiled)
    except Exception as exc:  # xgrammar raises on schemas it refuses
        return {"compile_s": time.perf_counter() - t0, "error": str(exc)[:80], **_mem_delta(rss0, hwm0)}
    compile_s = time.perf_counter() - t0
    words = np.zeros((1, (n_vocab + 31) // 32), dtype=np.int32)
    rng = random.Random(0)
    times = []
    for _ in range(steps):
        if matcher.is_terminated():
            break
        t0 = time.perf_counter()
        matcher.fill_next_token_bitmask(words)
        times.append(time.perf_counter() - t0)
        allowed = _allowed(words[0], n_vocab)
        matcher.accept_token(int(allowed[rng.randrange(len(allowed))]))
    return _walk_result(compile_s, times, rss0, hwm0)


def _mem_delta(rss0: int, hwm0: int) -> dict:
    rss, hwm = _mem()
    return {"rss_mb": (rss - rss0) / 1024, "peak_mb": (hwm - hwm0) / 1024}


def _walk_result(compile_s: float, times: list[float], rss0: int, hwm0: int) -> dict:
    out = {"compile_s": compile_s, "steps": len(times), **_mem_delta(rss0, hwm0)}
    if times:
        out["first_mask_s"] = times[0]
        rest = times[1:] or times
        out["mask_s"] = sum(rest) / len(rest)
    return out


def _llguidance_overheads(model_path: str) -> str:
    """The one-off tokenizer build (time, RSS) and the per-token cost of applying a mask to a logits row with numpy."""
    import numpy as np

    from appliance.drivers.llamacpp.constraint import GrammarCompiler
    from appliance.drivers.llamacpp.grammar import grammar_for
    from appliance.drivers.llamacpp.model import LoadedModel

    model = LoadedModel(model_path)
    compiler = GrammarCompiler(model.vocab, model.eog_tokens(), model.info.n_vocab)
    rss0, _ = _mem()
    t0 = time.perf_counter()
    compiler.tokenizer()
    build_s = time.perf_counter() - t0
    rss1, _ = _mem()
    c = compiler.compile(grammar_for({"type": "json_object"}), "response_format")
    row = np.zeros(model.info.n_vocab, dtype=np.float32)
    t0 = time.perf_counter()
    for _ in range(200):
        c.apply(row)
    apply_s = (time.perf_counter() - t0) / 200
    return (
        f"llguidance tokenizer for {model.info.n_vocab} tokens: built in {build_s:.2f} s, RSS +{(rss1 - rss0) / 1024:.0f} MB;"
        f" applying a mask to a logits row (numpy): {apply_s * 1000:.3f} ms"
    )


def _dump_vocab(model_path: str, target: Path) -> None:
    """The token bytes as llama.cpp renders them (control tokens empty), and the end-of-generation ids."""
    import ctypes

    import llama_cpp.llama_cpp as ll

    from appliance.drivers.llamacpp.model import LoadedModel

    model = LoadedModel(model_path)
    buf = ctypes.create_string_buffer(256)
    pieces = []
    for t in range(model.info.n_vocab):
        n = ll.llama_token_to_piece(model.vocab, t, buf, 256, 0, False)
        pieces.append(bytes(buf[: max(n, 0)]))
    with open(target, "wb") as f:
        pickle.dump((pieces, model.eog_tokens()), f)


def _case(engine: str, name: str, steps: int, model_path: str, vocab_file: str, python: str, timeout: float) -> dict:
    cmd = [python, "-m", "tests.bench.bench_grammar_engines", "--worker", engine, "--case", name]
    cmd += ["--steps", str(steps), "--model", model_path, "--vocab", vocab_file]
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=Path(__file__).parents[2])
    except subprocess.TimeoutExpired:
        return {"error": f"no answer within {timeout:g} s"}
    if proc.returncode != 0:
        return {"error": f"exit {proc.returncode}: {proc.stderr.strip().splitlines()[-1][:70] if proc.stderr.strip() else ''}"}
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    out["wall_s"] = time.perf_counter() - t0
    return out


def _ms(v: float | None) -> str:
    return "" if v is None else f"{v * 1000:.2f}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=48)
    ap.add_argument("--timeout", type=float, default=120.0)
    ap.add_argument("--xgrammar-python", default=None, help="an interpreter with xgrammar, torch and transformers")
    ap.add_argument("--cases", default=",".join(CASES))
    ap.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--case", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--model", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--vocab", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker == "overheads":
        print(json.dumps(_llguidance_overheads(args.model)))
        return
    if args.worker:
        schema = CASES[args.case]
        run = _run_llguidance(schema, args.steps, args.model) if args.worker == "llguidance" else None
        if args.worker == "xgrammar":
            run = _run_xgrammar(schema, args.steps, args.vocab)
        print(json.dumps(run))
        return

    from tests.fixtures_models import ensure_default_gguf

    model_path = str(ensure_default_gguf())
    engines = [("llguidance", sys.executable)]
    if args.xgrammar_python:
        engines.append(("xgrammar", args.xgrammar_python))
    with tempfile.TemporaryDirectory() as tmp:
        vocab_file = str(Path(tmp) / "vocab.pkl")
        _dump_vocab(model_path, Path(vocab_file))
        overheads = subprocess.run(
            [sys.executable, "-m", "tests.bench.bench_grammar_engines", "--worker", "overheads", "--model", model_path],
            capture_output=True,
            text=True,
            check=True,
            cwd=Path(__file__).parents[2],
        )
        print(json.loads(overheads.stdout.strip().splitlines()[-1]) + "\n")
        print("| engine | schema | compile ms | first mask ms | mask/token ms | steps | RSS +MB | peak +MB | note |")
        print("|---|---|---:|---:|---:|---:|---:|---:|---|")
        for name in args.cases.split(","):
            for engine, python in engines:
                r = _case(engine, name, args.steps, model_path, vocab_file, python, args.timeout)
                rss = f"{r['rss_mb']:.0f}" if "rss_mb" in r else ""
                peak = f"{r['peak_mb']:.0f}" if "peak_mb" in r else ""
                print(
                    f"| {engine} | {name} | {_ms(r.get('compile_s'))} | {_ms(r.get('first_mask_s'))} | {_ms(r.get('mask_s'))}"
                    f" | {r.get('steps', '')} | {rss} | {peak} | {r.get('error', '')} |",
                    flush=True,
                )


if __name__ == "__main__":
    main()
