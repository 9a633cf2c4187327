"""Tiny server-rendered SVG charts: no chart library, no script, no inline style.

Each function returns ``Markup`` assembled only from numbers it formatted itself
and text it escaped, so it is safe to print in an autoescaped template. The
SVGs scale to their container (``viewBox`` + ``preserveAspectRatio="none"``).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from markupsafe import Markup


def _clean(values: Iterable[float | None]) -> list[float | None]:
    out: list[float | None] = []
    for v in values:
        try:
            out.append(None if v is None else float(v))
        except (TypeError, ValueError):
            out.append(None)
    return out


def sparkline(values: Sequence[float | None], top: float | None = None, label: str = "", css: str = "") -> Markup:
    """A line over the last samples; ``top`` fixes the scale (100 for percentages)."""
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
    return Markup(
        '<svg class="spark {css}" viewBox="0 0 100 30" preserveAspectRatio="none" role="img" aria-label="{label}">'
        '<polygon class="area" points="{area}"/><polyline points="{line}" vector-effect="non-scaling-stroke"/></svg>'
    ).format(css=css, label=label, area=Markup(area), line=Markup(line))


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


def time_chart(
    ident: str,
    title: str,
    description: str,
    labels: Sequence[str],
    series: Sequence[tuple[str, Sequence[float | None]]],
    *,
    fmt: str = "{:,.0f}",
    kind: str = "bars",
) -> Markup:
    """A chart over time buckets: grouped bars (``kind="bars"``) or lines, one per named series.

    The SVG names itself with ``<title>`` and ``<desc>``; a legend follows it, and the same
    numbers follow as a table that only screen readers see. ``ident`` makes the ids unique.
    """
    values = [_clean(v) for _, v in series]
    known = [v for vs in values for v in vs if v is not None]
    high = max([v for v in known if v > 0], default=0.0) or 1.0
    n = max(len(labels), 1)
    slot = 100.0 / n
    marks: list[Markup] = []
    if kind == "bars":
        width = slot * 0.8 / max(len(series), 1)
        for s, vs in enumerate(values):
            for i, v in enumerate(vs):
                if not v or v <= 0:
                    continue
                h = max(0.6, v / high * 48)
                marks.append(
                    Markup(
                        '<rect class="s{s}" x="{x:.2f}" y="{y:.2f}" width="{w:.2f}" height="{h:.2f}"><title>{t}</title></rect>'
                    ).format(
                        s=s,
                        x=i * slot + slot * 0.1 + s * width,
                        y=50 - h,
                        w=width,
                        h=h,
                        t=f"{series[s][0]}, {labels[i]}: {fmt.format(v)}",
                    )
                )
    else:
        for s, vs in enumerate(values):
            points = [
                f"{(i + 0.5) * slot:.2f},{50 - (v / high * 48 if v > 0 else 0):.2f}" for i, v in enumerate(vs) if v is not None
            ]
            if len(points) == 1:  # one value: a short dash, as a dot would be stretched by the viewBox
                x, y = (float(c) for c in points[0].split(","))
                points = [f"{x - 0.6:.2f},{y:.2f}", f"{x + 0.6:.2f},{y:.2f}"]
            if points:
                marks.append(
                    Markup('<polyline class="s{}" points="{}" vector-effect="non-scaling-stroke"/>').format(s, " ".join(points))
                )
    axis = Markup('<line class="axis" x1="0" y1="50" x2="100" y2="50" vector-effect="non-scaling-stroke"/>')
    svg = Markup(
        '<svg class="timechart {kind}" viewBox="0 0 100 50" preserveAspectRatio="none" role="img" aria-labelledby="{i}-t {i}-d">'
        '<title id="{i}-t">{title}</title><desc id="{i}-d">{desc}</desc>{axis}{marks}</svg>'
    ).format(kind=kind, i=ident, title=title, desc=description, axis=axis, marks=Markup("").join(marks))
    legend = Markup("").join(
        Markup('<li><span class="swatch s{}" aria-hidden="true"></span>{}</li>').format(s, name)
        for s, (name, _) in enumerate(series)
    )
    span = Markup(
        '<div class="chart-span muted small" aria-hidden="true"><span>{}</span><span>max {}</span><span>{}</span></div>'
    ).format(labels[0] if labels else "", fmt.format(max(known, default=0.0)), labels[-1] if labels else "")
    head = Markup("").join(Markup('<th scope="col">{}</th>').format(name) for name, _ in series)
    body = Markup("").join(
        Markup('<tr><th scope="row">{}</th>{}</tr>').format(
            label, Markup("").join(Markup("<td>{}</td>").format("–" if vs[i] is None else fmt.format(vs[i])) for vs in values)
        )
        for i, label in enumerate(labels)
    )
    table = Markup(
        '<table class="visually-hidden" data-testid="{i}-table"><caption>{title}</caption><thead><tr><th '
        'scope="col">Time</th>{head}</tr>'
        "</thead><tbody>{body}</tbody></table>"
    ).format(i=ident, title=title, head=head, body=body)
    return Markup('<figure class="chart" data-testid="{}">{}{}<ul class="legend">{}</ul>{}</figure>').format(
        ident, svg, span, legend, table
    )
