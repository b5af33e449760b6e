"""Server-rendered SVG charts: no JavaScript library, nothing fetched from the internet.

Pure functions from numbers to SVG markup (escaped), so they are cheap to test and to render.
A chart spans its card (the SVG scales to the card's width) and draws only what was measured:
points further apart than their series' gap are not joined, so a minute without data is a
break in the line and a lone point a dot. Every chart of a page spans one time axis
(`axis_start`: a fresh fleet's ten minutes fill the charts, not their right sixth), hovering a
time shows each series' exact value there, both axes are labelled with round steps and the
unit, event marks that would overlap fold into one numbered mark, and a chart without data is
a sentence saying what is missing and when it will appear, not an empty box.
"""

import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from html import escape

from capacity.numbers import shown

# The windows every chart offers: name -> seconds. One list, so the endpoint page and the
# capacity page (and their ?window= parameter) agree.
WINDOWS: dict[str, int] = {"15m": 900, "1h": 3600, "6h": 6 * 3600, "1d": 86400, "1w": 7 * 86400}
DEFAULT_WINDOW = "1h"
# Older links (?window=hour) keep working.
WINDOW_ALIASES = {"hour": "1h", "day": "1d", "week": "1w"}
MIN_SPAN_S = 120  # a chart of 10 s of data still shows two minutes: steps stay readable
MARK_GROUP_PX = 8  # marks closer than this fold into one
MARK_TITLE_LINES = 8  # a folded mark's hover text lists at most this many events


def window_name(value: str | None) -> str:
    """The window a ?window= value names; anything else is the default (a hostile value too)."""
    value = WINDOW_ALIASES.get(value or "", value or "")
    return value if value in WINDOWS else DEFAULT_WINDOW


@dataclass(frozen=True)
class Series:
    name: str
    points: Sequence[tuple[float, float]]  # (unix seconds, value), ascending time
    css_class: str  # colours live in console.css
    step: bool = False  # replicas change in steps; load is a line
    # Seconds two consecutive points may lie apart and still be joined: further apart, nothing
    # was measured between them and the line breaks. None: always joined (a forecast's ends).
    gap_s: float | None = None
    unit: str = ""  # the hover text's unit, where it is not the chart's ("req/s" beside "req")


@dataclass(frozen=True)
class Mark:
    at: float  # unix seconds
    label: str  # shown on hover
    css_class: str = "mark"


@dataclass(frozen=True)
class Frame:
    """Maps data to pixels; the plot sits inside the margins (room for the axes' labels)."""

    width: int = 960
    height: int = 200
    pad: int = 22  # top and right margin, px (the legend and the unit sit above the plot)
    x_range: tuple[float, float] = (0.0, 1.0)
    y_max: float = 1.0
    left: int = 56  # room for the y-axis labels, px
    bottom: int = 24  # room for the x-axis labels, px

    def x(self, t: float) -> float:
        lo, hi = self.x_range
        span = (hi - lo) or 1.0
        return self.left + (t - lo) / span * (self.width - self.left - self.pad)

    def y(self, v: float) -> float:
        return self.height - self.bottom - v / (self.y_max or 1.0) * (self.height - self.bottom - self.pad)


@dataclass(frozen=True)
class Chart:
    title: str
    series: Sequence[Series]
    marks: Sequence[Mark] = field(default_factory=tuple)
    unit: str = ""  # the y-axis' unit, written above its labels ("req", "s", "MU/min")
    whole: bool = False  # values are whole numbers (replicas): ticks 1 apart at least
    # What the chart says instead of an empty plot: what is missing and when it will appear.
    empty: str = "Nothing measured in this window yet."


def axis_start(series: Iterable[Series], since: float, until: float) -> float:
    """Where the time axis of a page's charts starts: the window's start or the first point of
    any of the page's series, whichever is later, at least MIN_SPAN_S before `until`. Every
    chart of the page is drawn from it, so their times line up."""
    first = min((s.points[0][0] for s in series if s.points), default=since)
    return min(max(since, first), until - MIN_SPAN_S)


def on_one_axis(page_charts: Iterable[Chart], since: float, until: float) -> list[str]:
    """A page's charts, each drawn from the page's `axis_start` to `until`."""
    page_charts = list(page_charts)
    start = axis_start([s for c in page_charts for s in c.series], since, until)
    return [line_chart(c, start, until) for c in page_charts]


def empty_state(sentence: str) -> str:
    """What a chart without data shows: one short sentence, not an empty box."""
    return f'<p class="chart-empty">{escape(sentence)}</p>'


def line_chart(chart: Chart, since: float, until: float, frame: Frame = Frame()) -> str:
    """A time chart over exactly [since, until] (a page passes its `axis_start`): each series'
    runs of joined points as one polyline each, a lone point as a dot, a hover column per time
    with each series' exact value there, event marks, labelled axes. No points at all: the
    chart's `empty` sentence instead."""
    values = [v for s in chart.series for _, v in s.points]
    if not values:
        return empty_state(chart.empty)
    start = min(since, until - MIN_SPAN_S)
    y_ticks = _y_ticks(max(values, default=0.0), whole=chart.whole)
    f = Frame(frame.width, frame.height, frame.pad, (start, until), y_ticks[-1], frame.left, frame.bottom)
    plot_right = f.width - f.pad
    parts = [
        f'<svg class="chart" viewBox="0 0 {f.width} {f.height}" preserveAspectRatio="xMinYMin meet" '
        f'role="img" aria-label="{escape(chart.title)}" xmlns="http://www.w3.org/2000/svg">',
        f"<title>{escape(chart.title)}</title>",
    ]
    if chart.unit:  # above the axis' labels, in the margin that holds them
        parts.append(
            f'<text class="unit" x="{f.left - 6}" y="10" text-anchor="end">{escape(chart.unit)}</text>'
        )
    for v in y_ticks:
        y = f.y(v)
        label = _fmt(v)
        parts.append(
            f'<line class="{"axis" if v == 0 else "grid"}" x1="{f.left}" y1="{y:.1f}" '
            f'x2="{plot_right}" y2="{y:.1f}"/>'
            f'<text class="tick y" x="{f.left - 6}" y="{y + 4:.1f}" text-anchor="end">{escape(label)}</text>'
        )
    for t, label in _x_ticks(start, until):
        x = f.x(t)
        parts.append(
            f'<line class="grid" x1="{x:.1f}" y1="{f.pad}" x2="{x:.1f}" y2="{f.y(0):.1f}"/>'
            f'<text class="tick x" x="{x:.1f}" y="{f.height - 6}" text-anchor="middle">{label}</text>'
        )
    for s in chart.series:
        css = escape(s.css_class)
        series_runs = runs(s.points, s.gap_s)
        for i, run in enumerate(series_runs):
            # a staircase holds its last value to the window's end only while data is current
            held = s.step and i == len(series_runs) - 1 and (s.gap_s is None or until - run[-1][0] <= s.gap_s)
            if len(run) == 1 and not held:  # nothing measured either side: a dot, not a line
                t, v = run[0]
                x = f.x(_clamp(t, start, until))
                parts.append(f'<circle class="{css}" cx="{x:.1f}" cy="{f.y(v):.1f}" r="2.5"/>')
                continue
            coords = _step(run, until if held else run[-1][0]) if s.step else run
            path = " ".join(f"{f.x(_clamp(t, start, until)):.1f},{f.y(v):.1f}" for t, v in coords)
            parts.append(
                f'<polyline class="{css}" points="{path}"><title>{escape(s.name)}</title></polyline>'
            )
    parts += _hover_columns(chart, f, start, until)
    for x, group in group_marks([m for m in chart.marks if start <= m.at <= until], f.x):
        labels = [m.label for m in group]
        if len(labels) > MARK_TITLE_LINES:
            labels = [*labels[: MARK_TITLE_LINES - 1], f"... and {len(labels) - MARK_TITLE_LINES + 1} more"]
        title = escape("\n".join(labels))
        classes = " ".join(dict.fromkeys(c for m in group for c in m.css_class.split()))
        parts.append(
            f'<g class="{escape(classes)}" data-count="{len(group)}"><title>{title}</title>'
            f'<line class="{escape(classes)}" x1="{x:.1f}" y1="{f.pad}" x2="{x:.1f}" y2="{f.y(0):.1f}"/>'
        )
        if len(group) > 1:
            parts.append(
                f'<text class="mark-count" x="{x + 3:.1f}" y="{f.pad + 10}">&#215;{len(group)}</text>'
            )
        parts.append("</g>")
    legend_x = f.left
    for s in chart.series:
        parts.append(
            f'<text class="legend {escape(s.css_class)}" x="{legend_x}" y="12">{escape(s.name)}</text>'
        )
        legend_x += 7 * len(s.name) + 24
    parts.append("</svg>")
    return "".join(parts)


def runs(points: Sequence[tuple[float, float]], gap_s: float | None) -> list[list[tuple[float, float]]]:
    """The points cut where two consecutive ones lie more than `gap_s` apart: (0, 1), (60, 2),
    (300, 3) with a gap of 60 s are two runs, [(0, 1), (60, 2)] and [(300, 3)]."""
    out: list[list[tuple[float, float]]] = []
    for t, v in points:
        if out and (gap_s is None or t - out[-1][-1][0] <= gap_s):
            out[-1].append((t, v))
        else:
            out.append([(t, v)])
    return out


def _hover_columns(chart: Chart, f: Frame, start: float, until: float) -> list[str]:
    """One invisible column per time a series has a point, as wide as the space to its
    neighbours (at most its series' gap): hovering it shows the time and each series' exact
    value there, with its unit (the SVG <title>, the browser's tooltip)."""
    at: dict[float, list[str]] = {}
    half_s: dict[float, float] = {}
    for s in chart.series:
        unit = s.unit or chart.unit
        for t, v in s.points:
            at.setdefault(t, []).append(f"{s.name}: {shown(v)}{' ' + unit if unit else ''}")
            if s.gap_s is not None:
                half_s[t] = max(half_s.get(t, 0.0), s.gap_s / 2)
    times = sorted(t for t in at if start <= t <= until)
    fmt = "%a %d %b %H:%M UTC" if until - start > 86400 else "%H:%M:%S UTC"
    plot_left, plot_right = f.left, f.width - f.pad
    out = []
    for i, t in enumerate(times):
        x = f.x(t)
        reach = f.x(t + half_s[t]) - x if t in half_s else float("inf")
        left = max(plot_left, x - reach, (f.x(times[i - 1]) + x) / 2 if i else plot_left)
        right = min(plot_right, x + reach, (x + f.x(times[i + 1])) / 2 if i + 1 < len(times) else plot_right)
        if right - left < 3:  # a point among many in a week's chart stays hoverable
            left, right = x - 1.5, x + 1.5
        title = escape("\n".join([time.strftime(fmt, time.gmtime(t)), *at[t]]))
        out.append(
            f'<rect class="hover" x="{left:.1f}" y="{f.pad}" width="{right - left:.1f}" '
            f'height="{f.y(0) - f.pad:.1f}"><title>{title}</title></rect>'
        )
    return out


def _clamp(t: float, lo: float, hi: float) -> float:
    return min(max(t, lo), hi)


def group_marks(marks: Sequence[Mark], x: Callable[[float], float]) -> list[tuple[float, list[Mark]]]:
    """Marks in time order, those within MARK_GROUP_PX of the group's first folded into it:
    (pixel of the group's first mark, its marks). Ten scale steps in a minute of a day's chart
    are one mark that says x10."""
    groups: list[tuple[float, list[Mark]]] = []
    for m in sorted(marks, key=lambda m: m.at):
        px = x(m.at)
        if groups and px - groups[-1][0] < MARK_GROUP_PX:
            groups[-1][1].append(m)
        else:
            groups.append((px, [m]))
    return groups


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


def _y_ticks(value: float, whole: bool = False) -> list[float]:
    """Four or five round ticks from 0 to just above `value`: 7 -> 0, 2, 4, 6, 8; 730 -> 0, 200,
    ..., 800; 0.3 -> 0, 0.1, 0.2, 0.3; nothing -> 0, 0.25, ..., 1. With `whole`, steps of 1 at
    least: 2 replicas -> 0, 1, 2."""
    if value <= 0:
        return [0.0, 1.0] if whole else [0.0, 0.25, 0.5, 0.75, 1.0]
    for step in _steps(value / 4):
        if whole and (step < 1 or step != int(step)):
            continue
        if value / step <= 5:
            n = int(-(-value // step)) if value % step else int(value // step)
            return [round(i * step, 10) for i in range(max(n, 1) + 1)]
    raise AssertionError("unreachable: _steps grows without bound")


def _steps(least: float) -> list[float]:
    """1, 2, 2.5, 5 x powers of ten from just below `least` upwards (a few decades)."""
    exponent = 0
    while 10.0**exponent > least:
        exponent -= 1
    while 10.0 ** (exponent + 1) <= least:
        exponent += 1
    return [m * 10.0**e for e in range(exponent, exponent + 3) for m in (1, 2, 2.5, 5)]


# x-axis steps, seconds, and how their labels read (UTC): the first giving at most 8 ticks.
_X_STEPS = [60, 120, 300, 600, 900, 1800, 3600, 7200, 3 * 3600, 6 * 3600, 12 * 3600, 86400]


def _x_ticks(start: float, until: float, most: int = 8) -> list[tuple[float, str]]:
    """Round times inside [start, until] with their labels: 'HH:MM' within a day, 'Mon 3' a day
    or more apart (UTC, as the usage tables)."""
    span = until - start
    step = next((s for s in _X_STEPS if span / s <= most), 86400 * max(1, int(span / 86400 / most) + 1))
    first = -(-start // step) * step
    fmt = "%a %d" if step >= 86400 else ("%a %H:%M" if span > 86400 else "%H:%M")
    return [(t, time.strftime(fmt, time.gmtime(t))) for t in _frange(first, until, step)]


def _frange(first: float, last: float, step: float) -> list[float]:
    out, t = [], first
    while t <= last:
        out.append(t)
        t += step
    return out


def _fmt(value: float) -> str:
    return f"{value:,.0f}" if abs(value) >= 10 else f"{value:g}"
