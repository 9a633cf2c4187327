"""Template rendering for the console: one Jinja2 environment, autoescape always on.

The console renders its own templates (it does not need the app's template
engine): ``page()`` for full pages, ``partial()`` for htmx fragments. Every value
a template prints is HTML-escaped unless a filter below returns ``Markup`` built
from escaped parts (the SVG charts). Model names, chat templates and any other
metadata from model files are therefore always shown as text.
"""

from __future__ import annotations

import datetime as dt
import time
from pathlib import Path
from typing import Any

from jinja2 import Environment, FileSystemLoader, StrictUndefined
from litestar import MediaType, Request, Response

from appliance import __version__
from appliance.accounts.labels import key_label
from appliance.store.quantize import targets_for
from appliance.webui import charts
from appliance.webui.context import ROLE_RANK, console_user, csrf_for

TEMPLATES = Path(__file__).parent / "templates"

#: What a page or partial hands its template: names to values of any type, read by Jinja2 only.
TemplateContext = dict[str, Any]

NAV = (
    ("overview", "/", "Overview", "viewer"),
    ("models", "/models", "Models", "viewer"),
    ("playground", "/playground", "Playground", "operator"),
    ("keys", "/keys", "Keys & teams", "viewer"),
    ("usage", "/usage", "Usage", "viewer"),
    ("requests", "/requests", "Requests", "operator"),
    ("batches", "/batches", "Batches", "viewer"),
    ("alerts", "/alerts", "Alerts", "viewer"),
    ("cache", "/cache", "Cache", "viewer"),
    ("prices", "/prices", "Prices", "viewer"),
    ("aliases", "/aliases", "Aliases", "viewer"),
    ("users", "/users", "Users", "admin"),
    ("settings", "/settings", "Settings", "viewer"),
    ("audit", "/audit", "Audit log", "viewer"),
)


def human_bytes(value: float | None) -> str:
    if value is None:
        return "–"
    n = float(value)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"  # pragma: no cover


def human_number(value: float | None, digits: int = 1) -> str:
    if value is None:
        return "–"
    n = float(value)
    for unit, size in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(n) >= size:
            return f"{n / size:.{digits}f}{unit}"
    return f"{n:.0f}" if n == int(n) else f"{n:.{digits}f}"


def timestamp(value: float | None) -> str:
    if not value:
        return "–"
    return dt.datetime.fromtimestamp(float(value), dt.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def ago(value: float | None) -> str:
    if not value:
        return "–"
    seconds = max(0, time.time() - float(value))
    for unit, size in (("d", 86400), ("h", 3600), ("min", 60)):
        if seconds >= size:
            return f"{seconds / size:.0f} {unit} ago"
    return f"{seconds:.0f} s ago"


def percent(value: float | None, digits: int = 0) -> str:
    return "–" if value is None else f"{float(value):.{digits}f}%"


def _environment() -> Environment:
    env = Environment(
        loader=FileSystemLoader(str(TEMPLATES)),
        autoescape=True,
        undefined=StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters.update(bytes=human_bytes, num=human_number, ts=timestamp, ago=ago, pct=percent)
    env.globals.update(
        sparkline=charts.sparkline,
        bars=charts.bars,
        hbar=charts.meter,
        timechart=charts.time_chart,
        version=__version__,
        quantize_targets=targets_for,
        key_label=key_label,
    )
    return env


_ENV: Environment | None = None


def environment() -> Environment:
    global _ENV
    if _ENV is None:
        _ENV = _environment()
    return _ENV


def render(name: str, **context: object) -> str:
    return environment().get_template(name).render(**context)


def _common(request: Request, active: str | None) -> dict[str, object]:
    user = console_user(request)
    rank = ROLE_RANK.get(user.role, -1) if user else -1
    nav = [item for item in NAV if rank >= ROLE_RANK[item[3]]]
    return {
        "user": user,
        "csrf": csrf_for(request),
        "nav": nav,
        "active": active,
        "can_operate": rank >= ROLE_RANK["operator"],
        "is_admin": rank >= ROLE_RANK["admin"],
        "now_ts": time.time(),
    }


def page(
    request: Request,
    name: str,
    *,
    active: str | None = None,
    status: int = 200,
    headers: dict[str, str] | None = None,
    **context: Any,
) -> Response:
    """A full page (base layout), or only its content block when htmx asks for a fragment."""
    html = render(name, **_common(request, active), **context)
    return Response(content=html, media_type=MediaType.HTML, status_code=status, headers=headers)


def partial(request: Request, name: str, *, status: int = 200, headers: dict[str, str] | None = None, **context: Any) -> Response:
    html = render(name, **_common(request, None), **context)
    return Response(content=html, media_type=MediaType.HTML, status_code=status, headers=headers)
