"""The sell form and the endpoint form in a real browser (Chromium driven by Playwright, the live
server and sign-in of tests/console/test_browser.py): a refused sale gives way to the preview of
an amount that fits, and a form with two independent errors shows both at once."""

from controlplane.capacity.models import Reservation
from controlplane.endpoints.models import Endpoint
from tests.console.test_browser import browser, csp_reports, fleet, pytestmark, shoot, sign_in

__all__ = ["browser", "csp_reports", "fleet", "pytestmark"]  # the fixtures and marks used here


def test_a_refusal_gives_way_to_the_preview_of_an_amount_that_fits(browser, live_server, fleet, csp_reports):
    page = sign_in(browser, live_server, "ops", csp_reports)
    page.fill("#sell-form input[name=endpoint]", "owner/chat")
    page.fill("#sell-form input[name=mu_per_minute]", "5000")
    # The preview says it first, in the words the refusal will use.
    page.wait_for_selector("#sell-preview .verdict.over")
    assert "This needs 50 replicas of 1 GPU (50 GPUs, 5,000 MU/min)" in page.inner_text("#sell-preview")
    page.click("#sell-form button[type=submit]")
    refused = page.wait_for_selector("#sell-form .refused").inner_text()
    assert refused.startswith("Refused: pool 'use1-h100' cannot place this. It has 8 GPUs (1 node x 8 GPUs);")
    assert page.locator("#sell-form .verdict").count() == 0  # the refusal alone
    page.fill("#sell-form input[name=mu_per_minute]", "300")
    page.wait_for_selector("#sell-preview .verdict.fits")
    shown = page.inner_text("#sell-form")
    assert "Fits in pool use1-h100" in shown and "Refused" not in shown
    assert page.locator("#sell-form .error").count() == 0
    assert not Reservation.objects.filter(endpoint=fleet).exists()
    shoot(page, "sell-refusal-replaced")


def test_a_form_with_two_independent_errors_shows_both(browser, live_server, fleet, csp_reports):
    page = sign_in(browser, live_server, "olivia", csp_reports)
    page.click("text=New endpoint")
    page.fill("input[name=name]", "support-bot")
    page.fill("input[name=region_preference]", "US-East")  # not a region name: the field's own error
    page.fill("input[name=min_provisioned_concurrency]", "9")  # over the maximum: a rule's
    page.fill("input[name=max_provisioned_concurrency]", "3")
    page.click("main button[type=submit]")
    page.wait_for_selector("[data-field=region_preference]")
    assert "lowercase letters" in page.inner_text("[data-field=region_preference]")
    assert "must not exceed" in page.inner_text("[data-field=min_provisioned_concurrency]")
    assert "Not saved: fix the 2 fields marked below." in page.inner_text("main")
    shoot(page, "endpoint-form-errors")
    assert not Endpoint.objects.filter(name="support-bot").exists()
