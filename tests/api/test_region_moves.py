"""Moving an endpoint to another pool: a tenant's endpoint that holds an
operator's reservation stays where it was sold unless an operator moves it (and only to a pool
that packs it); an endpoint whose pods still run stays until none runs, so the ledger never
counts a ready pod in a pool it does not run in. API and console, the same 409."""

import pytest

from controlplane.capacity.models import GpuPool
from controlplane.endpoints.models import Endpoint, Pod
from controlplane.pool_ledgers import refresh_pools
from tests.api.test_packed_capacity import big_body, capacity_of, regions  # noqa: F401 (the fixture)
from tests.console.conftest import member_client

pytestmark = pytest.mark.usefixtures("regions")


def made_in_west(owner_client):
    made = owner_client.post("/api/v1/endpoints/", big_body("a", pool="west"), format="json")
    assert made.status_code == 201, made.content
    return made.json()


def sold(operator_client, endpoint_id):
    sale = operator_client.post(
        "/api/v1/reservations/", {"endpoint": endpoint_id, "mu_per_minute": 100}, format="json"
    )
    assert sale.status_code == 201, sale.content
    return sale.json()


def test_a_tenant_cannot_move_a_reserved_endpoint_to_another_region(owner_client, operator_client):
    a = made_in_west(owner_client)
    reservation = sold(operator_client, a["id"])
    refused = owner_client.patch(
        f"/api/v1/endpoints/{a['id']}/", {"region_preference": "us-east-1"}, format="json"
    )
    assert refused.status_code == 409, refused.content
    body = refused.json()
    assert (body["error"], body["pool"], body["to_pool"], body["reservation"]["id"]) == (
        "protected",
        "west",
        "east-b",
        reservation["id"],
    )
    assert list(body["fields"]) == ["region_preference"]
    assert "an operator releases it" in body["detail"] and "or moves the endpoint" in body["detail"]
    endpoint = Endpoint.objects.get(pk=a["id"])
    assert (endpoint.pool.name, endpoint.region_preference) == ("west", "")
    assert capacity_of(operator_client, "east-b")["sold_replicas"] == 0


def test_an_operator_moves_a_reserved_endpoint_only_where_it_packs(owner_client, operator_client):
    a = made_in_west(owner_client)
    sold(operator_client, a["id"])
    for name in ("b", "c"):  # east-a's 8 GPUs: two 4-GPU replicas
        made = owner_client.post("/api/v1/endpoints/", big_body(name, pool="east-a"), format="json")
        assert made.status_code == 201, made.content
    full = operator_client.patch(f"/api/v1/endpoints/{a['id']}/", {"pool": "east-a"}, format="json")
    assert full.status_code == 409 and full.json()["error"] == "oversold", full.content
    assert Endpoint.objects.get(pk=a["id"]).pool.name == "west"
    moved = operator_client.patch(
        f"/api/v1/endpoints/{a['id']}/", {"region_preference": "us-east-1"}, format="json"
    )
    assert moved.status_code == 200 and moved.json()["pool"] == "east-b", moved.content
    assert (
        capacity_of(operator_client, "east-b")["sold_replicas"],
        capacity_of(operator_client, "west")["sold_replicas"],
    ) == (1, 0)


def test_an_endpoint_with_running_pods_does_not_move(owner_client, operator_client):
    a = made_in_west(owner_client)
    Pod.objects.create(endpoint_id=a["id"], name="a-0", url="http://127.0.0.1:9/", ready=True)
    refresh_pools(GpuPool.objects.values_list("pk", flat=True))  # as the pod sync does after its writes
    east_b = capacity_of(operator_client, "east-b")
    for client in (owner_client, operator_client):
        refused = client.patch(
            f"/api/v1/endpoints/{a['id']}/", {"region_preference": "us-east-1"}, format="json"
        )
        assert refused.status_code == 409, refused.content
        body = refused.json()
        assert (body["error"], body["pods"], body["reservation"]) == ("protected", 1, None)
        assert "1 of its pods still run in 'west'" in body["detail"]
    # The ready pod is counted where it runs, and nowhere else.
    assert capacity_of(operator_client, "east-b") == east_b
    assert capacity_of(operator_client, "west")["used_gpus"] == 4
    Pod.objects.all().delete()
    refresh_pools(GpuPool.objects.values_list("pk", flat=True))
    moved = owner_client.patch(
        f"/api/v1/endpoints/{a['id']}/", {"region_preference": "us-east-1"}, format="json"
    )
    assert moved.status_code == 200 and moved.json()["pool"] == "east-b", moved.content


def test_the_console_form_refuses_the_move_with_the_same_message(owner, owner_client, operator_client):
    a = made_in_west(owner_client)
    sold(operator_client, a["id"])
    web = member_client("olivia", tenant=owner)
    form = {
        "name": "a", "model": "llama-70b", "gpu_type": "h100-80gb", "pool": "",
        "region_preference": "us-east-1",
        "min_provisioned_concurrency": "8", "max_provisioned_concurrency": "8",
        "target_concurrency_per_replica": "8", "routing_policy": "p2c-mu",
    }  # fmt: skip
    refused = web.post(f"/console/endpoints/{a['id']}/edit/", form)
    assert refused.status_code == 400
    page = refused.content.decode()
    assert 'data-field="region_preference"' in page
    assert "an operator releases it (DELETE /api/v1/reservations/&lt;id&gt;/) or moves the endpoint" in page
    assert Endpoint.objects.get(pk=a["id"]).pool == GpuPool.objects.get(name="west")
