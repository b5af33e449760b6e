"""SVG charts: pure functions from numbers to markup."""

import re
from html import unescape

from controlplane.console.charts import (
    Chart,
    Frame,
    Mark,
    Series,
    _nice_ceiling,
    _step,
    _x_ticks,
    _y_ticks,
    axis_start,
    capacity_bar,
    group_marks,
    line_chart,
    runs,
    window_name,
)

NOW = 1764600000.0  # 2025-12-01 14:40 UTC


def titles(svg: str) -> list[str]:
    """The hover text of each time's column, in time order."""
    return [unescape(t) for t in re.findall(r'<rect class="hover"[^>]*><title>([^<]*)</title>', svg)]


def test_axis_maximum_rounds_up_to_1_2_or_5():
    assert [_nice_ceiling(v) for v in (0, 0.3, 1, 7, 12, 730, 6528)] == [1, 1, 1, 10, 20, 1000, 10000]


def test_steps_hold_each_value_until_the_next():
    assert _step([(0, 2), (10, 4)], until=30) == [(0, 2), (10, 2), (10, 4), (30, 4)]


def test_frame_maps_time_and_value_to_pixels():
    f = Frame(width=100, height=60, pad=10, x_range=(0, 80), y_max=4, left=10, bottom=10)
    assert (f.x(0), f.x(80), f.x(40)) == (10, 90, 50)
    assert (f.y(0), f.y(4), f.y(2)) == (50, 10, 30)


def test_line_chart_escapes_labels_and_marks_events():
    svg = line_chart(
        Chart("<script>", [Series("a&b", [(0, 1), (60, 3)], "sold")], [Mark(30, 'scale "up"')]),
        since=0,
        until=60,
    )
    assert "<script>" not in svg and "&lt;script&gt;" in svg
    assert "a&amp;b" in svg and "scale &quot;up&quot;" in svg
    assert svg.count("<polyline") == 1 and 'class="mark"' in svg


def test_a_chart_without_data_is_a_sentence_not_an_empty_box():
    chart = Chart("t", [Series("s", [], "sold")], empty="No requests in the last 1h: <soon>.")
    html = line_chart(chart, 0, 3600)
    assert html == '<p class="chart-empty">No requests in the last 1h: &lt;soon&gt;.</p>'
    assert "<svg" not in html


def test_capacity_bar_shows_overcommit_beyond_have():
    # have 8, sold 10: the bar scales to 10; 2 GPUs beyond have are drawn in the overcommit colour.
    svg = capacity_bar(have=8, sellable=10, sold=10, used=4, width=100)
    assert 'class="have" x="0" y="0" width="80.0"' in svg
    assert 'class="overcommit" x="80.0" y="4" width="20.0"' in svg
    assert 'class="used" x="0" y="8" width="40.0"' in svg


def test_y_axis_has_four_or_five_round_ticks_above_the_data():
    assert _y_ticks(7) == [0, 2, 4, 6, 8]
    assert _y_ticks(730) == [0, 200, 400, 600, 800]
    assert _y_ticks(0.3) == [0, 0.1, 0.2, 0.3]
    assert _y_ticks(2, whole=True) == [0, 1, 2] and _y_ticks(0.5, whole=True) == [0, 1]  # replicas
    for top in (0.04, 1, 2.2, 12, 99, 6528, 1e6):
        ticks = _y_ticks(top)
        assert 4 <= len(ticks) <= 6 and ticks[0] == 0 and ticks[-1] >= top > ticks[-2], (top, ticks)


def test_x_axis_ticks_are_round_times_in_utc():
    now = 1764600000  # 2025-12-01 14:40 UTC
    assert [label for _, label in _x_ticks(now - 3600, now)] == [
        "13:40", "13:50", "14:00", "14:10", "14:20", "14:30", "14:40",
    ]  # fmt: skip
    assert _x_ticks(now - 7 * 86400, now)[0][1] == "Tue 25"
    for span in (120, 900, 3600, 6 * 3600, 86400, 7 * 86400):
        ticks = _x_ticks(now - span, now)
        assert 2 <= len(ticks) <= 8 and all(now - span <= t <= now for t, _ in ticks), span


def test_a_fresh_fleet_fills_the_chart_instead_of_its_right_edge():
    # An hour's window, ten minutes of data: the first point sits at the plot's left edge.
    now = 36000.0
    series = Series("s", [(now - 600, 1), (now, 2)], "sold")
    start = axis_start([series], since=now - 3600, until=now)
    assert start == now - 600
    svg = line_chart(Chart("t", [series]), start, now, frame=Frame(left=50, pad=10, width=1010))
    assert '<polyline class="sold" points="50.0,' in svg and "1000.0," in svg
    # ten seconds of data still span MIN_SPAN_S (two minutes), and old data the whole window
    assert axis_start([Series("s", [(now - 10, 1)], "sold")], now - 3600, now) == now - 120
    assert axis_start([Series("s", [(now - 7200, 1)], "sold")], now - 3600, now) == now - 3600


def test_the_charts_of_a_page_share_one_time_axis():
    # Replicas from 06:05, the first request at 06:53: both charts span 06:05 to 07:02.
    replicas = Series("ready", [(NOW - 57 * 60 + 60 * k, 1) for k in range(58)], "used", step=True)
    latency = Series("p99", [(NOW - 9 * 60, 0.3), (NOW - 8 * 60, 0.4)], "sold")
    start = axis_start([replicas, latency], NOW - 3600, NOW)
    svgs = [line_chart(Chart(n, [s]), start, NOW) for n, s in (("r", replicas), ("l", latency))]
    ticks = [re.findall(r'<text class="tick x"[^>]*>([^<]*)</text>', svg) for svg in svgs]
    assert ticks[0] == ticks[1] and ticks[0][0] == "13:50" and ticks[0][-1] == "14:40"


def test_points_further_apart_than_their_gap_are_not_joined():
    assert runs([(0, 1), (60, 2), (300, 3), (360, 4)], gap_s=60) == [[(0, 1), (60, 2)], [(300, 3), (360, 4)]]
    assert runs([(0, 1), (300, 3)], gap_s=None) == [[(0, 1), (300, 3)]]
    # A stack outage: load every minute, then none for four minutes, then load again.
    points = [(NOW - 900 + 60 * k, 5.0) for k in range(16) if not 5 <= k <= 8]
    svg = line_chart(Chart("t", [Series("in flight", points, "sold", gap_s=60)]), NOW - 900, NOW)
    lines = re.findall(r'<polyline class="sold" points="([^"]*)"', svg)
    assert len(lines) == 2
    end_of_first, start_of_second = lines[0].split()[-1], lines[1].split()[0]
    assert float(start_of_second.split(",")[0]) - float(end_of_first.split(",")[0]) > 4 * 60 / 900 * 800


def test_a_lone_point_is_a_dot_and_not_a_ramp_to_its_neighbours():
    # One 48-s request in a quiet quarter hour: the p99 is that one bin's, drawn where it was.
    p99 = Series("p99", [(NOW - 600, 0.2), (NOW - 300, 48.0), (NOW, 0.2)], "sold", gap_s=15, unit="s")
    svg = line_chart(Chart("latency", [p99], unit="s"), NOW - 900, NOW)
    assert "<polyline" not in svg and svg.count('<circle class="sold"') == 3


def test_a_staircase_stops_where_its_data_stops():
    stale = Series("ready", [(NOW - 600, 2), (NOW - 540, 3)], "used", step=True, gap_s=60)
    frame = Frame(left=50, pad=10, width=960)  # a pixel a second
    svg = line_chart(Chart("t", [stale]), NOW - 900, NOW, frame=frame)
    (points,) = re.findall(r'<polyline class="used" points="([^"]*)"', svg)
    assert points.split()[-1].startswith("410.0,")  # 9 minutes before now, not the plot's right end
    current = Series("ready", [(NOW - 60, 2), (NOW, 3)], "used", step=True, gap_s=60)
    svg = line_chart(Chart("t", [current]), NOW - 900, NOW, frame=frame)
    assert re.search(r'<polyline class="used" points="[^"]* 950.0,[0-9.]+"', svg)


def test_hovering_a_time_shows_each_series_exact_value_for_people():
    chart = Chart(
        "MU/min",
        [
            Series("have", [(NOW - 120, 12345.678), (NOW - 60, 1600.0)], "have", gap_s=120),
            Series("used", [(NOW - 120, 0.5), (NOW - 60, 1234567.0)], "used", gap_s=120),
        ],
        unit="MU/min",
    )
    svg = line_chart(chart, NOW - 120, NOW)
    assert titles(svg) == [
        "14:38:00 UTC\nhave: 12,345.68 MU/min\nused: 0.5 MU/min",
        "14:39:00 UTC\nhave: 1,600 MU/min\nused: 1,234,567 MU/min",
    ]
    # a series' own unit where it is not the chart's; a week's chart names the day
    load = Chart("load", [Series("requests/s", [(NOW - 86400 * 3, 2.25)], "have", unit="req/s")], unit="req")
    assert titles(line_chart(load, NOW - 7 * 86400, NOW)) == ["Fri 28 Nov 14:40 UTC\nrequests/s: 2.25 req/s"]


def test_hover_columns_tile_the_plot_without_spanning_a_gap():
    points = [(NOW - 900, 1.0), (NOW - 840, 2.0), (NOW, 3.0)]  # a gap of 14 minutes before the last
    svg = line_chart(Chart("t", [Series("s", points, "sold", gap_s=60)]), NOW - 900, NOW)
    widths = [float(w) for w in re.findall(r'<rect class="hover"[^>]* width="([0-9.]+)"', svg)]
    per_minute = (960 - 56 - 22) / 15
    assert len(widths) == 3 and widths[0] == widths[2] == round(per_minute / 2, 1)
    assert widths[1] == round(per_minute, 1)  # half a minute either side, not seven


def test_marks_closer_than_a_few_pixels_fold_into_one_with_a_count():
    marks = [Mark(t, f"scale {t}") for t in (0, 1, 2, 3, 500)]
    groups = group_marks(marks, x=lambda t: t)  # one pixel a second
    assert [(x, len(g)) for x, g in groups] == [(0, 4), (500, 1)]
    svg = line_chart(Chart("t", [Series("s", [(0, 1), (600, 1)], "sold")], marks), since=0, until=600)
    assert svg.count('<g class="mark"') == 2 and "&#215;4" in svg and 'data-count="4"' in svg


def test_the_window_parameter_takes_the_offered_windows_and_old_names():
    assert [window_name(w) for w in ("15m", "1w", "week", "hour", "<script>", None)] == [
        "15m", "1w", "1w", "1h", "1h", "1h",
    ]  # fmt: skip
