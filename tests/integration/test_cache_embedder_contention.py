"""The semantic cache's embedder gives up compute threads beside busy processes, as the engine worker does.

The real packaged MiniLM GGUF on two threads, with one ``while True: pass`` pinned
to each CPU this process may use; judged by the embedder's counters, not by time.
"""

from __future__ import annotations

import time

from appliance.cache.embedder import LlamaCppEmbedder
from tests.integration.test_worker_contention import DEADLINE_S, _cpus, hogs


def test_two_thread_embedder_steps_down_beside_busy_processes():
    e = LlamaCppEmbedder(threads=2)
    try:
        assert e.compute is not None and e.compute.threads == 2
        with hogs(_cpus()):
            deadline = time.monotonic() + DEADLINE_S
            i = 0
            while e.compute.governor.steps_down == 0:
                assert time.monotonic() < deadline, e.compute.snapshot()
                rows = e.embed([f"a sentence about the sea, number {i}", f"and another one, {i}"])
                assert rows.shape == (2, 384)
                i += 1
        snap = e.compute.snapshot()
        assert snap["threads_current"] == 1 and snap["threads_steps_down_total"] >= 1
        assert e.embed(["still embeds on one thread"]).shape == (1, 384)
    finally:
        e.close()


def test_one_thread_embedder_has_nothing_to_give_up():
    e = LlamaCppEmbedder(threads=1)
    try:
        assert e.compute is None
    finally:
        e.close()
