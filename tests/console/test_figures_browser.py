"""The capacity page's figures in a real browser (Chromium driven by Playwright, the live server
and sign-in of tests/console/test_browser.py): what a planner reads is written for people, says
what it means on hover, and a sale moves only what the sale changes."""

from tests.console.test_browser import browser, csp_reports, fleet, history, pytestmark, sign_in
from tests.console.test_console_figures import long_decimals

__all__ = ["browser", "csp_reports", "fleet", "pytestmark"]  # the fixtures and marks used here

POOL = "tr[data-pool=use1-h100]"


def have(page):
    """What the pool has, as the page shows it: GPUs, MU/min, and each model's MU/min alone."""
    return (
        page.inner_text(f"{POOL} td.have"),
        page.inner_text(f"{POOL} td.have-mu"),
        page.locator("[data-pool-models=use1-h100] .have-model").all_inner_texts(),
    )


def test_a_planner_reads_figures_with_their_meaning_and_a_sale_moves_no_have(
    browser, live_server, fleet, csp_reports
):
    history(fleet.pool, fleet)
    page = sign_in(browser, live_server, "ops", csp_reports)
    assert long_decimals(page.inner_text("body")) == []
    before = have(page)
    assert before[0] == "8" and before[2], before  # GPUs, and a figure per model
    # Every figure's heading and every coefficient says what it is on hover.
    headings = page.locator("table.capacity th[title]").all()
    assert len(headings) >= 8
    for heading in headings:
        meaning = heading.get_attribute("title") or ""
        assert len(meaning.split()) >= 3 and meaning != heading.inner_text(), heading.inner_text()
    assert "input token" in (page.get_attribute("td.alpha", "title") or "")

    page.fill("#sell-form input[name=endpoint]", "owner/chat")
    page.fill("#sell-form input[name=mu_per_minute]", "300")
    page.wait_for_selector("#sell-preview .verdict")
    page.click("#sell-form button[type=submit]")
    page.wait_for_selector("#sell-form .ok")
    # The pools table refreshes itself on the sale: what was sold moved, what the pool has did not.
    page.wait_for_function(f"() => document.querySelector('{POOL} td.sold').innerText !== '0'")
    assert have(page) == before
    assert long_decimals(page.inner_text("body")) == []
