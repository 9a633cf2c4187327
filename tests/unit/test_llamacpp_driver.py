"""The llama.cpp driver builds the worker's argv from a plan, purely."""

from __future__ import annotations

from types import SimpleNamespace

from appliance.drivers import get_driver
from appliance.drivers.llamacpp.driver import LlamaCppDriver, worker_command
from appliance.drivers.llamacpp.worker import parse_args


def _plan(**kw):
    base = dict(
        model_path="/store/m.gguf", context=4096, parallel=8, threads=2, n_gpu_layers=0, model="gemma3:270m", speculative=False
    )
    base.update(kw)
    return SimpleNamespace(**base)


def test_worker_command_round_trips_through_the_worker_parser():
    argv = worker_command(_plan(), "/run/e.sock", python="/py")
    assert argv[:3] == ["/py", "-m", "appliance.drivers.llamacpp.worker"]
    args = parse_args(argv[3:])
    assert (args.model, args.socket, args.served_name) == ("/store/m.gguf", "/run/e.sock", "gemma3:270m")
    assert (args.ctx, args.parallel, args.threads, args.n_gpu_layers) == (4096, 8, 2, 0)
    assert args.spec_ngram == 0 and not args.embedding


def test_speculative_and_embedding_flags():
    args = parse_args(worker_command(_plan(speculative=True, embedding=True, batch_size=512), "/s")[3:])
    assert args.spec_ngram > 0 and args.embedding and args.batch_size == 512


def test_never_tcp():
    argv = worker_command(_plan(), "/s")
    assert not any(a in argv for a in ("--host", "--port"))


def test_driver_protocol():
    d = get_driver("llamacpp")
    assert isinstance(d, LlamaCppDriver)
    assert d.health_path == "/health" and "/v1/chat/completions" in d.routes
    argv = d.command(_plan(), "/s")
    assert argv[argv.index("--n-gpu-layers") + 1] == "0"
    assert d.environment(_plan(), None)["OMP_NUM_THREADS"] == "2"
