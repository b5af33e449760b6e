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
