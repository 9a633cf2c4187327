"""The same model file, decoded from its page cache as it is and from a fresh copy.

    python tests/bench/bench_page_cache.py [--model PATH] [--rounds 4] [--reread]

Starts two llama.cpp workers (2 threads, 8 slots of 2,048 tokens): one on ``--model``
(default: the test suite's cached copy of the default model), one on a copy of it
written moments before. Then alternates single streamed requests between them
(128 greedy tokens with ``ignore_eos``) and prints each one's tokens per second.

With ``--reread`` the file is first dropped from the page cache
(``posix_fadvise(DONTNEED)``, which leaves pages another process maps) and read
back sequentially. A file whose cached pages have aged (faulted back in pieces
after the kernel reclaimed some) has decoded ~15% slower on the build machine;
the benchmarks that compare servers therefore give each one a fresh copy
(``compare_servers.fresh_model_copy``).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from tests.bench.compare_interleaved import PROMPTS, Target, one, start_worker  # noqa: E402
from tests.fixtures_models import ensure_default_gguf  # noqa: E402


def reread(path: Path) -> None:
    """Drop ``path``'s unmapped pages from the page cache, then read the file back in order."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)
    with open(path, "rb") as f:
        while f.read(1 << 24):
            pass


async def ready(target: Target, deadline: float) -> None:
    """Wait until the worker answers a request (its socket exists before the model is loaded)."""
    while True:
        try:
            await one(target, PROMPTS[0])
            return
        except (OSError, RuntimeError):
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.5)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", type=Path, default=None)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--reread", action="store_true")
    args = parser.parse_args()
    model = args.model or ensure_default_gguf()
    if args.reread:
        reread(model)
    with tempfile.TemporaryDirectory() as tmp:
        copy = Path(tmp) / "fresh-copy.gguf"
        shutil.copyfile(model, copy)
        targets, procs = [], []
        for name, path in (("as cached", model), ("fresh copy", copy)):
            sock = os.path.join(tmp, f"{len(procs)}.sock")
            procs.append(start_worker(path, sock, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
            targets.append(Target(name, socket=sock))
        try:
            for t in targets:
                asyncio.run(ready(t, time.monotonic() + 120))
            rates: dict[str, list[float]] = {t.name: [] for t in targets}
            for _ in range(args.rounds):
                for t in targets:
                    n, _, total = asyncio.run(one(t, PROMPTS[0]))
                    rates[t.name].append(n / total)
        finally:
            for p in procs:
                p.terminate()
                p.wait()
    for name, values in rates.items():
        print(f"{name}: {' '.join(f'{v:.1f}' for v in values)} tokens/s at 1 stream, median {statistics.median(values):.1f}")
    print(f"as cached / fresh copy: {statistics.median(rates['as cached']) / statistics.median(rates['fresh copy']):.2f}x")


if __name__ == "__main__":
    main()
