"""Every query parameter the API and the console read, given values no database column holds: ids
past bigint, date-times that leave the calendar once converted to UTC, forged cursors, page
numbers of thousands of digits. Each is a 400 naming the parameter, never a 500 nor a silent empty
page, on the test database (PostgreSQL in `make test`) with events in it."""

from base64 import b64encode
from datetime import UTC, datetime
from urllib.parse import quote

import pytest
from django.test import Client
from hypothesis import given
from hypothesis import strategies as st

from controlplane.api import params
from controlplane.oncall.models import Event
from tests.console.conftest import member_client

HUGE = "99999999999999999999"  # past bigint (2**63 - 1 is 19 digits)
EARLY = "0001-01-01T00:00:00+14:00"  # a day before year 1 in UTC
LATE = "9999-12-31T23:59:59-14:00"  # past year 9999 in UTC


def forged(querystring: str) -> str:
    return b64encode(querystring.encode()).decode()


# (path, parameter, value): the API's.
API = [
    ("/api/v1/events/", "group", HUGE),
    ("/api/v1/events/", "group", "-" + HUGE),
    ("/api/v1/events/", "group", "1.5"),
    ("/api/v1/events/", "endpoint", HUGE),
    ("/api/v1/events/", "endpoint", "abc"),
    ("/api/v1/pods/", "endpoint", HUGE),
    ("/api/v1/reservations/", "endpoint", "-1"),
    ("/api/v1/events/", "after", HUGE),
    ("/api/v1/events/", "after", "-1"),
    ("/api/v1/events/", "since", EARLY),
    ("/api/v1/events/", "until", LATE),
    ("/api/v1/events/", "since", "2026-13-01T00:00:00"),
    ("/api/v1/events/", "cursor", forged("p=abc")),
    ("/api/v1/events/", "cursor", forged(f"p={HUGE}")),
    ("/api/v1/events/", "cursor", forged("o=-1")),
    ("/api/v1/events/", "cursor", "not a cursor"),
    ("/api/v1/events/", "page_size", "9" * 5000),
    ("/api/v1/endpoints/", "cursor", forged(f"p={HUGE}")),
    ("/api/v1/endpoints/", "cursor", forged("p=abc&r=1")),
    ("/api/v1/endpoints/", "cursor", "not a cursor"),
    ("/api/v1/endpoints/?cursor=cD0x&", "page", "2"),  # a cursor or a page number, not both
    ("/api/v1/pods/", "cursor", forged("p=-5")),
    ("/api/v1/reservations/", "cursor", forged("o=-1")),
    ("/api/v1/endpoints/", "page", HUGE),
    ("/api/v1/endpoints/", "page", "abc"),
    ("/api/v1/endpoints/", "page_size", "9" * 5000),
    ("/api/v1/events/", "acknowledged", "maybe"),
    ("/api/v1/pods/", "ready", "maybe"),
    ("/api/v1/endpoints/", "scale_to_zero_enabled", "unknown"),
    ("/api/v1/usage/", "start", EARLY),
    ("/api/v1/usage/", "end", LATE),
    ("/api/v1/usage/", "endpoint", HUGE),
    ("/api/v1/usage/", "page", "9" * 5000),
]

# The console's: the on-call page (its groups and its events view) and the tail it polls.
CONSOLE = [
    ("/console/oncall/tail/", "after", HUGE),
    ("/console/oncall/tail/", "after", "-1"),
    ("/console/oncall/tail/", "after", "9" * 5000),
    ("/console/oncall/tail/", "group", HUGE),
    ("/console/oncall/tail/", "since", EARLY),
    ("/console/oncall/tail/", "until", LATE),
    ("/console/oncall/?view=events&", "group", HUGE),
    ("/console/oncall/?view=events&", "since", EARLY),
    ("/console/oncall/?", "endpoint", HUGE),
    ("/console/endpoints/?", "scale_to_zero_enabled", "maybe"),
    ("/console/endpoints/?", "after", HUGE),
    ("/console/endpoints/?", "after", "-1"),
    ("/console/endpoints/?search=chat&", "before", "abc"),
    ("/console/capacity/preview/?endpoint=owner/chat&", "mu_per_minute", "9" * 5000),
]


@pytest.fixture
def events(owner):
    settled = datetime(2026, 1, 1, tzinfo=UTC)
    for i in range(3):
        Event.objects.create(
            kind="hang", severity="critical", tenant=owner, pod=f"p-{i}", recorded_at=settled
        )


def url(path: str, name: str, value: str) -> str:
    joiner = "" if path.endswith(("?", "&")) else "?"
    return f"{path}{joiner}{name}={quote(value, safe='')}"


@pytest.mark.parametrize(("path", "name", "value"), API, ids=[f"{p}?{n}={v[:24]}" for p, n, v in API])
def test_the_api_refuses_each_parameter_by_name(operator_client, events, path, name, value):
    client = Client(raise_request_exception=False, HTTP_AUTHORIZATION=f"Bearer {operator_client.secret}")
    response = client.get(url(path, name, value))
    assert response.status_code == 400, (response.status_code, response.content[:300])
    body = response.json()
    assert body["error"] == "invalid" and name in body["fields"], body


@pytest.mark.parametrize(("path", "name", "value"), CONSOLE, ids=[f"{p}{n}={v[:24]}" for p, n, v in CONSOLE])
def test_the_console_refuses_each_parameter_by_name(db, owner, events, make_endpoint, path, name, value):
    make_endpoint(owner, "chat")
    client = member_client("opal", operator=True)
    client.raise_request_exception = False
    response = client.get(url(path, name, value))
    assert response.status_code == 400, (response.status_code, response.content[:300])
    assert name in response.content.decode()


def test_release_on_delete_is_true_or_false(operator_client, owner, make_endpoint):
    endpoint = make_endpoint(owner, "chat")
    response = operator_client.delete(f"/api/v1/endpoints/{endpoint.pk}/?release=maybe")
    assert response.status_code == 400 and "release" in response.json()["fields"]
    assert operator_client.get(f"/api/v1/endpoints/{endpoint.pk}/").status_code == 200  # not deleted


@pytest.mark.parametrize(("value", "count"), [("true", 1), ("FALSE", 2), ("1", 1), ("no", 2)])
def test_a_boolean_filter_reads_true_and_false(operator_client, events, value, count):
    Event.objects.filter(pod="p-0").update(acknowledged_at=datetime(2026, 1, 2, tzinfo=UTC))
    response = operator_client.get(f"/api/v1/events/?acknowledged={value}")
    assert response.status_code == 200 and len(response.json()["results"]) == count


def test_a_cursor_the_api_made_still_pages(operator_client, events):
    first = operator_client.get("/api/v1/events/?page_size=2").json()
    second = operator_client.get(first["next"])
    assert second.status_code == 200 and len(second.json()["results"]) == 1


@given(st.text(max_size=30))
def test_an_integer_is_in_range_or_a_parameter_error(raw):
    try:
        value = params.object_id("id", raw)
    except params.ParameterError as exc:
        assert exc.name == "id"
    else:
        assert 1 <= value <= params.MAX_ID


@given(st.datetimes(), st.integers(min_value=-(24 * 60 - 1), max_value=24 * 60 - 1))
def test_a_date_time_is_utc_or_a_parameter_error(when, offset_minutes):
    sign = "-" if offset_minutes < 0 else "+"
    raw = when.isoformat() + f"{sign}{abs(offset_minutes) // 60:02d}:{abs(offset_minutes) % 60:02d}"
    try:
        value = params.utc_datetime("since", raw)
    except params.ParameterError as exc:
        assert exc.name == "since"
    else:
        assert value.tzinfo is UTC
