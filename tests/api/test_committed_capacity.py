"""Provisioned concurrency is capacity: minimum replicas are committed in the pool's ledger, a
tenant's GPU quota bounds its minimum and maximum replicas, and every refusal reports the pool's
figures exactly as /api/v1/capacity/ and the console show them."""

import threading

import pytest
from django.db import connection, transaction
from rest_framework.test import APIClient

from capacity.ledger import Oversold
from controlplane.api.errors import LEDGER_FIGURES, TENANT_LEDGER_FIGURES
from controlplane.capacity.models import GpuPool, Reservation
from controlplane.endpoints.models import Endpoint, Pod
from controlplane.oncall.models import Event
from controlplane.pool_ledgers import refresh_pools
from controlplane.selling import release, save_endpoint, sell
from controlplane.tenants.models import Tenant
from tests.conftest import endpoint_body
from tests.console.conftest import member_client


def capacity_row(client, pool_name="use1-h100"):
    return next(row for row in client.get("/api/v1/capacity/").json() if row["pool"] == pool_name)


def test_a_tenant_cannot_provision_a_million_concurrency(
    operator_client, owner_client, owner, big_model, h100
):
    """Measured on main: 201 and desired_replicas 125,000 in a 32-GPU pool, counted nowhere."""
    GpuPool.objects.create(name="use1-h100-32", gpu_type=h100, region="r", gpu_count=32)
    Tenant.objects.filter(pk=owner.pk).update(gpu_quota=None)  # the default: the fleet's 32 GPUs
    body = endpoint_body(
        name="huge",
        model="llama-70b",
        pool="use1-h100-32",
        min_provisioned_concurrency=1_000_000,
        max_provisioned_concurrency=1_000_000,
    )
    refused = owner_client.post("/api/v1/endpoints/", body, format="json")
    assert refused.status_code == 409, refused.content
    quota = refused.json()
    # 125,000 replicas x 4 GPUs, against the default quota: the fleet's GPUs, this pool's 32.
    assert (quota["error"], quota["tenant"], quota["gpu_quota"], quota["asked_gpus"]) == (
        "over_quota",
        "owner",
        32,
        500_000,
    )
    assert "owner" in quota["detail"] and "32 GPUs" in quota["detail"]
    # With a quota that allows it, the pool refuses: 500,000 GPUs asked of 32.
    assert (
        operator_client.patch(f"/api/v1/tenants/{owner.pk}/", {"gpu_quota": 10**9}, format="json").status_code
        == 200
    )
    refused = owner_client.post("/api/v1/endpoints/", body, format="json")
    assert refused.status_code == 409
    pool = refused.json()
    assert (pool["error"], pool["pool"], pool["have_gpus"], pool["asked_gpus"]) == (
        "oversold",
        "use1-h100-32",
        32,
        500_000,
    )
    # In whole replicas on its 4 nodes x 8 GPUs: 125,000 replicas of 4 asked, 8 fit.
    assert (pool["asked_replicas"], pool["asked_gpus_per_replica"], pool["fit_replicas"]) == (125_000, 4, 8)
    assert "It has 32 GPUs (4 nodes x 8 GPUs)" in pool["detail"]
    assert (
        "This needs 125,000 replicas of 4 GPUs (500,000 GPUs, 12,500,000 MU/min); at most 8 fit"
        in pool["detail"]
    )
    assert not Endpoint.objects.exists()


def test_raising_the_minimum_beyond_the_pool_is_409_oversold(owner_client, owner, make_endpoint, big_model):
    # 8 GPUs; 'big' (4 GPUs per replica) keeps 1 replica: 4 GPUs committed, nothing sold.
    big = make_endpoint(owner, "big", profile=big_model)
    url = f"/api/v1/endpoints/{big.pk}/"
    ok = owner_client.patch(url, {"min_provisioned_concurrency": 16}, format="json")  # 2 replicas: 8 of 8
    assert ok.status_code == 200 and ok.json()["min_replicas"] == 2
    refused = owner_client.patch(
        url, {"min_provisioned_concurrency": 17, "max_provisioned_concurrency": 64}, format="json"
    )  # 3 replicas: 12 GPUs in place of 8
    assert refused.status_code == 409
    body = refused.json()
    # The tenant's view: its pool and what it asked, not the pool's committed or sold figures.
    assert (body["error"], body["pool"], body["have_gpus"], body["fit_replicas"]) == (
        "oversold",
        "use1-h100",
        8,
        2,
    )
    assert (body["asked_gpus"], body["replacing_gpus"]) == (12, 8)
    assert (body["asked_mu_per_minute"], body["replacing_mu_per_minute"]) == (300, 200)
    assert "committed_gpus" not in body and "sold_gpus" not in body
    big.refresh_from_db()
    assert (big.min_provisioned_concurrency, big.max_provisioned_concurrency) == (16, 16)
    # A new endpoint's minimum is checked too: 9 replicas of the 1-GPU model in a full pool.
    new = owner_client.post(
        "/api/v1/endpoints/", endpoint_body(name="more", min_provisioned_concurrency=8), format="json"
    )
    assert new.status_code == 409 and new.json()["asked_gpus"] == 1


def test_a_reservation_and_a_minimum_are_not_counted_twice(operator_client, owner, make_endpoint):
    chat = make_endpoint(
        owner, "chat", min_provisioned_concurrency=24, max_provisioned_concurrency=64
    )  # 3 replicas
    row = capacity_row(operator_client)
    assert (row["committed_gpus"], row["sold_gpus"]) == (3, 0)
    sell(chat, mu_per_minute=300, best_effort_allowed=True, sold_by="t")  # served by the minimum
    row = capacity_row(operator_client)
    assert (row["committed_gpus"], row["sold_gpus"], row["headroom_gpus"]) == (3, 3, 5)
    sell(chat, mu_per_minute=800, best_effort_allowed=True, sold_by="t")  # 8 in place of 3: fits
    assert capacity_row(operator_client)["committed_gpus"] == 8


def test_every_409_reports_the_pool_as_capacity_shows_it(
    operator_client, owner_client, owner, make_endpoint, big_model
):
    """Measured on main: /capacity/ said 3,328 MU/min have, the 409 on the same pool 6,400: it
    priced the pool without the endpoint being changed."""
    chat = make_endpoint(owner, "chat")
    big = make_endpoint(owner, "big", profile=big_model)
    sell(chat, mu_per_minute=200, best_effort_allowed=True, sold_by="t")  # 2 GPUs
    reservation = sell(big, mu_per_minute=100, best_effort_allowed=True, sold_by="t")  # 4 GPUs
    Endpoint.objects.filter(pk=chat.pk).update(used_mu_per_minute=120)
    Pod.objects.create(endpoint=chat, name="chat-0", url="http://127.0.0.1:9", ready=True)
    refresh_pools([chat.pool_id])  # as the autoscaler's pass and the pod sync do after their writes
    row = capacity_row(operator_client)
    assert (row["have_mu_per_minute"], row["committed_gpus"], row["used_gpus"]) == (500, 6, 1)
    refusals = [
        # 200 MU/min of the 70B model: 8 GPUs in place of 4, 10 > 8.
        operator_client.patch(
            f"/api/v1/reservations/{reservation.pk}/", {"mu_per_minute": 200}, format="json"
        ),
        # chat's minimum to 5 replicas: 5 GPUs in place of 2, 9 > 8.
        owner_client.patch(
            f"/api/v1/endpoints/{chat.pk}/",
            {"min_provisioned_concurrency": 40, "max_provisioned_concurrency": 64},
            format="json",
        ),
    ]
    assert [refused.status_code for refused in refusals] == [409, 409]
    by_operator, by_tenant = (refused.json() for refused in refusals)
    assert {k: by_operator[k] for k in ["pool", *LEDGER_FIGURES]} == {
        k: row[k] for k in ["pool", *LEDGER_FIGURES]
    }
    # The tenant sees the pool's hardware as /capacity/ has it, and none of its other figures.
    assert {k: by_tenant[k] for k in ["pool", *TENANT_LEDGER_FIGURES]} == {
        k: row[k] for k in ["pool", *TENANT_LEDGER_FIGURES]
    }
    assert not set(by_tenant) & (set(LEDGER_FIGURES) - set(TENANT_LEDGER_FIGURES))
    assert [(r.json()["asked_gpus"], r.json()["replacing_gpus"]) for r in refusals] == [(8, 4), (5, 2)]
    # The console's capacity page shows the same figures.
    html = member_client("ops", operator=True).get("/console/capacity/").content.decode()
    assert '<td class="num committed">6</td>' in html
    assert '<td class="num sold-mu">300</td>' in html and '<td class="num committed-mu">300</td>' in html


def test_a_tenant_refused_sees_what_it_asked_and_what_fits_not_others_sales(
    operator_client, owner_client, owner, other, make_endpoint, big_model
):
    """The same refusal in its two views (capacity.ledger.Oversold): 'other' holds 4 GPUs sold
    (its 1 minimum replica among them) in the 8-GPU pool; the owner's 4-GPU endpoint asks 2 replicas (8 GPUs)
    where 1 fits. The owner sees its pool, its ask and the 1 that fits; an operator also sees
    the pool's committed, sold and free figures, which the owner's body and text do not name."""
    theirs = make_endpoint(other, "theirs")
    sell(theirs, mu_per_minute=400, best_effort_allowed=True, sold_by="ops")  # 4 replicas of 1 GPU
    mine = make_endpoint(owner, "mine", profile=big_model, scale_to_zero_enabled=True)
    ask = {
        "min_provisioned_concurrency": 16,
        "max_provisioned_concurrency": 16,
        "scale_to_zero_enabled": False,
    }
    url = f"/api/v1/endpoints/{mine.pk}/"
    tenant = owner_client.patch(url, ask, format="json")
    operator = operator_client.patch(url, ask, format="json")
    assert (tenant.status_code, operator.status_code) == (409, 409), (tenant.content, operator.content)
    tenant_body, operator_body = tenant.json(), operator.json()
    assert {k: tenant_body[k] for k in tenant_body if k != "detail"} == {
        "error": "oversold", "pool": "use1-h100", "node_count": 1, "gpus_per_node": 8, "have_gpus": 8,
        "asked_replicas": 2, "asked_gpus_per_replica": 4, "asked_gpus": 8, "asked_mu_per_minute": 200,
        "fit_replicas": 1, "replacing_replicas": 0, "replacing_gpus": 0, "replacing_mu_per_minute": 0,
    }  # fmt: skip
    assert tenant_body["detail"] == (
        "pool 'use1-h100' cannot place this. It has 8 GPUs (1 node x 8 GPUs)."
        " This needs 2 replicas of 4 GPUs (8 GPUs, 200 MU/min); at most 1 fit"
    )
    assert (operator_body["sold_gpus"], operator_body["committed_gpus"], operator_body["free_gpus"]) == (
        4,
        4,
        4,
    )
    # The operator's is the same with what is committed in the pool between what it has and what this needs.
    assert operator_body["detail"] == (
        "pool 'use1-h100' cannot place this. It has 8 GPUs (1 node x 8 GPUs); 4 GPUs are committed to"
        " reservations and minimum replicas (4 replicas, 400 MU/min; sold: 4 replicas = 400 MU/min at"
        " over-commit 1), 4 GPUs are free, 0 of them stranded. This needs 2 replicas of 4 GPUs (8 GPUs,"
        " 200 MU/min); at most 1 fit"
    )
    assert "400" not in tenant_body["detail"] and "sold" not in tenant_body["detail"]
    # The console's endpoint form shows the tenant the same text, an operator the whole one.
    form = {"name": "mine", "model": "llama-70b", "gpu_type": "h100-80gb", "routing_policy": "p2c-mu",
            "min_provisioned_concurrency": "16", "max_provisioned_concurrency": "16"}  # fmt: skip
    shown = member_client("alice", tenant=owner).post(f"/console/endpoints/{mine.pk}/edit/", form)
    assert shown.status_code == 400 and "cannot place this" in shown.content.decode()
    assert "committed to reservations" not in shown.content.decode()
    shown = member_client("ops", operator=True).post(f"/console/endpoints/{mine.pk}/edit/", form)
    assert shown.status_code == 400 and "committed to reservations" in shown.content.decode()


def test_the_console_endpoint_form_refuses_a_minimum_beyond_the_pool(owner, make_endpoint):
    chat = make_endpoint(owner, "chat")
    web = member_client("alice", tenant=owner)
    form = {"name": "chat", "model": "llama-8b", "gpu_type": "h100-80gb", "routing_policy": "p2c-mu"}
    response = web.post(
        f"/console/endpoints/{chat.pk}/edit/",
        {**form, "min_provisioned_concurrency": "72", "max_provisioned_concurrency": "72"},
    )
    assert response.status_code == 400
    assert (
        "pool &#x27;use1-h100&#x27; cannot place this. It has 8 GPUs (1 node x 8 GPUs)."
        " This needs 9 replicas of 1 GPU" in response.content.decode()
    )
    chat.refresh_from_db()
    assert chat.min_provisioned_concurrency == 0


def test_the_tenant_quota_bounds_min_and_max_and_only_operators_set_it(
    settings, operator_client, owner_client, owner, pool, small_model
):
    settings.TENANT_GPU_QUOTA_DEFAULT = 8
    Tenant.objects.filter(pk=owner.pk).update(gpu_quota=None)  # the default
    tenant_url = f"/api/v1/tenants/{owner.pk}/"
    shown = owner_client.get(tenant_url).json()
    assert (shown["gpu_quota"], shown["effective_gpu_quota"]) == (None, 8)
    first = owner_client.post("/api/v1/endpoints/", endpoint_body(name="a"), format="json")  # max 8 GPUs
    assert first.status_code == 201, first.content
    refused = owner_client.post(
        "/api/v1/endpoints/",
        endpoint_body(name="b", min_provisioned_concurrency=8, max_provisioned_concurrency=8),
        format="json",
    )
    assert refused.status_code == 409
    body = refused.json()
    assert (body["error"], body["tenant"], body["gpu_quota"], body["bound"]) == (
        "over_quota",
        "owner",
        8,
        "max",
    )
    assert (body["asked_gpus"], body["other_endpoints_gpus"], body["total_gpus"]) == (1, 8, 9)
    # Raising max on the existing endpoint is bounded the same way.
    grow = owner_client.patch(
        f"/api/v1/endpoints/{first.json()['id']}/", {"max_provisioned_concurrency": 72}, format="json"
    )
    assert grow.status_code == 409 and grow.json()["error"] == "over_quota"
    # The tenant cannot raise its own quota; an operator can.
    assert owner_client.patch(tenant_url, {"gpu_quota": 1000}, format="json").status_code == 403
    assert (
        operator_client.patch(tenant_url, {"gpu_quota": 16}, format="json").json()["effective_gpu_quota"]
        == 16
    )
    again = owner_client.post(
        "/api/v1/endpoints/",
        endpoint_body(name="b", min_provisioned_concurrency=8, max_provisioned_concurrency=8),
        format="json",
    )
    assert again.status_code == 201
    # A quota lowered below what the tenant has does not stop it shrinking.
    operator_client.patch(tenant_url, {"gpu_quota": 2}, format="json")
    shrink = owner_client.patch(
        f"/api/v1/endpoints/{first.json()['id']}/", {"max_provisioned_concurrency": 32}, format="json"
    )
    assert shrink.status_code == 200


@pytest.mark.django_db(transaction=True)
def test_concurrent_minimum_raises_cannot_together_oversell(owner, make_endpoint, owner_client):
    """Two raises that each fit alone but not together: the pool lock lets exactly one in."""
    if connection.vendor != "postgresql":
        pytest.skip("row locks need PostgreSQL")
    first, second = make_endpoint(owner, "a"), make_endpoint(owner, "b")  # 1 GPU each of 8
    barrier = threading.Barrier(2)
    statuses = []

    def raise_min(endpoint_id):
        client = APIClient()
        client.credentials(HTTP_AUTHORIZATION=f"Bearer {owner_client.secret}")
        barrier.wait()
        response = client.patch(
            f"/api/v1/endpoints/{endpoint_id}/",
            {"min_provisioned_concurrency": 40, "max_provisioned_concurrency": 64},  # 5 replicas
            format="json",
        )
        statuses.append(response.status_code)
        connection.close()

    threads = [threading.Thread(target=raise_min, args=(e.pk,)) for e in (first, second)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert sorted(statuses) == [200, 409]
    assert sorted(Endpoint.objects.values_list("min_provisioned_concurrency", flat=True)) == [0, 40]


@pytest.mark.django_db(transaction=True)
def test_a_minimum_raise_sees_the_reservation_a_concurrent_sale_left(owner, make_endpoint):
    """An operator releases the endpoint's reservation and sells its GPUs to another endpoint in
    one transaction while the tenant raises the endpoint's minimum. The raise waits for the sale
    (both lock the tenant, then the pool), then sees the reservation gone and is refused. Before,
    the sale locked only the pool and touched the tenant's row at commit (its events' deferred
    foreign keys) while the raise held the tenant and waited for the pool: a deadlock, a 500."""
    if connection.vendor != "postgresql":
        pytest.skip("row locks need PostgreSQL")
    raised = make_endpoint(owner, "raised", min_provisioned_concurrency=32, max_provisioned_concurrency=64)
    other = make_endpoint(owner, "other")
    sell(raised, mu_per_minute=700, best_effort_allowed=False, sold_by="ops")  # 7 GPUs + other's 1
    outcome: list[str] = []
    backend: list[int] = []  # the raise's database session, the one the test waits on
    started = threading.Event()

    def raise_minimum() -> None:  # 4 -> 6 replicas of 1 GPU
        try:
            with connection.cursor() as cursor:
                cursor.execute("SELECT pg_backend_pid()")
                backend.append(cursor.fetchone()[0])
            started.set()
            endpoint = Endpoint.objects.get(pk=raised.pk)
            endpoint.min_provisioned_concurrency = 48
            save_endpoint(endpoint, changed=["min_provisioned_concurrency"])
            outcome.append("saved")
        except Oversold:
            outcome.append("oversold")
        finally:
            connection.close()

    with transaction.atomic():
        release(Reservation.objects.get(endpoint=raised), released_by="ops")
        sell(other, mu_per_minute=300, best_effort_allowed=False, sold_by="ops")  # holds the pool
        writer = threading.Thread(target=raise_minimum)
        writer.start()
        assert started.wait(timeout=30)
        with connection.cursor() as cursor:  # until the raise waits on the sale's locks
            for _ in range(2000):
                cursor.execute(
                    "SELECT count(*) FROM pg_stat_activity WHERE pid = %s AND wait_event_type = 'Lock'",
                    [backend[0]],
                )
                if cursor.fetchone()[0]:
                    break
            else:
                pytest.fail("the raise never waited for the sale")
    writer.join(timeout=30)
    assert outcome == ["oversold"]  # 6 GPUs of its minimum + 3 sold to the other > 8
    assert Endpoint.objects.get(pk=raised.pk).min_provisioned_concurrency == 32


def test_the_default_quota_is_what_the_fleet_holds(settings, operator_client, owner, pool, h100):
    """Measured on main: a default of 256 GPUs, larger than any demo pool. The default is now
    the fleet's GPUs (every pool's), and TENANT_GPU_QUOTA_DEFAULT, when set, only lowers it."""
    Tenant.objects.filter(pk=owner.pk).update(gpu_quota=None)
    url = f"/api/v1/tenants/{owner.pk}/"
    assert operator_client.get(url).json()["effective_gpu_quota"] == 8
    GpuPool.objects.create(name="more", gpu_type=h100, region="r", gpu_count=32)
    assert operator_client.get(url).json()["effective_gpu_quota"] == 40
    settings.TENANT_GPU_QUOTA_DEFAULT = 16
    assert operator_client.get(url).json()["effective_gpu_quota"] == 16
    settings.TENANT_GPU_QUOTA_DEFAULT = 1000
    assert operator_client.get(url).json()["effective_gpu_quota"] == 40
    operator_client.patch(url, {"gpu_quota": 1000}, format="json")  # an operator's own word stands
    assert operator_client.get(url).json()["effective_gpu_quota"] == 1000


def test_minimum_replicas_beyond_reservations_are_bounded_by_the_allowance(
    operator_client, owner_client, other_client, owner, other, h100, small_model
):
    """Measured on main: a tenant with no reservation raised its minimum replicas until the
    pool's free GPUs were committed, and the operator's next sale there was a 409. Now each
    tenant's minimum replicas beyond its reservations in a pool stay within its allowance there:
    one node's GPUs by default, or what an operator sets."""
    GpuPool.objects.create(name="wide", gpu_type=h100, region="r", gpu_count=32, gpus_per_node=8)  # 4 x 8

    def endpoint(client, name, minimum):
        body = endpoint_body(name=name, pool="wide", min_provisioned_concurrency=minimum,
                             max_provisioned_concurrency=128)  # fmt: skip
        return client.post("/api/v1/endpoints/", body, format="json")

    first = endpoint(owner_client, "a", 64)  # 8 replicas of 1 GPU: the default allowance, one node
    assert first.status_code == 201, first.content
    url = f"/api/v1/endpoints/{first.json()['id']}/"
    refused = owner_client.patch(url, {"min_provisioned_concurrency": 72}, format="json")  # 9
    assert refused.status_code == 409
    body = refused.json()
    assert {k: v for k, v in body.items() if k != "detail"} == {
        "error": "over_allowance", "tenant": "owner", "pool": "wide", "allowance_gpus": 8,
        "allowance": "the default: 1 node(s) of 8 GPUs", "asked_gpus": 9, "other_endpoints_gpus": 0,
        "total_gpus": 9,
    }  # fmt: skip
    assert body["detail"].startswith(
        "tenant 'owner' has an allowance of 8 GPUs (the default: 1 node(s) of 8 GPUs) in pool 'wide' for"
        " minimum replicas beyond its reservations: this endpoint's take 9 GPUs"
    )
    assert Endpoint.objects.get(name="a").min_provisioned_concurrency == 64
    # Only operators set allowances; a tenant reads its own.
    allowance = {"tenant": "owner", "pool": "wide", "gpus": 12}
    assert owner_client.post("/api/v1/allowances/", allowance, format="json").status_code == 403
    made = operator_client.post("/api/v1/allowances/", allowance, format="json")
    assert made.status_code == 201, made.content
    assert (made.json()["gpus"], made.json()["used_gpus"], made.json()["set_by"]) == (12, 8, "ops")
    again = operator_client.post("/api/v1/allowances/", allowance, format="json")
    assert (
        again.status_code == 400 and "already has an allowance" in again.json()["fields"]["pool"]["errors"][0]
    )
    assert [a["gpus"] for a in owner_client.get("/api/v1/allowances/").json()["results"]] == [12]
    assert other_client.get("/api/v1/allowances/").json()["results"] == []
    assert owner_client.patch(url, {"min_provisioned_concurrency": 72}, format="json").status_code == 200
    second = endpoint(owner_client, "b", 32)  # 4 more: 13 > 12
    assert second.status_code == 409
    assert (second.json()["allowance_gpus"], second.json()["other_endpoints_gpus"]) == (12, 9)
    assert second.json()["allowance"] == "set by ops"
    # A reservation covers minimum replicas: 300 MU/min sold on 'a' leaves 6 of its 9 beyond it.
    sold = operator_client.post(
        "/api/v1/reservations/", {"endpoint": first.json()["id"], "mu_per_minute": 300}, format="json"
    )
    assert sold.status_code == 201
    assert endpoint(owner_client, "b", 32).status_code == 201  # 6 + 4 of 12
    # Per tenant: another tenant has its own default node's worth, and the operator can still
    # sell what is left of the pool (9 + 4 + 8 committed of 32).
    theirs = endpoint(other_client, "theirs", 64)
    assert theirs.status_code == 201
    assert endpoint(other_client, "more", 8).status_code == 409  # 8 + 1 beyond its 8
    sale = operator_client.post(
        "/api/v1/reservations/", {"endpoint": theirs.json()["id"], "mu_per_minute": 1900}, format="json"
    )
    assert sale.status_code == 201, sale.content  # 19 replicas: 9 + 4 + 19 = 32
    event = Event.objects.get(kind="reservation", message__contains="allowance")
    assert event.message == (
        "ops set tenant owner's allowance in pool wide to 12 GPUs of minimum replicas beyond its reservations"
    )
