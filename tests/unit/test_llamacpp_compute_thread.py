"""The worker computes every graph on its decode thread, the warm-up included.

llama.cpp's CPU backend runs each graph as an OpenMP parallel region, and libgomp
keeps a team of threads for every thread that ever started one. With more team
threads than CPUs it stops spinning at barriers and sleeps, and every decode slows
down (see ``drivers/llamacpp/context.py``). So no thread but the decode thread may
call ``llama_decode``: not the thread that loaded the model (the worker loads it in
an executor thread), not the HTTP loop.

The engine here is real (libllama on a tiny GGUF); only ``llama_decode`` is wrapped
to record which thread called it.
"""

from __future__ import annotations

import asyncio
import threading
from concurrent.futures import ThreadPoolExecutor

import llama_cpp.llama_cpp as ll

from appliance.drivers.llamacpp.protocol import parse_completion
from appliance.drivers.llamacpp.service import WorkerConfig, WorkerEngine


def test_every_decode_runs_on_the_decode_thread(tiny_gguf, monkeypatch):
    callers: list[str] = []
    real = ll.llama_decode

    def recording(ctx, batch):
        callers.append(threading.current_thread().name)
        return real(ctx, batch)

    monkeypatch.setattr(ll, "llama_decode", recording)
    with ThreadPoolExecutor(1, thread_name_prefix="loader") as loader:  # as the worker loads: off its loop
        engine = loader.submit(WorkerEngine, WorkerConfig(str(tiny_gguf), "tiny", ctx=256, parallel=2, threads=2)).result()
    assert callers == [], "loading the model computed a graph on the loading thread"

    async def serve() -> tuple[str, list[list[float]]]:
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(None, engine.start, loop)
        seq = engine.prepare(
            parse_completion({"prompt": "The quick brown fox", "max_tokens": 8, "temperature": 0}, engine.model.info.n_vocab)
        )
        engine.batcher.submit(seq)
        text = "".join([piece async for piece, _ in seq.events()])
        vectors = await engine.batcher.embed(
            [engine.model.tokenize("an embedded sentence", add_special=True, parse_special=False)]
        )
        return text, vectors

    try:
        text, vectors = asyncio.run(serve())
    finally:
        engine.close()
    assert text and len(vectors) == 1 and len(vectors[0]) > 0
    # the warm-up, the prompt, each generated token and the embedding: all on one thread
    assert len(callers) >= 3
    assert set(callers) == {"llama-decode"}, f"graphs computed on {sorted(set(callers))}"
