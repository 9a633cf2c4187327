"""The ledger's live figures per window (5 min, 1 h, 1 day), read at most once per short period.

:class:`BoxFigures` runs :func:`appliance.metering.attainment.ledger_rows` for a window when its cached reading is
older than ``MIN_REFRESH_S`` (10 s) and than ``1 / READ_SHARE`` (50) times what its last read took, so reading the
ledger costs at most about 2% of a core per window however many rows it holds (a day of 100,000 requests, read in
~0.65 s, is re-read every ~33 s; a quiet box's every 10 s). The scheduler's :meth:`BoxFigures.refresh` (every 10 s,
in a worker thread), the console and the admin API share those reads, one bounded range query on
``ix_usage_created`` each. The ``/metrics`` gauges (:func:`register_figure_gauges`) and the batch
runner's hold-back run on the event loop: they read only what is cached, never the database.
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

MIN_REFRESH_S = 10.0
READ_SHARE = 0.02  # most of a core's time reading one window may take
HOLDBACK_WINDOW = "5m"


@dataclass(frozen=True, slots=True)
class WindowFigures:
    window: str
    read_at: float
    read_cost_s: float
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
        self._locks = {name: threading.Lock() for name in WINDOWS}  # a day's slow read never holds up the 5 minutes'
        self._cache: dict[str, WindowFigures] = {}

    def window(self, name: str) -> WindowFigures:
        """The figures of window ``name`` (a key of ``WINDOWS``), read afresh when the cached ones are stale."""
        with self._locks[name]:
            now = self._clock()
            cached = self._cache.get(name)
            if cached is not None and now - cached.read_at < max(MIN_REFRESH_S, cached.read_cost_s / READ_SHARE):
                return cached
            started = time.perf_counter()
            since = now - WINDOWS[name]
            rows = ledger_rows(self._db, since, now)
            found = attainment(rows, self._settings.latency_targets, since)
            money = economics(rows, since, now, OwnerRates.of(self._settings), self._capacity())
            figures = WindowFigures(name, now, time.perf_counter() - started, found, money)
            self._cache[name] = figures
            return figures

    def refresh(self) -> None:
        """Read every window whose figures are stale (the scheduler calls this off the event loop)."""
        for name in WINDOWS:
            self.window(name)

    def cached(self, name: str) -> WindowFigures | None:
        """The last figures read of window ``name``, without touching the database (None before the first read)."""
        return self._cache.get(name)

    def interactive_attainment(self) -> float | None:
        """Share of the last 5 minutes' interactive requests within their targets (None: none counted, or not read yet).
        Never reads the database: the batch runner asks on the event loop."""
        figures = self.cached(HOLDBACK_WINDOW)
        return class_share(figures.attainment, "interactive") if figures is not None else None

    def all_windows(self) -> list[WindowFigures]:
        """Every window, read afresh where stale (for callers off the event loop: the console, the admin API)."""
        return [self.window(name) for name in WINDOWS]

    def all_cached(self) -> list[WindowFigures]:
        """Every window read so far, as last read (for /metrics, whose scrape runs on the event loop)."""
        return [found for name in WINDOWS if (found := self.cached(name)) is not None]


def _per_class(figures: BoxFigures, read: Callable[[Attainment], float | None]) -> GaugeValue:
    out: dict[tuple[str, ...], float] = {}
    for w in figures.all_cached():
        for (model, klass), found in w.attainment.items():
            value = read(found)
            if value is not None:
                out[(model, klass, w.window)] = value
    return out or None


def _per_model(figures: BoxFigures, read: Callable[[Economics, str], float | None]) -> GaugeValue:
    out: dict[tuple[str, ...], float] = {}
    for w in figures.all_cached():
        for model in w.economics.models:
            value = read(w.economics, model)
            if value is not None:
                out[(model, w.window)] = value
    return out or None


def _per_window(figures: BoxFigures, read: Callable[[Economics], float | None]) -> GaugeValue:
    out = {w.window: value for w in figures.all_cached() if (value := read(w.economics)) is not None}
    return out or None


def _headroom(figures: WindowFigures | None) -> GaugeValue:
    if figures is None:
        return None
    return {m: v for m, e in figures.economics.models.items() if (v := e.headroom_tps) is not None} or None


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
        lambda: _headroom(figures.cached(HOLDBACK_WINDOW)),
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
