"""The overview's "targets and token cost" block: latency-target attainment per model and class, engine utilisation,
tokens produced, what a token costs the owner and the headroom left, from :class:`BoxFigures` (cached ledger reads)."""

from __future__ import annotations

from appliance.metering.attainment import WINDOWS
from appliance.metering.box_figures import HOLDBACK_WINDOW, BoxFigures
from appliance.settings import Settings
from appliance.webui.render import TemplateContext

COST_WINDOW = "1h"


def _pct(share: float | None) -> str:
    return "-" if share is None else f"{share * 100:.1f}%"


def _secs(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value * 1000:.0f} ms" if value < 1 else f"{value:.2f} s"


def _money(value: float | None, currency: str) -> str:
    return "-" if value is None else f"{value:.4f} {currency}"


def economics_context(figures: BoxFigures, settings: Settings) -> TemplateContext:
    windows = figures.all_windows()
    share = figures.interactive_attainment()
    attainment = []
    for w in windows:
        for (model, klass), found in sorted(w.attainment.items()):
            target = settings.latency_targets.get(klass) or {}  # type: ignore[call-overload]
            attainment.append(
                {
                    "window": w.window,
                    "model": model,
                    "class": klass,
                    "requests": found.requests,
                    "attainment": _pct(found.share),
                    "below": settings.batch_holdback_attainment > 0 and found.share < settings.batch_holdback_attainment,
                    "ttft_p95": _secs(found.ttft_p95_s),
                    "tpot_p95": _secs(found.tpot_p95_s),
                    "targets": f"{_secs(target.get('ttft_p95_s'))} / {_secs(target.get('tpot_p95_s'))}",
                }
            )
    by_name = {w.window: w for w in windows}
    cost_window, now_window = by_name[COST_WINDOW].economics, by_name[HOLDBACK_WINDOW].economics
    models = []
    for model, mine in cost_window.models.items():
        recent = now_window.models.get(model)
        models.append(
            {
                "model": model,
                "tokens": mine.tokens,
                "utilisation": _pct(mine.utilisation),
                "cost_per_million": _money(mine.cost_per_million, settings.currency),
                "headroom": "-" if recent is None or recent.headroom_tps is None else f"{recent.headroom_tps:.0f} tok/s",
            }
        )
    return {
        "windows": list(WINDOWS),
        "attainment": attainment,
        "models": models,
        "tokens_per_hour": by_name["1h"].economics.tokens,
        "tokens_per_day": by_name["1d"].economics.tokens,
        "cost_per_million_1h": _money(cost_window.cost_per_million, settings.currency),
        "cost_per_million_1d": _money(by_name["1d"].economics.cost_per_million, settings.currency),
        "cost_known": settings.box_cost_per_hour > 0 or settings.energy_price_per_kwh > 0,
        "interactive_now": _pct(share),
        "holding_back": share is not None and share < settings.batch_holdback_attainment,
    }
