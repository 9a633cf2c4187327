"""What ``appliancectl doctor|plan`` and ``/admin/hardware|plan`` share.

Gathers the planner's inputs (hardware, software, preferences from settings,
variants from the store, the catalog or a local file) and shapes the answers as
JSON-able dicts. The planner itself stays pure; the I/O is here.
"""

from __future__ import annotations

import asyncio
import logging
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

from sqlalchemy import Engine

from appliance.catalog import ArchFacts, Catalog, CatalogVariant, load_catalog
from appliance.errors import DoesNotFit, ModelNotFound
from appliance.hardware import Finding, HardwareSnapshot, detect_hardware, detect_software, software_findings
from appliance.hardware.ray_cluster import ClusterView, describe, read_cluster
from appliance.hardware.software import SoftwareInfo, with_offload_probe
from appliance.hardware.units import GiB
from appliance.jsontypes import JsonObject
from appliance.modelfacts import ModelFacts, inspect_gguf, inspect_hf
from appliance.planner.calibration import load_calibrations
from appliance.planner.plan import CalibrationPoint, Plan, Preferences, Variant, plan, plan_all
from appliance.planner.types import PlanRow
from appliance.settings import Settings
from appliance.store.hub.pulls import Candidate, Chooser
from appliance.store.store import ModelStore
from appliance.store.variants import VariantInfo

SEVERITY_ORDER = {"error": 0, "warning": 1, "info": 2}
SNAPSHOT_TTL_S = 5.0
CLUSTER_TTL_S = 60.0
"""How long a read of the Ray cluster is reused (it is read at start-up and when a plan is made)."""
_cache: dict[str, tuple[float, HardwareSnapshot]] = {}
_clusters: dict[tuple[str, str], ClusterView] = {}
_cluster_lock = threading.Lock()
_refreshing: set[tuple[str, str]] = set()
log = logging.getLogger("appliance.planner")


def live_snapshot(max_age: float = SNAPSHOT_TTL_S) -> HardwareSnapshot:
    """This box's hardware, re-detected at most every ``max_age`` seconds (free memory moves)."""
    hit = _cache.get("snapshot")
    if hit is None or time.monotonic() - hit[0] > max_age:
        hit = (time.monotonic(), detect_hardware())
        _cache["snapshot"] = hit
    return hit[1]


def _on_event_loop() -> bool:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


def _read_cluster(key: tuple[str, str], max_age: float) -> ClusterView:
    with _cluster_lock:  # one read at a time; a second caller takes the first one's answer
        hit = _clusters.get(key)
        if hit is not None and time.time() - hit.read_at <= max_age:
            return hit
        view = read_cluster(*key)
        _clusters[key] = view
    if hit is None or (hit.error, hit.nodes, hit.local) != (view.error, view.nodes, view.local):
        if view.error:
            log.warning("%s; plans use this box's GPUs only", describe(view))
        else:
            log.info(describe(view))
    return view


def _refresh(key: tuple[str, str]) -> None:
    try:
        _read_cluster(key, 0.0)
    finally:
        _refreshing.discard(key)


def cluster_view(settings: Settings, max_age: float = CLUSTER_TTL_S) -> ClusterView | None:
    """The Ray cluster at ``ray_address`` (None when unset), read at most every ``max_age`` seconds.

    Read by the vLLM environment's Python (``vllm_python``, else the appliance's own). On the
    daemon's event loop it never blocks: a stale or missing read is refreshed in a thread and
    the last one answers meanwhile (None before the first). Never raises.
    """
    if not settings.ray_address:
        return None
    key = (settings.ray_address, str(settings.vllm_python or sys.executable))
    hit = _clusters.get(key)
    if hit is not None and time.time() - hit.read_at <= max_age:
        return hit
    if _on_event_loop():
        if key not in _refreshing:
            _refreshing.add(key)
            threading.Thread(target=_refresh, args=(key,), name="ray-cluster-read", daemon=True).start()
        return hit
    return _read_cluster(key, max_age)


def cluster_findings(settings: Settings, view: ClusterView | None) -> list[Finding]:
    """What ``doctor`` says about the cluster: its nodes, or why it could not be read."""
    if not settings.ray_address:
        return []
    if view is None:
        return [Finding("ray", "info", f"Ray cluster at {settings.ray_address}: being read")]
    if view.error:
        return list(view.all_findings())
    return [Finding("ray", "info", describe(view)), *view.all_findings()]


def software(settings: Settings) -> SoftwareInfo:
    return detect_software(settings.vllm_python)


def preferences_for(settings: Settings, sw: SoftwareInfo, ctx: int | None = None, parallel: int | None = None) -> Preferences:
    """Planner preferences from the settings, with optional ``--ctx``/``--parallel`` overrides."""
    return Preferences(
        min_context=ctx or settings.engine_context,
        parallel=parallel or settings.engine_parallel,
        memory_margin=int(settings.memory_margin_gib * GiB),
        vllm_available=sw.vllm_available,
        llamacpp_gpu=sw.llamacpp_gpu,
        ray_address=settings.ray_address,
        cluster=view.nodes if (view := cluster_view(settings)) is not None else (),
        backend=settings.backend,
        threads=settings.engine_threads,
        memory_budget=int(settings.memory_budget_gib * GiB) if settings.memory_budget_gib else None,
        speculative_ngram=settings.speculative_ngram,
        kv_cache_dtype=settings.engine_kv_cache_type,
        min_decode_tps=settings.min_decode_tokens_per_s,
    )


def hardware_report(settings: Settings, snapshot: HardwareSnapshot | None = None) -> JsonObject:
    """The doctor's answer: snapshot, software, and every finding (errors first) with its fix."""
    snap = snapshot or detect_hardware()
    sw = with_offload_probe(software(settings))
    view = cluster_view(settings)
    findings = sorted(
        [*snap.findings, *software_findings(sw, snap), *cluster_findings(settings, view)],
        key=lambda f: SEVERITY_ORDER.get(f.severity, 3),
    )
    return {
        "hardware": snap.to_dict(),
        "cluster": view.to_dict() if view is not None else None,
        "software": {
            "llamacpp_version": sw.llamacpp_version,
            "llamacpp_gpu_backends": list(sw.llamacpp_backends),
            "llamacpp_flavour": sw.engine_flavour,
            "llamacpp_gpu_offload": sw.gpu_offload,
            "vllm_available": sw.vllm_available,
            "vllm_version": sw.vllm_version,
        },
        "findings": [f.__dict__ for f in findings],
        "ok": not any(f.severity == "error" for f in findings),
    }


def variants_from_path(path: Path) -> list[Variant]:
    """One variant from a local GGUF file or Hugging Face folder (inspected, never loaded)."""
    if path.is_dir():
        facts = inspect_hf(path)
        family = path.name.lower()
    else:
        facts = inspect_gguf(path)
        family = path.stem.lower()
    quant = facts.file_type or facts.quant_method
    name = (quant or "default").lower()
    size = path.stat().st_size if path.is_file() else (facts.tensor_bytes or 0)
    return [Variant(family, name, facts.format, quant, size, facts, str(path))]


def facts_from_catalog(variant: CatalogVariant, f: ArchFacts) -> ModelFacts:
    """Planner facts from a catalog variant and its published architecture numbers (the same names)."""
    swa = f.n_layer - f.n_layer // f.sliding_window_pattern if f.sliding_window and f.sliding_window_pattern else 0
    return ModelFacts(
        format=variant.format,
        architecture=f.architecture,
        n_layer=f.n_layer,
        n_embd=f.n_embd,
        n_head=f.n_head,
        n_head_kv=f.n_head_kv,
        head_dim=f.head_dim,
        context_length=f.context_length,
        sliding_window=f.sliding_window,
        swa_layers=swa,
        n_vocab=f.n_vocab,
        n_expert=f.n_expert,
        n_expert_used=f.n_expert_used,
        file_type=variant.quantization,
        parameter_count=f.parameter_count,
    )


def split_name(name: str) -> tuple[str, str | None]:
    family, _, variant = name.partition(":")
    return family, variant or None


def variants_from_catalog(name: str, catalog: Catalog | None = None) -> list[Variant]:
    """Variants of a catalog family (or the one named ``family:variant``); [] when unknown."""
    if catalog is None:
        catalog = load_catalog()
    family_name, variant_name = split_name(name)
    family = catalog.family(family_name)
    if family is None:
        return []
    return [
        Variant(family.name, v.name, v.format, v.quantization, v.size_bytes, facts_from_catalog(v, v.facts), "")
        for v in family.variants
        if variant_name in (None, v.name) and v.facts is not None
    ]


def variants_from_store(store: ModelStore, name: str) -> list[Variant]:
    """Ready installed variants of the family (or the one named) that carry inspected facts."""
    family_name, variant_name = split_name(name)
    out = []
    for info in store.list():
        if info.family != family_name or info.status != "ready" or variant_name not in (None, info.variant):
            continue
        facts = info.model_facts
        if facts is not None:
            out.append(Variant(info.family, info.variant, info.format, info.quantization, info.size_bytes, facts, info.path))
    return out


def variants_of_available(infos: Sequence[VariantInfo]) -> list[Variant]:
    """Planner variants of the ``available`` ones among ``infos``: the architecture read from a ready GGUF variant
    of the same family (one repository, many quantizations: the shape holds for all), the quantization and listed
    size of each. One without a ready sibling to read it from is left out."""
    shapes = {i.family: i.model_facts for i in infos if i.status == "ready" and i.format == "gguf" and i.model_facts}
    out = []
    for info in infos:
        facts = shapes.get(info.family)
        if info.available and facts is not None:
            shaped = replace(facts, file_type=info.quantization, tensor_bytes=None, nonlayer_bytes=None)
            out.append(Variant(info.family, info.variant, "gguf", info.quantization, info.size_bytes, shaped, ""))
    return out


def available_fits(settings: Settings, db: Engine, infos: Sequence[VariantInfo]) -> dict[str, PlanRow]:
    """``family:variant`` → the planner's row for each ``available`` variant, planned alone on this box as pulling
    and loading it would be; {} when the planner cannot answer."""
    variants = variants_of_available(infos)
    if not variants:
        return {}
    try:
        snapshot, prefs = live_snapshot(), preferences_for(settings, software(settings))
        calibrations = load_calibrations(db)
        return {f"{v.family}:{v.name}": plan_all(snapshot, [v], prefs, calibrations)[0] for v in variants}
    except Exception:  # a fit is advice: a planner failure must not hide the list
        log.debug("planning the available variants failed", exc_info=True)
        return {}


def resolve_variants(name: str, *, store: ModelStore | None = None, catalog: Catalog | None = None) -> list[Variant]:
    """Installed variants first, else the catalog's; raises ModelNotFound."""
    found = variants_from_store(store, name) if store is not None else []
    found = found or variants_from_catalog(name, catalog)
    if not found:
        raise ModelNotFound(f"The model `{name}` is neither installed nor in the catalog.", param="model")
    return found


def plan_report(
    snapshot: HardwareSnapshot, variants: Sequence[Variant], prefs: Preferences, calibrations: Sequence[CalibrationPoint] = ()
) -> JsonObject:
    """The plan table: the decision (plan or refusal) and one row per variant."""
    decision = plan(snapshot, variants, prefs, calibrations)
    rows = plan_all(snapshot, variants, prefs, calibrations)
    reads = [v for (address, _), v in _clusters.items() if address == prefs.ray_address] if prefs.ray_address else []
    view = max(reads, key=lambda v: v.read_at) if reads else None
    if view is not None and view.error:  # say it where the decision is read, not only in the log
        decision = replace(decision, reason=f"{decision.reason} (this box only: {describe(view)})")
    return {
        "model": variants[0].family if variants else None,
        "context": prefs.min_context,
        "parallel": prefs.parallel,
        "min_decode_tps": prefs.min_decode_tps,
        "plan": decision.to_dict() if isinstance(decision, Plan) else None,
        "refusal": None if isinstance(decision, Plan) else decision.to_dict(),
        "rows": [r.to_dict() for r in rows],
        "cluster": view.to_dict() if view is not None else None,
    }


def hub_chooser(settings: Settings, db: Engine) -> Chooser:
    """The planner's choice among a hub repository's GGUF variants for this box, with its reason."""

    def choose(family: str, candidates: Sequence[Candidate]) -> tuple[str, str]:
        variants = [Variant(family, c.name, "gguf", c.quantization, c.size_bytes, c.facts) for c in candidates]
        decision = plan(live_snapshot(), variants, preferences_for(settings, software(settings)), load_calibrations(db))
        if not isinstance(decision, Plan):
            raise DoesNotFit(f"no variant of {family} fits this box: {decision.to_dict()['reason']}", param="url")
        return decision.variant.rpartition(":")[2], decision.reason

    return choose
