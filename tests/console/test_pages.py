"""Console pages, server side: scoping on the rendered HTML, htmx partials, forms, the tail."""

import re
from datetime import UTC, datetime, timedelta

import pytest
from django.contrib.auth.models import User
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from capacity import numbers
from controlplane.capacity.models import Reservation
from controlplane.endpoints.models import Endpoint, LoadBucket
from controlplane.oncall.models import Event
from controlplane.selling import sell
from controlplane.tasks import record_snapshots
from controlplane.tenants.models import ApiKey, Tenant
from tests.console.conftest import member_client

SETTLED = datetime(2026, 1, 1, tzinfo=UTC)
PAGES = ["/console/endpoints/", "/console/oncall/"]


@pytest.fixture
def owned(owner, make_endpoint):
    endpoint = make_endpoint(owner, "owner-secret-chat")
    sell(endpoint, mu_per_minute=300, best_effort_allowed=True, sold_by="t")
    Event.record("hang", "owner-hang-message", endpoint=endpoint, severity="critical", pod="owner-pod-0")
    return endpoint


def test_anonymous_visitors_are_sent_to_sign_in(db):
    response = Client().get("/console/endpoints/")
    assert response.status_code == 302 and response["Location"].startswith("/accounts/login/?next=")


def test_a_user_without_a_tenant_or_operator_role_is_refused(db):
    client = Client()
    client.force_login(User.objects.create_user("nobody", password="x"))
    assert client.get("/console/endpoints/").status_code == 403


def test_another_tenant_sees_none_of_the_first_on_any_page(other_web, owned):
    for url in PAGES:
        html = other_web.get(url).content.decode()
        for secret in ("owner-secret-chat", "owner-hang-message", "owner-pod-0", ">owner<"):
            assert secret not in html, (url, secret)
    assert other_web.get(f"/console/endpoints/{owned.pk}/").status_code == 404
    assert other_web.get(f"/console/endpoints/{owned.pk}/edit/").status_code == 404
    assert other_web.get(f"/console/endpoints/{owned.pk}/live/").status_code == 404
    assert other_web.get("/console/capacity/").status_code == 403
    tail = other_web.get("/console/oncall/tail/?after=0").content.decode()
    assert "owner-hang-message" not in tail


def test_the_owner_sees_its_endpoint_reservation_and_events(owner_web, owned):
    listing = owner_web.get("/console/endpoints/").content.decode()
    assert "owner-secret-chat" in listing and "0 / 300" in listing
    detail = owner_web.get(f"/console/endpoints/{owned.pk}/").content.decode()
    assert "0 / 300" in detail and "owner-hang-message" in detail
    Event.objects.update(recorded_at=SETTLED)
    assert "owner-hang-message" in owner_web.get("/console/oncall/").content.decode()


def test_on_call_names_a_tenant_typed_and_lists_none(operator_web, owner_web, owned):
    """An operator filters on-call by a tenant typed (a fleet has thousands: no list of them);
    a tenant has no such filter, and sees no other tenant's name."""
    Event.objects.update(recorded_at=SETTLED)
    page = operator_web.get("/console/oncall/", {"tenant": "owner"}).content.decode()
    assert '<input name="tenant" placeholder="any tenant" aria-label="tenant" value="owner">' in page
    assert "<option>owner</option>" not in page and "owner-hang-message" in page
    assert 'name="tenant"' not in owner_web.get("/console/oncall/").content.decode()


def test_the_chart_marks_redact_addresses_for_the_tenant_not_the_operator(owner_web, operator_web, owned):
    Event.record("scale", "scaled 1 -> 2 after the probe of http://10.9.8.7:8000 (fd00:10:244::17)",
                 endpoint=owned, severity="info")  # fmt: skip
    for path in (f"/console/endpoints/{owned.pk}/live/", f"/console/endpoints/{owned.pk}/"):
        tenant = owner_web.get(path).content.decode()
        assert "scaled 1 -&gt; 2 after the probe of &lt;internal address&gt;" in tenant, path
        assert "10.9.8.7" not in tenant and "fd00" not in tenant, path
        assert "http://10.9.8.7:8000" in operator_web.get(path).content.decode(), path


def test_endpoint_detail_shows_metered_traffic_latency_and_the_replica_timeline(owner_web, owned):
    now = int(timezone.now().timestamp()) // 5 * 5
    # Two buckets in the last minute: 40 and 10 requests over 5 s each -> 50 / 10 s = 5 req/s.
    # Latency from the summed histograms (LATENCY_BUCKETS_S): 40 requests in (0.1, 0.25] s, then
    # 9 in (0.25, 0.5] and 1 in (1, 2.5]. p50 is rank 25 of the first 40: 0.1 + 0.15 x 25/40 =
    # 0.19 s; p99 rank 49.5, half-way into the last: 1.75 s. The buckets' own p99s (0.25 and
    # 2.35 s) would have said 2.35 taking the larger: the histogram is what the p99 is.
    first, second = [0] * 15, [0] * 15
    first[5], second[6], second[8] = 40, 9, 1
    for end, requests, counts, desired in ((now - 10, 40, first, 2), (now - 5, 10, second, 3)):
        LoadBucket.objects.create(
            endpoint=owned, end=end, seconds=5, in_flight=6.0, mu_per_minute=30.0, requests=requests,
            queue_depth=0, p50_latency_s=0.2, p99_latency_s=2.35, latency_counts=counts, errors=0,
            throttled=0, ready_replicas=2, desired_replicas=desired,
        )  # fmt: skip
    Event.record("scale", "owner-secret-chat: replicas 2 -> 3: need 2.4", endpoint=owned)
    html = owner_web.get(f"/console/endpoints/{owned.pk}/live/", HTTP_HX_REQUEST="true").content.decode()
    assert '<dd class="traffic">5 req/s</dd>' in html
    # p50 is 0.19375 s: shown at two decimals, exact in the figure's title
    assert '<dd class="latency"><span class="figure" title="0.19375">0.19</span> s / 1.75 s</dd>' in html
    # ready replicas and p50 in green: a line, or a dot where the two buckets fall in one bin
    assert html.count('<polyline class="replicas"') == 1
    assert html.count('<polyline class="used"') + html.count('<circle class="used"') == 2
    assert "scale: owner-secret-chat: replicas 2 -&gt; 3" in html  # the event's mark
    assert 'data-window="1h"' in html  # the default window; ?window= picks another
    assert (
        'data-window="15m"'
        in owner_web.get(f"/console/endpoints/{owned.pk}/live/?window=15m").content.decode()
    )


def test_endpoint_detail_shows_its_usage_by_hour_and_day_as_the_api_does(
    settings, owner_web, owned, operator_client
):
    from controlplane import scaling
    from controlplane.endpoints import samples
    from dataplane.wire.load_samples import RouterSecond, TrafficSample

    # Ten seconds posted as routers without Redis do, then the autoscaler's pass collects them.
    settings.REDIS_URL = ""
    now = int(timezone.now().timestamp()) // 5 * 5
    one = TrafficSample(owned.pk, "owner", requests=2, mu=0.75, tokens_in=40, tokens_out=9, throttled=3)
    for second in range(now - 10, now):
        answer = operator_client.post(
            "/api/v1/load-samples/", RouterSecond(second, (one,), "router-a").to_json(), format="json"
        )
        assert answer.status_code == 201
    scaling.horizontal_pass(None, datetime.fromtimestamp(now + samples.LAG_S, UTC))
    html = owner_web.get(f"/console/endpoints/{owned.pk}/").content.decode()
    hours, days = re.findall(r'<table class="grid usage-table">(.*?)</table>', html, re.S)
    assert hours.count("<tr>") == 1 + 24 and days.count("<tr>") == 1 + 7  # every period, zeros too
    api = operator_client.get("/api/v1/usage/", {"endpoint": owned.pk}).json()["results"]
    assert sum(r["requests"] for r in api) == 20  # ten seconds may straddle two hours
    for r in api:
        when = datetime.fromisoformat(r["start"].replace("Z", "+00:00")).strftime("%H:%M")
        assert (
            f'<time datetime="{r["start"].replace("Z", "+00:00")}">{when}</time></td><td class="num mu">'
            f'{numbers.shown(r["mu"])}</td><td class="num requests">{r["requests"]}</td>'
            f'<td class="num tokens-in">'
            f'{r["tokens_in"]}</td><td class="num tokens-out">{r["tokens_out"]}</td>'
            f'<td class="num throttled">{r["throttled"]}</td>'
        ) in hours

    def column(table, name):
        return [float(v) for v in re.findall(rf'<td class="num {name}">([\d.]+)</td>', table)]

    for name, total in (
        ("mu", 7.5),
        ("requests", 20),
        ("tokens-in", 400),
        ("tokens-out", 90),
        ("throttled", 30),
    ):
        assert sum(column(days, name)) == pytest.approx(total) == sum(column(hours, name)), name


def test_capacity_page_shows_have_sold_used_per_pool(operator_web, owned):
    record_snapshots(timezone.now() - timedelta(minutes=5))
    html = operator_web.get("/console/capacity/").content.decode()
    assert 'data-pool="use1-h100"' in html
    assert '<td class="num sold">3</td>' in html  # 300 MU/min at 100 per 1-GPU replica
    assert '<td class="num headroom">5</td>' in html
    assert "<svg" in html and "llama-8b" in html
    assert operator_web.get("/console/capacity/?window=week").status_code == 200


def test_htmx_requests_get_only_the_partial(operator_web, owned):
    full = operator_web.get("/console/endpoints/").content.decode()
    partial = operator_web.get("/console/endpoints/", HTTP_HX_REQUEST="true").content.decode()
    assert "<html" in full and "<html" not in partial and "owner-secret-chat" in partial


def test_selling_from_the_page_refuses_an_oversell_with_the_numbers(operator_web, owned):
    refused = operator_web.post(
        "/console/capacity/sell/", {"endpoint": "owner/owner-secret-chat", "mu_per_minute": "900"}
    )
    assert refused.status_code == 409
    html = refused.content.decode()
    assert "Refused" in html and "use1-h100" in html and "8 GPUs" in html and "900 MU/min" in html
    assert Reservation.objects.get(endpoint=owned).mu_per_minute == 300
    changed = operator_web.post(
        "/console/capacity/sell/", {"endpoint": "owner/owner-secret-chat", "mu_per_minute": "800"}
    )
    assert changed.status_code == 200
    assert 'id="pools" hx-swap-oob="innerHTML"' in changed.content.decode()  # the table refreshes too
    assert '<td class="num sold">8</td>' in changed.content.decode()
    assert Reservation.objects.get(endpoint=owned).mu_per_minute == 800
    unknown = operator_web.post("/console/capacity/sell/", {"endpoint": "nope", "mu_per_minute": "1"})
    assert unknown.status_code == 400 and "tenant/endpoint" in unknown.content.decode()
    bad = operator_web.post(
        "/console/capacity/sell/", {"endpoint": "owner/owner-secret-chat", "mu_per_minute": "-4"}
    )
    assert bad.status_code == 400 and "mu_per_minute" in bad.content.decode()


def test_the_endpoint_form_validates_like_the_api(owner_web, pool, small_model):
    body = {
        "name": "new-chat",
        "model": "llama-8b",
        "gpu_type": "h100-80gb",
        "pool": "",
        "min_provisioned_concurrency": "10",
        "max_provisioned_concurrency": "4",
        "target_concurrency_per_replica": "",
        "routing_policy": "p2c-mu",
    }
    refused = owner_web.post("/console/endpoints/new/", body)
    assert refused.status_code == 400
    assert (
        "min_provisioned_concurrency (10) must not exceed max_provisioned_concurrency (4)"
        in refused.content.decode()
    )
    assert not Endpoint.objects.exists()
    made = owner_web.post("/console/endpoints/new/", {**body, "max_provisioned_concurrency": "40"})
    endpoint = Endpoint.objects.get()
    assert made.status_code == 302 and made["Location"] == f"/console/endpoints/{endpoint.pk}/"
    assert (endpoint.tenant.name, endpoint.pool.name) == ("owner", "use1-h100")
    edited = owner_web.post(
        f"/console/endpoints/{endpoint.pk}/edit/", {**body, "max_provisioned_concurrency": "80"}
    )
    assert edited.status_code == 302
    endpoint.refresh_from_db()
    assert endpoint.max_provisioned_concurrency == 80


def test_the_tail_hands_out_each_settled_event_once(operator_web, owner):
    first = Event.record("hang", "first", tenant=owner, recorded_at=SETTLED)
    page = operator_web.get("/console/oncall/?view=events").content.decode()
    assert f'data-cursor="{first.pk}"' in page
    second = Event.record("restart", "second", tenant=owner, recorded_at=SETTLED)
    fresh = Event.record("scale", "fresh", tenant=owner)  # not settled: an older id may still commit
    tail = operator_web.get(f"/console/oncall/tail/?after={first.pk}").content.decode()
    assert "second" in tail and "first" not in tail and "fresh" not in tail
    assert f'data-cursor="{second.pk}"' in tail and 'hx-swap-oob="afterbegin:#event-rows"' in tail
    assert 'id="attention"' in tail  # new events refresh the attention panel too
    Event.objects.filter(pk=fresh.pk).update(recorded_at=SETTLED)
    later = operator_web.get(f"/console/oncall/tail/?after={second.pk}").content.decode()
    assert "fresh" in later and "second" not in later
    quiet = operator_web.get(f"/console/oncall/tail/?after={fresh.pk}").content.decode()
    assert "<tr" not in quiet and 'id="attention"' not in quiet and f'data-cursor="{fresh.pk}"' in quiet
    assert operator_web.get("/console/oncall/tail/?after=x").status_code == 400


def test_the_tail_keeps_the_page_filters(operator_web, owner):
    Event.record("hang", "a-hang", tenant=owner, recorded_at=SETTLED, severity="critical")
    Event.record("scale", "a-scale", tenant=owner, recorded_at=SETTLED)
    tail = operator_web.get("/console/oncall/tail/?after=0&kind=hang").content.decode()
    assert "a-hang" in tail and "a-scale" not in tail and "kind=hang" in tail


def test_a_region_refusal_shows_a_tenant_where_it_fits_and_an_operator_every_pool(
    owner_web, operator_web, owner, pool, small_model
):
    body = {
        "name": "far-chat", "model": "llama-8b", "gpu_type": "h100-80gb", "pool": "",
        "min_provisioned_concurrency": "8", "max_provisioned_concurrency": "8",
        "target_concurrency_per_replica": "8", "routing_policy": "p2c-mu", "region_preference": "ap-south-1",
    }  # fmt: skip
    asked = (
        "no h100-80gb pool in region &#x27;ap-south-1&#x27; places 1 replica(s) of llama-8b (1 GPUs each): "
    )

    def refusal(client, form):
        html = client.post("/console/endpoints/new/", form).content.decode()
        return re.search(r'data-field="region_preference">(.*?)</p>', html, re.S).group(1)

    # A tenant reads where it would fit, not another pool's name or what fits in it.
    assert refusal(owner_web, body) == (
        asked + "no h100-80gb pool is in ap-south-1; they would fit in region(s) us-east-1"
    )
    assert refusal(operator_web, {**body, "tenant": owner.name}) == (
        asked + "no h100-80gb pool is in ap-south-1; elsewhere: use1-h100 in us-east-1 (8)"
    )
    assert not Endpoint.objects.exists()


def test_attention_surfaces_crash_loops_and_repeated_hangs(operator_web, owner, make_endpoint):
    chat = make_endpoint(owner, "chat")
    for _ in range(3):
        Event.record("hang", "hung", endpoint=chat, severity="critical", pod="chat-0")
    Event.record("crash_loop", "looping", endpoint=chat, severity="critical", pod="chat-1")
    Event.record("restart", "restarted", endpoint=chat, pod="chat-0")
    html = operator_web.get("/console/oncall/").content.decode()
    assert "Crash loops" in html and "chat-1" in html
    assert "Repeated hangs" in html and "\u00d73" in html  # x3
    assert '<b class="count">4</b>' in html  # unacknowledged critical events


def test_acknowledging_records_who_and_needs_csrf(owner, db):
    event = Event.record("hang", "hung", tenant=owner, severity="critical")
    strict = member_client("carol", operator=True, enforce_csrf=True)
    assert strict.post(f"/console/oncall/events/{event.pk}/ack/").status_code == 403
    event.refresh_from_db()
    assert event.acknowledged_at is None
    lenient = member_client("dave", operator=True)
    response = lenient.post(f"/console/oncall/events/{event.pk}/ack/")
    assert "dave at" in response.content.decode()
    assert response["HX-Trigger"] == "event-acknowledged"  # the attention panel refreshes
    panels = lenient.get("/console/oncall/attention/").content.decode()
    assert '<b class="count">0</b>' in panels


def test_tenant_members_see_their_events_but_cannot_acknowledge_them(owner, db):
    # Operators acknowledge (oncall.models.may_acknowledge): a tenant gets no button, and a post
    # is refused before any lookup, the same for its own event, another's and none at all.
    event = Event.record("hang", "hung", tenant=owner, severity="critical", recorded_at=SETTLED)
    olivia = member_client("olivia", tenant=owner)
    html = olivia.get("/console/oncall/?view=events").content.decode()
    assert f'id="event-{event.pk}"' in html and 'button class="ack"' not in html
    assert olivia.post(f"/console/oncall/events/{event.pk}/ack/").status_code == 403
    other = member_client("eve", tenant=Tenant.objects.create(name="eve-corp"))
    assert other.post(f"/console/oncall/events/{event.pk}/ack/").status_code == 403
    assert olivia.post("/console/oncall/events/999999/ack/").status_code == 403
    event.refresh_from_db()
    assert event.acknowledged_at is None
    ops = member_client("opal", operator=True)
    assert 'button class="ack"' in ops.get("/console/oncall/?view=events").content.decode()
    assert '<b class="count">1</b>' in ops.get("/console/oncall/attention/").content.decode()


def test_the_oncall_cursor_is_the_newest_event_the_viewer_may_see(owner, other, db):
    mine = Event.record("scale", "mine", tenant=owner, recorded_at=SETTLED)
    Event.record("scale", "theirs", tenant=other, recorded_at=SETTLED)
    Event.record("scale", "fleet", recorded_at=SETTLED)
    html = member_client("olivia", tenant=owner).get("/console/oncall/?view=events").content.decode()
    assert f'data-cursor="{mine.pk}"' in html
    newest = Event.objects.order_by("-id").first()
    ops_html = member_client("opal", operator=True).get("/console/oncall/?view=events").content.decode()
    assert f'data-cursor="{newest.pk}"' in ops_html


def test_the_oncall_filter_answers_alike_for_another_tenants_endpoint_and_none(owner, other, make_endpoint):
    theirs = make_endpoint(other, "theirs")
    Event.record("scale", "their-scale-event", endpoint=theirs, recorded_at=SETTLED)
    olivia = member_client("olivia", tenant=owner)
    pages = [
        olivia.get(f"/console/oncall/?view=events&endpoint={pk}") for pk in (theirs.pk, theirs.pk + 1000)
    ]
    # Both a 400 naming the filter (neither is a choice the viewer has), and alike in every other way.
    assert [p.status_code for p in pages] == [400, 400]
    rows = [re.search(r'<tbody id="event-rows">(.*?)</tbody>', p.content.decode(), re.S) for p in pages]
    cursors = [re.search(r'data-cursor="(\d+)"', p.content.decode()) for p in pages]
    assert rows[0] and rows[1] and rows[0].group(1).strip() == rows[1].group(1).strip() == ""
    assert cursors[0] and cursors[1] and cursors[0].group(1) == cursors[1].group(1) == "0"
    bodies = [p.content.decode() for p in pages]
    assert "their-scale-event" not in bodies[0]


def test_every_posting_form_carries_a_csrf_token(operator_web, owned):
    Event.objects.update(recorded_at=SETTLED)
    for url in [
        "/console/capacity/",
        "/console/endpoints/new/",
        f"/console/endpoints/{owned.pk}/edit/",
        "/console/oncall/",
    ]:
        html = operator_web.get(url).content.decode()
        posting = [
            f for f in re.findall(r"<form.*?</form>", html, re.S) if 'method="post"' in f or "hx-post" in f
        ]
        assert posting, url
        assert all("csrfmiddlewaretoken" in form for form in posting), url
        # htmx posts outside forms (acknowledge buttons) send the token from <body hx-headers>.
        assert '"X-CSRFToken": "' in html


def test_no_key_secret_or_hash_is_ever_rendered(operator_web, owner_web, owner, owned):
    key, secret = ApiKey.issue(name="k", tenant=owner)
    for client in (operator_web, owner_web):
        for url in [*PAGES, "/console/capacity/", f"/console/endpoints/{owned.pk}/"]:
            html = client.get(url).content.decode()
            assert secret not in html and key.secret_hash not in html


@pytest.mark.parametrize(
    "url",
    [
        "/console/capacity/",
        "/console/endpoints/",
        "/console/oncall/",
        "/console/oncall/attention/",
        "ENDPOINT",
    ],
)
def test_page_queries_do_not_grow_with_rows(operator_web, owner, make_endpoint, grow_fleet, url):
    def grow(n):
        grow_fleet(n)
        for i in range(n):  # the detail page's timeline grows too
            Event.record("scale", "x", endpoint=first, detail={"replicas": i + 1}, recorded_at=SETTLED)
        record_snapshots(timezone.now() - timedelta(minutes=n))

    first = make_endpoint(owner, "first")
    target = f"/console/endpoints/{first.pk}/" if url == "ENDPOINT" else url

    def count():
        with CaptureQueriesContext(connection) as queries:
            assert operator_web.get(target).status_code == 200
        return len(queries)

    grow(2)
    few = count()
    grow(10)
    assert count() == few


def test_profiles_show_their_benchmark_history_and_a_rerun_button(operator_web, owner_web, small_model):
    from capacity.benchmark.config import SweepConfig
    from capacity.benchmark.drivers import SimulatedDriver
    from controlplane import profile_benchmarks
    from engine_model.profiles import get_profile

    shapes = ((16, 1), (16, 16), (64, 64), (128, 128), (256, 16), (16, 200))
    profile_benchmarks.run_benchmark(
        small_model, config=SweepConfig(shapes=shapes), driver=SimulatedDriver(get_profile("tiny-test"))
    )
    html = operator_web.get("/console/capacity/").content.decode()
    assert "published" in html and "simulated:tiny-test" in html and "Re-run benchmark" in html
    row = operator_web.post(f"/console/capacity/profiles/{small_model.pk}/benchmark/").content.decode()
    assert "benchmark requested" in row
    small_model.refresh_from_db()
    assert small_model.benchmark_requested_at is not None
    assert owner_web.post(f"/console/capacity/profiles/{small_model.pk}/benchmark/").status_code == 403


def test_the_pods_table_is_live_with_each_pods_facts_and_hides_urls_from_tenants(
    owner_web, operator_web, other_web, owned, other, make_endpoint
):
    from controlplane.endpoints.deployments import deployment_name
    from controlplane.pods import sync_pods
    from dataplane.cluster.driver import PodState
    from tests.test_autoscaling import Recorder

    theirs = make_endpoint(other, "theirs")
    deployment = deployment_name(owned.pk, owned.version)
    a = PodState(f"{deployment}-a", deployment, "http://10.0.0.7:9001", True, 2, True, 1.4)
    pods = [a, PodState(f"{deployment}-b", deployment, "http://10.0.0.8:9002", False)]
    sync_pods(Recorder(pods))
    # Restarts and hangs name their pod: the owner sees the last one; another tenant's event on a
    # pod of the same name (it cannot have one; a hostile report) is not shown to the owner.
    Event.record("restart", "engine restarted after a hang", endpoint=owned, pod=f"{deployment}-a")
    Event.record("restart", "other-tenant-restart", endpoint=theirs, pod=f"{deployment}-b")
    live = owner_web.get(f"/console/endpoints/{owned.pk}/live/", HTTP_HX_REQUEST="true").content.decode()
    row_a = re.search(rf'<tr data-pod="{deployment}-a">(.*?)</tr>', live, re.S).group(1)
    assert '<td class="num restarts">2</td>' in row_a and '<td class="warm">warm</td>' in row_a
    assert '<td class="num start-to-ready">1.4 s</td>' in row_a and "engine restarted after a hang" in row_a
    row_b = re.search(rf'<tr data-pod="{deployment}-b">(.*?)</tr>', live, re.S).group(1)
    assert "not ready" in row_b and "cold" in row_b and "other-tenant-restart" not in row_b
    assert "10.0.0.7" not in live and "10.0.0.8" not in live  # a tenant never sees a pod's URL
    assert "http://10.0.0.7:9001" in operator_web.get(f"/console/endpoints/{owned.pk}/").content.decode()
    # The next sync carries a new restart count to the page.
    sync_pods(Recorder([PodState(pods[0].name, deployment, pods[0].url, True, restarts=3)]))
    live = owner_web.get(f"/console/endpoints/{owned.pk}/live/").content.decode()
    assert '<td class="num restarts">3</td>' in live and f"{deployment}-b" not in live


def test_timeline_bins_sum_buckets_by_slot_and_the_last_minute_in_one():
    from controlplane.console.views.endpoints import timeline_bins

    # (end, desired, ready, in_flight, requests, seconds, queued, latency counts)
    rows = [
        (55, 1, 1, 2.0, 10, 5, 0.0, [1, 2]),
        (60, 2, 1, 4.0, 20, 5, 1.0, [0, 3]),
        (65, 3, 2, 0.0, 5, 5, 0.0, []),
    ]
    by_minute = timeline_bins(rows, 60)
    assert [(b.slot, b.requests, b.desired) for b in by_minute] == [(60, 30, 2.0), (120, 5, 3.0)]
    assert by_minute[0].in_flight == (2.0 * 5 + 5.0 * 5) / 10 and by_minute[0].latency_counts == [1, 5]
    (whole,) = timeline_bins(rows, float("inf"))  # a minute that straddles two slots is one bin
    assert (whole.requests, whole.seconds, whole.desired) == (35, 15, 3.0)


def test_a_failing_streak_shows_on_the_profile(operator_web, small_model):
    from controlplane import profile_benchmarks

    profile_benchmarks.run_benchmark(small_model, engine_url="http://127.0.0.1:9")  # nothing listens
    profile_benchmarks.run_benchmark(small_model, engine_url="http://127.0.0.1:9")
    html = operator_web.get("/console/capacity/").content.decode()
    assert 'class="benchmark-streak"' in html and "2 in a row, next" in html


@pytest.mark.parametrize("who", ["operator", "tenant"])
@pytest.mark.parametrize(
    "url",
    [
        "/console/endpoints/",
        "/console/endpoints/?gpu_type=h100-80gb&state=pending&search=owner-e",
        "/console/oncall/",
        "/console/oncall/?view=events",
        "/console/oncall/?view=events&kind=hang&severity=critical",
        # (a full page of the tail adds one query, for the cursor it skips to: 30 hangs fill none)
        "/console/oncall/tail/?after=0&kind=hang",
        "ENDPOINT",
    ],
)
def test_a_page_makes_as_many_queries_for_30_endpoints_as_for_3(operator_web, owner, grow_tenant, who, url):
    client = operator_web if who == "operator" else member_client("olivia", tenant=owner)

    def count():
        first = Endpoint.objects.filter(tenant=owner).order_by("id").first()
        target = f"/console/endpoints/{first.pk}/" if url == "ENDPOINT" else url
        with CaptureQueriesContext(connection) as queries:
            response = client.get(target)
        assert response.status_code == 200, response.content[:300]
        assert "owner-e2" in response.content.decode() or url == "ENDPOINT"  # rows drawn: an N+1 would show
        return len(queries)

    grow_tenant(owner, 3)
    few = count()
    grow_tenant(owner, 27)
    assert count() == few
