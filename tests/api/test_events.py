"""Events: written by operator keys (probers, autoscaler), read scoped, filtered, tailed by cursor."""

from dataclasses import replace
from datetime import UTC, datetime

from controlplane.oncall.models import Event
from dataplane.wire.pod_events import PodEvent
from tests.conftest import client_for

SETTLED = datetime(2026, 1, 1, tzinfo=UTC)  # recorded long ago: the tail may hand it out
HANG = PodEvent(
    "hang", "critical", "chat-0", "3 probes failed", None, {"failed_probes": 3}, "2026-11-29T03:00:00Z"
)


def test_an_operator_key_reports_a_hang(operator_client, owner, make_endpoint, owner_client):
    endpoint = make_endpoint(owner, "chat")
    response = operator_client.post(
        "/api/v1/events/", replace(HANG, endpoint=endpoint.pk).to_json(), format="json"
    )
    assert response.status_code == 201, response.content
    body = response.json()
    assert (body["tenant"], body["endpoint_name"], body["reported_by"]) == ("owner", "chat", "ops")
    event = Event.objects.get(pk=body["id"])
    assert event.tenant == owner and event.time == datetime(2026, 11, 29, 3, tzinfo=UTC)
    # The tenant sees its own hang.
    assert [e["id"] for e in owner_client.get("/api/v1/events/").json()["results"]] == [body["id"]]


def test_bad_events_are_refused_by_field(operator_client):
    def bad(field, value=None):
        """A pod's hang with one field broken (dropped when no value is given)."""
        body = HANG.to_json()
        body.pop(field)
        return body if value is None else {**body, field: value}

    for body, field in [
        (bad("kind", "explosion"), "kind"),
        (bad("severity", "apocalyptic"), "severity"),
        (bad("message"), "message"),
        (bad("detail", [1, 2]), "detail"),
        (bad("endpoint", 424242), "endpoint"),
        (bad("time", "yesterday"), "time"),
    ]:
        response = operator_client.post("/api/v1/events/", body, format="json")
        assert response.status_code == 400, body
        assert field in response.json()["fields"], body
    assert not Event.objects.exists()


def test_events_outlive_their_endpoint(operator_client, owner, make_endpoint):
    endpoint = make_endpoint(owner, "chat")
    Event.record(Event.Kind.RESTART, "restarted", endpoint=endpoint, pod="chat-0")
    endpoint.delete()
    (event,) = operator_client.get("/api/v1/events/").json()["results"]
    assert (event["endpoint"], event["endpoint_name"], event["tenant"]) == (None, "chat", "owner")


def test_filters_by_severity_kind_endpoint_and_time(operator_client, owner, make_endpoint):
    chat, search = make_endpoint(owner, "chat"), make_endpoint(owner, "search")
    Event.record("hang", "a", endpoint=chat, severity="critical", time=datetime(2026, 1, 1, tzinfo=UTC))
    Event.record("scale", "b", endpoint=chat, severity="info", time=datetime(2026, 1, 2, tzinfo=UTC))
    Event.record("restart", "c", endpoint=search, severity="warning", time=datetime(2026, 1, 3, tzinfo=UTC))

    def messages(query):
        response = operator_client.get(f"/api/v1/events/?{query}")
        assert response.status_code == 200, response.content
        return [e["message"] for e in response.json()["results"]]

    assert messages("") == ["c", "b", "a"]  # newest first
    assert messages("severity=critical&severity=warning") == ["c", "a"]
    assert messages("kind=scale") == ["b"]
    assert messages(f"endpoint={search.pk}") == ["c"]
    assert messages("since=2026-01-02T00:00:00Z") == ["c", "b"]
    assert messages("tenant=owner&until=2026-01-02T00:00:00Z") == ["a"]
    assert operator_client.get("/api/v1/events/?severity=bad").status_code == 400


def test_the_cursor_never_misses_nor_repeats_while_events_arrive(operator_client, owner):
    for i in range(5):
        Event.record("scale", f"e{i}", tenant=owner, recorded_at=SETTLED)
    first = operator_client.get("/api/v1/events/?page_size=2").json()
    assert [e["message"] for e in first["results"]] == ["e4", "e3"]
    Event.record("hang", "new", tenant=owner, recorded_at=SETTLED)  # lands while we page backwards
    seen = [e["message"] for e in first["results"]]
    page = first
    while page["next"]:
        page = operator_client.get(page["next"]).json()
        seen += [e["message"] for e in page["results"]]
    assert seen == ["e4", "e3", "e2", "e1", "e0"]
    # The tail asks for what came after the newest it has.
    newest = Event.objects.get(message="e4").pk
    tail = operator_client.get(f"/api/v1/events/?after={newest}").json()["results"]
    assert [e["message"] for e in tail] == ["new"]


def test_the_tail_holds_back_events_that_could_still_be_overtaken(operator_client, owner):
    old = Event.record("scale", "old", tenant=owner, recorded_at=SETTLED)
    Event.record("hang", "just now", tenant=owner)  # an older id may still be uncommitted
    tail = operator_client.get(f"/api/v1/events/?after={old.pk - 1}").json()["results"]
    assert [e["message"] for e in tail] == ["old"]


def test_acknowledge_records_who_and_when_once(operator_client, owner):
    event = Event.record("hang", "hung", tenant=owner, severity="critical")
    first = operator_client.post(f"/api/v1/events/{event.pk}/acknowledge/")
    assert first.status_code == 200
    assert first.json()["acknowledged_by"] == "ops" and first.json()["acknowledged_at"]
    again = client_for(None, name="ops-2").post(f"/api/v1/events/{event.pk}/acknowledge/").json()
    assert again["acknowledged_by"] == "ops"  # the first acknowledgement stands
    assert operator_client.get("/api/v1/events/?acknowledged=false").json()["results"] == []


def test_tenants_cannot_clear_operators_alerts(
    owner_client, other_client, operator_client, make_endpoint, owner
):
    # An operator-written critical hang on the tenant's own endpoint: only operators acknowledge it
    # (oncall.models.may_acknowledge), so it stays on the operators' unacknowledged panel.
    chat = make_endpoint(owner, "chat")
    posted = operator_client.post(
        "/api/v1/events/",
        {"kind": "hang", "severity": "critical", "message": "hung", "endpoint": chat.pk},
        format="json",
    )
    assert posted.status_code == 201, posted.json()
    event = Event.objects.get(pk=posted.json()["id"])
    refused = owner_client.post(f"/api/v1/events/{event.pk}/acknowledge/")
    assert refused.status_code == 403, refused.json()
    assert refused.json() == {"error": "permission_denied", "detail": "only operators may acknowledge events"}
    # Another tenant, and an id that does not exist, get the same 403: nothing leaks by id.
    assert other_client.post(f"/api/v1/events/{event.pk}/acknowledge/").json() == refused.json()
    assert owner_client.post("/api/v1/events/999999/acknowledge/").json() == refused.json()
    event.refresh_from_db()
    assert event.acknowledged_at is None
    unacked = operator_client.get("/api/v1/events/?acknowledged=false&severity=critical").json()["results"]
    assert [e["id"] for e in unacked] == [event.pk]
    assert operator_client.post(f"/api/v1/events/{event.pk}/acknowledge/").status_code == 200
