"""An owner tenant, a second tenant that must see nothing of the first, and an operator."""

import pytest

from controlplane.oncall.models import Event
from controlplane.selling import sell
from dataplane.wire.pod_events import PodEvent


@pytest.fixture
def owned(owner, make_endpoint):
    endpoint = make_endpoint(owner, "chat")
    sell(endpoint, mu_per_minute=100, best_effort_allowed=True, sold_by="test")
    Event.record(Event.Kind.HANG, "hung", endpoint=endpoint, severity="critical", pod="chat-0")
    return endpoint


def test_the_owner_sees_its_endpoint_reservation_and_events(owner_client, owned):
    assert [e["name"] for e in owner_client.get("/api/v1/endpoints/").json()["results"]] == ["chat"]
    assert owner_client.get(f"/api/v1/endpoints/{owned.pk}/").status_code == 200
    assert len(owner_client.get("/api/v1/reservations/").json()["results"]) == 1
    kinds = [e["kind"] for e in owner_client.get("/api/v1/events/").json()["results"]]
    assert "hang" in kinds


def test_another_tenant_sees_nothing_of_the_first(other_client, owned):
    assert other_client.get("/api/v1/endpoints/").json()["results"] == []
    assert other_client.get("/api/v1/reservations/").json()["results"] == []
    assert other_client.get("/api/v1/events/").json()["results"] == []
    assert [t["name"] for t in other_client.get("/api/v1/tenants/").json()["results"]] == ["other"]
    reservation_id = owned.reservation.pk
    # 404, not 403: existence does not leak.
    for method, url in [
        ("get", f"/api/v1/endpoints/{owned.pk}/"),
        ("patch", f"/api/v1/endpoints/{owned.pk}/"),
        ("delete", f"/api/v1/endpoints/{owned.pk}/"),
        ("get", f"/api/v1/reservations/{reservation_id}/"),
        ("get", f"/api/v1/tenants/{owned.tenant_id}/"),
    ]:
        response = getattr(other_client, method)(url, {"max_provisioned_concurrency": 1}, format="json")
        assert response.status_code == 404, (method, url, response.content)
    owned.refresh_from_db()
    assert owned.max_provisioned_concurrency == 16


def test_another_tenant_cannot_filter_its_way_in(other_client, owned):
    assert other_client.get("/api/v1/endpoints/?tenant=owner").json()["results"] == []


@pytest.mark.parametrize("path", ["/api/v1/events/", "/api/v1/reservations/", "/api/v1/pods/"])
def test_filtering_by_another_tenants_endpoint_answers_as_for_one_that_does_not_exist(
    path, owner_client, other_client, owned
):
    # The filter's choices are what the principal may see (api.filters.ScopedFilterSet): another
    # tenant's id and an id nobody has get the same 400, so ids cannot be probed for existence.
    theirs = other_client.get(f"{path}?endpoint={owned.pk}")
    nobodys = other_client.get(f"{path}?endpoint={owned.pk + 1000}")
    assert theirs.status_code == nobodys.status_code == 400
    assert theirs.json()["fields"]["endpoint"]["errors"] == nobodys.json()["fields"]["endpoint"]["errors"]
    assert owner_client.get(f"{path}?endpoint={owned.pk}").status_code == 200


def test_naming_another_tenant_in_a_write_answers_as_for_one_that_does_not_exist(other_client, owned):
    for path, body in [
        ("/api/v1/api-keys/", {"name": "k"}),
        (
            "/api/v1/endpoints/",
            {"name": "e", "model": "llama-8b", "gpu_type": "h100-80gb", "min_provisioned_concurrency": 1},
        ),
    ]:
        theirs = other_client.post(path, {**body, "tenant": "owner"}, format="json")
        nobodys = other_client.post(path, {**body, "tenant": "nobody"}, format="json")
        assert theirs.status_code == nobodys.status_code == 400, path
        errors = [
            r.json()["fields"]["tenant"]["errors"][0].replace("nobody", "owner") for r in (theirs, nobodys)
        ]
        assert errors[0] == errors[1], (path, errors)


def test_the_operator_sees_every_tenant(operator_client, owned, other, make_endpoint):
    make_endpoint(other, "search")
    names = {e["name"] for e in operator_client.get("/api/v1/endpoints/").json()["results"]}
    assert names == {"chat", "search"}
    assert operator_client.get(f"/api/v1/endpoints/{owned.pk}/").status_code == 200


def test_the_capacity_summary_is_for_operators_only(owner_client, operator_client, owned):
    assert owner_client.get("/api/v1/capacity/").status_code == 403
    assert operator_client.get("/api/v1/capacity/").status_code == 200


def test_tenants_cannot_write_the_fleet(owner_client, pool, small_model):
    for url, body in [
        ("/api/v1/gpu-types/", {"name": "a100", "memory_gib": 80, "hourly_cost_usd": "1.5"}),
        ("/api/v1/pools/", {"name": "p2", "gpu_type": "h100-80gb", "region": "r", "gpu_count": 4}),
        (
            "/api/v1/model-profiles/",
            {"model": "m", "gpu_type": "h100-80gb", "alpha": 0, "beta": 0, "gamma": 1},
        ),
        ("/api/v1/tenants/", {"name": "new"}),
        ("/api/v1/events/", PodEvent("hang", "critical", "chat-0", "x").to_json()),
    ]:
        response = owner_client.post(url, body, format="json")
        assert response.status_code == 403, url
    assert (
        owner_client.patch(f"/api/v1/pools/{pool.pk}/", {"gpu_count": 1000}, format="json").status_code == 403
    )
    # ...but may read them.
    assert owner_client.get("/api/v1/pools/").status_code == 200
    assert owner_client.get("/api/v1/model-profiles/").status_code == 200


def test_tenants_cannot_sell_themselves_capacity(owner_client, owned):
    response = owner_client.patch(
        f"/api/v1/reservations/{owned.reservation.pk}/", {"mu_per_minute": 200}, format="json"
    )
    assert response.status_code == 403
    owned.reservation.refresh_from_db()
    assert owned.reservation.mu_per_minute == 100
