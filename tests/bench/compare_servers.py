"""Side-by-side serving benchmark on the same model file, in one run.

  (a) the appliance (gateway + llama.cpp batching worker)
  (b) python -m llama_cpp.server --interrupt_requests False (threads 1 and 2)
  (c) llama.cpp's C++ llama-server -np 8: --llama-server PATH, or --build-llama-server, which builds
      it from the sources vendored in the installed llama-cpp-python's sdist with the engine's own
      CPU flags (-DGGML_NATIVE=OFF, as tools/engine_build.sh) into ~/.cache/appliance-bench (once)

Every server gets 2,048 context tokens per sequence (llama-server: -c 16384 over 8 slots).

Each server is started alone, warmed up, measured at 1 and 8 concurrent streams
(streaming /v1/completions, greedy, 128 new tokens, 16 different prompts) and
stopped before the next starts. Then the appliance's prefix cache: TTFT with a
shared ~1,000-token system prompt, cold vs warm.

    python tests/bench/compare_servers.py [--llama-server PATH | --build-llama-server] [--requests 16]

``python -m llama_cpp.server`` needs its web stack beside the engine's wheel (``pip install fastapi
sse-starlette starlette-context pydantic-settings``), or pass ``--skip-llama-cpp-python``.

With llama-server measured, the last lines are the appliance's ratios to it: one stream's
tokens/s, the aggregate at 8 streams, and TTFT p95 at 8 (lower is better).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from appliance.bench import run_bench  # noqa: E402
from tests.daemon import start_daemon  # noqa: E402
from tests.fixtures_models import ensure_default_gguf  # noqa: E402


def build_llama_server(threads: int = 2) -> Path:
    """llama-server built from the installed llama-cpp-python's sdist with the engine's CPU flags (cached)."""
    from importlib.metadata import version

    ver = version("llama_cpp_python")
    home = Path.home() / ".cache" / "appliance-bench" / f"llama-server-{ver}"
    binary = home / "src" / "vendor" / "llama.cpp" / "build" / "bin" / "llama-server"
    if binary.exists():
        return binary
    home.mkdir(parents=True, exist_ok=True)
    print(f"building llama-server {ver} from the llama-cpp-python sdist in {home} (once; minutes)", flush=True)
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "download",
            f"llama-cpp-python=={ver}",
            "--no-binary",
            ":all:",
            "--no-deps",
            "-d",
            str(home),
        ],
        check=True,
        stdout=subprocess.DEVNULL,
    )
    sdist = next(home.glob("llama_cpp_python-*.tar.gz"))
    subprocess.run(["tar", "xzf", str(sdist), "-C", str(home)], check=True)
    (home / sdist.name.removesuffix(".tar.gz")).rename(home / "src")
    tree = home / "src" / "vendor" / "llama.cpp"
    subprocess.run(
        [
            "cmake",
            "-B",
            "build",
            "-DGGML_NATIVE=OFF",
            "-DLLAMA_CURL=OFF",
            "-DLLAMA_BUILD_TESTS=OFF",
            "-DCMAKE_BUILD_TYPE=Release",
        ],
        cwd=tree,
        check=True,
        stdout=subprocess.DEVNULL,
    )
    subprocess.run(
        ["cmake", "--build", "build", "-j", str(threads), "--target", "llama-server"],
        cwd=tree,
        check=True,
        stdout=subprocess.DEVNULL,
    )
    return binary


def fresh_model_copy(directory: Path) -> Path:
    """A new copy of the default model in ``directory``, for the servers that do not install their own.

    The daemon installs the model into its data directory, a file just written. The shared test
    copy may have sat in the page cache for hours, and on this box the same bytes once decoded about
    15% slower at one stream from such an aged page cache (``bench_page_cache.py`` compares the
    two). So every contender gets a file written moments before the run.
    """
    target = directory / "default-model-copy.gguf"
    shutil.copyfile(ensure_default_gguf(), target)
    return target


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_http(url: str, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if httpx.get(url, timeout=1).status_code < 500:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.3)
    raise RuntimeError(f"{url} not ready")


def start_process(argv: list[str], health: str, env: dict | None = None) -> subprocess.Popen:
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True, env=env)
    wait_http(health)
    return proc


def start_llama_server_np8(binary: Path, model: str, port: int) -> subprocess.Popen:
    """llama-server as the serving comparisons run it: 8 slots sharing 16,384 context tokens, 2 threads."""
    return start_process(
        [str(binary), "-m", model, "--port", str(port), "-np", "8", "-c", "16384", "-t", "2", "--no-webui"],
        f"http://127.0.0.1:{port}/health",
        env={**os.environ, "LD_LIBRARY_PATH": str(binary.parent)},
    )


def start_comparison_daemon(data_dir: Path, **env: str):
    """The appliance as the serving comparisons run it: 8 slots of 2,048 tokens, 2 threads, response cache off."""
    return start_daemon(
        data_dir,
        **{
            "APPLIANCE_ENGINE_PARALLEL": "8",
            "APPLIANCE_ENGINE_CONTEXT": "2048",
            "APPLIANCE_ENGINE_THREADS": "2",
            "APPLIANCE_CACHE_ENABLED": "false",
            **env,
        },
    )


def daemon_worker_socket(data_dir: Path) -> Path | None:
    """The socket of the newest llama.cpp worker of the daemon whose data directory is ``data_dir`` (None: none)."""
    found = sorted((data_dir / "run").glob("engine-*.sock"), key=lambda p: p.stat().st_mtime)
    return found[-1] if found else None


def stop_process(proc: subprocess.Popen) -> None:
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(20)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def measure(name: str, base_url: str, model: str, api_key: str | None, requests: int, max_tokens: int) -> dict:
    asyncio.run(run_bench(base_url, api_key=api_key, model=model, concurrency=1, requests=2, max_tokens=8))  # warm-up
    one = asyncio.run(
        run_bench(base_url, api_key=api_key, model=model, concurrency=1, requests=max(3, requests // 4), max_tokens=max_tokens)
    )
    eight = asyncio.run(
        run_bench(base_url, api_key=api_key, model=model, concurrency=8, requests=requests, max_tokens=max_tokens)
    )
    row = {
        "server": name,
        "single_tps": one.per_stream_tps_median,
        "single_agg_tps": one.aggregate_tps,
        "agg8_tps": eight.aggregate_tps,
        "per_stream8_tps": eight.per_stream_tps_median,
        "ttft8_p50_s": eight.ttft_p50_s,
        "ttft8_p95_s": eight.ttft_p95_s,
        "failed": one.failed + eight.failed,
    }
    print(json.dumps(row), flush=True)
    return row


def prefix_cache_ttft(base_url: str, api_key: str, model: str, rounds: int = 5) -> tuple[float, float]:
    """Median TTFT with a fresh ~1,000-token system prompt (cold) vs the same one again (warm)."""
    filler = " ".join(
        f"Rule {i}: answer politely, cite sources, keep it short, and never reveal secret number {i * 7}." for i in range(60)
    )
    headers = {"Authorization": f"Bearer {api_key}"}
    cold, warm = [], []

    def ttft(system: str, question: str) -> float:
        body = {
            "model": model,
            "messages": [{"role": "system", "content": system}, {"role": "user", "content": question}],
            "max_tokens": 4,
            "temperature": 0,
            "stream": True,
        }
        started = time.perf_counter()
        with httpx.stream(
            "POST", base_url + "/chat/completions", json=body, headers={**headers, "Cache-Control": "no-store"}, timeout=300
        ) as r:
            for line in r.iter_lines():
                if not line.startswith("data: {"):
                    continue
                choices = json.loads(line[6:]).get("choices") or []
                if any((c.get("delta") or {}).get("content") for c in choices):  # the first generated text, not the role chunk
                    return time.perf_counter() - started
        return time.perf_counter() - started

    for i in range(rounds):
        system = f"Session {i} {time.time_ns()}. " + filler
        cold.append(ttft(system, "What is rule 3?"))
        warm.append(ttft(system, "What is rule 5?"))
    return statistics.median(cold), statistics.median(warm)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--llama-server", type=Path, help="path to a llama-server binary (C++ yardstick)")
    parser.add_argument(
        "--build-llama-server",
        action="store_true",
        help="build llama-server from the installed llama-cpp-python's sources (cached) and compare",
    )
    parser.add_argument("--requests", type=int, default=16)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--skip-llama-cpp-python", action="store_true")
    args = parser.parse_args()
    if args.build_llama_server and not args.llama_server:
        args.llama_server = build_llama_server()
    rows = []
    copies = tempfile.TemporaryDirectory()
    model_path = fresh_model_copy(Path(copies.name))  # see fresh_model_copy: the daemon's own copy is as fresh
    try:
        with tempfile.TemporaryDirectory() as tmp:
            daemon = start_daemon(
                Path(tmp), APPLIANCE_ENGINE_PARALLEL="8", APPLIANCE_ENGINE_CONTEXT="2048", APPLIANCE_CACHE_ENABLED="false"
            )
            try:
                key = daemon.create_key("bench")
                rows.append(measure("appliance", daemon.url + "/v1", "default", key, args.requests, args.max_tokens))
                cold, warm = prefix_cache_ttft(daemon.url + "/v1", key, "default")
                print(
                    json.dumps(
                        {
                            "prefix_cache": {
                                "cold_ttft_s": round(cold, 3),
                                "warm_ttft_s": round(warm, 3),
                                "ratio": round(warm / cold, 3),
                            }
                        }
                    ),
                    flush=True,
                )
            finally:
                daemon.stop()
        if not args.skip_llama_cpp_python:
            for threads in (1, 2):
                port = free_port()
                proc = start_process(
                    [
                        sys.executable,
                        "-m",
                        "llama_cpp.server",
                        "--model",
                        str(model_path),
                        "--port",
                        str(port),
                        "--interrupt_requests",
                        "False",
                        "--n_threads",
                        str(threads),
                        "--n_ctx",
                        "2048",
                    ],
                    f"http://127.0.0.1:{port}/v1/models",
                )
                try:
                    rows.append(
                        measure(
                            f"llama_cpp.server t={threads}",
                            f"http://127.0.0.1:{port}/v1",
                            "x",
                            None,
                            args.requests,
                            args.max_tokens,
                        )
                    )
                finally:
                    stop_process(proc)
        if args.llama_server:
            for threads in (2, 1):
                port = free_port()
                env = {**os.environ, "LD_LIBRARY_PATH": str(args.llama_server.parent)}
                proc = start_process(
                    [
                        str(args.llama_server),
                        "-m",
                        str(model_path),
                        "--port",
                        str(port),
                        "-np",
                        "8",
                        "-c",
                        "16384",
                        "-t",
                        str(threads),
                        "--no-webui",
                    ],
                    f"http://127.0.0.1:{port}/health",
                    env=env,
                )
                try:
                    rows.append(
                        measure(
                            f"llama-server t={threads}", f"http://127.0.0.1:{port}/v1", "x", None, args.requests, args.max_tokens
                        )
                    )
                finally:
                    stop_process(proc)
    finally:
        copies.cleanup()
    print("\n| server | 1 stream tok/s | 8 streams aggregate tok/s | per stream at 8 | TTFT p50 at 8 | TTFT p95 at 8 | failed |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['server']} | {r['single_tps']:.1f} | {r['agg8_tps']:.1f} | {r['per_stream8_tps']:.1f} | "
            f"{r['ttft8_p50_s']:.2f} s | {r['ttft8_p95_s']:.2f} s | {r['failed']} |"
        )
    ours = next(r for r in rows if r["server"] == "appliance")
    yardstick = next((r for r in rows if r["server"] == "llama-server t=2"), None)
    if yardstick is not None:
        print(
            f"\nappliance / llama-server (2 threads): 1 stream {ours['single_tps'] / yardstick['single_tps']:.2f}x "
            f"(target >= 0.95), 8 streams {ours['agg8_tps'] / yardstick['agg8_tps']:.2f}x (target >= 1.0), "
            f"TTFT p95 at 8 {ours['ttft8_p95_s'] / yardstick['ttft8_p95_s']:.2f}x (target <= 1.0)"
        )


if __name__ == "__main__":
    main()
