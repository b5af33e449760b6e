"""The endpoint page's charts in a real browser (headless Debian Chromium driven by Playwright):
a stack outage is a break in the lines, a lone slow request is a dot whose exact latency the
pointer shows, and the three charts span one time axis. A screenshot lands in docs/screenshots/.
"""

import shutil

import pytest
from django.utils import timezone

from controlplane.endpoints.models import LoadBucket
from tests.console.test_browser import CHROMIUM, browser, csp_reports, fleet, shoot, sign_in  # noqa: F401

pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(not shutil.which(CHROMIUM), reason="needs Debian's chromium (.ci/run installs it)"),
]

HOVERED_TITLE = """() => {
  const column = document.querySelector("section.timeline rect.hover:hover");
  return column ? column.querySelector("title").textContent : null;
}"""


def test_the_endpoint_charts_show_gaps_as_gaps_and_exact_values_on_hover(
    browser,  # noqa: F811
    live_server,
    fleet,  # noqa: F811
    csp_reports,  # noqa: F811
):
    now = int(timezone.now().timestamp()) // 5 * 5
    outage = range(now - 12 * 60, now - 8 * 60)  # no router reported for four minutes
    slow = [0] * 15
    slow[12] = 1  # the one request of a quiet stretch took 48 s: in (30, 60] s
    LoadBucket.objects.bulk_create(
        LoadBucket(
            endpoint=fleet, end=end, seconds=5, in_flight=1.0, mu_per_minute=60.0,
            requests=int(end == now - 15 * 60), queue_depth=0,
            latency_counts=slow if end == now - 15 * 60 else [], errors=0, throttled=0,
            ready_replicas=2, desired_replicas=2,
        )
        for end in range(now - 20 * 60, now + 1, 5)
        if end not in outage
    )  # fmt: skip
    page = sign_in(browser, live_server, "olivia", csp_reports)
    page.goto(f"{live_server.url}/console/endpoints/{fleet.pk}/")
    charts = page.locator("section.timeline svg.chart")
    assert charts.count() == 3
    replicas, latency = charts.nth(0), charts.nth(2)

    # The outage is a break: two lines with four minutes of nothing between them.
    lines = replicas.locator("polyline.replicas")
    assert lines.count() == 2
    before, after = lines.nth(0).bounding_box(), lines.nth(1).bounding_box()
    replicas.scroll_into_view_if_needed()
    plot = replicas.locator("line.axis").bounding_box()  # the x-axis: the plot's width
    minute_px = plot["width"] / 20  # the axis spans the twenty minutes of data
    assert after["x"] - (before["x"] + before["width"]) > 3.5 * minute_px, (before, after, minute_px)
    middle = (before["x"] + before["width"] + after["x"]) / 2
    gap_hit = page.evaluate(
        "([x, y]) => document.elementFromPoint(x, y).closest('rect.hover') === null",
        [middle, before["y"] + before["height"] / 2],
    )
    assert gap_hit, "nothing to hover inside the gap: no value is shown for minutes without data"

    # The slow request is one dot per quantile (no ramp to the minutes around it), and the pointer
    # on it shows its bin's exact figures.
    assert latency.locator("polyline").count() == 0 and latency.locator("circle").count() == 2
    title = None
    for _ in range(3):  # the live part redraws every 5 s: hover again if a redraw came between
        latency.scroll_into_view_if_needed()
        dot = latency.locator("circle.sold").bounding_box()
        page.mouse.move(dot["x"] + dot["width"] / 2, dot["y"] + dot["height"] / 2)
        title = page.evaluate(HOVERED_TITLE)
        if title:
            break
    assert title is not None and title.endswith(" UTC\np50: 45 s\np99: 59.7 s"), title

    # One time axis: the three charts' time labels are the same.
    labels = [charts.nth(i).locator("text.tick.x").all_inner_texts() for i in range(3)]
    assert labels[0] == labels[1] == labels[2] and len(labels[0]) >= 4, labels
    shoot(page, "endpoint-charts", docs=True)
