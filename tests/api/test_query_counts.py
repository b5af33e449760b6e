"""List endpoints run a constant number of SQL queries however many rows they return (no N+1)."""

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from capacity.models import GpuPool, ModelProfile, sell
from controlplane.endpoints.models import Pod
from controlplane.oncall.models import Event
from controlplane.tenants.models import ApiKey, Tenant


def grow(n, make_endpoint, h100):
    for i in range(n):
        tenant = Tenant.objects.create(name=f"t{i}-{n}")
        pool = GpuPool.objects.create(name=f"p{i}-{n}", gpu_type=h100, region="r", gpu_count=100)
        profile = ModelProfile.objects.create(model=f"m{i}-{n}", gpu_type=h100, alpha=0, beta=0, gamma=1)
        endpoint = make_endpoint(tenant, f"e{i}", profile=profile, pool=pool)
        sell(endpoint, mu_per_minute=10, best_effort_allowed=True, sold_by="t")
        Event.record("scale", "x", endpoint=endpoint)
        ApiKey.issue(name=f"k{i}", tenant=tenant)
        Pod.objects.create(endpoint=endpoint, name=f"pod-{i}-{n}", url="http://127.0.0.1:9000", ready=True)


@pytest.mark.parametrize(
    "url",
    [
        "/api/v1/endpoints/",
        "/api/v1/reservations/",
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
def test_list_queries_do_not_grow_with_rows(operator_client, make_endpoint, h100, url):
    def count():
        with CaptureQueriesContext(connection) as queries:
            response = operator_client.get(url)
        assert response.status_code == 200, response.content
        return len(queries), response

    operator_client.get("/api/v1/whoami/")  # the key's first use writes its last-used time
    grow(2, make_endpoint, h100)
    few, small = count()
    grow(12, make_endpoint, h100)
    many, large = count()
    assert len(str(large.content)) > len(str(small.content))
    assert many == few, f"{url}: {few} queries for few rows, {many} for many"
