"""On-call in a real browser (Debian Chromium, Playwright), as the operator who is paged: problems
arrive folded into groups while the page is open, are acknowledged, silenced with a reason and
resolved, and link their runbook; restarts count per replica slot; a death of the stack's own
worker puts the page in alarm; a tenant sees its own pods' problems only. No
Content-Security-Policy violation anywhere (the sparklines are server-drawn SVG, no script)."""

from datetime import UTC, datetime, timedelta

from controlplane.oncall import stack
from controlplane.oncall.models import Event, EventGroup
from tests.console.test_browser import browser, csp_reports, fleet, pytestmark, shoot, sign_in

__all__ = ["browser", "csp_reports", "fleet", "pytestmark"]


def test_oncall_sees_repeats_fold_live_and_acts_on_the_group(browser, live_server, fleet, csp_reports):
    page = sign_in(browser, live_server, "ops", csp_reports)  # operators act on groups
    page.goto(f"{live_server.url}/console/oncall/")
    page.evaluate("window.__not_reloaded = true")
    now = datetime.now(UTC)
    hung = "engine hung: probe unanswered for 20.0 s"
    Event.record(
        "hang", hung, endpoint=fleet, severity="critical", pod="ep-1-v1-1", time=now - timedelta(hours=2)
    )
    for i in range(30):
        pod = f"ep-{fleet.pk}-v1-r0-{i + 1}"  # one replica slot, a new pod each time
        Event.record(
            "restart", f"pod {pod} restarted (restart #{i + 1}): OOMKilled, exit code 137",
            endpoint=fleet, severity="warning", pod=pod, time=now - timedelta(minutes=30 - i),
        )  # fmt: skip
    Event.record("scale", "chat: replicas 1 -> 2: load", endpoint=fleet)  # info: not in the default view
    restart = page.wait_for_selector("tr[data-kind=restart]", timeout=15_000)  # the 5 s refresh
    assert page.evaluate("window.__not_reloaded") is True  # arrived by the refresh, not a reload
    assert "\u00d730" in restart.query_selector("a.count").inner_text()
    assert len(page.query_selector_all("#group-rows tr")) == 2
    assert page.query_selector("tr[data-kind=scale]") is None
    assert page.query_selector("tr[data-kind=restart] svg.spark polyline") is not None
    assert page.query_selector_all("#group-rows tr")[0].get_attribute("data-kind") == "hang"  # critical first
    page.wait_for_function("() => document.querySelector('.attention .count').innerText === '1'")  # refreshes
    slot = page.locator(f"#restarts tr[data-slot=ep-{fleet.pk}-v1-r0]")  # one row, not one per pod
    assert page.locator(f"#restarts tr[data-slot^=ep-{fleet.pk}-]").count() == 1
    assert "30 pods" in slot.inner_text()
    assert slot.locator("td.num").inner_text() == "30" and "OOMKilled" in slot.inner_text()
    shoot(page, "oncall")
    shoot(page, "oncall", docs=True)

    # locators, not element handles: the table is redrawn every 5 s under the test's feet
    page.locator("tr[data-kind=hang] button.acknowledge").click()
    page.wait_for_selector("tr[data-kind=hang].state-acknowledged")
    assert "acked by ops" in page.inner_text("tr[data-kind=hang]")
    assert Event.objects.get(kind="hang").acknowledged_by == "ops"
    page.wait_for_function("() => document.querySelector('.attention .count').innerText === '0'")  # after 1

    row = page.locator("tr[data-kind=restart]")
    row.locator("select[name=minutes]").select_option("240")
    row.locator("input[name=reason]").fill("OOM: limit raised, rolling out")
    page.wait_for_timeout(5_500)  # a refresh of the table comes and goes: what was typed stays
    assert row.locator("input[name=reason]").input_value() == "OOM: limit raised, rolling out"
    row.locator("button.silence").click()
    page.wait_for_selector("tr[data-kind=restart].silenced")
    assert "OOM: limit raised, rolling out" in page.inner_text("tr[data-kind=restart]")
    group = EventGroup.objects.get(kind="restart", endpoint=fleet)
    assert group.silenced_by == "ops" and group.silenced(datetime.now(UTC) + timedelta(hours=3, minutes=59))

    page.locator("tr[data-kind=hang] button.resolve").click()
    page.wait_for_selector("tr[data-kind=hang].state-resolved")
    assert EventGroup.objects.get(kind="hang").state == "resolved"
    shoot(page, "oncall-acted")

    page.click("tr[data-kind=restart] td:nth-child(2) a")  # the kind links its runbook
    page.wait_for_url("**/console/oncall/runbooks/restart/")
    assert "What to check" in page.inner_text("article.runbook")
    shoot(page, "runbook")


def test_a_tenant_sees_its_pods_restarts_and_nothing_of_another_tenants(
    browser, live_server, fleet, csp_reports
):
    Event.record("restart", "pod ep-1-v1-1 restarted: liveness failed (http://10.0.3.7:8001/livez 503)",
                 endpoint=fleet, severity="warning", pod="ep-1-v1-1")  # fmt: skip
    page = sign_in(browser, live_server, "olivia", csp_reports)
    page.goto(f"{live_server.url}/console/oncall/")
    row = page.wait_for_selector("tr[data-kind=restart]")
    assert "ep-1-v1-1" in row.inner_text() and "10.0.3.7" not in page.content()
    assert page.query_selector("button.ack") is None  # operators act on groups
    other = sign_in(browser, live_server, "oscar", csp_reports)
    other.goto(f"{live_server.url}/console/oncall/?severity=any")
    html = other.content()
    assert "ep-1-v1-1" not in html and "other-pod-0" in html


def test_a_death_of_the_stacks_worker_turns_the_open_page_to_alarm(browser, live_server, fleet, csp_reports):
    page = sign_in(browser, live_server, "ops", csp_reports)
    page.goto(f"{live_server.url}/console/oncall/")
    assert page.query_selector(".attention.alarm .stack-deaths") is None
    Event.record(
        "restart",
        "celery of the embedded stack exited with code 1 after 130 s; started again after 1 s",
        severity="warning",
        pod=stack.pod_of("celery"),
        reported_by=stack.REPORTER,
        detail={"log": "var/celery.log", "log_tail": ["Unrecoverable error: JSONDecodeError"]},
    )
    deaths = page.wait_for_selector(".attention.alarm .stack-deaths", timeout=15_000)  # the 10 s refresh
    assert "stack-celery \u00d71" in deaths.inner_text()
    deaths.query_selector("a").click()  # to the process's events, its log's end under the message
    page.wait_for_selector("details.log-tail").click()
    assert "Unrecoverable error: JSONDecodeError" in page.inner_text("details.log-tail pre")
