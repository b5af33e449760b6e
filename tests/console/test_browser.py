"""The three personas in a real browser: headless Debian Chromium driven by Playwright.

Screenshots of each page at desktop width land in test-artifacts/screenshots/.
"""

import os
import shutil
import threading
import time
from datetime import timedelta
from pathlib import Path
from urllib.parse import quote

import pytest
from django.contrib.auth.models import User
from django.core.signals import request_finished, request_started

from controlplane.capacity.models import Reservation
from controlplane.endpoints.models import Endpoint
from controlplane.oncall.models import SETTLE, Event
from controlplane.tenants.models import Member, Tenant

CHROMIUM = "/usr/bin/chromium"
SHOTS = Path(__file__).resolve().parents[2] / "test-artifacts" / "screenshots"
DOCS_SHOTS = Path(__file__).resolve().parents[2] / "docs" / "screenshots"  # the README's
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


class InFlight:
    """Requests the live server has started and not finished (Django's request signals)."""

    def __init__(self) -> None:
        self.count = 0
        self.lock = threading.Lock()

    def started(self, **_: object) -> None:
        with self.lock:
            self.count += 1

    def finished(self, **_: object) -> None:
        with self.lock:
            self.count -= 1


@pytest.fixture
def fleet(transactional_db, owner, other, make_endpoint, csp_reports):
    in_flight = InFlight()
    request_started.connect(in_flight.started, weak=False)
    request_finished.connect(in_flight.finished, weak=False)
    chat = make_endpoint(owner, "chat")
    make_endpoint(other, "other-private-endpoint")
    event = Event.record("restart", "other-private-event", tenant=other, pod="other-pod-0")
    # The event list shows settled events only (recorded SETTLE ago); the pages below may load
    # within a second of this on a quiet machine, so it is given that age now.
    Event.objects.filter(pk=event.pk).update(recorded_at=event.recorded_at - SETTLE - timedelta(seconds=1))
    for name, tenant, operator in [("ops", None, True), ("olivia", owner, False), ("oscar", other, False)]:
        user = User.objects.create_user(name, password=f"{name}-password")
        Member.objects.create(user=user, tenant=tenant, is_operator=operator)
    yield chat
    # Before the database is flushed: a page left open polls on (the live parts), and a request
    # that holds a table while the flush truncates it deadlocks the two; so the pages close,
    # and the requests they had sent (an htmx preview, a poll) finish first.
    csp_reports.collect()
    for page in csp_reports.pages:
        page.close()
    deadline = time.monotonic() + 10
    while in_flight.count > 0 and time.monotonic() < deadline:
        time.sleep(0.02)  # another thread's request: nothing to await here
    request_started.disconnect(in_flight.started)
    request_finished.disconnect(in_flight.finished)


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


def shoot(page, name, docs=False):
    """A full-page screenshot in test-artifacts/; with docs, the README's copy in docs/ too."""
    folder = DOCS_SHOTS if docs else SHOTS
    folder.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(folder / f"{name}.png"), full_page=True)


def history(pool, endpoint):
    """Three days of the pool's snapshots (a daily peak at this hour) and a few hours of usage,
    so the charts, the forecast and the usage table show something."""
    import math
    from datetime import timedelta

    from django.utils import timezone

    from controlplane.capacity import snapshots
    from controlplane.capacity.models import CapacitySnapshot
    from controlplane.endpoints import usage
    from dataplane.wire.load_samples import EndpointSecond

    now = timezone.now()
    rows = []
    # every minute of the last two hours, as beat snapshots (the charts join minutes only), then
    # every ten minutes: the forecast reads hours
    for minutes in [*range(0, 120), *range(120, 3 * 24 * 60, 10)]:
        at = now - timedelta(minutes=minutes)
        daily = 250 + 200 * math.cos(2 * math.pi * (minutes / 1440 - 1 / 24))
        rows.append(
            CapacitySnapshot(
                pool=pool, at=at, have_gpus=8, sold_gpus=1, used_gpus=2, have_mu_per_minute=800,
                sold_mu_per_minute=100 if minutes > 30 else 300, used_mu_per_minute=daily,
            )
        )  # fmt: skip
    snapshots.write(rows)
    hour = int(now.timestamp()) // 3600 * 3600
    usage.record(
        (endpoint.pk, hour - k * 3600, EndpointSecond(mu=14000.0 - 500 * k, requests=900)) for k in range(12)
    )


def test_operator_sells_capacity_and_sees_an_oversell_refused(browser, live_server, fleet, csp_reports):
    history(fleet.pool, fleet)
    page = sign_in(browser, live_server, "ops", csp_reports)
    assert page.url.endswith("/console/capacity/")
    # A pool's node grid is read when its panel opens: each endpoint's one minimum replica.
    page.click("details.nodes[data-pool=use1-h100] summary")
    grid = page.wait_for_selector("details.nodes[data-pool=use1-h100] .node-grid")
    assert "6 GPUs free" in grid.inner_text()
    # The endpoint is typed: the datalist suggests the endpoints that match, a tenant's by its name.
    endpoint = page.locator("#sell-form input[name=endpoint]")
    endpoint.press_sequentially("owner/c")
    page.wait_for_function(
        "() => [...document.querySelectorAll('#sell-endpoints option')].map((o) => o.value).join()"
        " === 'owner/chat'"
    )
    assert "llama-8b in use1-h100 · 0 MU/min now" in page.inner_text("#sell-endpoints option")
    endpoint.fill("owner/chat")  # as picking the suggestion does
    page.fill("#sell-form input[name=mu_per_minute]", "300")
    # Before selling, the preview says what the sale would leave: 4 of 8 GPUs committed, the
    # sale's 3 whole replicas and the other endpoint's minimum replica.
    page.wait_for_function(
        "() => (document.querySelector('#sell-preview .committed-after') || {}).innerText === '4'"
    )
    assert "Fits" in page.inner_text("#sell-preview")
    page.click("#sell-form button[type=submit]")
    page.wait_for_selector("#sell-form .ok")
    assert "Sold 300 MU/min on owner/chat" in page.inner_text("#sell-form")
    # The pools table refreshes itself on the sale: 3 of 8 GPUs sold.
    page.wait_for_function("() => document.querySelector('[data-pool=use1-h100] td.sold').innerText === '3'")
    assert Reservation.objects.get(endpoint=fleet).mu_per_minute == 300
    # The open node grid stayed open through the pools' refresh, as it was read; it is read again
    # as it opens: the sale's 3 replicas and the other endpoint's minimum one on the pool's node.
    assert "6 GPUs free" in page.inner_text("details.nodes[data-pool=use1-h100][open] .node-grid")
    page.click("details.nodes[data-pool=use1-h100] summary")
    page.click("details.nodes[data-pool=use1-h100] summary")
    page.wait_for_function(
        "() => document.querySelector('details.nodes[data-pool=use1-h100] .free-gpus').innerText === '4'"
    )
    assert page.locator("details.nodes[data-pool=use1-h100] .gpu[title='owner/chat · llama-8b']").count() == 3

    page.fill("#sell-form input[name=mu_per_minute]", "5000")
    page.click("#sell-form button[type=submit]")
    refused = page.wait_for_selector("#sell-form .refused").inner_text()
    assert "use1-h100" in refused and "8 GPUs" in refused and "5,000 MU/min" in refused
    assert Reservation.objects.get(endpoint=fleet).mu_per_minute == 300
    shoot(page, "capacity")
    shoot(page, "capacity", docs=True)


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
    # The console's own refusal: its header and navigation, what was refused and why.
    assert "only operators may see this page" in page.inner_text("main")
    assert page.query_selector("header.top nav a[href='/console/endpoints/']") is not None
    shoot(page, "refused-403")
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
    page.wait_for_function("() => document.body.innerText.includes('must be a whole number')")
    assert page.evaluate("window.__pwned") is None
    assert page.query_selector("main img") is None


def test_the_api_docs_render_under_their_policy(browser, live_server, db, csp_reports):
    """Swagger UI's init script is a file (SpectacularSwaggerSplitView), as its policy needs."""
    page = new_page(browser, csp_reports)
    page.goto(f"{live_server.url}/api/docs/")
    page.wait_for_selector(".swagger-ui .info .title")
    assert "Inference control plane API" in page.inner_text(".swagger-ui .info .title")


def test_the_endpoint_page_is_live_pods_charts_and_window(browser, live_server, fleet, csp_reports):
    """The pods table refreshes with the rest (a restart shows without a reload), a tenant sees
    no pod URL, the charts span their card, and a window picked stays picked across polls."""
    from datetime import timedelta

    from django.utils import timezone

    from controlplane import pods
    from controlplane.endpoints.deployments import deployment_name
    from controlplane.endpoints.models import LoadBucket
    from dataplane.cluster.driver import PodState
    from tests.test_autoscaling import Recorder

    deployment = deployment_name(fleet.pk, fleet.version)
    pod = PodState(f"{deployment}-a", deployment, "http://10.0.0.7:9001", True, 0, True, 1.2)
    pods.sync_pods(Recorder([pod]))
    now = int(timezone.now().timestamp()) // 5 * 5
    counts = [0] * 15
    counts[5], counts[7] = 30, 2
    LoadBucket.objects.bulk_create(
        LoadBucket(
            endpoint=fleet, end=now - 5 * k, seconds=5, in_flight=3.0 + (k % 7), mu_per_minute=60.0,
            requests=32, queue_depth=0, latency_counts=counts, errors=0, throttled=0,
            ready_replicas=1 + (k < 60), desired_replicas=1 + (k < 70),
        )
        for k in range(240)  # the last 20 minutes
    )  # fmt: skip
    for k in (70, 69, 68):  # three scale steps within seconds: one mark, "x3"
        Event.record("scale", f"chat: replicas {k}", endpoint=fleet)
    Event.objects.filter(kind="scale").update(time=timezone.now() - timedelta(minutes=6))
    page = sign_in(browser, live_server, "olivia", csp_reports)
    missing = []
    page.on("response", lambda r: missing.append(r.url) if r.status == 404 else None)
    page.goto(f"{live_server.url}/console/endpoints/{fleet.pk}/")
    page.evaluate("window.__not_reloaded = true")
    assert page.inner_text(f"tr[data-pod={deployment}-a] td.restarts") == "0"
    assert "10.0.0.7" not in page.content()  # a tenant never sees a pod's URL
    # The chart spans its card (within its padding), not 60 % of it.
    card = page.query_selector("section.timeline").bounding_box()
    chart = page.query_selector("section.timeline svg.chart").bounding_box()
    assert chart["width"] > 0.9 * card["width"], (chart, card)
    assert page.query_selector("section.timeline g.mark[data-count='3']") is not None
    # Latency from the histograms: 30 requests in (0.1, 0.25] s, 2 in (0.5, 1]: p50 0.18 s.
    assert page.inner_text("dd.latency").startswith("0.18 s")
    pods.sync_pods(Recorder([PodState(pod.name, deployment, pod.url, True, 1, True, 1.2)]))
    Event.record("restart", "engine restarted after a hang", endpoint=fleet, pod=pod.name)
    page.wait_for_function(
        f"() => document.querySelector('tr[data-pod={deployment}-a] td.restarts').innerText === '1'",
        timeout=15_000,
    )
    assert "engine restarted" in page.inner_text(f"tr[data-pod={deployment}-a] td.last-event")
    page.click("nav.windows a:text('15m')")
    page.wait_for_selector("#live[data-window='15m']")
    assert page.url.endswith("?window=15m")
    page.wait_for_timeout(6_000)  # a poll later, still 15 minutes
    assert page.query_selector("#live[data-window='15m']") is not None
    assert page.evaluate("window.__not_reloaded") is True
    assert not missing, missing  # no 404 on the page (the favicon included)
    shoot(page, "endpoint-live")
    shoot(page, "endpoint", docs=True)
