"""Numbers for the overview: host/GPU telemetry series and live serving figures.

Serving figures come from the usage ledger (the system of record), so they are
right after a restart and agree with the usage page: requests/s and tokens/s
over the last minute, a per-minute token series for the sparkline, TTFT
percentiles and the cache hit rate over the last hour.
"""

from __future__ import annotations

import logging
import time

from sqlalchemy import Engine, text

from appliance.cache.responses import ResponseCache
from appliance.hardware.telemetry import sample_telemetry
from appliance.jsontypes import JsonObject, JsonValue
from appliance.metrics import Metrics
from appliance.serving.router import Router

log = logging.getLogger("appliance.webui")

SERIES_POINTS = 60  # telemetry samples per sparkline (5 min at one sample per 5 s)
STALE_AFTER_S = 8.0


def telemetry(metrics: Metrics) -> list[JsonObject]:
    """Recent telemetry samples, oldest first; takes a fresh one if the scheduler has not lately."""
    history = metrics.telemetry_history()
    if not history or time.time() - float(history[-1].get("t", 0)) > STALE_AFTER_S:
        try:
            sample_telemetry(metrics)
            history = metrics.telemetry_history()
        except Exception:  # telemetry is a nicety; the page must render without it
            log.debug("telemetry sample failed", exc_info=True)
    return history[-SERIES_POINTS:]


def _pct(used: JsonValue, total: JsonValue) -> float | None:
    if used is None or not total:
        return None
    return 100.0 * float(used) / float(total)


def host_card(samples: list[JsonObject]) -> JsonObject | None:
    if not samples:
        return None
    last = samples[-1]
    return {
        "cpu_percent": last.get("cpu_percent"),
        "memory_used": last.get("memory_used_bytes"),
        "memory_total": last.get("memory_total_bytes"),
        "cpu_series": [s.get("cpu_percent") for s in samples],
        "memory_series": [_pct(s.get("memory_used_bytes"), s.get("memory_total_bytes")) for s in samples],
    }


def gpu_cards(samples: list[JsonObject]) -> list[JsonObject]:
    if not samples:
        return []
    cards = []
    for gpu in samples[-1].get("gpus") or []:
        index = gpu.get("index")

        def series(field: str, index: JsonValue = index) -> list[JsonValue]:
            return [next((g.get(field) for g in (s.get("gpus") or []) if g.get("index") == index), None) for s in samples]

        used, total = series("memory_used_bytes"), series("memory_total_bytes")
        cards.append(
            {
                "index": index,
                "name": gpu.get("name") or f"GPU {index}",
                "utilization": gpu.get("utilization_percent"),
                "memory_used": gpu.get("memory_used_bytes"),
                "memory_total": gpu.get("memory_total_bytes"),
                "temperature": gpu.get("temperature_celsius"),
                "power": gpu.get("power_watts"),
                "util_series": series("utilization_percent"),
                "memory_series": [_pct(u, t) for u, t in zip(used, total, strict=True)],
                "temp_series": series("temperature_celsius"),
                "power_series": series("power_watts"),
            }
        )
    return cards


def _percentile(sorted_values: list[float], q: float) -> float | None:
    if not sorted_values:
        return None
    index = min(len(sorted_values) - 1, max(0, round(q * (len(sorted_values) - 1))))
    return sorted_values[index]


def serving(db: Engine, now: float | None = None) -> JsonObject:
    """Requests/s and tokens/s (last minute), TTFT p50/p95 and cache hit rate (last hour), tokens per minute.

    TTFT is the engine's: streamed answers that an engine generated (cache replays would pull it towards zero).
    """
    now = time.time() if now is None else now
    with db.connect() as conn:
        minute = conn.execute(
            text(
                "SELECT count(*), coalesce(sum(prompt_tokens + completion_tokens), 0), coalesce(sum(completion_tokens), 0)"
                " FROM usage WHERE created_at >= :since"
            ),
            {"since": now - 60},
        ).one()
        hour = conn.execute(
            text(
                "SELECT count(*), coalesce(sum(cache_tier != 'miss'), 0), coalesce(sum(status >= 400), 0)"
                " FROM usage WHERE created_at >= :since"
            ),
            {"since": now - 3600},
        ).one()
        ttfts = [
            r[0]
            for r in conn.execute(
                text(
                    "SELECT ttft_ms FROM usage WHERE created_at >= :since AND ttft_ms IS NOT NULL AND status < 400 AND "
                    "cache_tier = 'miss'"
                    " ORDER BY ttft_ms LIMIT 100000"
                ),
                {"since": now - 3600},
            )
        ]
        per_minute: dict[int, int] = dict(
            conn.execute(
                text(
                    "SELECT CAST((:now - created_at) / 60 AS INTEGER) AS ago, sum(completion_tokens) FROM usage"
                    " WHERE created_at >= :since GROUP BY ago"
                ),
                {"now": now, "since": now - 30 * 60},
            ).all()
        )
    requests_hour = int(hour[0] or 0)
    return {
        "requests_per_s": (minute[0] or 0) / 60.0,
        "tokens_per_s": float(minute[1] or 0) / 60.0,
        "completion_tokens_per_s": float(minute[2] or 0) / 60.0,
        "requests_hour": requests_hour,
        "errors_hour": int(hour[2] or 0),
        "cache_hit_rate": (100.0 * int(hour[1] or 0) / requests_hour) if requests_hour else None,
        "ttft_p50": _percentile(ttfts, 0.50),
        "ttft_p95": _percentile(ttfts, 0.95),
        "tokens_series": [float(per_minute.get(i, 0) or 0) / 60.0 for i in range(29, -1, -1)],
    }


def instances(router: Router) -> list[JsonObject]:
    out = []
    for instance in list(router.instances.values()):
        try:
            out.append(instance.summary())
        except Exception:  # an engine mid-restart must not break the page
            out.append({"model": instance.name, "state": "unknown", "pinned": instance.pinned})
    return sorted(out, key=lambda s: s["model"])


def cache_stats(cache: ResponseCache) -> JsonObject | None:
    """The response cache's figures, or None when they cannot be read (the page renders without them)."""
    try:
        return cache.stats()
    except Exception:
        log.debug("cache stats failed", exc_info=True)
        return None
