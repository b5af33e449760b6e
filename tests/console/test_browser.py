"""The three personas in a real browser: headless Debian Chromium driven by Playwright.

Screenshots of each page at desktop width land in test-artifacts/screenshots/.
"""

import os
import shutil
from pathlib import Path
from urllib.parse import quote

import pytest
from django.contrib.auth.models import User

from controlplane.capacity.models import Reservation
from controlplane.endpoints.models import Endpoint
from controlplane.oncall.models import Event
from controlplane.tenants.models import Member, Tenant

CHROMIUM = "/usr/bin/chromium"
SHOTS = Path(__file__).resolve().parents[2] / "test-artifacts" / "screenshots"
# Playwright's sync API runs an event loop on this thread; the ORM calls the test makes between
# browser steps are plain synchronous code, which Django otherwise refuses next to a loop.
os.environ.setdefault("DJANGO_ALLOW_ASYNC_UNSAFE", "true")

pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(not shutil.which(CHROMIUM), reason="needs Debian's chromium (.ci/run installs it)"),
]


@pytest.fixture(scope="module")
def browser():
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(
            executable_path=CHROMIUM,
            args=[
                "--no-sandbox",
                "--disable-gpu",
                "--disable-quic",
                "--no-first-run",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
            ],
        )
        yield chromium
        chromium.close()


@pytest.fixture
def fleet(transactional_db, owner, other, make_endpoint):
    chat = make_endpoint(owner, "chat")
    make_endpoint(other, "other-private-endpoint")
    Event.record("restart", "other-private-event", tenant=other, pod="other-pod-0")
    for name, tenant, operator in [("ops", None, True), ("olivia", owner, False), ("oscar", other, False)]:
        user = User.objects.create_user(name, password=f"{name}-password")
        Member.objects.create(user=user, tenant=tenant, is_operator=operator)
    return chat


# What the browser reported against the Content-Security-Policy on the pages a test opened: the
# securitypolicyviolation events (an init script, which runs outside the page's policy) and the
# console's CSP messages. Every test here must end with none: the console works under the policy.
# (A test's own waits pass functions, "() => ...": Playwright evaluates a bare expression string
# in the page with eval, which the policy refuses like any other.)
CSP_WATCH = """
window.__csp_violations = [];
document.addEventListener("securitypolicyviolation",
  (e) => window.__csp_violations.push(`${e.violatedDirective} ${e.blockedURI} ${e.lineNumber}`));
"""


class CspReports(list):
    """The violations seen, and the pages to ask for theirs at the end."""

    def __init__(self) -> None:
        super().__init__()
        self.pages: list = []

    def collect(self) -> None:
        for page in self.pages:
            if not page.is_closed():
                self.extend(page.evaluate("window.__csp_violations || []"))


@pytest.fixture(autouse=True)
def csp_reports():
    reports = CspReports()
    yield reports
    reports.collect()
    assert not reports, f"Content-Security-Policy violations: {list(reports)}"


def new_page(browser, csp_reports):
    page = browser.new_page(viewport={"width": 1440, "height": 900})
    page.set_default_timeout(15_000)
    page.add_init_script(CSP_WATCH)
    # Chromium logs each refusal ("... violates the following Content Security Policy directive").
    page.on("console", lambda m: csp_reports.append(m.text) if "Content Security Policy" in m.text else None)
    csp_reports.pages.append(page)
    return page


def sign_in(browser, live_server, username, csp_reports):
    page = new_page(browser, csp_reports)
    page.goto(f"{live_server.url}/console/")
    assert "/accounts/login/" in page.url
    page.fill("input[name=username]", username)
    page.fill("input[name=password]", f"{username}-password")
    page.click("button[type=submit]")
    page.wait_for_url("**/console/**")
    return page


def shoot(page, name):
    SHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SHOTS / f"{name}.png"), full_page=True)


def test_operator_sells_capacity_and_sees_an_oversell_refused(browser, live_server, fleet, csp_reports):
    page = sign_in(browser, live_server, "ops", csp_reports)
    assert page.url.endswith("/console/capacity/")
    page.fill("#sell-form input[name=endpoint]", "owner/chat")
    page.fill("#sell-form input[name=mu_per_minute]", "300")
    page.click("#sell-form button[type=submit]")
    page.wait_for_selector("#sell-form .ok")
    assert "Sold 300 MU/min on owner/chat" in page.inner_text("#sell-form")
    # The pools table refreshes itself on the sale: 3 of 8 GPUs sold.
    page.wait_for_function("() => document.querySelector('[data-pool=use1-h100] td.sold').innerText === '3'")
    assert Reservation.objects.get(endpoint=fleet).mu_per_minute == 300

    page.fill("#sell-form input[name=mu_per_minute]", "5000")
    page.click("#sell-form button[type=submit]")
    refused = page.wait_for_selector("#sell-form .refused").inner_text()
    assert "use1-h100" in refused and "8 GPUs" in refused and "5000 MU/min" in refused
    assert Reservation.objects.get(endpoint=fleet).mu_per_minute == 300
    shoot(page, "capacity")


def test_tenant_engineer_creates_an_endpoint(browser, live_server, fleet, csp_reports):
    page = sign_in(browser, live_server, "olivia", csp_reports)
    assert page.url.endswith("/console/endpoints/")
    page.click("text=New endpoint")
    page.fill("input[name=name]", "support-bot")
    page.fill("input[name=min_provisioned_concurrency]", "9")
    page.fill("input[name=max_provisioned_concurrency]", "3")
    page.click("main button[type=submit]")
    assert "must not exceed" in page.inner_text("[data-field=min_provisioned_concurrency]")
    shoot(page, "endpoint-form-error")
    page.fill("input[name=max_provisioned_concurrency]", "64")
    page.click("main button[type=submit]")
    page.wait_for_url("**/console/endpoints/*/")
    assert "owner/support-bot" in page.inner_text("h1")
    assert Endpoint.objects.filter(tenant__name="owner", name="support-bot").exists()
    shoot(page, "endpoint-detail")
    page.goto(f"{live_server.url}/console/endpoints/")
    page.fill("input[name=search]", "support")
    page.wait_for_function("() => !document.querySelector('#endpoint-table').innerText.includes('chat\\t')")
    assert "support-bot" in page.inner_text("#endpoint-table")
    shoot(page, "endpoints")


def test_another_tenant_sees_nothing_of_the_first_in_the_browser(browser, live_server, fleet, csp_reports):
    Event.record("hang", "owner-only-hang", endpoint=fleet, severity="critical", pod="chat-0")
    Reservation.objects.create(endpoint=fleet, mu_per_minute=100)
    page = sign_in(browser, live_server, "oscar", csp_reports)
    for path in ["/console/endpoints/", "/console/oncall/?severity=any", "/console/oncall/?view=events"]:
        page.goto(f"{live_server.url}{path}")
        html = page.content()
        assert "other-private-endpoint" in html or "other-private-event" in html
        for leaked in ("owner-only-hang", ">chat<", "owner/chat", "chat-0"):
            assert leaked not in html, (path, leaked)
    assert page.goto(f"{live_server.url}/console/endpoints/{fleet.pk}/").status == 404
    assert page.goto(f"{live_server.url}/console/capacity/").status == 403
    assert not Tenant.objects.filter(name="oscar").exists()


def test_a_script_sent_in_a_query_does_not_run_nor_reach_the_csrf_token(
    browser, live_server, fleet, csp_reports
):
    """The reported attack: a link to the on-call tail with markup in ?after ran as the user."""
    page = sign_in(browser, live_server, "olivia", csp_reports)
    assert "csrftoken" not in page.evaluate("document.cookie")  # HttpOnly: script never reads it
    attack = '<img src=x onerror="window.__pwned = document.cookie || 1"><script>window.__pwned = 2</script>'
    response = page.goto(f"{live_server.url}/console/oncall/tail/?after={quote(attack)}")
    assert response.status == 400
    assert page.evaluate("window.__pwned") is None
    assert page.query_selector("img, script") is None  # shown as text, not parsed as markup
    assert "<img src=x" in page.inner_text("body")
    # htmx swaps a 400 into the page: the same answer, fetched by htmx into the live on-call page.
    page.goto(f"{live_server.url}/console/oncall/?view=events")  # the live event tail
    page.evaluate(
        "(url) => htmx.ajax('GET', url, {target: '#tail-poller', swap: 'outerHTML'})",
        f"/console/oncall/tail/?after={quote(attack)}",
    )
    page.wait_for_function("() => document.body.innerText.includes('after must be an event id')")
    assert page.evaluate("window.__pwned") is None
    assert page.query_selector("main img") is None


def test_the_api_docs_render_under_their_policy(browser, live_server, db, csp_reports):
    """Swagger UI's init script is a file (SpectacularSwaggerSplitView), as its policy needs."""
    page = new_page(browser, csp_reports)
    page.goto(f"{live_server.url}/api/docs/")
    page.wait_for_selector(".swagger-ui .info .title")
    assert "Inference control plane API" in page.inner_text(".swagger-ui .info .title")
