"""A tenant's API keys are bounded: API_KEYS_PER_TENANT_MAX active keys (the 101st by default is
a 409; revoking one makes room) and API_KEY_CREATIONS_PER_HOUR made in any hour (a 429 with
Retry-After), through the API, under concurrent creates on PostgreSQL (live_server's threads,
each its own connection), and for the management command that makes a tenant's first key."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
from django.db import connection

from controlplane.tenants.key_limits import CREATION_WINDOW_S, refusal
from controlplane.tenants.models import ApiKey, Tenant
from tests.conftest import client_for


def make_key(client, name: str = "app", tenant: str | None = None):
    return client.post(
        "/api/v1/api-keys/", {"name": name, **({"tenant": tenant} if tenant else {})}, format="json"
    )


def test_the_101st_active_key_is_refused_and_revoking_one_makes_room(owner_client, owner, settings):
    settings.API_KEY_CREATIONS_PER_HOUR = 1000  # the cap alone is under test
    assert settings.API_KEYS_PER_TENANT_MAX == 100  # the default
    made = [make_key(owner_client, f"app-{i}") for i in range(99)]  # the client's own key is the 1st
    assert {r.status_code for r in made} == {201}
    refused = make_key(owner_client, "app-101")
    assert refused.status_code == 409, refused.content
    body = refused.json()
    assert body["error"] == "api_key_limit"
    assert "API_KEYS_PER_TENANT_MAX=100" in body["detail"] and "revoke one" in body["detail"]
    assert ApiKey.objects.filter(tenant=owner).active().count() == 100  # nothing half-made
    assert owner_client.delete(f"/api/v1/api-keys/{made[0].json()['id']}/").status_code == 204
    assert make_key(owner_client, "app-101").status_code == 201
    assert make_key(owner_client, "app-102").status_code == 409


def test_a_script_making_keys_meets_the_creation_rate(owner_client, owner, settings):
    assert settings.API_KEY_CREATIONS_PER_HOUR == 60  # the default; the client's key is one of them
    statuses = []
    for i in range(70):
        response = make_key(owner_client, f"app-{i}")
        statuses.append(response.status_code)
        if response.status_code == 201:  # revoking does not give the rate back
            assert owner_client.delete(f"/api/v1/api-keys/{response.json()['id']}/").status_code == 204
    assert statuses == [201] * 59 + [429] * 11
    refused = make_key(owner_client, "one-more")
    assert refused.status_code == 429
    assert refused.json()["error"] == "api_key_rate"
    assert "API_KEY_CREATIONS_PER_HOUR=60" in refused.json()["detail"]
    assert 3500 <= int(refused["Retry-After"]) <= CREATION_WINDOW_S


def test_operators_keys_are_exempt_and_an_operator_making_a_tenant_key_meets_its_bound(
    operator_client, owner, settings
):
    settings.API_KEYS_PER_TENANT_MAX = 2
    settings.API_KEY_CREATIONS_PER_HOUR = 2
    assert [make_key(operator_client, f"ops-{i}").status_code for i in range(4)] == [201] * 4
    assert [make_key(operator_client, f"t-{i}", tenant="owner").status_code for i in range(3)] == [
        201,
        201,
        409,
    ]


def test_the_rule():
    assert (
        refusal("acme", active=99, made_in_window=0, oldest_in_window_age_s=0, cap=100, per_hour=60) is None
    )
    cap = refusal("acme", active=100, made_in_window=0, oldest_in_window_age_s=0, cap=100, per_hour=60)
    assert cap is not None and cap.status == 409
    rate = refusal("acme", active=5, made_in_window=60, oldest_in_window_age_s=3000, cap=100, per_hour=60)
    assert rate is not None and (rate.status, rate.retry_after_s) == (429, 600)


@pytest.mark.django_db(transaction=True)
def test_concurrent_creates_never_pass_the_cap(live_server, settings):
    if connection.vendor != "postgresql":
        pytest.skip("the lock on the tenant's row is PostgreSQL's")
    settings.API_KEYS_PER_TENANT_MAX = 5
    settings.API_KEY_CREATIONS_PER_HOUR = 1000
    tenant = Tenant.objects.create(name="racer")
    secret = client_for(tenant).secret  # 1 of 5

    def create(i: int) -> int:
        return httpx.post(
            f"{live_server.url}/api/v1/api-keys/",
            json={"name": f"k{i}"},
            headers={"authorization": f"Bearer {secret}"},
            timeout=30,
        ).status_code

    with ThreadPoolExecutor(16) as pool:
        statuses = list(pool.map(create, range(16)))
    assert sorted(statuses) == [201] * 4 + [409] * 12, statuses
    assert ApiKey.objects.filter(tenant=tenant).active().count() == 5


def test_create_tenant_makes_its_first_key_within_the_bounds(db, settings):
    from django.core.management import call_command

    call_command("create_tenant", "fresh")
    assert ApiKey.objects.filter(tenant__name="fresh").active().count() == 1
