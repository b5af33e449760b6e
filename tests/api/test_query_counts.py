"""List endpoints run a constant number of SQL queries however many rows they return (no N+1)."""

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext


@pytest.mark.parametrize(
    "url",
    [
        "/api/v1/endpoints/",
        "/api/v1/reservations/",
        "/api/v1/allowances/",
        "/api/v1/events/",
        "/api/v1/pools/",
        "/api/v1/model-profiles/",
        "/api/v1/capacity/",
        "/api/v1/tenants/",
        "/api/v1/api-keys/",
        "/api/v1/pods/",
        "/api/v1/routing-table/",
    ],
)
def test_list_queries_do_not_grow_with_rows(operator_client, grow_fleet, url):
    def count():
        with CaptureQueriesContext(connection) as queries:
            response = operator_client.get(url)
        assert response.status_code == 200, response.content
        return len(queries), response

    operator_client.get("/api/v1/whoami/")  # the key's first use writes its last-used time
    operator_client.get(url)  # the first read stores the ledger of a pool made without selling
    grow_fleet(2)
    few, small = count()
    grow_fleet(12)
    many, large = count()
    assert len(str(large.content)) > len(str(small.content))
    assert many == few, f"{url}: {few} queries for few rows, {many} for many"


# The lists that grow with the fleet, each under the filters the console and clients use.
FLEET_LISTS = [
    "/api/v1/endpoints/",
    "/api/v1/endpoints/?state=pending&gpu_type=h100-80gb",
    "/api/v1/endpoints/?search=owner-e",
    "/api/v1/endpoints/?page=1",
    "/api/v1/events/",
    "/api/v1/events/?kind=hang&severity=critical",
    "/api/v1/events/?after=0",
    "/api/v1/pods/",
    "/api/v1/reservations/",
]


@pytest.mark.parametrize("who", ["operator", "tenant"])
@pytest.mark.parametrize("url", FLEET_LISTS)
def test_a_page_makes_as_many_queries_for_30_endpoints_as_for_3(
    operator_client, owner, owner_client, grow_tenant, who, url
):
    client = operator_client if who == "operator" else owner_client

    def count():
        with CaptureQueriesContext(connection) as queries:
            response = client.get(url)
        assert response.status_code == 200, response.content
        assert response.json()["results"], url  # rows to serialize: an N+1 would show
        return len(queries)

    client.get("/api/v1/whoami/")  # the key's first use writes its last-used time
    grow_tenant(owner, 3)
    few = count()
    grow_tenant(owner, 27)
    assert count() == few, url
