"""List endpoints run a constant number of SQL queries however many rows they return (no N+1), and a
sale as many however large its pool."""

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


@pytest.mark.parametrize("method", ["POST", "PATCH"])
def test_a_sale_makes_as_many_queries_in_a_pool_of_30_endpoints_as_of_3(
    operator_client, owner, grow_tenant, make_endpoint, method
):
    """A sale (a new reservation, or one raised) reads its pool's stored ledger, not its rows:
    its statements do not grow with the pool, and its reservation is one statement."""
    from controlplane.capacity.models import GpuPool

    operator_client.get("/api/v1/whoami/")  # the key's first use writes its last-used time
    grow_tenant(owner, 3)
    pool = GpuPool.objects.get(name=f"{owner.name}-pool")

    def sale(i: int) -> list[str]:
        endpoint = make_endpoint(owner, f"sold-{i}", pool=pool)
        if method == "PATCH":
            made = operator_client.post(
                "/api/v1/reservations/", {"endpoint": endpoint.pk, "mu_per_minute": 5}, format="json"
            )
            assert made.status_code == 201, made.content
        with CaptureQueriesContext(connection) as queries:
            if method == "POST":
                response = operator_client.post(
                    "/api/v1/reservations/", {"endpoint": endpoint.pk, "mu_per_minute": 20}, format="json"
                )
            else:
                response = operator_client.patch(
                    f"/api/v1/reservations/{made.json()['id']}/", {"mu_per_minute": 20}, format="json"
                )
        assert response.status_code in (200, 201), response.content
        assert response.json()["mu_per_minute"] == 20
        return [q["sql"] for q in queries]

    few = sale(1)
    grow_tenant(owner, 27)
    many = sale(2)
    assert len(many) == len(few), "\n".join(many)
    touching = [sql for sql in many if "capacity_reservation" in sql]
    writes = [sql for sql in touching if not sql.startswith("SELECT")]
    assert len(writes) == 1 and "ON CONFLICT" in writes[0], writes  # made or changed, one upsert
    assert not [sql for sql in touching if "FOR UPDATE" in sql]  # the pool's lock orders sales
