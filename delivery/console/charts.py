"""Line charts drawn on the server as inline SVG: no script, no library, works offline.

``line_chart`` takes named series of per-bucket values (``None`` is a gap) and returns SVG
markup (escaped text only) with axes, a few time labels, the maximum, and a legend.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping, Sequence
from html import escape

from markupsafe import Markup

__all__ = ["line_chart"]

_COLORS = ("#2563eb", "#dc2626", "#d97706", "#059669", "#7c3aed", "#0891b2", "#db2777")
_NAMED = {"sent": "#059669", "dead": "#dc2626", "unknown": "#d97706"}


def _fmt(value: float) -> str:
    if value >= 100 or value == int(value):
        return f"{value:.0f}"
    return f"{value:.2f}" if value < 1 else f"{value:.1f}"


def line_chart(
    title: str,
    starts: Sequence[dt.datetime],
    series: Mapping[str, Sequence[float | None]],
    *,
    unit: str = "",
) -> Markup:
    """An SVG line chart of ``series`` over the buckets starting at ``starts``, titled
    ``title``; ``unit`` follows the maximum on the axis."""
    left, right, top, bottom = 44, 18, 36, 30
    width, height = 430, 180
    plot_w, plot_h = width - left - right, height - top - bottom
    values = [v for points in series.values() for v in points if v is not None]
    peak = max(values, default=0.0) or 1.0
    n = max(len(starts), 2)

    def x(i: int) -> float:
        return left + plot_w * i / (n - 1)

    def y(v: float) -> float:
        return top + plot_h * (1 - v / peak)

    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" class="chart" viewBox="0 0 {width} {height}" '
        f'width="{width}" height="{height}" role="img" aria-label="{escape(title)}">',
        f'<text x="{left}" y="14" class="chart-title">{escape(title)}</text>',
        f'<line x1="{left}" y1="{top + plot_h}" x2="{left + plot_w}" y2="{top + plot_h}" '
        'stroke="#cbd5e1"/>',
        f'<line x1="{left}" y1="{top}" x2="{left + plot_w}" y2="{top}" stroke="#eef2f7"/>',
        f'<text x="{left - 4}" y="{top + 4}" text-anchor="end" class="axis">'
        f"{escape(_fmt(peak if values else 0))}{escape(unit)}</text>",
        f'<text x="{left - 4}" y="{top + plot_h + 4}" text-anchor="end" class="axis">0</text>',
    ]
    if starts:
        for i in sorted({0, len(starts) // 2, len(starts) - 1}):
            label = starts[i].strftime("%H:%M")
            parts.append(
                f'<text x="{x(i):.1f}" y="{height - 10}" text-anchor="middle" class="axis">'
                f"{label}</text>"
            )
    legend_x = left + plot_w
    for number, (name, points) in enumerate(series.items()):
        color = _NAMED.get(name, _COLORS[number % len(_COLORS)])
        segments: list[list[str]] = [[]]
        for i, value in enumerate(points):
            if value is None:
                segments.append([])
            else:
                segments[-1].append(f"{x(i):.1f},{y(value):.1f}")
        for segment in segments:
            if len(segment) == 1:
                cx, cy = segment[0].split(",")
                parts.append(f'<circle cx="{cx}" cy="{cy}" r="2" fill="{color}"/>')
            elif segment:
                parts.append(
                    f'<polyline fill="none" stroke="{color}" stroke-width="1.6" '
                    f'points="{" ".join(segment)}"/>'
                )
        legend_x -= 8 + 7 * len(name) + 12
        parts.append(
            f'<rect x="{legend_x}" y="20" width="9" height="9" fill="{color}"/>'
            f'<text x="{legend_x + 12}" y="28" class="legend">{escape(name)}</text>'
        )
    if not values:
        parts.append(
            f'<text x="{left + plot_w / 2}" y="{top + plot_h / 2}" text-anchor="middle" '
            'class="axis">no data in this window</text>'
        )
    parts.append("</svg>")
    return Markup("".join(parts))
