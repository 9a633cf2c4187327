"""The llama.cpp engine worker: one model, OpenAI-shaped HTTP on a Unix socket.

Run as::

    python -m appliance.drivers.llamacpp.worker --model PATH --socket PATH \\
        --served-name NAME --ctx N --parallel N --threads N --n-gpu-layers N \\
        [--batch-size N] [--spec-ngram N] [--embedding]

``--ctx`` is the context of ONE request (slot); the KV cache holds
``ctx × parallel`` cells, shared (unified) by all slots. The worker never
listens on TCP: the socket is created mode 0600 before uvicorn serves it.
The HTTP layer is a raw ASGI app (no framework on the per-token path).
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import os
import signal
import struct
import sys
import time
import traceback

from appliance.errors import ApplianceError, BadRequest, EngineUnavailable, NotFound
from appliance.jsontypes import JsonObject

from .chat_output import ChatOutput
from .contention import ContentionPolicy
from .errors import DecodeFailure, EmbeddingError, MethodNotAllowed, ModelLoadError, WorkerError
from .http_io import JSON_HEADERS, SSE_HEADERS, Receive, Send, off_loop, read_json, send_json
from .latency import LatencyTargets, parse_targets, priority_of
from .logprobs import LogprobView, joined
from .output_parity import MODES as EVEN_OUTPUT_MODES
from .params import SPLIT_MODES, GpuPlacement, KvSettings
from .placement import FLASH_ATTN_MODES, KV_CACHE_TYPES, is_quantized_kv
from .protocol import DONE, GenRequest, Shaper, parse_chat, parse_completion, sse, usage_dict
from .sequence import FINISH_CANCELLED, FINISH_ERROR, FINISH_LENGTH, Sequence
from .service import WorkerConfig, WorkerEngine
from .unix_server import bind_unix, server_class, unlink


class WorkerApp:
    """Raw ASGI application; ``engine`` is None until the model has loaded."""

    def __init__(self, served_name: str) -> None:
        self.served_name = served_name
        self.engine: WorkerEngine | None = None
        self.created = int(time.time())

    @property
    def loaded(self) -> WorkerEngine:
        """The engine, for the handlers (they run only once it has loaded: ``__call__`` answers 503 before)."""
        if self.engine is None:
            raise EngineUnavailable("the model is still loading")
        return self.engine

    async def __call__(self, scope: JsonObject, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return  # lifespan is off; websockets are not served
        path, method = scope["path"], scope["method"]
        try:
            if path == "/health":
                if self.engine is None:
                    await send_json(send, 503, {"status": "loading"})
                else:
                    await send_json(send, 200, {"status": "ok"})
                return
            route = _ROUTES.get(path)
            if route is None:
                raise NotFound(f"no route {path}")
            want, handler = route
            if method != want:
                raise MethodNotAllowed(f"{path} accepts {want} only")
            if self.engine is None:
                raise EngineUnavailable("the model is still loading")
            await handler(self, scope, receive, send)
        except ConnectionAbortedError:
            return
        except ApplianceError as exc:
            await send_json(send, exc.status, exc.envelope())
        except Exception:  # a bug: log it, answer in the OpenAI shape, keep serving
            traceback.print_exc(file=sys.stderr)
            with contextlib.suppress(Exception):
                await send_json(send, 500, WorkerError("internal engine error").envelope())

    # -- routes ------------------------------------------------------------------
    async def models(self, scope: JsonObject, receive: Receive, send: Send) -> None:
        await send_json(
            send,
            200,
            {
                "object": "list",
                "data": [{"id": self.served_name, "object": "model", "created": self.created, "owned_by": "appliance"}],
            },
        )

    async def stats(self, scope: JsonObject, receive: Receive, send: Send) -> None:
        await send_json(send, 200, self.loaded.batcher.snapshot())

    async def completions(self, scope: JsonObject, receive: Receive, send: Send) -> None:
        body = await read_json(receive)
        req = await off_loop(parse_completion, body, self.loaded.model.info.n_vocab, param="response_format")
        await self._generate(req, priority_of(scope), receive, send)

    async def chat_completions(self, scope: JsonObject, receive: Receive, send: Send) -> None:
        body = await read_json(receive)
        req = await off_loop(parse_chat, body, self.loaded.model.info.n_vocab, param="response_format")
        await self._generate(req, priority_of(scope), receive, send)

    async def embeddings(self, scope: JsonObject, receive: Receive, send: Send) -> None:
        body = await read_json(receive)
        engine = self.loaded
        inputs = await off_loop(engine.embedding_inputs, body, param="input")
        fmt = body.get("encoding_format", "float")
        if fmt not in ("float", "base64"):
            raise BadRequest("encoding_format must be float or base64", param="encoding_format")
        try:
            vectors = await engine.batcher.embed(inputs)
        except (DecodeFailure, EmbeddingError) as exc:
            raise WorkerError(str(exc)) from None
        data = []
        for i, vec in enumerate(vectors):
            emb: list[float] | str = vec
            if fmt == "base64":
                emb = base64.b64encode(struct.pack(f"<{len(vec)}f", *vec)).decode()
            data.append({"object": "embedding", "index": i, "embedding": emb})
        n = sum(len(t) for t in inputs)
        await send_json(
            send,
            200,
            {"object": "list", "data": data, "model": self.served_name, "usage": {"prompt_tokens": n, "total_tokens": n}},
        )

    async def _generate(self, req: GenRequest, priority: str, receive: Receive, send: Send) -> None:
        engine = self.loaded
        seq = await off_loop(engine.prepare, req, param="prompt")  # BadRequest → 400 before anything is sent
        seq.priority = priority
        shaper = Shaper(req.kind, self.served_name)
        output = engine.chat_output(req, seq.prompt, shaper)  # None: plain text, passed through as generated
        batcher = engine.batcher

        async def watch_disconnect() -> None:
            while True:
                msg = await receive()
                if msg["type"] == "http.disconnect":
                    batcher.cancel(seq)
                    seq.push("", FINISH_CANCELLED)
                    return

        watcher = asyncio.get_running_loop().create_task(watch_disconnect())
        if seq.max_new > 0 or seq.scores_prompt:  # scoring a prompt reads it even with max_tokens=0
            batcher.submit(seq)
        else:  # max_tokens=0: nothing to generate, no slot needed
            seq.free_samplers()
            seq.push("", FINISH_LENGTH)
        try:
            if req.stream:
                await self._stream(req, seq, shaper, send, output)
            else:
                parts: list[str] = []
                finish: str | None = None
                async for text, finish in seq.events():  # noqa: B007 - the last event's finish is read after the loop
                    parts.append(text)
                if finish == FINISH_CANCELLED:
                    return
                if finish == FINISH_ERROR:
                    raise WorkerError(f"generation failed: {seq.error}")
                if finish is None:  # the events end with a finish reason; an empty stream is a bug
                    raise WorkerError("generation ended without a finish reason")
                message = None
                if output is not None:
                    message, finish = output.message("".join(parts), finish)
                usage = usage_dict(
                    len(seq.prompt), seq.n_gen, seq.cached, output.reasoning_tokens(seq.n_gen) if output is not None else None
                )
                echo, lp = self._echo(req, seq), self._logprobs(req, seq)
                logprobs = None
                if lp is not None:
                    logprobs = lp.next() if echo is None else joined(lp.prompt(echo), lp.next())
                body = shaper.full(
                    (echo or "") + "".join(parts), finish, usage, message=message, logprobs=logprobs, stop_reason=seq.text.matched
                )
                await send({"type": "http.response.start", "status": 200, "headers": JSON_HEADERS})
                await send({"type": "http.response.body", "body": body})
        finally:
            watcher.cancel()
            if seq.finish is None or seq.finish == FINISH_CANCELLED:
                batcher.cancel(seq)

    async def _stream(self, req: GenRequest, seq: Sequence, shaper: Shaper, send: Send, output: ChatOutput | None) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": SSE_HEADERS})
        body = "http.response.body"
        if req.kind == "chat":
            await send({"type": body, "body": shaper.role_chunk(), "more_body": True})
        echo, lp = self._echo(req, seq), self._logprobs(req, seq)
        async for text, finish in seq.events():
            if echo is not None and finish not in (FINISH_CANCELLED, FINISH_ERROR):  # the prompt comes first
                await send({"type": body, "body": shaper.chunk(echo, lp.prompt(echo) if lp else None), "more_body": True})
                echo = None
            if finish is None:
                if output is None:
                    await send({"type": body, "body": shaper.chunk(text, lp.next() if lp else None), "more_body": True})
                elif chunks := output.chunks(text, lp.next() if lp else None):
                    await send({"type": body, "body": chunks, "more_body": True})
                continue
            if finish == FINISH_CANCELLED:
                return
            if finish == FINISH_ERROR:
                err = WorkerError(f"generation failed: {seq.error}")
                await send({"type": body, "body": sse(err.envelope()) + DONE})
                return
            if output is not None:
                out, finish = output.last_chunks(text, finish, lp.next() if lp is not None and (text or lp.pending()) else None)
            elif lp is not None and (text or lp.pending()):
                out = shaper.chunk(text, lp.next())
            else:
                out = shaper.chunk(text) if text else b""
            out += shaper.final_chunk(finish, seq.text.matched)
            if req.include_usage:
                reasoning = output.reasoning_tokens(seq.n_gen) if output is not None else None
                out += shaper.usage_chunk(usage_dict(len(seq.prompt), seq.n_gen, seq.cached, reasoning))
            await send({"type": body, "body": out + DONE})
            return

    def _echo(self, req: GenRequest, seq: Sequence) -> str | None:
        """The prompt an ``echo`` completion starts with: as sent, or the text of the token ids sent."""
        if not req.echo:
            return None
        return req.prompt_text if req.prompt_text is not None else self.loaded.model.detokenize(seq.prompt)

    def _logprobs(self, req: GenRequest, seq: Sequence) -> LogprobView | None:
        if seq.logprobs is None:
            return None
        return LogprobView(req.kind, seq.logprobs, self.loaded.model.piece)


_ROUTES = {
    "/v1/models": ("GET", WorkerApp.models),
    "/stats": ("GET", WorkerApp.stats),
    "/v1/completions": ("POST", WorkerApp.completions),
    "/v1/chat/completions": ("POST", WorkerApp.chat_completions),
    "/v1/embeddings": ("POST", WorkerApp.embeddings),
}


# -- process entry ------------------------------------------------------------------


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        prog="python -m appliance.drivers.llamacpp.worker", description="llama.cpp continuous-batching engine on a Unix socket"
    )
    ap.add_argument("--model", required=True, help="path of the GGUF file")
    ap.add_argument("--socket", required=True, help="Unix socket path to serve on (never TCP)")
    ap.add_argument("--served-name", required=True, help="model name reported by /v1/models and responses")
    ap.add_argument("--ctx", type=int, default=4096, help="context tokens per request (slot)")
    ap.add_argument("--parallel", type=int, default=4, help="concurrent sequences (slots)")
    ap.add_argument("--threads", type=int, default=max(1, (os.cpu_count() or 2) // 2))
    ap.add_argument("--n-gpu-layers", type=int, default=0)
    ap.add_argument("--batch-size", type=int, default=256, help="max tokens per decode step")
    ap.add_argument("--spec-ngram", type=int, default=0, help="prompt-lookup speculative n-gram size (0 = off)")
    ap.add_argument("--embedding", action="store_true", help="serve /v1/embeddings only")
    ap.add_argument(
        "--latency-targets",
        type=parse_targets,
        default=LatencyTargets(),
        help="TTFT and TPOT p95 targets per class, e.g. interactive:2:0.15,batch:30:0.5 (see latency.py)",
    )
    ap.add_argument(
        "--split-mode",
        choices=SPLIT_MODES,
        default="layer",
        help="how layers spread over the visible GPUs (none: all on --main-gpu)",
    )
    ap.add_argument("--main-gpu", type=int, default=0, help="visible GPU index for split-mode none")
    ap.add_argument(
        "--tensor-split", type=_fractions, default=(), help="comma-separated share of the layers per visible GPU (e.g. 0.6,0.4)"
    )
    ap.add_argument("--kv-type", choices=KV_CACHE_TYPES, default="f16", help="KV cache element type (K and V)")
    ap.add_argument("--flash-attn", choices=FLASH_ATTN_MODES, default="auto", help="flash attention kernel")
    ap.add_argument(
        "--swa-full", action=argparse.BooleanOptionalAction, default=True, help="full-size KV cache for sliding-window layers"
    )
    ap.add_argument(
        "--even-outputs",
        choices=EVEN_OUTPUT_MODES,
        default="auto",
        help="pad decodes keeping an odd number (3+) of logits rows to even: auto measures at load",
    )
    ap.add_argument(
        "--adapt-threads",
        choices=("on", "off"),
        default="on",
        help="measure fewer compute threads while other processes take the cores, keep the faster (see contention.py)",
    )
    ap.add_argument("--adapt-probe-s", type=float, default=5.0, help="seconds at fewer threads before one more is measured")
    ap.add_argument("--adapt-max-probe-s", type=float, default=60.0, help="longest wait before a trial after trials that lost")
    args = ap.parse_args(argv)
    for name in ("ctx", "parallel", "threads", "batch_size"):
        if getattr(args, name) < 1:
            ap.error(f"--{name.replace('_', '-')} must be at least 1")
    if args.spec_ngram < 0:
        ap.error("--spec-ngram must be 0 or more")
    if args.adapt_probe_s <= 0 or args.adapt_max_probe_s <= 0:
        ap.error("--adapt-probe-s and --adapt-max-probe-s must be more than 0")
    if args.main_gpu < 0:
        ap.error("--main-gpu must be 0 or more")
    if is_quantized_kv(args.kv_type) and args.flash_attn == "off":
        ap.error(f"--kv-type {args.kv_type} needs flash attention (--flash-attn on or auto)")
    return args


def _fractions(text: str) -> tuple[float, ...]:
    try:
        parts = tuple(float(x) for x in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a comma-separated list of numbers: {text!r}") from None
    if any(x < 0 for x in parts) or not any(parts):
        raise argparse.ArgumentTypeError("the shares must be non-negative and not all zero")
    return parts


async def serve(args: argparse.Namespace) -> int:
    import uvicorn

    _Server = server_class()

    app = WorkerApp(args.served_name)
    sock = bind_unix(args.socket)
    config = uvicorn.Config(app, http="httptools", lifespan="off", access_log=False, log_level="warning", timeout_keep_alive=30)
    server = _Server(config)
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, server.request_exit)
    serve_task = loop.create_task(server.serve(sockets=[sock]))
    cfg = WorkerConfig(
        model_path=args.model,
        served_name=args.served_name,
        ctx=args.ctx,
        parallel=args.parallel,
        threads=args.threads,
        n_gpu_layers=args.n_gpu_layers,
        batch_size=args.batch_size,
        spec_ngram=args.spec_ngram,
        embedding=args.embedding,
        gpu=GpuPlacement(split_mode=args.split_mode, main_gpu=args.main_gpu, tensor_split=args.tensor_split),
        kv=KvSettings(kv_type=args.kv_type, flash_attn=args.flash_attn, swa_full=args.swa_full),
        even_outputs=args.even_outputs,
        targets=args.latency_targets,
        contention=ContentionPolicy(
            enabled=args.adapt_threads == "on", probe_s=args.adapt_probe_s, max_probe_s=args.adapt_max_probe_s
        ),
    )
    try:
        engine = await loop.run_in_executor(None, WorkerEngine, cfg)
        try:  # the decode thread warms the context up: it alone computes graphs (see .context)
            await loop.run_in_executor(None, engine.start, loop)
        except BaseException:
            engine.close()
            raise
    except (ModelLoadError, DecodeFailure) as exc:
        print(f"llamacpp_worker: cannot load the model: {exc}", file=sys.stderr, flush=True)
        server.should_exit = True
        await serve_task
        unlink(args.socket)
        return 2
    app.engine = engine
    try:
        await serve_task
    finally:
        engine.close()
        unlink(args.socket)
    return 0


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvicorn[standard] brings it
        return asyncio.run(serve(args))
    return uvloop.run(serve(args))


if __name__ == "__main__":
    sys.exit(main())
