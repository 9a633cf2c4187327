"""The fit planner: which variant, which backend, which devices. Pure: no I/O.

``plan(snapshot, variants, preferences, calibrations=()) -> Plan | Refusal``

Rules, in order (each choice carries a one-line reason):

1. vLLM, when a GPU it supports is present (NVIDIA compute capability >= 7.0, or
   AMD with ROCm), a safetensors variant exists and vLLM is installed: the
   highest-quality such variant that fits, at the smallest tensor-parallel size
   (Ray pipeline stages across nodes when ``ray_address`` and the cluster's
   snapshots are given).
2. llama.cpp, the highest-quality GGUF variant that fits entirely on the GPU(s).
3. llama.cpp partial offload: the highest-quality variant with at least half its
   layers on the GPU(s), else the one with the largest share there.
4. CPU: the highest-quality variant that fits in RAM with the margin (vLLM's CPU
   backend only when ``backend="vllm"`` is asked for).
5. Otherwise a :class:`Refusal` that says what would be needed.

Speed: every placement that fits gets a decode and prompt speed estimate
(:mod:`appliance.planner.speed`). With an interactive floor (``min_decode_tps``),
the first placement in the order above whose decode rate per stream, at
``parallel`` streams, reaches the floor is chosen; when none does, the fastest.

Measured loads (``calibrations``) correct the estimate of the same
(family:variant, backend) at the nearest context; measured decode speeds correct
the speed estimates (:func:`appliance.planner.speed.speed_correction`).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace

from appliance.errors import BadRequest
from appliance.hardware.snapshot import HardwareSnapshot
from appliance.planner.common import (
    TIER_CPU,
    TIER_FULL_GPU,
    TIER_PARTIAL,
    TIER_VLLM,
    Attempt,
    gib,
    gpu_groups,
    llamacpp_gpus,
)
from appliance.planner.llamacpp import cpu_only, full_gpu, llamacpp_context, llamacpp_flash_attn, partial
from appliance.planner.quality import meets_floor, quality_key, quantization_of
from appliance.planner.speed import Speed, decode_curve, estimate_speed, speed_correction, speed_text
from appliance.planner.types import (
    CalibrationPoint,
    DeviceMemory,
    Plan,
    PlanRow,
    Preferences,
    Refusal,
    Variant,
)
from appliance.planner.vllm import vllm_context, vllm_cpu, vllm_gpu

__all__ = ["CalibrationPoint", "DeviceMemory", "Plan", "PlanRow", "Preferences", "Refusal", "Variant", "plan", "plan_all"]

TIER_WORDS = {TIER_VLLM: "on vLLM", TIER_FULL_GPU: "fully on GPU", TIER_PARTIAL: "partly on GPU", TIER_CPU: "on CPU"}
PARTIAL_MIN_SHARE = 0.5


@dataclass
class _Eval:
    variant: Variant
    attempts: list[Attempt] = field(default_factory=list)
    blocked: str | None = None
    calibrated: int | None = None
    speeds: dict[int, Speed] = field(default_factory=dict)
    """Speed estimate of each fitting attempt, by ``id(attempt)``."""


def _correction(v: Variant, backend: str, context: int, calibrations: Sequence[CalibrationPoint]) -> int | None:
    """Measured minus estimated bytes of the nearest-context load of this variant and backend."""
    same = [c for c in calibrations if c.variant_key == v.key and c.backend == backend and c.measured_bytes > 0]
    if not same:
        return None
    near = min(same, key=lambda c: (abs(c.context - context), -c.context))
    return near.measured_bytes - near.estimated_bytes


def _evaluate(v: Variant, snapshot: HardwareSnapshot, prefs: Preferences, calibrations: Sequence[CalibrationPoint]) -> _Eval:
    e = _Eval(v)
    if not meets_floor(v, prefs.quality_floor):
        e.blocked = f"below the quality floor {prefs.quality_floor}"
        return e
    if v.format == "safetensors":
        if prefs.backend == "llamacpp":
            e.blocked = "safetensors needs vLLM; backend llamacpp was asked"
        elif not prefs.vllm_available:
            e.blocked = "safetensors needs vLLM, which is not installed"
        else:
            extra = _correction(v, "vllm", vllm_context(v, prefs)[0], calibrations)
            e.calibrated = extra
            attempt = vllm_gpu(v, snapshot, prefs, extra or 0)
            if attempt is None and prefs.backend == "vllm":
                attempt = vllm_cpu(v, snapshot, prefs, extra or 0)
            if attempt is None:
                e.blocked = (
                    "vLLM needs an NVIDIA GPU of compute capability >= 7.0 or an AMD GPU with ROCm (backend=vllm uses its CPU "
                    "backend)"
                )
            else:
                e.attempts.append(attempt)
        return _with_speeds(e, snapshot, prefs, calibrations)
    if v.format != "gguf":
        e.blocked = f"unsupported format {v.format}"
        return e
    if prefs.backend == "vllm":
        e.blocked = "GGUF runs on llama.cpp; backend vllm was asked"
        return e
    extra = _correction(v, "llamacpp", llamacpp_context(v, prefs)[0], calibrations)
    e.calibrated = extra
    groups = gpu_groups(llamacpp_gpus(snapshot, prefs))
    for gpus in groups:
        e.attempts.append(full_gpu(v, snapshot, prefs, gpus, extra or 0))
        if e.attempts[-1].fits:
            break
    if groups and not any(a.fits for a in e.attempts):
        partials = [partial(v, snapshot, prefs, gpus, extra or 0) for gpus in groups]
        fitting = [a for a in partials if a.fits]
        e.attempts.append(max(fitting, key=lambda a: a.gpu_fraction) if fitting else partials[-1])
    e.attempts.append(cpu_only(v, snapshot, prefs, extra or 0))
    if prefs.memory_budget is not None:
        e.attempts = [_within_budget(a, prefs.memory_budget) for a in e.attempts]
    return _with_speeds(e, snapshot, prefs, calibrations)


def _with_speeds(e: _Eval, snapshot: HardwareSnapshot, prefs: Preferences, calibrations: Sequence[CalibrationPoint]) -> _Eval:
    for a in e.attempts:
        if a.fits:
            speed = estimate_speed(a, snapshot, prefs, speed_correction(a.variant.key, a.backend, calibrations))
            if speed is not None:
                e.speeds[id(a)] = speed
    return e


def _within_budget(a: Attempt, budget: int) -> Attempt:
    total = sum(m.used for m in a.memory)
    if not a.fits or total <= budget:
        return a
    return Attempt(
        a.variant,
        a.backend,
        a.tier,
        False,
        a.memory,
        f"needs {gib(total)} > the memory budget {gib(budget)}",
        a.placement,
        a.context,
    )


def _best(e: _Eval) -> Attempt | None:
    return next((a for a in e.attempts if a.fits), None)


def _preference_order(evals: list[_Eval]) -> list[Attempt]:
    """Every fitting placement, most wanted first: vLLM, all layers on GPU, a partial offload with
    at least half the layers on GPU (then by GPU share), CPU; by quality within each."""
    fits = [a for e in evals for a in e.attempts if a.fits]
    partials = [a for a in fits if a.tier == TIER_PARTIAL]
    return [
        *(a for a in fits if a.tier == TIER_VLLM),
        *(a for a in fits if a.tier == TIER_FULL_GPU),
        *(a for a in partials if a.gpu_fraction >= PARTIAL_MIN_SHARE),
        *sorted((a for a in partials if a.gpu_fraction < PARTIAL_MIN_SHARE), key=lambda a: -a.gpu_fraction),
        *(a for a in fits if a.tier == TIER_CPU),
    ]


def _speeds(evals: list[_Eval]) -> dict[int, Speed]:
    return {k: s for e in evals for k, s in e.speeds.items()}


def _choose(evals: list[_Eval], floor: float = 0.0) -> Attempt | None:
    """The first placement in preference order that decodes at ``floor`` tokens/s per stream; else the fastest."""
    order = _preference_order(evals)
    if not order or floor <= 0:
        return order[0] if order else None
    speeds = _speeds(evals)
    rate = {id(a): speeds[id(a)].decode_tps if id(a) in speeds else 0.0 for a in order}
    return next((a for a in order if rate[id(a)] >= floor), None) or max(order, key=lambda a: rate[id(a)])


def _slow(e: _Eval, chosen: Attempt, speeds: dict[int, Speed], floor: float) -> str | None:
    """``would decode ~6 tok/s per stream at 8 streams < the 10 tok/s floor`` for a better variant passed over for speed."""
    best = _best(e)
    s = speeds.get(id(best)) if best is not None else None
    if best is None or s is None or floor <= 0 or s.decode_tps >= floor or quality_key(e.variant) >= quality_key(chosen.variant):
        return None
    at = f" per stream at {s.streams} streams" if s.streams > 1 else ""
    return f"would decode ~{s.decode_tps:.1f} tok/s{at} {TIER_WORDS[best.tier]} < the {floor:g} tok/s floor"


def _why_not(e: _Eval, chosen: Attempt, speeds: dict[int, Speed] | None = None, floor: float = 0.0) -> str:
    if e.blocked:
        return e.blocked
    slow = _slow(e, chosen, speeds or {}, floor)
    if slow:
        return slow
    best = _best(e)
    if best is None:
        first = e.attempts[0].summary
        cpu = e.attempts[-1]
        if cpu is not e.attempts[0] and cpu.tier == TIER_CPU and cpu.backend == "llamacpp":
            return f"{first}; on CPU {cpu.summary}"
        return first
    if best.tier > chosen.tier:
        missed = f"{e.attempts[0].summary}; " if e.attempts[0] is not best else ""
        return f"{missed}fits only {TIER_WORDS[best.tier]} ({best.placement})"
    return f"fits {TIER_WORDS[best.tier]} too, but {quantization_of(chosen.variant)} ranks higher"


def _ordered(variants: Iterable[Variant]) -> list[Variant]:
    return sorted(variants, key=quality_key)


def _check(prefs: Preferences) -> None:
    if prefs.parallel < 1 or prefs.min_context < 1:
        raise BadRequest("context and parallel must be at least 1")
    if prefs.backend not in ("auto", "llamacpp", "vllm"):
        raise BadRequest(f"unknown backend {prefs.backend!r} (auto, llamacpp, vllm)")


def _to_plan(a: Attempt, e: _Eval, evals: list[_Eval], snapshot: HardwareSnapshot, prefs: Preferences) -> Plan:
    v = a.variant
    speeds, floor = _speeds(evals), prefs.min_decode_tps
    rejected = tuple((o.variant.name, _why_not(o, a, speeds, floor)) for o in evals if o.variant is not v)
    better = [o for o in evals if o.variant is not v and quality_key(o.variant) < quality_key(v) and not o.blocked]
    # Name the best variant that lost, or, when speed decided, the next better one that was too slow.
    slow = [o for o in better if _slow(o, a, speeds, floor)]
    above = slow[-1] if slow else next(iter(better), None)
    speed = e.speeds.get(id(a))
    reason = a.summary
    if e.calibrated:
        reason += f" (calibrated {'+' if e.calibrated > 0 else '-'}{gib(abs(e.calibrated))} from a measured load)"
    if speed is not None:
        reason += f", {speed_text(speed)}"
    if above is not None:
        reason += f"; {quantization_of(above.variant) or above.variant.name} {_why_not(above, a, speeds, floor)}"
    if speed is not None and floor > 0 and speed.decode_tps < floor:
        reason += f"; nothing that fits reaches the {floor:g} tok/s floor per stream, so the fastest is chosen"
    f = a.fields
    return Plan(
        model=v.key,
        variant=v.name,
        backend=a.backend,
        model_path=v.path,
        context=a.context,
        parallel=prefs.parallel,
        threads=f.get("threads"),
        n_gpu_layers=f.get("n_gpu_layers", 0),
        devices=tuple(f.get("devices", ("cpu",))),
        tensor_parallel_size=f.get("tensor_parallel_size", 1),
        pipeline_parallel_size=f.get("pipeline_parallel_size", 1),
        kv_cache_dtype=f.get("kv_cache_dtype", "f16"),
        gpu_memory_utilization=f.get("gpu_memory_utilization"),
        quantization=quantization_of(v) or None,
        estimated_bytes=sum(m.used for m in a.memory),
        memory=a.memory,
        reason=reason,
        rejected=rejected,
        distributed_executor=f.get("distributed_executor"),
        tensor_split=tuple(f.get("tensor_split", ())),
        calibration_bytes=e.calibrated or 0,
        swa_full=f.get("swa_full", True),
        speculative=prefs.speculative_ngram and a.backend == "llamacpp",
        flash_attn=llamacpp_flash_attn(f.get("kv_cache_dtype", "f16")) if a.backend == "llamacpp" else "auto",
        decode_tps=round(speed.decode_tps, 2) if speed else None,
        aggregate_tps=round(speed.aggregate_tps, 2) if speed else None,
        prompt_tps=round(speed.prompt_tps, 1) if speed else None,
        speed_correction=speed.correction if speed else 1.0,
        decode_curve=decode_curve(a, snapshot, prefs) if speed else (),
    )


def _refusal(
    model: str, evals: list[_Eval], snapshot: HardwareSnapshot, prefs: Preferences, calibrations: Sequence[CalibrationPoint]
) -> Refusal:
    live = [e for e in evals if not e.blocked and e.attempts]
    rejected = tuple((e.variant.name, _why_not(e, e.attempts[0]) if e.attempts else e.blocked or "") for e in evals)
    if not live:
        return Refusal(model, "no variant can run here: " + "; ".join(f"{n}: {w}" for n, w in rejected), (), rejected)
    smallest = min(live, key=lambda e: e.variant.size_bytes)
    needed = []
    for a in smallest.attempts:
        if a.memory and a.tier in (TIER_VLLM, TIER_FULL_GPU, TIER_CPU):
            short = min(a.memory, key=lambda m: m.headroom)
            where = "RAM" if short.device == "cpu" else f"memory on {short.device}"
            needed.append(f"{gib(short.used + prefs.memory_margin)} of free {where} (have {gib(short.free)})")
    ctx = prefs.min_context // 2
    while ctx >= 512:
        retry = _evaluate(smallest.variant, snapshot, replace(prefs, min_context=ctx), calibrations)
        if _best(retry):
            needed.append(f"a context of {ctx} tokens or less (--ctx {ctx})")
            break
        ctx //= 2
    reason = (
        f"nothing fits; the smallest, {quantization_of(smallest.variant) or smallest.variant.name}, "
        f"{smallest.attempts[0].summary}"
    )
    return Refusal(model, reason, tuple(needed), rejected)


def plan(
    snapshot: HardwareSnapshot,
    variants: Sequence[Variant],
    preferences: Preferences,
    calibrations: Sequence[CalibrationPoint] = (),
) -> Plan | Refusal:
    """Choose variant, backend and placement for one model, or refuse with what is needed.

    ``variants`` are the variants of one family (their ``family`` names the model).
    Pure and deterministic: same inputs, same answer.
    """
    _check(preferences)
    if not variants:
        return Refusal("?", "the model has no variants")
    evals = [_evaluate(v, snapshot, preferences, calibrations) for v in _ordered(variants)]
    chosen = _choose(evals, preferences.min_decode_tps)
    model = variants[0].family
    if chosen is None:
        return _refusal(model, evals, snapshot, preferences, calibrations)
    e = next(x for x in evals if x.variant is chosen.variant)
    return _to_plan(chosen, e, evals, snapshot, preferences)


def plan_all(
    snapshot: HardwareSnapshot,
    variants: Sequence[Variant],
    preferences: Preferences,
    calibrations: Sequence[CalibrationPoint] = (),
) -> tuple[PlanRow, ...]:
    """One row per variant, best quality first: fits or not, how, why, and the memory breakdown."""
    _check(preferences)
    evals = [_evaluate(v, snapshot, preferences, calibrations) for v in _ordered(variants)]
    floor = preferences.min_decode_tps
    chosen = _choose(evals, floor)
    speeds = _speeds(evals)
    rows = []
    for e in evals:
        v = e.variant
        a = chosen if chosen is not None and chosen.variant is v else _best(e)
        shown = a or (e.attempts[0] if e.attempts else None)
        speed = speeds.get(id(a)) if a is not None else None
        summary = f"{a.summary}, {speed_text(speed)}" if a is not None and speed is not None else a.summary if a else ""
        if e.blocked or shown is None:
            reason = e.blocked or "no placement"
        elif a is not None:
            reason = summary if chosen is None or a is chosen else f"{summary}; not chosen: {_why_not(e, chosen, speeds, floor)}"
        else:
            reason = _why_not(e, shown)
        rows.append(
            PlanRow(
                variant=v.name,
                format=v.format,
                quantization=quantization_of(v) or None,
                size_bytes=v.size_bytes,
                fits=a is not None,
                chosen=a is not None and a is chosen,
                backend=shown.backend if shown else None,
                placement=shown.placement if shown else "-",
                reason=reason,
                estimated_bytes=sum(m.used for m in shown.memory) if shown else 0,
                memory=shown.memory if shown else (),
                decode_tps=round(speed.decode_tps, 2) if speed else None,
                prompt_tps=round(speed.prompt_tps, 1) if speed else None,
            )
        )
    return tuple(rows)
