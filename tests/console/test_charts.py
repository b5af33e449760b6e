"""SVG charts: pure functions from numbers to markup."""

from controlplane.console.charts import (
    Chart,
    Frame,
    Mark,
    Series,
    _nice_ceiling,
    _step,
    capacity_bar,
    line_chart,
)


def test_axis_maximum_rounds_up_to_1_2_or_5():
    assert [_nice_ceiling(v) for v in (0, 0.3, 1, 7, 12, 730, 6528)] == [1, 1, 1, 10, 20, 1000, 10000]


def test_steps_hold_each_value_until_the_next():
    assert _step([(0, 2), (10, 4)], until=30) == [(0, 2), (10, 2), (10, 4), (30, 4)]


def test_frame_maps_time_and_value_to_pixels():
    f = Frame(width=100, height=60, pad=10, x_range=(0, 80), y_max=4)
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
