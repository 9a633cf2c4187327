"""Lower-bit GGUF variants from a higher-precision one, with libllama's quantizer.

The quantizer runs in a child process (``python -m appliance.store.quantize``): native
code that crashes takes only the child down, and cancelling a job kills it. The
child reports progress as JSON lines on stdout (one per tensor, from libllama's
log), the parent turns them into job progress and registers the result through
the store's one install path (hash, inspect, fsync, rename) with its parent
variant recorded.

Sources must be F32, F16 or BF16 (or Q8_0, re-quantized with
``allow_requantize``): quantizing an already low-bit file again compounds the
error, and libllama refuses it by default.
"""

from __future__ import annotations

import ctypes
import json
import re
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

from appliance.errors import BadRequest
from appliance.jsontypes import JsonObject
from appliance.store.errors import QuantizeFailed
from appliance.store.jobs import JobContext
from appliance.store.variants import ResolvedVariant, VariantInfo

# Target name → (llama_cpp ftype constant name, approximate bits per weight)
TARGETS: dict[str, tuple[str, float]] = {
    "f16": ("LLAMA_FTYPE_MOSTLY_F16", 16.0),
    "bf16": ("LLAMA_FTYPE_MOSTLY_BF16", 16.0),
    "q8_0": ("LLAMA_FTYPE_MOSTLY_Q8_0", 8.5),
    "q6_k": ("LLAMA_FTYPE_MOSTLY_Q6_K", 6.56),
    "q5_k_m": ("LLAMA_FTYPE_MOSTLY_Q5_K_M", 5.7),
    "q5_k_s": ("LLAMA_FTYPE_MOSTLY_Q5_K_S", 5.5),
    "q5_0": ("LLAMA_FTYPE_MOSTLY_Q5_0", 5.5),
    "q4_k_m": ("LLAMA_FTYPE_MOSTLY_Q4_K_M", 4.85),
    "q4_k_s": ("LLAMA_FTYPE_MOSTLY_Q4_K_S", 4.6),
    "q4_0": ("LLAMA_FTYPE_MOSTLY_Q4_0", 4.5),
    "q3_k_l": ("LLAMA_FTYPE_MOSTLY_Q3_K_L", 4.3),
    "q3_k_m": ("LLAMA_FTYPE_MOSTLY_Q3_K_M", 3.9),
    "q3_k_s": ("LLAMA_FTYPE_MOSTLY_Q3_K_S", 3.5),
    "q2_k": ("LLAMA_FTYPE_MOSTLY_Q2_K", 3.0),
}
SOURCE_BITS = {"f32": 32.0, "f16": 16.0, "bf16": 16.0, "q8_0": 8.5}
_TENSOR_LINE = re.compile(r"\[\s*(\d+)\s*/\s*(\d+)\s*\]")


def targets_for(source: VariantInfo) -> list[str]:
    """The targets :func:`check_request` accepts for ``source`` (smaller than its precision); none for a non-GGUF or low-bit "
    "one."""
    src = (source.quantization or "").lower()
    if source.format != "gguf" or src not in SOURCE_BITS:
        return []
    return [name for name, (_ftype, bits) in TARGETS.items() if bits < SOURCE_BITS[src]]


def check_request(source: VariantInfo, to: str) -> str:
    """The target name, or BadRequest explaining why this quantization cannot be made."""
    target = (to or "").lower()
    if target not in TARGETS:
        raise BadRequest(f"unknown target {to!r}; choose one of {', '.join(TARGETS)}", param="to", code="invalid_quantization")
    if source.format != "gguf":
        raise BadRequest("only GGUF variants can be quantized here", param="name", code="invalid_quantization")
    src = (source.quantization or "").lower()
    if src not in SOURCE_BITS:
        raise BadRequest(
            f"`{source.name}` is {source.quantization or 'of unknown precision'}; quantize from an F32, F16, BF16 "
            "or Q8_0 variant",
            param="name",
            code="invalid_quantization",
        )
    if TARGETS[target][1] >= SOURCE_BITS[src]:
        raise BadRequest(f"{target} is not smaller than the source's {src}", param="to", code="invalid_quantization")
    return target


def quantized_writer(source: ResolvedVariant, target: str, *, threads: int, ctx: JobContext) -> Callable[[Path], None]:
    """The store's ``write(partial)`` for a quantization of ``source`` to ``target`` (a checked request)."""
    src_path = source.file
    assert src_path is not None
    requantize = (source.quantization or "").lower() == "q8_0"

    def write(partial: Path) -> None:
        run_quantizer(src_path, partial, target, threads=threads, allow_requantize=requantize, ctx=ctx, total=source.size_bytes)

    return write


def run_quantizer(
    src: Path, dst: Path, target: str, *, threads: int, allow_requantize: bool, ctx: JobContext, total: int
) -> None:
    """Run the child quantizer; progress in source bytes (tensor i of n ≈ i/n of the file)."""
    ctx.stage(f"quantizing to {target}")
    cmd = [
        sys.executable,
        "-m",
        "appliance.store.quantize",
        str(src),
        str(dst),
        target,
        str(threads),
        "1" if allow_requantize else "0",
    ]
    with tempfile.TemporaryFile() as errors:
        proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=errors, text=True)
        ctx.attach_process(proc)
        result: JsonObject = {}
        try:
            assert proc.stdout is not None
            for line in proc.stdout:
                try:
                    msg = json.loads(line)
                except ValueError:
                    continue
                if "tensor" in msg:
                    ctx.progress(int(total * msg["tensor"] / max(1, msg["of"])), total)
                else:
                    result = msg
            rc = proc.wait()
        finally:
            ctx.attach_process(None)
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        ctx.check_cancelled()
        if rc != 0 or not result.get("ok"):
            errors.seek(0)
            detail = result.get("error") or errors.read()[-500:].decode(errors="replace").strip() or f"exit status {rc}"
            raise QuantizeFailed(f"quantization to {target} failed: {detail}")


# ------------------------------------------------------------------ the child
def _child(src: str, dst: str, target: str, threads: int, allow_requantize: bool) -> int:
    import llama_cpp

    problems: list[str] = []

    def emit(obj: JsonObject) -> None:
        sys.stdout.write(json.dumps(obj) + "\n")
        sys.stdout.flush()

    @llama_cpp.llama_log_callback
    def on_log(level: int, text: bytes, _user: ctypes.c_void_p) -> None:
        line = text.decode("utf-8", errors="replace")
        match = _TENSOR_LINE.match(line.lstrip())
        if match:
            emit({"tensor": int(match.group(1)), "of": int(match.group(2))})
        elif level in (3, 4) and line.strip():  # GGML_LOG_LEVEL_WARN / _ERROR
            problems.append(line.strip())

    llama_cpp.llama_log_set(on_log, ctypes.c_void_p(0))
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = getattr(llama_cpp, TARGETS[target][0])
    params.nthread = threads
    params.allow_requantize = allow_requantize
    rc = llama_cpp.llama_model_quantize(src.encode(), dst.encode(), ctypes.byref(params))
    if rc != 0:
        emit({"ok": False, "error": (problems[-1] if problems else f"llama_model_quantize returned {rc}")[:500]})
        return 1
    emit({"ok": True})
    return 0


if __name__ == "__main__":
    if len(sys.argv) != 6:
        raise SystemExit("usage: python -m appliance.store.quantize SRC DST TARGET THREADS ALLOW_REQUANTIZE")
    raise SystemExit(_child(sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5] == "1"))
