"""Installed and loaded models in Ollama's shapes (``/api/tags``, ``/api/ps``, ``/api/show``). Pure: no I/O.

Names are the store's ``family:variant``, which reads as Ollama's ``name:tag``;
aliases (``default`` and those an admin defined) are listed under their own
name with the facts of the variant they point to.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime

from appliance.jsontypes import JsonObject
from appliance.planner.types import Plan
from appliance.store.variants import VariantInfo

#: The Ollama release whose API shapes ``/api/*`` follows, reported by ``/api/version``.
OLLAMA_API_VERSION = "0.12.0"


def rfc3339(timestamp: float) -> str:
    return datetime.fromtimestamp(timestamp, UTC).isoformat().replace("+00:00", "Z")


def parameter_size(count: int | None) -> str:
    """Ollama's short spelling of a parameter count: ``268.1M``, ``7.6B``."""
    if not count:
        return ""
    for unit, scale in (("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if count >= scale:
            return f"{count / scale:.1f}{unit}"
    return str(count)


def details(info: VariantInfo) -> JsonObject:
    facts = info.facts
    architecture = str(facts.get("architecture") or info.family)
    quantization = info.quantization or facts.get("file_type") or facts.get("quant_method") or ""
    return {
        "parent_model": info.parent or "",
        "format": info.format,
        "family": architecture,
        "families": [architecture],
        "parameter_size": parameter_size(facts.get("parameter_count")),
        "quantization_level": str(quantization).upper(),
    }


def _digest(info: VariantInfo) -> str:
    return info.sha256 or ""


def tag_entry(name: str, info: VariantInfo) -> JsonObject:
    """One ``/api/tags`` entry: ``name`` is what the client sends, ``info`` the installed variant it means."""
    return {
        "name": name,
        "model": name,
        "modified_at": rfc3339(info.created_at),
        "size": info.size_bytes,
        "digest": _digest(info),
        "details": details(info),
    }


def _vram_bytes(plan: Plan) -> int:
    return sum(m.weights + m.kv_cache + m.compute + m.overhead for m in plan.memory if m.device != "cpu")


def ps_entry(
    info: VariantInfo, plan: Plan, *, last_used_ago: float, idle_unload_seconds: int, pinned: bool, now: float | None = None
) -> JsonObject:
    """One ``/api/ps`` entry. ``expires_at`` is when idle unloading would stop it (absent: never)."""
    now = time.time() if now is None else now
    entry: JsonObject = {
        "name": info.name,
        "model": info.name,
        "size": plan.estimated_bytes,
        "digest": _digest(info),
        "details": details(info),
        "size_vram": _vram_bytes(plan),
        "context_length": plan.context,
    }
    if not pinned and idle_unload_seconds > 0:
        entry["expires_at"] = rfc3339(now - last_used_ago + idle_unload_seconds)
    return entry


def capabilities(info: VariantInfo) -> list[str]:
    """What the model can be asked for: text always; embeddings from llama.cpp; tools when its template takes them."""
    template = str(info.facts.get("chat_template") or "")
    found = ["completion"]
    if info.format == "gguf":
        found.append("embedding")
    if "tools" in template:
        found.append("tools")
    if "enable_thinking" in template or "reasoning_content" in template:
        found.append("thinking")
    return found


def model_info(info: VariantInfo) -> JsonObject:
    """GGUF-style metadata keys, as Ollama's ``model_info``, from the facts the store read from the file."""
    facts = info.facts
    architecture = str(facts.get("architecture") or info.family)
    keys = {
        "context_length": "context_length",
        "embedding_length": "n_embd",
        "block_count": "n_layer",
        "feed_forward_length": "n_ff",
        "attention.head_count": "n_head",
        "attention.head_count_kv": "n_head_kv",
        "attention.key_length": "head_dim",
        "attention.sliding_window": "sliding_window",
        "vocab_size": "n_vocab",
    }
    out: JsonObject = {"general.architecture": architecture}
    if facts.get("parameter_count"):
        out["general.parameter_count"] = facts["parameter_count"]
    for key, fact in keys.items():
        if facts.get(fact) is not None:
            out[f"{architecture}.{key}"] = facts[fact]
    return out


def show(info: VariantInfo) -> JsonObject:
    """``/api/show``: details, metadata, the chat template (``parameters`` and ``modelfile`` have no equivalent: empty)."""
    return {
        "license": "",
        "modelfile": "",
        "parameters": "",
        "template": str(info.facts.get("chat_template") or ""),
        "details": details(info),
        "model_info": model_info(info),
        "capabilities": capabilities(info),
        "modified_at": rfc3339(info.created_at),
    }
