"""Gauges read at scrape time: free space of the data dir, budget use of the current windows, certificate expiry."""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable
from pathlib import Path

from sqlalchemy import Engine, bindparam, text

from appliance.db.engine import session
from appliance.metering.quotas import DIMENSIONS, Windows
from appliance.metrics import GaugeValue, Metrics
from appliance.tls.certinfo import CertInfo

BUDGETS = tuple(d for d in DIMENSIONS if d.budget)  # tokens_per_day, tokens_per_month, cost_per_month


def disk_gauges(path: Path) -> tuple[Callable[[], GaugeValue], Callable[[], GaugeValue]]:
    """Free and total bytes of the file system holding ``path`` (None while it cannot be read)."""

    def usage(field: str) -> GaugeValue:
        try:
            return float(getattr(shutil.disk_usage(path), field))
        except OSError:
            return None

    return (lambda: usage("free")), (lambda: usage("total"))


def budget_use(db: Engine, now: Callable[[], float] = time.time) -> dict[tuple[str, ...], float]:
    """Spent plus reserved over the limit, per (subject type, subject id, dimension), for each budget counter of the
    window now running (a day's or a month's tokens, a month's cost). A budget with no counter yet in this window has
    no series (it stands at 0)."""
    windows = Windows()
    t = now()
    starts = {d.name: windows.bounds(d.window, t)[0] for d in BUDGETS}
    query = text(
        "SELECT subject_type, subject_id, dimension, window_start, limit_value, spent + reserved FROM quota_counters "
        "WHERE dimension IN :dimensions AND window_start >= :oldest AND limit_value > 0"
    ).bindparams(bindparam("dimensions", expanding=True))
    params = {"dimensions": list(starts), "oldest": min(starts.values())}
    out: dict[tuple[str, ...], float] = {}
    with session(db) as s:
        for subject, subject_id, dimension, start, limit, used in s.execute(query, params):
            if start == starts.get(dimension):
                out[(subject, str(subject_id), dimension)] = float(used) / float(limit)
    return out


def register_box_gauges(metrics: Metrics, data_dir: Path, db: Engine) -> None:
    free, total = disk_gauges(data_dir)
    metrics.set_gauge_source(
        "data_dir_free_bytes", free, help="Bytes free on the file system of the data dir (models, database, backups)."
    )
    metrics.set_gauge_source("data_dir_size_bytes", total, help="Size in bytes of the file system of the data dir.")
    metrics.set_gauge_source(
        "budget_used_ratio",
        lambda: budget_use(db),
        help="Spent plus reserved over the limit of each budget in its current window (1 = the limit).",
        labels=("subject", "subject_id", "dimension"),
    )


def register_tls_gauge(metrics: Metrics, current: Callable[[], CertInfo | None]) -> None:
    """``appliance_tls_certificate_expiry_seconds``: when the certificate now served expires (Unix time)."""

    def expiry() -> GaugeValue:
        cert = current()
        return cert.not_after.timestamp() if cert is not None else None

    metrics.set_gauge_source(
        "tls_certificate_expiry_seconds", expiry, help="Expiry of the served TLS certificate, in seconds since the epoch."
    )
