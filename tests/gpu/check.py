"""The GPU host check (run by tests/gpu/check.sh, by hand, on a machine with a GPU; CI never runs it).

1. ``appliancectl doctor --json``: GPUs, llama.cpp flavour, whether the library offloads.
2. ``appliancectl plan`` for the default model and a catalog model: variant, placement, estimated speed.
3. A real daemon in a temporary data dir loads the default model, which must be fully offloaded;
   then streamed completions at 1 and 8 streams: measured tokens/s beside the plan's estimate, and
   the engine's measured memory (process tree RSS + GPU memory through NVML) beside the estimate.
4. The daemon stops (which stores the measured decode speed) and the stored calibration is printed.

Exit status 0 when every step passed, 1 otherwise. Uses only the appliance's own dependencies.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

GiB = 1 << 30
CATALOG_MODEL = "llama-3.2-1b-instruct"
STREAMS = (1, 8)
NEW_TOKENS = 128


class Check:
    """Collects the outcome of each step and prints it as it goes."""

    def __init__(self) -> None:
        self.failed: list[str] = []

    def ok(self, what: str) -> None:
        print(f"  ok    {what}", flush=True)

    def fail(self, what: str) -> None:
        self.failed.append(what)
        print(f"  FAIL  {what}", flush=True)

    def expect(self, condition: bool, what: str) -> bool:
        (self.ok if condition else self.fail)(what)
        return condition


def appliancectl(*args: str, env: dict[str, str]) -> tuple[int, str]:
    done = subprocess.run([sys.executable, "-m", "appliance.cli", *args], env=env, capture_output=True, text=True, timeout=120)
    return done.returncode, done.stdout if done.stdout.strip() else done.stderr


def doctor(check: Check, env: dict[str, str]) -> None:
    print("== doctor", flush=True)
    _, out = appliancectl("doctor", "--json", env=env)
    report = json.loads(out)
    gpus = report["hardware"]["gpus"]
    for g in gpus:
        print(
            f"  GPU{g['index']}: {g['name']} ({g['vendor']}), {g['memory_free'] / GiB:.1f} of {g['memory_total'] / GiB:.1f} GiB "
            "free"
        )
    sw = report["software"]
    print(
        f"  llama-cpp-python {sw['llamacpp_version']}, flavour {sw.get('llamacpp_flavour')}, "
        f"GPU offload {sw.get('llamacpp_gpu_offload')}",
        flush=True,
    )
    for f in report["findings"]:
        print(f"  {f['severity']:<7} {f['component']}: {f['message']}" + (f" (fix: {f['fix']})" if f.get("fix") else ""))
    check.expect(bool(gpus), "a GPU is detected")
    check.expect(sw.get("llamacpp_gpu_offload") is True, "llama.cpp offloads to the GPU (llama_supports_gpu_offload)")


def show_plan(check: Check, model: str, env: dict[str, str]) -> None:
    print(f"== plan {model}", flush=True)
    code, out = appliancectl("plan", model, "--json", env=env)
    if not check.expect(code in (0, 2), f"appliancectl plan {model} answers"):
        print(out)
        return
    report = json.loads(out)
    p = report["plan"]
    if p is None:
        print(f"  does not fit: {report['refusal']['reason']}")
        return
    print(
        f"  {p['model']} on {p['backend']}, devices {p['devices']}, n_gpu_layers {p['n_gpu_layers']}, "
        f"estimate {p['estimated_bytes'] / GiB:.2f} GiB, decode ~{p['decode_tps']} tok/s per stream at "
        f"{p['parallel']} streams, prompt ~{p['prompt_tps']} tok/s"
    )
    print(f"  reason: {p['reason']}", flush=True)


def default_model() -> str:
    from appliance.settings import Settings

    return str(Settings.model_fields["default_model"].default)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_daemon(data_dir: Path, env: dict[str, str], timeout: float = 180.0) -> tuple[subprocess.Popen, str]:
    port = free_port()
    env = {
        **env,
        "APPLIANCE_PORT": str(port),
        "APPLIANCE_HOST": "127.0.0.1",
        "APPLIANCE_ENGINE_PARALLEL": str(max(STREAMS)),
        "APPLIANCE_ENGINE_CONTEXT": "4096",
        "APPLIANCE_LOG_FORMAT": "text",
        "APPLIANCE_CACHE_ENABLED": "false",
    }  # every request must reach the engine
    log = (data_dir.parent / "daemon.log").open("ab")
    proc = subprocess.Popen(
        [sys.executable, "-m", "appliance.daemon"], env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
    )
    url, sock = f"http://127.0.0.1:{port}", data_dir / "run" / "admin.sock"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the daemon exited with {proc.returncode}; see {data_dir.parent / 'daemon.log'}")
        try:
            if httpx.get(url + "/readyz", timeout=1.0).status_code == 200 and sock.exists():
                return proc, url
        except httpx.HTTPError:
            pass
        time.sleep(0.3)
    proc.kill()
    raise RuntimeError(f"the daemon was not ready within {timeout:.0f} s")


async def stream_once(client: httpx.AsyncClient, prompt: str) -> tuple[int, float]:
    """Tokens of one streamed completion and its seconds from the request to the last token (a short
    prompt, so nearly all of it is decoding)."""
    body = {
        "model": "default",
        "prompt": prompt,
        "max_tokens": NEW_TOKENS,
        "temperature": 0,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    started, last, tokens = time.perf_counter(), None, 0
    async with client.stream("POST", "/v1/completions", json=body) as r:
        r.raise_for_status()
        async for line in r.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            event = json.loads(line[6:])
            if event.get("usage"):
                tokens = event["usage"]["completion_tokens"]
            if event.get("choices"):
                last = time.perf_counter()
    return tokens, (last - started) if last else 0.0


async def measure(url: str, key: str, streams: int) -> tuple[float, float]:
    """Per-stream and aggregate decode tokens/s with ``streams`` concurrent streamed completions."""
    async with httpx.AsyncClient(base_url=url, headers={"Authorization": f"Bearer {key}"}, timeout=300) as client:
        started = time.perf_counter()
        results = await asyncio.gather(*(stream_once(client, f"Story number {i}: once upon a time") for i in range(streams)))
        wall = time.perf_counter() - started
    per_stream = sum(t / s for t, s in results if s > 0) / max(1, len(results))
    return per_stream, sum(t for t, _ in results) / wall


def engine_memory(pid: int) -> tuple[int, int | None]:
    from appliance.planner.calibration import gpu_bytes_of, process_tree_pids, rss_of

    pids = process_tree_pids(pid)
    return rss_of(pids), gpu_bytes_of(pids)


def load_and_measure(check: Check, env: dict[str, str], base: Path) -> None:
    print("== load the default model on a real daemon", flush=True)
    data_dir = base / "data"
    env = {**env, "APPLIANCE_DATA_DIR": str(data_dir)}
    proc, url = start_daemon(data_dir, env)
    try:
        admin = httpx.Client(
            transport=httpx.HTTPTransport(uds=str(data_dir / "run" / "admin.sock")), base_url="http://appliance", timeout=300
        )
        key = admin.post("/admin/keys/", json={"name": "gpu-check"}).raise_for_status().json()["secret"]
        plan = admin.get("/admin/plan", params={"model": default_model()}).raise_for_status().json()["plan"]
        started = time.perf_counter()
        instance = admin.post("/admin/instances/default/load").raise_for_status().json()
        print(
            f"  loaded in {time.perf_counter() - started:.1f} s: {plan['model']} on {plan['devices']}, "
            f"n_gpu_layers {plan['n_gpu_layers']}, KV {plan['kv_cache_dtype']}, flash attention {plan['flash_attn']}"
        )
        check.expect(
            plan["n_gpu_layers"] == -1 and all(d != "cpu" for d in plan["devices"]),
            "the default model is planned fully offloaded",
        )
        # Warm up once, then measure.
        asyncio.run(measure(url, key, 1))
        curve = plan.get("decode_curve") or []
        for n in STREAMS:
            per_stream, aggregate = asyncio.run(measure(url, key, n))
            estimate = curve[n - 1] if len(curve) >= n else None
            shown = f"{estimate:.0f}" if estimate else "-"
            print(
                f"  {n} stream(s): {per_stream:.1f} tok/s per stream, {aggregate:.1f} in all (estimated {shown} per stream)",
                flush=True,
            )
            check.expect(per_stream > 0, f"{n} stream(s) decode")
        rss, gpu = engine_memory(instance["pid"])
        measured = rss + (gpu or 0)
        print(
            f"  memory: estimated {plan['estimated_bytes'] / GiB:.2f} GiB, measured {measured / GiB:.2f} GiB "
            f"(RSS {rss / GiB:.2f} + GPU {(gpu or 0) / GiB:.2f}; GPU bytes "
            f"{'from NVML' if gpu is not None else 'not measurable'})"
        )
        for row in plan["memory"]:
            used = row["weights"] + row["kv_cache"] + row["compute"] + row["overhead"]
            print(f"    {row['device']}: estimated {used / GiB:.2f} GiB of {row['free'] / GiB:.1f} GiB free")
        check.expect(gpu is not None and gpu > 0, "the engine holds GPU memory")
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
    from appliance.db.engine import make_engine
    from appliance.planner.calibration import calibration_report, load_calibrations

    db = make_engine(data_dir / "appliance.db")
    for row in calibration_report(load_calibrations(db)):
        print(f"  calibration: {json.dumps(row)}")
    db.dispose()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--catalog-model", default=CATALOG_MODEL, help="catalog model to plan besides the default one")
    args = ap.parse_args(argv)
    check = Check()
    env = {k: v for k, v in os.environ.items() if not k.startswith("APPLIANCE_")}
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="appliance-gpu-check-") as tmp:
        base = Path(tmp)
        env["APPLIANCE_DATA_DIR"] = str(base / "plan-data")
        doctor(check, env)
        show_plan(check, default_model(), env)
        show_plan(check, args.catalog_model, env)
        try:
            load_and_measure(check, env, base)
        except (RuntimeError, httpx.HTTPError) as exc:
            check.fail(f"load and measure: {exc}")
            log = base / "daemon.log"
            if log.exists():
                print(log.read_text(errors="replace")[-4000:])
    print(f"== {'PASSED' if not check.failed else 'FAILED: ' + '; '.join(check.failed)} in {time.monotonic() - started:.0f} s")
    return 0 if not check.failed else 1


if __name__ == "__main__":
    sys.exit(main())
