"""Server-rendered SVG charts: no JavaScript library, nothing fetched from the internet.

Pure functions from numbers to SVG markup (escaped), so they are cheap to test and to render.
"""

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from html import escape


@dataclass(frozen=True)
class Series:
    name: str
    points: Sequence[tuple[float, float]]  # (unix seconds, value), ascending time
    css_class: str  # colours live in console.css
    step: bool = False  # replicas change in steps; load is a line


@dataclass(frozen=True)
class Mark:
    at: float  # unix seconds
    label: str  # shown on hover
    css_class: str = "mark"


@dataclass(frozen=True)
class Frame:
    """Maps data to pixels; the plot sits inside `pad` pixels of margin."""

    width: int = 720
    height: int = 180
    pad: int = 28
    x_range: tuple[float, float] = (0.0, 1.0)
    y_max: float = 1.0

    def x(self, t: float) -> float:
        lo, hi = self.x_range
        span = (hi - lo) or 1.0
        return self.pad + (t - lo) / span * (self.width - 2 * self.pad)

    def y(self, v: float) -> float:
        return self.height - self.pad - v / (self.y_max or 1.0) * (self.height - 2 * self.pad)


@dataclass(frozen=True)
class Chart:
    title: str
    series: Sequence[Series]
    marks: Sequence[Mark] = field(default_factory=tuple)
    unit: str = ""


def line_chart(chart: Chart, since: float, until: float, frame: Frame = Frame()) -> str:
    """A time chart: one polyline per series, vertical marks for events, a y-axis maximum."""
    values = [v for s in chart.series for _, v in s.points]
    y_max = _nice_ceiling(max(values, default=0.0))
    f = Frame(frame.width, frame.height, frame.pad, (since, until), y_max)
    parts = [
        f'<svg class="chart" viewBox="0 0 {f.width} {f.height}" role="img" '
        f'aria-label="{escape(chart.title)}" xmlns="http://www.w3.org/2000/svg">',
        f"<title>{escape(chart.title)}</title>",
        f'<line class="axis" x1="{f.pad}" y1="{f.y(0):.1f}" x2="{f.width - f.pad}" y2="{f.y(0):.1f}"/>',
        f'<text class="tick" x="2" y="{f.y(y_max) + 4:.1f}">{_fmt(y_max)}{escape(chart.unit)}</text>',
        f'<text class="tick" x="2" y="{f.y(0) + 4:.1f}">0</text>',
        f'<text class="tick" x="{f.pad}" y="{f.height - 6}">{_ago(until - since)}</text>',
        f'<text class="tick" x="{f.width - f.pad - 20}" y="{f.height - 6}">now</text>',
    ]
    if not values:
        parts.append(f'<text class="empty" x="{f.width / 2:.0f}" y="{f.height / 2:.0f}">no data yet</text>')
    for s in chart.series:
        if s.points:
            coords = _step(s.points, until) if s.step else s.points
            path = " ".join(f"{f.x(t):.1f},{f.y(v):.1f}" for t, v in coords)
            parts.append(
                f'<polyline class="{escape(s.css_class)}" points="{path}">'
                f"<title>{escape(s.name)}</title></polyline>"
            )
    for m in chart.marks:
        if since <= m.at <= until:
            x = f.x(m.at)
            parts.append(
                f'<line class="{escape(m.css_class)}" x1="{x:.1f}" y1="{f.pad}" x2="{x:.1f}"'
                f' y2="{f.y(0):.1f}"><title>{escape(m.label)}</title></line>'
            )
    legend_x = f.pad
    for s in chart.series:
        parts.append(
            f'<text class="legend {escape(s.css_class)}" x="{legend_x}" y="14">{escape(s.name)}</text>'
        )
        legend_x += 9 * len(s.name) + 24
    parts.append("</svg>")
    return "".join(parts)


def capacity_bar(have: float, sellable: float, sold: float, used: float, width: int = 360) -> str:
    """HAVE / SOLD / USED as nested bars; what is sold beyond HAVE (over-commit) shows in red.

    The scale is the larger of sellable and sold, so an oversold pool still fits on the bar.
    """
    scale = max(have, sellable, sold, 1e-9)
    px: Callable[[float], float] = lambda v: max(0.0, v / scale * width)  # noqa: E731 - a unit conversion
    over = max(0.0, sold - have)
    title = f"have {_fmt(have)}, sellable {_fmt(sellable)}, sold {_fmt(sold)}, used {_fmt(used)}"
    return (
        f'<svg class="capacity-bar" viewBox="0 0 {width} 22" width="{width}" height="22" role="img" '
        f'aria-label="{escape(title)}" xmlns="http://www.w3.org/2000/svg"><title>{escape(title)}</title>'
        f'<rect class="have" x="0" y="0" width="{px(have):.1f}" height="22"/>'
        f'<rect class="sold" x="0" y="4" width="{px(min(sold, have)):.1f}" height="14"/>'
        f'<rect class="overcommit" x="{px(have):.1f}" y="4" width="{px(over):.1f}" height="14"/>'
        f'<rect class="used" x="0" y="8" width="{px(used):.1f}" height="6"/>'
        f'<line class="sellable" x1="{px(sellable):.1f}" y1="0" x2="{px(sellable):.1f}" y2="22"/>'
        "</svg>"
    )


def _step(points: Sequence[tuple[float, float]], until: float) -> list[tuple[float, float]]:
    """(t0, 2), (t1, 4) -> a staircase that holds 2 until t1, then 4 until the window ends."""
    out: list[tuple[float, float]] = []
    for (t, v), nxt in zip(points, [*points[1:], (until, None)], strict=True):
        out += [(t, v), (nxt[0], v)]
    return out


def _nice_ceiling(value: float) -> float:
    """Round an axis maximum up to 1, 2 or 5 x a power of ten: 730 -> 1000, 0 -> 1."""
    if value <= 0:
        return 1.0
    magnitude = 10 ** len(str(int(value))) / 10 if value >= 1 else 1.0
    for step in (1, 2, 5, 10):
        if value <= step * magnitude:
            return step * magnitude
    return 10 * magnitude


def _ago(seconds: float) -> str:
    """The left edge's label: 3600 -> '1 h ago', 604800 -> '7 d ago'."""
    if seconds >= 86400:
        return f"{seconds / 86400:g} d ago"
    if seconds >= 3600:
        return f"{seconds / 3600:g} h ago"
    return f"{seconds / 60:g} min ago"


def _fmt(value: float) -> str:
    return f"{value:,.0f}" if abs(value) >= 10 else f"{value:g}"
