"""SVG charts: pure functions from numbers to markup."""

from controlplane.console.charts import (
    Chart,
    Frame,
    Mark,
    Series,
    _nice_ceiling,
    _step,
    _x_ticks,
    _y_ticks,
    capacity_bar,
    group_marks,
    line_chart,
    window_name,
)


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


def test_an_empty_chart_says_so():
    assert "no data yet" in line_chart(Chart("t", [Series("s", [], "sold")]), 0, 60)


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
    chart = Chart("t", [Series("s", [(now - 600, 1), (now, 2)], "sold")])
    svg = line_chart(chart, since=now - 3600, until=now, frame=Frame(left=50, pad=10, width=1010))
    assert '<polyline class="sold" points="50.0,' in svg and "1000.0," in svg


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
