"""GET /api/v1/usage/: the routers' seconds (published to Redis as routers do, or posted to
/load-samples/), billed by the collector (here the one the horizontal pass runs first), summed
per endpoint by UTC hour and day; each tenant sees only its own. Usage outlives its endpoint:
deleted, it reads the same, and the seconds metered after the delete are billed to it."""

import math
from datetime import UTC, datetime, timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from controlplane import scaling
from controlplane.endpoints import collector, samples, tasks, usage
from controlplane.endpoints.models import DeletedEndpoint, Lease, TenantUsageHour, UsageHour
from controlplane.selling import sell
from dataplane.wire.load_samples import CATCH_UP_S, EndpointSecond, RouterSecond, TrafficSample
from tests.conftest import endpoint_body

DAY = datetime(2026, 11, 29, tzinfo=UTC)


def at(hours: float) -> int:
    """Unix seconds, `hours` after midnight of DAY."""
    return int((DAY + timedelta(hours=hours)).timestamp())


def collect(until: int) -> None:
    """The horizontal pass (its collect pass first) just after the slot ending at `until` was
    published."""
    assert scaling.horizontal_pass(None, datetime.fromtimestamp(until + samples.LAG_S, UTC)) is not None


def iso(ts: int) -> str:
    return datetime.fromtimestamp(ts, UTC).isoformat().replace("+00:00", "Z")


@pytest.fixture
def chat(owner, make_endpoint):
    return make_endpoint(owner, "chat")


@pytest.fixture
def rival(other, make_endpoint):
    return make_endpoint(other, "rival")


def figures(row):
    return {k: row[k] for k in ("mu", "requests", "tokens_in", "tokens_out", "throttled", "errors")}


@pytest.fixture
def traffic(publish_seconds, chat, rival):
    """Four slots of chat's traffic across two hours and two days, one of rival's."""
    one = TrafficSample(chat.pk, "owner", requests=1, mu=0.5, tokens_in=100, tokens_out=20, throttled=1)
    # 10:00:00-10:00:05, two routers: 10 requests, 5 MU, 1000 in, 200 out, 10 throttled
    publish_seconds({s: [[one], [one]] for s in range(at(10), at(10) + 5)})
    rivals = TrafficSample(rival.pk, "other", requests=7, mu=9.0, tokens_in=1, tokens_out=1)
    publish_seconds({at(10) + 4: [[rivals]]})
    collect(at(10) + 5)
    # 10:59:55-11:00:00, still hour 10: 5 requests, one error
    late = TrafficSample(chat.pk, "owner", requests=1, mu=0.25, tokens_in=10, tokens_out=4)
    publish_seconds({s: [[late]] for s in range(at(11) - 5, at(11))})
    publish_seconds({at(11) - 1: [[TrafficSample(chat.pk, "owner", errors=1)]]})
    collect(at(11))
    # 11:00:00-11:00:05: hour 11
    publish_seconds({at(11) + 2: [[TrafficSample(chat.pk, "owner", requests=2, mu=1.0, tokens_out=50)]]})
    collect(at(11) + 5)
    # the next day, 00:00:00-00:00:05
    publish_seconds({at(24): [[TrafficSample(chat.pk, "owner", requests=3, mu=2.0, tokens_in=30)]]})
    collect(at(24) + 5)


def test_usage_sums_the_routers_seconds_by_hour_and_by_day(owner_client, traffic, chat):
    answer = owner_client.get("/api/v1/usage/", {"start": iso(at(9)), "end": iso(at(25))})
    assert answer.status_code == 200, answer.json()
    rows = answer.json()["results"]
    assert [(r["start"], r["end"], r["endpoint"], r["endpoint_name"], r["tenant"]) for r in rows] == [
        (iso(at(10)), iso(at(11)), chat.pk, "chat", "owner"),
        (iso(at(11)), iso(at(12)), chat.pk, "chat", "owner"),
        (iso(at(24)), iso(at(25)), chat.pk, "chat", "owner"),
    ]  # rival's hour is another tenant's: not here
    hour_10 = {"mu": 6.25, "requests": 15, "tokens_in": 1050, "tokens_out": 220, "throttled": 10, "errors": 1}
    hour_11 = {"mu": 1, "requests": 2, "tokens_in": 0, "tokens_out": 50, "throttled": 0, "errors": 0}
    next_day = {"mu": 2, "requests": 3, "tokens_in": 30, "tokens_out": 0, "throttled": 0, "errors": 0}
    assert [figures(r) for r in rows] == [hour_10, hour_11, next_day]

    by_day = owner_client.get(
        "/api/v1/usage/", {"granularity": "day", "start": iso(at(10)), "end": iso(at(30))}
    ).json()["results"]
    assert [(r["start"], r["end"]) for r in by_day] == [(iso(at(0)), iso(at(24))), (iso(at(24)), iso(at(48)))]
    assert figures(by_day[0]) == {k: hour_10[k] + hour_11[k] for k in hour_10}
    assert figures(by_day[1]) == next_day


def test_a_slot_collected_again_is_not_counted_twice(owner_client, traffic):
    # A collect pass that committed but could not move its cursor: the next one reads the same
    # slots. Their buckets are there already, and billing does not follow the cursor.
    Lease.objects.filter(name=collector.COLLECTOR).update(cursor=at(24) - 5, last_run_at=None)
    assert collector.collect_pass(datetime.fromtimestamp(at(24) + 5 + samples.LAG_S, UTC)) is not None
    rows = owner_client.get("/api/v1/usage/", {"start": iso(at(24)), "end": iso(at(25))}).json()["results"]
    assert [r["requests"] for r in rows] == [3]


def test_a_decider_that_fails_leaves_billing_alone(owner_client, publish_seconds, chat, monkeypatch):
    # The horizontal pass fails after its collect pass (here its forecast): the usage is billed
    # all the same, once, and the next pass does not bill it again.
    publish_seconds({at(10) + 2: [[TrafficSample(chat.pk, "owner", requests=4, mu=1.5, tokens_out=9)]]})

    def broken(*args, **kwargs):
        raise RuntimeError("the forecast failed")

    monkeypatch.setattr(scaling, "predicted_minimums", broken)
    with pytest.raises(RuntimeError):
        collect(at(10) + 5)
    monkeypatch.undo()
    window = {"start": iso(at(10)), "end": iso(at(11))}
    billed = [
        (r["requests"], r["mu"], r["tokens_out"])
        for r in owner_client.get("/api/v1/usage/", window).json()["results"]
    ]
    assert billed == [(4, 1.5, 9)]
    collect(at(10) + 10)
    rows = owner_client.get("/api/v1/usage/", window).json()["results"]
    assert [(r["requests"], r["mu"], r["tokens_out"]) for r in rows] == [(4, 1.5, 9)]


def test_each_tenant_sees_its_own_and_operators_see_all(
    owner_client, other_client, operator_client, traffic, chat, rival
):
    window = {"start": iso(at(10)), "end": iso(at(11))}
    theirs = other_client.get("/api/v1/usage/", window).json()["results"]
    assert [(r["endpoint"], r["requests"], r["mu"]) for r in theirs] == [(rival.pk, 7, 9)]
    everyone = operator_client.get("/api/v1/usage/", window).json()["results"]
    assert [(r["endpoint"], r["requests"]) for r in everyone] == [(chat.pk, 15), (rival.pk, 7)]
    only = operator_client.get("/api/v1/usage/", {**window, "tenant": "other"}).json()["results"]
    assert [r["endpoint"] for r in only] == [rival.pk]
    one = operator_client.get("/api/v1/usage/", {**window, "endpoint": chat.pk}).json()["results"]
    assert [r["endpoint"] for r in one] == [chat.pk]
    # Another tenant's endpoint or tenant answers exactly as one that does not exist.
    for query in ({"endpoint": rival.pk}, {"endpoint": 987654}, {"tenant": "other"}, {"tenant": "nobody"}):
        answer = owner_client.get("/api/v1/usage/", {**window, **query})
        assert (answer.status_code, answer.json()) == (
            200,
            {"count": 0, "next": None, "previous": None, "results": []},
        ), query


def test_without_redis_the_posted_seconds_are_the_usage(settings, operator_client, owner_client, chat):
    settings.REDIS_URL = ""
    now = int(timezone.now().timestamp()) // 5 * 5
    rows = (TrafficSample(chat.pk, "owner", requests=2, mu=0.75, tokens_in=40, tokens_out=9, throttled=3),)
    for second in range(now - 10, now):
        answer = operator_client.post(
            "/api/v1/load-samples/", RouterSecond(second, rows, "router-a").to_json(), format="json"
        )
        assert answer.status_code == 201, answer.json()
    collect(now)
    # No window given: the last 24 hours by the hour, the current one included.
    answer = owner_client.get("/api/v1/usage/")
    assert answer.status_code == 200, answer.json()
    totals = [figures(r) for r in answer.json()["results"]]
    hour_of = {second // 3600 for second in range(now - 10, now)}
    assert len(totals) == len(hour_of)  # ten seconds may straddle an hour
    assert sum(t["requests"] for t in totals) == 20 and sum(t["throttled"] for t in totals) == 30
    assert sum(t["tokens_in"] for t in totals) == 400 and sum(t["tokens_out"] for t in totals) == 90
    assert sum(t["mu"] for t in totals) == pytest.approx(7.5)
    by_day = owner_client.get("/api/v1/usage/", {"granularity": "day"}).json()["results"]
    assert sum(r["requests"] for r in by_day) == 20


@pytest.mark.parametrize(
    ("query", "field"),
    [
        ({"granularity": "week"}, "granularity"),
        ({"start": "yesterday"}, "start"),
        ({"end": "2026-13-01T00:00:00Z"}, "end"),
        ({"start": "2026-11-29T10:00:00Z", "end": "2026-11-29T09:00:00Z"}, "start"),
        ({"start": "2026-11-29T10:00:00Z", "end": "2026-11-29T10:00:00Z"}, "start"),
        ({"start": "2026-10-01T00:00:00Z", "end": "2026-11-29T00:00:00Z"}, "start"),  # 59 days by the hour
        ({"granularity": "day", "start": "2024-01-01T00:00:00Z", "end": "2026-01-01T00:00:00Z"}, "start"),
        ({"endpoint": "chat"}, "endpoint"),
        ({"endpoint": "0"}, "endpoint"),
        ({"endpoint": str(10**30)}, "endpoint"),
        ({"tenant": "x" * 64}, "tenant"),
    ],
)
def test_bad_parameters_are_a_400_naming_them(owner_client, query, field):
    answer = owner_client.get("/api/v1/usage/", query)
    assert answer.status_code == 400, answer.json()
    body = answer.json()
    assert body["error"] == "invalid" and list(body["fields"]) == [field], body


def test_the_window_is_whole_periods():
    now = at(10.5)
    assert usage.window("hour", None, None, now) == usage.Window("hour", at(-13), at(11))
    assert usage.window("day", None, None, now) == usage.Window("day", at(-6 * 24), at(24))
    assert usage.window("hour", at(9.25), at(9.75), now) == usage.Window("hour", at(9), at(10))
    assert usage.window("day", at(1), None, now) == usage.Window("day", at(0), at(24))
    assert len(usage.window("hour", at(-31 * 24), at(0), now).periods()) == 31 * 24


def test_usage_pages_take_the_same_queries_however_many_rows(operator_client, owner, make_endpoint):
    def grow(n):
        start = len(UsageHour.objects.values("endpoint_id").distinct())
        for i in range(start, start + n):
            # At zero: twelve endpoints of a minimum replica each would not fit the 8-GPU pool.
            e = make_endpoint(owner, f"e{i}", scale_to_zero_enabled=True)
            usage.record((e.pk, at(h), EndpointSecond(requests=1, mu=0.5)) for h in range(5))

    def count():
        with CaptureQueriesContext(connection) as queries:
            answer = operator_client.get("/api/v1/usage/", {"start": iso(at(0)), "end": iso(at(24))})
        assert answer.status_code == 200, answer.json()
        return len(queries), answer.json()["count"]

    operator_client.get("/api/v1/whoami/")  # the key's first use writes its last-used time
    grow(2)
    few, rows_few = count()
    grow(10)
    many, rows_many = count()
    assert (rows_few, rows_many) == (10, 60)
    assert many == few, f"{few} queries for {rows_few} rows, {many} for {rows_many}"


def test_usage_needs_a_key(db):
    from rest_framework.test import APIClient

    assert APIClient().get("/api/v1/usage/").status_code == 401


def answers(client, endpoint) -> list:
    """Every usage answer a client gets about the DAY's traffic: the endpoint's and the whole
    list's, by the hour and by the day."""
    hours = {"start": iso(at(9)), "end": iso(at(25))}
    days = {"granularity": "day", "start": iso(at(0)), "end": iso(at(48))}
    return [
        client.get("/api/v1/usage/", query).json()
        for query in (hours, days, {**hours, "endpoint": endpoint.pk}, {**days, "endpoint": endpoint.pk})
    ]


@pytest.mark.parametrize("released", [False, True])
def test_a_deleted_endpoints_usage_reads_as_before_the_delete(
    owner_client, other_client, operator_client, traffic, chat, rival, released
):
    if released:
        sell(chat, mu_per_minute=100, best_effort_allowed=True, sold_by="ops")
    owners, operators = answers(owner_client, chat), answers(operator_client, chat)
    assert [r["requests"] for r in owners[2]["results"]] == [15, 2, 3]
    if released:  # reserved: only an operator's ?release=true deletes it
        assert owner_client.delete(f"/api/v1/endpoints/{chat.pk}/").status_code == 409
        deleted = operator_client.delete(f"/api/v1/endpoints/{chat.pk}/?release=true")
    else:
        deleted = owner_client.delete(f"/api/v1/endpoints/{chat.pk}/")
    assert deleted.status_code == 204
    assert owner_client.get(f"/api/v1/endpoints/{chat.pk}/").status_code == 404
    assert answers(owner_client, chat) == owners
    assert answers(operator_client, chat) == operators
    # Another tenant asking for it gets what it got before: nothing, as for an id never made.
    mine = other_client.get("/api/v1/usage/", {"start": iso(at(9)), "end": iso(at(25))}).json()["results"]
    assert [r["endpoint"] for r in mine] == [rival.pk]
    for query in ({"endpoint": chat.pk}, {"tenant": "owner"}):
        asked = other_client.get("/api/v1/usage/", {"start": iso(at(9)), "end": iso(at(25)), **query})
        assert asked.json()["results"] == [], query


def test_a_new_endpoint_under_a_deleted_ones_name_starts_clean(owner_client, publish_seconds, traffic, chat):
    assert owner_client.delete(f"/api/v1/endpoints/{chat.pk}/").status_code == 204
    made = owner_client.post("/api/v1/endpoints/", endpoint_body(name="chat"), format="json")
    assert made.status_code == 201, made.json()
    again = made.json()["id"]
    assert again != chat.pk
    day = {"start": iso(at(24)), "end": iso(at(25))}
    assert owner_client.get("/api/v1/usage/", {**day, "endpoint": again}).json()["results"] == []
    publish_seconds({at(24) + 7: [[TrafficSample(again, "owner", requests=1, mu=0.5)]]})
    collect(at(24) + 10)
    rows = owner_client.get("/api/v1/usage/", day).json()["results"]
    assert [(r["endpoint"], r["endpoint_name"], r["requests"]) for r in rows] == [
        (chat.pk, "chat", 3),
        (again, "chat", 1),
    ]


def test_a_renamed_endpoints_usage_reads_under_its_new_name(owner_client, traffic, chat):
    renamed = owner_client.patch(f"/api/v1/endpoints/{chat.pk}/", {"name": "talk"}, format="json")
    assert renamed.status_code == 200, renamed.json()
    rows = owner_client.get("/api/v1/usage/", {"start": iso(at(9)), "end": iso(at(25))}).json()["results"]
    assert [(r["endpoint_name"], r["requests"]) for r in rows] == [("talk", 15), ("talk", 2), ("talk", 3)]


@pytest.fixture(params=["redis", "posted"])
def meter(request, settings, publish_seconds, operator_client):
    """``meter({second: samples})``: one router's seconds, published to Redis or, without it
    (the embedded default), posted to /api/v1/load-samples/."""
    if request.param == "redis":
        return lambda seconds: publish_seconds({s: [rows] for s, rows in seconds.items()})
    settings.REDIS_URL = ""

    def post(seconds):
        for second, rows in seconds.items():
            answer = operator_client.post(
                "/api/v1/load-samples/",
                RouterSecond(second, tuple(rows), "router-1").to_json(),
                format="json",
            )
            assert answer.status_code == 201, answer.json()

    return post


@pytest.mark.parametrize("released", [False, True])
def test_seconds_metered_after_a_delete_are_billed_to_the_deleted_endpoint(
    meter, owner_client, other_client, operator_client, chat, released
):
    one = [TrafficSample(chat.pk, "owner", requests=1, mu=0.5, tokens_in=10, tokens_out=2)]
    start = int(timezone.now().timestamp()) // 5 * 5 - 30
    meter({s: one for s in range(start, start + 5)})
    collect(start + 5)  # 5 requests billed while it lives
    meter({s: one for s in range(start + 5, start + 8)})  # 3 more metered, not billed yet
    if released:
        sell(chat, mu_per_minute=100, best_effort_allowed=True, sold_by="ops")
        deleted = operator_client.delete(f"/api/v1/endpoints/{chat.pk}/?release=true")
    else:
        deleted = owner_client.delete(f"/api/v1/endpoints/{chat.pk}/")
    assert deleted.status_code == 204
    gone = math.ceil(DeletedEndpoint.objects.get(endpoint_id=chat.pk).deleted_at.timestamp())
    # 2 requests in flight at the delete finish after it, and a router held one through an
    # outage well past the collector's catch-up: each is the deleted endpoint's, billed once.
    meter({gone + 1: one, gone + 2: one, gone + CATCH_UP_S + 5: one})
    collect(gone + 10)
    # A collect pass that committed but could not move its cursor: the next reads the same slots.
    Lease.objects.filter(name=collector.COLLECTOR).update(cursor=start - 5)
    Lease.objects.update(last_run_at=None)  # and it comes within half a tick of the last
    collect(gone + 10)
    collect(gone + CATCH_UP_S + 20)
    window = {"start": iso(start - 3600), "end": iso(gone + CATCH_UP_S + 3600)}
    for client in (owner_client, operator_client):
        rows = client.get("/api/v1/usage/", {**window, "endpoint": chat.pk}).json()["results"]
        assert {(r["endpoint_name"], r["tenant"]) for r in rows} == {("chat", "owner")}
        assert {f: sum(r[f] for r in rows) for f in ("requests", "mu", "tokens_in", "tokens_out")} == {
            "requests": 11,
            "mu": 5.5,
            "tokens_in": 110,
            "tokens_out": 22,
        }
    assert other_client.get("/api/v1/usage/", {**window, "endpoint": chat.pk}).json()["results"] == []


def test_seconds_of_an_id_that_never_was_an_endpoint_bill_no_one(owner, chat):
    usage.record(
        [(chat.pk, at(10), EndpointSecond(requests=1, mu=1.0)), (9999, at(10), EndpointSecond(requests=5))]
    )
    assert list(UsageHour.objects.values_list("endpoint_id", "endpoint_name", "tenant")) == [
        (chat.pk, "chat", owner.pk)
    ]


def test_usage_of_deleted_endpoints_is_kept_usage_retention_days(settings, owner_client, owner, chat):
    settings.CLUSTER_DRIVER, settings.USAGE_RETENTION_DAYS = "none", 30
    hour = int(timezone.now().timestamp()) // 3600 * 3600
    old, kept = hour - 31 * 86400, hour - 29 * 86400
    DeletedEndpoint.objects.create(
        endpoint_id=9999, name="gone", tenant=owner, deleted_at=datetime.fromtimestamp(old, UTC)
    )
    usage.record(
        [(chat.pk, s, EndpointSecond(requests=1, mu=1.0)) for s in (old, kept)]
        + [(9999, old, EndpointSecond(requests=5, mu=5.0))]
    )
    assert owner_client.delete(f"/api/v1/endpoints/{chat.pk}/").status_code == 204
    tasks.collect_load()
    assert list(UsageHour.objects.values_list("endpoint_id", "start")) == [(chat.pk, kept)]
    assert list(TenantUsageHour.objects.values_list("tenant", "start")) == [(owner.pk, kept)]
    assert list(DeletedEndpoint.objects.values_list("endpoint_id", flat=True)) == [chat.pk]
    rows = owner_client.get(
        "/api/v1/usage/", {"granularity": "day", "start": iso(old - 86400), "end": iso(hour)}
    ).json()["results"]
    assert [(r["endpoint"], r["requests"]) for r in rows] == [(chat.pk, 1)]


def test_a_tenant_is_not_deleted_while_it_has_usage(operator_client, owner_client, owner, traffic, chat):
    assert owner_client.delete(f"/api/v1/endpoints/{chat.pk}/").status_code == 204
    refused = operator_client.delete(f"/api/v1/tenants/{owner.pk}/")
    assert refused.status_code == 409 and refused.json()["error"] == "protected", refused.json()
    kept = owner_client.get("/api/v1/usage/", {"endpoint": chat.pk, "start": iso(at(9)), "end": iso(at(25))})
    assert kept.json()["count"] == 3
