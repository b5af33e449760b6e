"""Selling capacity: reservations are checked against the pool's ledger under a lock."""

import threading

import pytest
from django.db import connection
from rest_framework.test import APIClient

from controlplane.capacity.models import Reservation
from controlplane.oncall.models import Event


def test_sell_change_and_release(operator_client, owner, make_endpoint):
    endpoint = make_endpoint(owner, "chat")
    sold = operator_client.post(
        "/api/v1/reservations/", {"endpoint": endpoint.pk, "mu_per_minute": 300}, format="json"
    )
    assert sold.status_code == 201, sold.content
    assert sold.json()["tenant"] == "owner"
    assert sold.json()["gpus"] == 3  # 300 MU/min at 100 per 1-GPU replica
    assert sold.json()["best_effort_allowed"] is True
    url = f"/api/v1/reservations/{sold.json()['id']}/"
    changed = operator_client.patch(url, {"mu_per_minute": 500, "best_effort_allowed": False}, format="json")
    assert changed.status_code == 200 and changed.json()["mu_per_minute"] == 500
    assert operator_client.get(f"/api/v1/endpoints/{endpoint.pk}/").json()["reserved_mu_per_minute"] == 500
    assert operator_client.delete(url).status_code == 204
    assert not Reservation.objects.exists()
    # Every sale is on the record.
    details = [e.detail["mu_per_minute"] for e in Event.objects.filter(kind="reservation").order_by("id")]
    assert details == [300, 500, 0]


def test_oversell_is_409_naming_pool_have_sold_and_asked(operator_client, owner, make_endpoint, big_model):
    # Pool: 8 H100s. 'chat' (1 GPU/replica) holds 600 MU/min = 6 GPUs.
    chat = make_endpoint(owner, "chat")
    big = make_endpoint(owner, "big", profile=big_model, scale_to_zero_enabled=True)  # commits nothing yet
    ok = operator_client.post(
        "/api/v1/reservations/", {"endpoint": chat.pk, "mu_per_minute": 600}, format="json"
    )
    assert ok.status_code == 201
    # 100 MU/min of the 4-GPU model asks 4 GPUs: 6 + 4 > 8.
    refused = operator_client.post(
        "/api/v1/reservations/", {"endpoint": big.pk, "mu_per_minute": 100}, format="json"
    )
    assert refused.status_code == 409
    body = refused.json()
    assert body["error"] == "oversold"
    assert (body["pool"], body["have_gpus"], body["sold_gpus"], body["asked_gpus"]) == ("use1-h100", 8, 6, 4)
    assert (body["sold_mu_per_minute"], body["asked_mu_per_minute"]) == (600, 100)
    assert body["have_mu_per_minute"] == 500  # the mean of the 8B alone (800) and the 70B alone (200)
    assert "use1-h100" in body["detail"]
    assert not Reservation.objects.filter(endpoint=big).exists()
    assert not Event.objects.filter(kind="reservation", endpoint=big).exists()
    assert (body["asked_replicas"], body["asked_gpus_per_replica"], body["fit_replicas"]) == (1, 4, 0)
    # 50 MU/min is still a whole replica of 4 GPUs: refused too (a GPU count sold it as 2).
    half = operator_client.post(
        "/api/v1/reservations/", {"endpoint": big.pk, "mu_per_minute": 50}, format="json"
    )
    assert half.status_code == 409 and half.json()["asked_gpus"] == 4
    # Once chat's sale is cut to 400 MU/min (4 replicas), the 4-GPU replica fits beside it.
    chat_sale = Reservation.objects.get(endpoint=chat).pk
    cut = operator_client.patch(f"/api/v1/reservations/{chat_sale}/", {"mu_per_minute": 400}, format="json")
    assert cut.status_code == 200
    fits = operator_client.post(
        "/api/v1/reservations/", {"endpoint": big.pk, "mu_per_minute": 50}, format="json"
    )
    assert fits.status_code == 201 and fits.json()["replicas"] == 1 and fits.json()["gpus"] == 4


def test_raising_a_reservation_counts_only_the_increase(operator_client, owner, make_endpoint):
    chat = make_endpoint(owner, "chat")
    sold = operator_client.post(
        "/api/v1/reservations/", {"endpoint": chat.pk, "mu_per_minute": 700}, format="json"
    )
    url = f"/api/v1/reservations/{sold.json()['id']}/"
    assert operator_client.patch(url, {"mu_per_minute": 800}, format="json").status_code == 200
    refused = operator_client.patch(url, {"mu_per_minute": 801}, format="json")
    # The pool's figures as /capacity/ shows them, with what is asked and what it would replace.
    body = refused.json()
    assert refused.status_code == 409 and (body["sold_gpus"], body["committed_gpus"]) == (8, 8)
    # 801 MU/min is 9 whole replicas in place of 8; 8 fit.
    assert (body["asked_replicas"], body["replacing_replicas"], body["fit_replicas"]) == (9, 8, 8)
    assert (body["asked_gpus"], body["replacing_gpus"]) == (9, 8)
    assert Reservation.objects.get().mu_per_minute == 800


def test_overcommit_setting_lets_operators_sell_beyond_the_fleet(
    settings, operator_client, owner, make_endpoint
):
    settings.CAPACITY_OVERCOMMIT = 1.5  # a replica's 100 MU/min is sold as 150: 8 GPUs sell 1200
    chat = make_endpoint(owner, "chat")
    assert (
        operator_client.post(
            "/api/v1/reservations/", {"endpoint": chat.pk, "mu_per_minute": 1200}, format="json"
        ).status_code
        == 201
    )
    row = operator_client.get("/api/v1/capacity/").json()[0]
    assert (row["sellable_mu_per_minute"], row["sold_replicas"], row["sold_gpus"], row["headroom_gpus"]) == (
        1200,
        8,
        8,
        0,
    )
    refused = operator_client.patch(
        f"/api/v1/reservations/{Reservation.objects.get().pk}/", {"mu_per_minute": 1201}, format="json"
    )
    assert refused.status_code == 409 and refused.json()["asked_replicas"] == 9


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"endpoint": 999999, "mu_per_minute": 10}, "endpoint"),
        ({"mu_per_minute": 10}, "endpoint"),
        ({"endpoint": "PLACEHOLDER", "mu_per_minute": 0}, "mu_per_minute"),
        ({"endpoint": "PLACEHOLDER", "mu_per_minute": -5}, "mu_per_minute"),
        ({"endpoint": "PLACEHOLDER", "mu_per_minute": "lots"}, "mu_per_minute"),
    ],
)
def test_bad_reservations_name_the_field(operator_client, owner, make_endpoint, body, field):
    endpoint = make_endpoint(owner, "chat")
    body = {k: endpoint.pk if v == "PLACEHOLDER" else v for k, v in body.items()}
    response = operator_client.post("/api/v1/reservations/", body, format="json")
    assert response.status_code == 400
    assert field in response.json()["fields"]
    assert not Reservation.objects.exists()


def test_a_second_reservation_on_one_endpoint_is_refused(operator_client, owner, make_endpoint):
    chat = make_endpoint(owner, "chat")
    operator_client.post("/api/v1/reservations/", {"endpoint": chat.pk, "mu_per_minute": 10}, format="json")
    again = operator_client.post(
        "/api/v1/reservations/", {"endpoint": chat.pk, "mu_per_minute": 10}, format="json"
    )
    assert again.status_code == 400
    assert "already has a reservation; change it with PATCH" in again.json()["detail"]


def test_deleting_a_reserved_endpoint_is_409_protected_naming_the_reservation(
    operator_client, owner_client, owner, make_endpoint
):
    """Today's code let the tenant's DELETE cascade the operator's sale away with a 204."""
    chat = make_endpoint(owner, "chat")
    sold = operator_client.post(
        "/api/v1/reservations/", {"endpoint": chat.pk, "mu_per_minute": 800}, format="json"
    )
    refused = owner_client.delete(f"/api/v1/endpoints/{chat.pk}/")
    assert refused.status_code == 409
    body = refused.json()
    assert body["error"] == "protected"
    assert body["reservation"] == {"id": sold.json()["id"], "mu_per_minute": 800, "sold_by": "ops"}
    assert "800 MU/min" in body["detail"] and "ops" in body["detail"]
    # A tenant cannot release it by asking; the operator without ?release=true is refused too.
    assert owner_client.delete(f"/api/v1/endpoints/{chat.pk}/?release=true").status_code == 403
    assert operator_client.delete(f"/api/v1/endpoints/{chat.pk}/").status_code == 409
    assert Reservation.objects.filter(endpoint=chat).exists()
    assert operator_client.get("/api/v1/capacity/").json()[0]["sold_gpus"] == 8


def test_an_operator_releases_and_deletes_with_release_true(
    operator_client, owner_client, owner, make_endpoint
):
    chat = make_endpoint(owner, "chat")
    operator_client.post("/api/v1/reservations/", {"endpoint": chat.pk, "mu_per_minute": 800}, format="json")
    assert operator_client.delete(f"/api/v1/endpoints/{chat.pk}/?release=true").status_code == 204
    assert operator_client.get("/api/v1/capacity/").json()[0]["sold_gpus"] == 0
    (released,) = Event.objects.filter(kind="reservation", detail__mu_per_minute=0)
    assert released.reported_by == "ops" and "released 800 MU/min on chat" in released.message
    # An unreserved endpoint is deleted by its tenant as before.
    spare = make_endpoint(owner, "spare")
    assert owner_client.delete(f"/api/v1/endpoints/{spare.pk}/").status_code == 204


@pytest.mark.django_db(transaction=True)
def test_concurrent_sales_cannot_together_oversell(owner, make_endpoint, operator_client):
    """Two sales that each fit alone but not together: the pool lock lets exactly one in."""
    if connection.vendor != "postgresql":
        pytest.skip("row locks need PostgreSQL (SQLite serialises all writers anyway)")
    first, second = make_endpoint(owner, "a"), make_endpoint(owner, "b")
    barrier = threading.Barrier(2)
    statuses = []

    def sell(endpoint_id):
        client = APIClient()
        client.credentials(HTTP_AUTHORIZATION=f"Bearer {operator_client.secret}")
        barrier.wait()
        response = client.post(
            "/api/v1/reservations/", {"endpoint": endpoint_id, "mu_per_minute": 500}, format="json"
        )
        statuses.append(response.status_code)
        connection.close()

    threads = [threading.Thread(target=sell, args=(e.pk,)) for e in (first, second)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert sorted(statuses) == [201, 409]
    assert sum(r.mu_per_minute for r in Reservation.objects.all()) == 500
