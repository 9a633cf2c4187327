"""The ledger's live figures per window (5 min, 1 h, 1 day), read at most once per short period.

:class:`BoxFigures` runs :func:`appliance.metering.attainment.ledger_rows` for a window when its cached reading is
older than that window's refresh period (10 s for 5 min, 60 s for an hour, 5 min for a day), so a Prometheus scrape,
the console and the batch runner all share one bounded range query on ``ix_usage_created`` per period. It feeds the
``/metrics`` gauges (:func:`register_figure_gauges`), the console's overview and the batch runner's hold-back.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from sqlalchemy import Engine

from appliance.metering.attainment import WINDOWS, Attainment, attainment, class_share, ledger_rows
from appliance.metering.economics import Economics, OwnerRates, economics
from appliance.metrics import GaugeValue, Metrics
from appliance.settings import Settings

REFRESH_S = {"5m": 10.0, "1h": 60.0, "1d": 300.0}
HOLDBACK_WINDOW = "5m"


@dataclass(frozen=True, slots=True)
class WindowFigures:
    window: str
    read_at: float
    attainment: dict[tuple[str, str], Attainment]
    economics: Economics


class BoxFigures:
    def __init__(
        self,
        settings: Settings,
        db: Engine,
        capacity: Callable[[], Mapping[str, float]],
        clock: Callable[[], float] = time.time,
    ):
        self._settings = settings
        self._db = db
        self._capacity = capacity
        self._clock = clock
        self._lock = threading.Lock()
        self._cache: dict[str, WindowFigures] = {}

    def window(self, name: str) -> WindowFigures:
        """The figures of window ``name`` (a key of ``WINDOWS``), read afresh when the cached ones are stale."""
        now = self._clock()
        with self._lock:
            cached = self._cache.get(name)
            if cached is not None and now - cached.read_at < REFRESH_S[name]:
                return cached
            since = now - WINDOWS[name]
            rows = ledger_rows(self._db, since, now)
            figures = WindowFigures(
                name,
                now,
                attainment(rows, self._settings.latency_targets, since),
                economics(rows, since, now, OwnerRates.of(self._settings), self._capacity()),
            )
            self._cache[name] = figures
            return figures

    def interactive_attainment(self) -> float | None:
        """Share of the last 5 minutes' interactive requests within their targets (None: none counted)."""
        return class_share(self.window(HOLDBACK_WINDOW).attainment, "interactive")

    def all_windows(self) -> list[WindowFigures]:
        return [self.window(name) for name in WINDOWS]


def _per_class(figures: BoxFigures, read: Callable[[Attainment], float | None]) -> GaugeValue:
    out: dict[tuple[str, ...], float] = {}
    for w in figures.all_windows():
        for (model, klass), found in w.attainment.items():
            value = read(found)
            if value is not None:
                out[(model, klass, w.window)] = value
    return out or None


def _per_model(figures: BoxFigures, read: Callable[[Economics, str], float | None]) -> GaugeValue:
    out: dict[tuple[str, ...], float] = {}
    for w in figures.all_windows():
        for model in w.economics.models:
            value = read(w.economics, model)
            if value is not None:
                out[(model, w.window)] = value
    return out or None


def _per_window(figures: BoxFigures, read: Callable[[Economics], float | None]) -> GaugeValue:
    out = {w.window: value for w in figures.all_windows() if (value := read(w.economics)) is not None}
    return out or None


def register_figure_gauges(metrics: Metrics, figures: BoxFigures) -> None:
    def gauge(name: str, source: Callable[[], GaugeValue], help_: str, labels: tuple[str, ...]) -> None:
        metrics.set_gauge_source(name, source, help=help_, labels=labels)

    cls = ("model", "class", "window")
    gauge(
        "latency_target_attainment",
        lambda: _per_class(figures, lambda a: a.share),
        "Share of engine-answered requests within both latency targets of their class (TTFT and TPOT), by window.",
        cls,
    )
    gauge(
        "latency_target_requests",
        lambda: _per_class(figures, lambda a: float(a.requests)),
        "Requests the attainment share counts, by window.",
        cls,
    )
    gauge("ttft_p95_seconds", lambda: _per_class(figures, lambda a: a.ttft_p95_s), "TTFT p95 by model, class, window.", cls)
    gauge("tpot_p95_seconds", lambda: _per_class(figures, lambda a: a.tpot_p95_s), "TPOT p95 by model, class, window.", cls)
    gauge(
        "engine_utilization_ratio",
        lambda: _per_model(figures, lambda e, m: e.models[m].utilisation),
        "Share of the window at least one request was in flight on the model's engine (from the ledger).",
        ("model", "window"),
    )
    gauge(
        "cost_per_million_tokens",
        lambda: _per_model(figures, lambda e, m: e.models[m].cost_per_million),
        "Owner cost (box_cost_per_hour and energy) per million completion tokens, split by busy time; set costs to see it.",
        ("model", "window"),
    )
    gauge(
        "box_cost_per_million_tokens",
        lambda: _per_window(figures, lambda e: e.cost_per_million),
        "The box's owner cost per million completion tokens produced in the window.",
        ("window",),
    )
    gauge(
        "tokens_produced",
        lambda: _per_window(figures, lambda e: float(e.tokens)),
        "Completion tokens produced in the window (1h: per hour, 1d: per day).",
        ("window",),
    )
    gauge(
        "headroom_tokens_per_second",
        lambda: (
            {m: v for m, e in figures.window(HOLDBACK_WINDOW).economics.models.items() if (v := e.headroom_tps) is not None}
            or None
        ),
        "Decode tokens/s a loaded model could still add: the planner's aggregate speed x (1 - utilisation over 5 min).",
        ("model",),
    )


def figures_json(figures: BoxFigures) -> dict[str, object]:
    """Every window's figures as JSON (``GET /admin/usage/box``)."""
    out: dict[str, object] = {}
    for w in figures.all_windows():
        e = w.economics
        out[w.window] = {
            "seconds": e.seconds,
            "tokens_produced": e.tokens,
            "energy_joules": e.energy_joules,
            "owner_cost": e.cost,
            "owner_cost_per_million": e.cost_per_million,
            "interactive_attainment": class_share(w.attainment, "interactive"),
            "models": {
                m: {
                    "tokens_produced": x.tokens,
                    "busy_s": x.busy_s,
                    "utilisation": x.utilisation,
                    "owner_cost_per_million": x.cost_per_million,
                    "headroom_tps": x.headroom_tps,
                }
                for m, x in e.models.items()
            },
            "attainment": [
                {
                    "model": model,
                    "class": klass,
                    "requests": a.requests,
                    "within": a.within,
                    "share": a.share,
                    "ttft_p95_s": a.ttft_p95_s,
                    "tpot_p95_s": a.tpot_p95_s,
                }
                for (model, klass), a in sorted(w.attainment.items())
            ],
        }
    return out
