"""The appliance, its llama.cpp worker alone, and llama.cpp's llama-server, in interleaved rounds.

All three serve the default model at once (2 threads, 8 slots of 2,048 tokens each);
each round measures one stream and then 8 concurrent streams on each of them in
turn (streaming ``/v1/completions``, greedy, 128 new tokens with ``ignore_eos``,
the same 8 prompts), so a drift of the box's speed during the run touches all three
alike. The client is a few lines of asyncio on raw sockets (TCP, or the worker's
Unix socket), the same for all. Medians over the rounds, then the ratios to
llama-server.

    python tests/bench/compare_interleaved.py [--rounds 5] [--llama-server PATH]

Without ``--llama-server`` it is built as ``compare_servers.py --build-llama-server`` does.
The worker alone and llama-server read a copy of the model written at the start of the run,
as the daemon reads the copy it installs (see ``compare_servers.fresh_model_copy``).

It also prints how busy each server's compute threads were during the 8-stream
runs: the CPU time of the process's two busiest threads (ggml's two, at 2 threads)
per second of wall time, out of 2.0, and the box's idle time per second. Compute
threads that leave the box idle while a decode runs are waiting on something
(a sleeping barrier, a lock), not computing. After the rounds, each llama.cpp worker's
compute-thread trials and even-output calibration (its ``/stats``): two workers of the
same build can decide those differently, and odd stream counts (3, 5) feel the second.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from tests.bench.compare_servers import (  # noqa: E402 - run as a script: the repo root goes on sys.path first
    build_llama_server,
    daemon_worker_socket,
    free_port,
    fresh_model_copy,
    start_comparison_daemon,
    start_llama_server_np8,
    stop_process,
)

PROMPTS = [
    "Write a short story about a lighthouse keeper.",
    "Explain how a bicycle stays upright.",
    "List some facts about the planet Mars.",
    "Describe the water cycle for a child.",
    "What makes bread rise when it bakes?",
    "Tell me about the history of the printing press.",
    "Describe a walk through a busy market.",
    "How do bees make honey?",
]
MAX_TOKENS = 128


class Refused(RuntimeError):
    """The server answered with an HTTP status other than 200 (a 429 or 503 sheds load)."""

    def __init__(self, status: int, head: bytes):
        super().__init__(f"HTTP {status}: {head!r}")
        self.status = status


class Target:
    """Where one contender listens, and what it needs in each request."""

    def __init__(
        self,
        name: str,
        *,
        port: int | None = None,
        socket: str | None = None,
        model: str = "m",
        key: str | None = None,
        pid: int | None = None,
    ):
        self.name, self.port, self.socket, self.model, self.key = name, port, socket, model, key
        self.pid = pid  # the process that decodes, whose threads are accounted

    async def connect(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        if self.socket:
            return await asyncio.open_unix_connection(self.socket)
        return await asyncio.open_connection("127.0.0.1", self.port)


async def one(target: Target, prompt: str, max_tokens: int = MAX_TOKENS) -> tuple[int, float, float]:
    """(tokens, seconds to the first, seconds in all) of one streamed completion.

    Tokens are the usage's ``completion_tokens`` where the server reports it (one text event may carry
    several tokens: speculative drafts kept in one step), else the text events.
    """
    reader, writer = await target.connect()
    body = json.dumps(
        {
            "model": target.model,
            "prompt": prompt,
            "max_tokens": max_tokens,
            "temperature": 0,
            "stream": True,
            "stream_options": {"include_usage": True},
            "ignore_eos": True,
        }
    ).encode()
    auth = f"authorization: Bearer {target.key}\r\n".encode() if target.key else b""
    writer.write(
        b"POST /v1/completions HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: application/json\r\n"
        + auth
        + b"connection: close\r\ncontent-length: %d\r\n\r\n" % len(body)
        + body
    )
    await writer.drain()
    started, first, received = time.perf_counter(), None, b""
    while b"data: [DONE]" not in received:
        chunk = await reader.read(65536)
        if not chunk:
            break
        if first is None and b'"text"' in chunk:
            first = time.perf_counter() - started
        received += chunk
    writer.close()
    status = received[9:12]
    if not received.startswith(b"HTTP/1.1 200") and status.isdigit():
        raise Refused(int(status), received[:300])
    usage = re.findall(rb'"completion_tokens":\s*(\d+)', received)
    tokens = int(usage[-1]) if usage else received.count(b'"text"')
    if b"data: [DONE]" not in received or tokens < max_tokens // 2:
        raise RuntimeError(f"{target.name} answered badly: {received[:300]!r}")
    return tokens, first or 0.0, time.perf_counter() - started


def start_worker(model: str | Path, socket: str, *extra: str, **popen: object) -> subprocess.Popen:
    """The llama.cpp worker alone on ``socket``, set up as the daemon starts it here (2 threads, 8 slots of 2,048)."""
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "appliance.drivers.llamacpp.worker",
            "--model",
            str(model),
            "--socket",
            socket,
            "--served-name",
            "m",
            "--ctx",
            "2048",
            "--parallel",
            "8",
            "--threads",
            "2",
            *extra,
        ],
        env={**os.environ, "OMP_NUM_THREADS": "2"},
        start_new_session=True,
        **popen,
    )


def thread_cpu(pid: int) -> dict[int, float]:
    """CPU seconds (user + system) of each thread of process ``pid``."""
    tick, out = os.sysconf("SC_CLK_TCK"), {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except FileNotFoundError:  # the thread ended
            continue
        out[int(tid)] = (int(fields[11]) + int(fields[12])) / tick
    return out


def idle_cpu() -> float:
    """CPU seconds the whole box has been idle."""
    with open("/proc/stat") as f:
        return int(f.readline().split()[4]) / os.sysconf("SC_CLK_TCK")


async def measure(target: Target, streams: int) -> dict[str, float]:
    before, idle = (thread_cpu(target.pid) if target.pid else {}), idle_cpu()
    started = time.perf_counter()
    results = await asyncio.gather(*(one(target, PROMPTS[i % len(PROMPTS)]) for i in range(streams)))
    wall = time.perf_counter() - started
    run = {
        "aggregate": sum(n for n, _, _ in results) / wall,
        "per_stream": statistics.median(n / total for n, _, total in results),
        "ttft_max": max(first for _, first, _ in results),
        "idle": (idle_cpu() - idle) / wall,
    }
    if target.pid:
        after = thread_cpu(target.pid)
        busiest = sorted((cpu - before.get(tid, 0.0) for tid, cpu in after.items()), reverse=True)[:2]
        run["compute_busy"] = sum(busiest) / wall
    return run


def worker_of(daemon_pid: int) -> int:
    """The pid of the llama.cpp worker the daemon started."""
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                cmdline = f.read()
        except (FileNotFoundError, ProcessLookupError):
            continue
        if ppid == daemon_pid and b"llamacpp.worker" in cmdline:
            return int(entry)
    raise RuntimeError("the daemon has no llama.cpp worker")


#: The worker ``/stats`` fields printed after the rounds: the compute-thread governor's and the even-output calibration's.
STAT_PREFIXES = ("threads_", "even_outputs")


def worker_stats(socket: Path | str) -> dict[str, int]:
    """The ``threads_*`` and ``even_outputs*`` fields of a llama.cpp worker's ``/stats``."""
    with httpx.Client(transport=httpx.HTTPTransport(uds=str(socket)), base_url="http://worker", timeout=30) as c:
        return {k: v for k, v in c.get("/stats").json().items() if k.startswith(STAT_PREFIXES)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--llama-server", type=Path)
    parser.add_argument(
        "--streams", type=int, nargs="+", default=[1, 8], help="concurrent streams measured each round (1 and 8 always)"
    )
    parser.add_argument(
        "--fixed-threads-too",
        action="store_true",
        help="also a second daemon with engine_adapt_threads off, measured in the same rounds",
    )
    parser.add_argument(
        "--speculation-off-too",
        action="store_true",
        help="also a second daemon with speculative_ngram off, measured in the same rounds",
    )
    args = parser.parse_args()
    binary = args.llama_server or build_llama_server()
    with tempfile.TemporaryDirectory() as tmp:
        model = str(fresh_model_copy(Path(tmp)))  # as fresh in the page cache as the daemon's own copy
        socket = os.path.join(tmp, "worker.sock")
        worker = start_worker(model, socket)
        port = free_port()
        server = daemon = fixed = plain = None
        try:
            server = start_llama_server_np8(binary, model, port)
            daemon = start_comparison_daemon(Path(tmp))
            if args.fixed_threads_too:
                fixed_dir = Path(tmp) / "fixed"
                fixed_dir.mkdir()
                fixed = start_comparison_daemon(fixed_dir, APPLIANCE_ENGINE_ADAPT_THREADS="false")
            if args.speculation_off_too:
                plain_dir = Path(tmp) / "no-drafts"
                plain_dir.mkdir()
                plain = start_comparison_daemon(plain_dir, APPLIANCE_SPECULATIVE_NGRAM="false")
            while not os.path.exists(socket):
                time.sleep(0.2)
            targets = [
                Target("appliance", port=daemon.port, model="default", key=daemon.create_key("bench")),
                Target("worker alone", socket=socket, pid=worker.pid),
                Target("llama-server", port=port, pid=server.pid),
            ]
            if fixed is not None:
                targets.insert(1, Target("appliance, fixed threads", port=fixed.port, model="default", key=fixed.create_key("b")))
            if plain is not None:
                targets.insert(1, Target("appliance, no drafts", port=plain.port, model="default", key=plain.create_key("c")))
            for t in targets:  # loads the model on demand, warms every server up
                asyncio.run(measure(t, 2))
            targets[0].pid = worker_of(daemon.proc.pid)
            for extra in (fixed, plain):
                if extra is not None:
                    next(t for t in targets if t.port == extra.port).pid = worker_of(extra.proc.pid)
            loads = sorted({1, 8, *args.streams})
            runs: dict[str, dict[int, list[dict[str, float]]]] = {t.name: {n: [] for n in loads} for t in targets}
            for r in range(args.rounds):
                for streams in loads:
                    for t in targets:
                        runs[t.name][streams].append(asyncio.run(measure(t, streams)))
                print(f"round {r + 1}/{args.rounds} done", flush=True)
            sockets = {"appliance": daemon_worker_socket(daemon.data_dir), "worker alone": socket}
            for name, extra in (("appliance, fixed threads", fixed), ("appliance, no drafts", plain)):
                if extra is not None:
                    sockets[name] = daemon_worker_socket(extra.data_dir)
            for name, path in sockets.items():
                if path is not None:
                    fields = worker_stats(path)
                    print(f"{name} worker: " + ", ".join(f"{k}={v}" for k, v in fields.items()), flush=True)
        finally:
            for extra in (fixed, plain):
                if extra is not None:
                    extra.stop()
            if daemon is not None:
                daemon.stop()
            if server is not None:
                stop_process(server)
            worker.terminate()
            worker.wait()

    def med(name: str, streams: int, field: str) -> float:
        return statistics.median(run[field] for run in runs[name][streams])

    print(f"\n{args.rounds} interleaved rounds, medians; 128 greedy tokens per stream, 2 threads\n")
    print(
        "| server | 1 stream tok/s | 8 streams aggregate tok/s | per stream at 8 | slowest TTFT at 8 "
        "| compute threads busy at 8 (of 2) | box idle at 8 (cores) |"
    )
    print("|---|---|---|---|---|---|---|")
    for t in targets:
        print(
            f"| {t.name} | {med(t.name, 1, 'per_stream'):.1f} | {med(t.name, 8, 'aggregate'):.1f} | "
            f"{med(t.name, 8, 'per_stream'):.1f} | {med(t.name, 8, 'ttft_max'):.2f} s | "
            f"{med(t.name, 8, 'compute_busy'):.2f} | {med(t.name, 8, 'idle'):.2f} |"
        )
    print()
    for name in [t.name for t in targets if t.name != "llama-server"]:
        print(
            f"{name} / llama-server: 1 stream {med(name, 1, 'per_stream') / med('llama-server', 1, 'per_stream'):.2f}x, "
            f"8 streams {med(name, 8, 'aggregate') / med('llama-server', 8, 'aggregate'):.2f}x, "
            f"slowest TTFT at 8 {med(name, 8, 'ttft_max') / med('llama-server', 8, 'ttft_max'):.2f}x"
        )
    others = [n for n in loads if n not in (1, 8)]
    if others:
        print("\naggregate tok/s at every load (ratio to llama-server):\n")
        print("| server | " + " | ".join(f"{n} stream{'s' * (n > 1)}" for n in loads) + " |")
        print("|---|" + "---|" * len(loads))
        for t in targets:
            cells = []
            for n in loads:
                agg, ref = med(t.name, n, "aggregate"), med("llama-server", n, "aggregate")
                cells.append(f"{agg:.1f}" + ("" if t.name == "llama-server" else f" ({agg / ref:.2f}x)"))
            print(f"| {t.name} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
