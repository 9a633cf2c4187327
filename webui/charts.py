"""Tiny server-rendered SVG charts: no chart library, no script, no inline style.

Each function returns ``Markup`` assembled only from numbers it formatted itself
and text it escaped, so it is safe to print in an autoescaped template. Marks
scale to their container (``viewBox`` + ``preserveAspectRatio="none"``); the time
chart's labels sit outside that stretched box, placed in pixels and percentages
of the outer SVG, so text is never distorted and no inline style is needed. Units
come from :mod:`appliance.webui.units`, gridlines and ticks from
:mod:`appliance.webui.chart_axes`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

from markupsafe import Markup

from appliance.webui.chart_axes import TimeAxis, value_ticks
from appliance.webui.units import Unit, axis_formatter, compact, exact_formatter, unit_name


def _clean(values: Iterable[float | None]) -> list[float | None]:
    out: list[float | None] = []
    for v in values:
        try:
            out.append(None if v is None else float(v))
        except (TypeError, ValueError):
            out.append(None)
    return out


def _reading(value: float, unit: str) -> str:
    if unit == "%":
        return f"{value:.0f}%"
    return f"{compact(value)} {unit}".rstrip()


def sparkline(
    values: Sequence[float | None], top: float | None = None, label: str = "", css: str = "", unit: str = "", span: str = ""
) -> Markup:
    """A line over the last samples; ``top`` fixes the scale (100 for percentages).

    Each sample has a transparent column whose ``<title>`` the browser shows on hover (``label: 43%``); with ``span``
    (``5 min``) a line under the chart says where the time axis starts and ends, and the highest sample."""
    points = _clean(values)
    width, height = 100.0, 30.0
    known = [v for v in points if v is not None]
    if len(known) < 2:
        return Markup(
            '<svg class="spark spark-empty {}" viewBox="0 0 100 30" preserveAspectRatio="none" role="img" '
            'aria-label="{}"><line x1="0" y1="29" x2="100" y2="29"/></svg>'
        ).format(css, label or "no data yet")
    high = top if top else max(known) or 1.0
    step = width / (len(points) - 1)
    coords = []
    for i, v in enumerate(points):
        if v is None:
            continue
        y = height - 1 - (min(max(v, 0.0), high) / high) * (height - 2)
        coords.append(f"{i * step:.2f},{y:.2f}")
    line = " ".join(coords)
    area = f"{coords[0].split(',')[0]},{height} {line} {coords[-1].split(',')[0]},{height}"
    hits = Markup("").join(
        Markup('<rect class="hit" x="{x:.2f}" y="0" width="{w:.2f}" height="30"><title>{t}</title></rect>').format(
            x=max(0.0, (i - 0.5) * step), w=step if 0 < i < len(points) - 1 else step / 2, t=f"{label}: {_reading(v, unit)}"
        )
        for i, v in enumerate(points)
        if v is not None
    )
    latest = _reading(known[-1], unit)
    named = f"{label}, last {span}" if span else label
    svg = Markup(
        '<svg class="spark {css}" viewBox="0 0 100 30" preserveAspectRatio="none" role="img" aria-label="{label}, now {now}">'
        '<polygon class="area" points="{area}"/><polyline points="{line}" vector-effect="non-scaling-stroke"/>{hits}</svg>'
    ).format(css=css, label=named, now=latest, area=Markup(area), line=Markup(line), hits=hits)
    if not span:
        return svg
    return svg + Markup(
        '<div class="spark-axis muted small" aria-hidden="true"><span>{}</span><span>max {}</span><span>now</span></div>'
    ).format(f"{span} ago", _reading(max(known), unit))


def bars(items: Sequence[tuple[str, float]], label: str = "", fmt: str = "{:,.0f}") -> Markup:
    """Vertical bars, one per (label, value); each bar has a tooltip."""
    if not items:
        return Markup('<p class="muted">No data for this period.</p>')
    values = [max(0.0, float(v or 0)) for _, v in items]
    high = max(values) or 1.0
    n = len(items)
    slot = 100.0 / n
    gap = min(0.6, slot * 0.2)
    rects = []
    for i, ((name, _), v) in enumerate(zip(items, values, strict=True)):
        h = 0 if v <= 0 else max(0.8, v / high * 48)
        rects.append(
            Markup('<rect x="{x:.2f}" y="{y:.2f}" width="{w:.2f}" height="{h:.2f}"><title>{t}</title></rect>').format(
                x=i * slot + gap / 2, y=50 - h, w=slot - gap, h=h, t=f"{name}: {fmt.format(v)}"
            )
        )
    axis = Markup('<line class="axis" x1="0" y1="50" x2="100" y2="50" vector-effect="non-scaling-stroke"/>')
    return Markup(
        '<svg class="bars" viewBox="0 0 100 50" preserveAspectRatio="none" role="img" aria-label="{}">{}{}</svg>'
    ).format(label, axis, Markup("").join(rects))


def meter(value: float | None, top: float | None) -> Markup:
    """A one-line horizontal bar for tables (share of the largest row)."""
    v = max(0.0, float(value or 0))
    share = 0.0 if not top else min(1.0, v / float(top))
    return Markup(
        '<svg class="hbar" viewBox="0 0 100 6" preserveAspectRatio="none" aria-hidden="true">'
        '<rect class="track" width="100" height="6"/><rect width="{:.2f}" height="6"/></svg>'
    ).format(share * 100)


CHART_HEIGHT = 180  # px, as the stylesheet draws .timechart
PLOT_TOP = 14  # room for the top gridline's label
PLOT_HEIGHT = 144  # what is left above the time labels


def _x_anchor(percent: float) -> str:
    return "start" if percent < 6 else "end" if percent > 94 else "middle"


def _grid(ticks: list[float], fmt: Callable[[float], str]) -> Markup:
    """Horizontal gridlines, each labelled with its value at the left, above the line."""
    top = ticks[-1] or 1.0
    parts = []
    for value in ticks:
        y = PLOT_TOP + PLOT_HEIGHT - value / top * PLOT_HEIGHT
        parts.append(
            Markup(
                '<line class="{c}" x1="0" x2="100%" y1="{y:.1f}" y2="{y:.1f}"/><text class="tick-y" x="2" y="{ty:.1f}">{t}</text>'
            ).format(c="axis" if value == 0 else "grid", y=y, ty=y - 3, t=fmt(value))
        )
    return Markup('<g class="value-axis" aria-hidden="true">{}</g>').format(Markup("").join(parts))


def _time_axis(axis: TimeAxis) -> Markup:
    """A tick and a label at each round moment (whole hours, days, Mondays, months), with a faint vertical gridline."""
    n = max(len(axis.starts), 1)
    bottom = PLOT_TOP + PLOT_HEIGHT
    parts = []
    for tick in axis.ticks():
        x = tick.index * 100.0 / n
        parts.append(
            Markup(
                '<line class="grid" x1="{x:.2f}%" x2="{x:.2f}%" y1="{top}" y2="{b}"/>'
                '<line class="tick" x1="{x:.2f}%" x2="{x:.2f}%" y1="{b}" y2="{b4}"/>'
                '<text class="tick-x" x="{x:.2f}%" y="{ty}" text-anchor="{a}">{t}</text>'
            ).format(x=x, top=PLOT_TOP, b=bottom, b4=bottom + 4, ty=CHART_HEIGHT - 4, a=_x_anchor(x), t=tick.label)
        )
    return Markup('<g class="time-axis" data-testid="time-ticks" aria-hidden="true">{}</g>').format(Markup("").join(parts))


def _marks(values: list[list[float | None]], top: float, kind: str) -> list[Markup]:
    n = max(max((len(vs) for vs in values), default=0), 1)
    slot = 100.0 / n
    marks: list[Markup] = []
    if kind == "bars":
        width = slot * 0.8 / max(len(values), 1)
        for s, vs in enumerate(values):
            for i, v in enumerate(vs):
                if not v or v <= 0:
                    continue
                h = max(1.0, v / top * PLOT_HEIGHT)
                marks.append(
                    Markup('<rect class="s{s}" x="{x:.3f}" y="{y:.2f}" width="{w:.3f}" height="{h:.2f}"/>').format(
                        s=s, x=i * slot + slot * 0.1 + s * width, y=PLOT_HEIGHT - h, w=width, h=h
                    )
                )
        return marks
    for s, vs in enumerate(values):
        points = [
            f"{(i + 0.5) * slot:.3f},{PLOT_HEIGHT - (v / top * PLOT_HEIGHT if v > 0 else 0):.2f}"
            for i, v in enumerate(vs)
            if v is not None
        ]
        if len(points) == 1:  # one value: a short dash, as a dot would be stretched by the viewBox
            x, y = (float(c) for c in points[0].split(","))
            points = [f"{x - 0.6:.3f},{y:.2f}", f"{x + 0.6:.3f},{y:.2f}"]
        if points:
            marks.append(
                Markup('<polyline class="s{}" points="{}" vector-effect="non-scaling-stroke"/>').format(s, " ".join(points))
            )
    return marks


def _say(value: float | None, fmt: Callable[[float], str]) -> str:
    return "–" if value is None else fmt(value)


def _hover_columns(axis: TimeAxis, names: list[str], values: list[list[float | None]], exact: Callable[[float], str]) -> Markup:
    """One transparent column per bucket whose ``<title>`` the browser shows on hover: the time and every series' value."""
    n = max(len(axis.starts), 1)
    slot = 100.0 / n
    columns = []
    for i in range(len(axis.starts)):
        said = " · ".join(f"{name}: {_say(vs[i], exact)}" for name, vs in zip(names, values, strict=True))
        columns.append(
            Markup('<rect class="hit" x="{x:.3f}" y="0" width="{w:.3f}" height="{h}"><title>{t}</title></rect>').format(
                x=i * slot, w=slot, h=PLOT_HEIGHT, t=f"{axis.label(i)} UTC — {said}"
            )
        )
    return Markup("").join(columns)


def time_chart(
    ident: str,
    title: str,
    description: str,
    axis: TimeAxis,
    series: Sequence[tuple[str, Sequence[float | None]]],
    *,
    unit: Unit = "count",
    currency: str = "",
    kind: str = "bars",
) -> Markup:
    """A chart over time buckets: grouped bars (``kind="bars"``) or lines, one per named series.

    Horizontal gridlines carry their values and the time axis its ticks, in ``unit`` (tokens and counts in k/M,
    durations in ms/s, money in ``currency``); hovering a bucket shows its time and exact values. The SVG names
    itself with ``<title>`` and ``<desc>``; a legend follows it, and the same numbers follow as a table that only
    screen readers see. ``ident`` makes the ids unique. No script and no inline style: the Content-Security-Policy
    allows neither.
    """
    values = [_clean(v)[: len(axis.starts)] for _, v in series]
    values = [vs + [None] * (len(axis.starts) - len(vs)) for vs in values]
    names = [name for name, _ in series]
    high = max((v for vs in values for v in vs if v is not None and v > 0), default=0.0)
    ticks = value_ticks(high, whole=unit in ("tokens", "count"))
    exact = exact_formatter(unit, currency)
    said = exact if unit != "tokens" else (lambda v: f"{exact(v)} {unit_name(unit, v)}")
    plot = Markup(
        '<svg class="plot" x="0" y="{top}" width="100%" height="{h}" viewBox="0 0 100 {h}" preserveAspectRatio="none">'
        "{marks}{hits}</svg>"
    ).format(
        top=PLOT_TOP,
        h=PLOT_HEIGHT,
        marks=Markup("").join(_marks(values, ticks[-1], kind)),
        hits=_hover_columns(axis, names, values, said),
    )
    svg = Markup(
        '<svg class="timechart {kind}" width="100%" height="{height}" role="img" aria-labelledby="{i}-t {i}-d" '
        'data-unit="{unit}"><title id="{i}-t">{title}</title><desc id="{i}-d">{desc}</desc>{grid}{time}{plot}</svg>'
    ).format(
        kind=kind,
        height=CHART_HEIGHT,
        i=ident,
        unit=unit,
        title=title,
        desc=description,
        grid=_grid(ticks, axis_formatter(unit, currency, alongside=ticks[-1])),
        time=_time_axis(axis),
        plot=plot,
    )
    legend = Markup("").join(
        Markup('<li><span class="swatch s{}" aria-hidden="true"></span>{}</li>').format(s, name) for s, name in enumerate(names)
    )
    head = Markup("").join(Markup('<th scope="col">{}</th>').format(name) for name in names)
    body = Markup("").join(
        Markup('<tr><th scope="row">{}</th>{}</tr>').format(
            label, Markup("").join(Markup("<td>{}</td>").format(_say(vs[i], exact)) for vs in values)
        )
        for i, label in enumerate(axis.labels)
    )
    table = Markup(
        '<table class="visually-hidden" data-testid="{i}-table"><caption>{title}</caption><thead><tr><th '
        'scope="col">Time (UTC)</th>{head}</tr></thead><tbody>{body}</tbody></table>'
    ).format(i=ident, title=title, head=head, body=body)
    return Markup('<figure class="chart" data-testid="{}">{}<ul class="legend legend-{}">{}</ul>{}</figure>').format(
        ident, svg, kind, legend, table
    )
