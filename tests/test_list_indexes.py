"""The lists' queries, as the pages make them, are served by the indexes made for them
(endpoints and oncall migrations "list_indexes"): EXPLAIN names the index. PostgreSQL only;
sequential scans are priced out so that a handful of rows still shows which index fits."""

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from tests.conftest import client_for
from tests.console.conftest import member_client

pytestmark = pytest.mark.skipif(connection.vendor != "postgresql", reason="PostgreSQL's plans")


def plans(client, url: str, table: str) -> str:
    """The plans of every query on `table` that the page at `url` makes."""
    with CaptureQueriesContext(connection) as queries:
        response = client.get(url)
    assert response.status_code == 200, response.content[:300]
    found = []
    with connection.cursor() as cursor:
        cursor.execute("SET LOCAL enable_seqscan = off")
        for query in queries.captured_queries:
            if query["sql"].startswith("SELECT") and f'FROM "{table}"' in query["sql"]:
                cursor.execute("EXPLAIN " + query["sql"])
                found.append("\n".join(row[0] for row in cursor.fetchall()))
    assert found, f"no query on {table}"
    return "\n\n".join(found)


@pytest.fixture
def fleet(owner, other, grow_tenant):
    grow_tenant(owner, 3)
    grow_tenant(other, 3)
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE")


@pytest.mark.parametrize(
    ("who", "url", "index"),
    [
        ("tenant", "/api/v1/endpoints/", "endpoint_tenant_newest"),
        ("operator", "/api/v1/endpoints/?state=ready", "endpoint_state_newest"),
        ("operator", "/api/v1/endpoints/?search=owner-e1", "endpoint_name_trigram"),
        ("operator", "/api/v1/events/?pod=owner-pod-1", "oncall_event_pod_newest"),
        ("operator", "/api/v1/events/?acknowledged=true", "oncall_event_acknowledged"),
        ("operator", "/api/v1/events/?group=1", "oncall_event_group_time"),
    ],
)
def test_each_api_list_has_its_index(fleet, owner, who, url, index):
    client = client_for(None, "ops") if who == "operator" else client_for(owner)
    table = "endpoints_endpoint" if "endpoints" in url else "oncall_event"
    assert index in plans(client, url, table)


@pytest.mark.parametrize(
    ("who", "url", "table", "index"),
    [
        (
            "operator",
            "/console/endpoints/?search=owner-e2",
            "endpoints_endpoint",
            "endpoint_name_trigram",
        ),
        ("tenant", "/console/endpoints/", "endpoints_endpoint", "endpoint_tenant_newest"),
        ("operator", "/console/oncall/", "oncall_eventgroup", "oncall_group_on_call"),
        (
            "operator",
            "/console/oncall/?state=resolved&severity=any",
            "oncall_eventgroup",
            "oncall_group_on_call",
        ),
        ("tenant", "/console/oncall/", "oncall_eventgroup", "oncall_group_tenant_on_call"),
        (
            "operator",
            "/console/oncall/?view=events&pod=owner-pod-0",
            "oncall_event",
            "oncall_event_pod_newest",
        ),
    ],
)
def test_each_console_list_has_its_index(fleet, owner, who, url, table, index):
    client = (
        member_client("opal", operator=True) if who == "operator" else member_client("olivia", tenant=owner)
    )
    assert index in plans(client, url, table)
