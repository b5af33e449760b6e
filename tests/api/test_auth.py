"""Bearer keys: unknown, revoked, malformed and missing keys get 401; secrets are shown once."""

import threading
from datetime import timedelta

import pytest
from django.db import connection
from django.utils import timezone
from rest_framework.test import APIClient

from controlplane.tenants.models import ApiKey, hash_secret


def test_missing_key_is_401_with_a_bearer_challenge(db):
    response = APIClient().get("/api/v1/endpoints/")
    assert response.status_code == 401
    assert response["WWW-Authenticate"] == "Bearer"
    assert response.json()["error"] == "not_authenticated"


def test_unknown_key_is_401(db):
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION="Bearer mu_not-a-real-key")
    response = client.get("/api/v1/endpoints/")
    assert response.status_code == 401
    assert response.json()["detail"] == "API key is unknown or revoked"


def test_malformed_header_is_401_naming_the_format(db):
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION="Token abc")
    response = client.get("/api/v1/endpoints/")
    assert response.status_code == 401
    assert "Bearer <api key>" in response.json()["detail"]


def test_revoked_key_is_401(owner_client):
    assert owner_client.get("/api/v1/endpoints/").status_code == 200
    ApiKey.objects.get(secret_hash=hash_secret(owner_client.secret)).revoke()
    assert owner_client.get("/api/v1/endpoints/").status_code == 401


def test_only_the_hash_is_stored(owner_client):
    key = ApiKey.objects.get(secret_hash=hash_secret(owner_client.secret))
    assert owner_client.secret not in {key.name, key.prefix, key.secret_hash}
    assert owner_client.secret.startswith(key.prefix)


def test_last_used_is_recorded_at_most_once_a_minute(owner_client):
    key = ApiKey.objects.get(secret_hash=hash_secret(owner_client.secret))
    assert key.last_used_at is None
    owner_client.get("/api/v1/endpoints/")
    first = ApiKey.objects.get(pk=key.pk).last_used_at
    assert first is not None
    owner_client.get("/api/v1/endpoints/")
    assert ApiKey.objects.get(pk=key.pk).last_used_at == first
    ApiKey.objects.filter(pk=key.pk).update(last_used_at=timezone.now() - timedelta(minutes=5))
    owner_client.get("/api/v1/endpoints/")
    assert ApiKey.objects.get(pk=key.pk).last_used_at > first


@pytest.mark.django_db(transaction=True)
def test_a_request_does_not_wait_for_another_writing_its_keys_last_use(owner):
    """Another transaction holds the key's row (a request writing its last use, whose lock lasts
    until that request ends): a request with the same key is answered without waiting for it,
    and the last use stays the other's to write."""
    if connection.vendor != "postgresql":
        pytest.skip("row locks: PostgreSQL")
    import psycopg

    from tests.production_server import database_url

    key, secret = ApiKey.issue(tenant=owner, name="busy")
    answers: list[int] = []

    def request() -> None:
        client = APIClient()
        client.credentials(HTTP_AUTHORIZATION=f"Bearer {secret}")
        try:
            answers.append(client.get("/api/v1/whoami/").status_code)
        finally:
            connection.close()

    with psycopg.connect(database_url()) as other:  # a transaction, open until the block ends
        other.execute("SELECT 1 FROM tenants_apikey WHERE id = %s FOR UPDATE", [key.pk])
        thread = threading.Thread(target=request)
        thread.start()
        thread.join(timeout=10)
        blocked = thread.is_alive()
    thread.join()
    assert not blocked and answers == [200]
    assert ApiKey.objects.get(pk=key.pk).last_used_at is None


def test_a_new_key_is_shown_once_and_then_revocable(owner_client, owner):
    made = owner_client.post("/api/v1/api-keys/", {"name": "ci"}, format="json")
    assert made.status_code == 201
    secret = made.json()["key"]
    assert made.json()["tenant"] == "owner"
    listed = owner_client.get(f"/api/v1/api-keys/{made.json()['id']}/").json()
    assert "key" not in listed and secret not in str(listed)

    fresh = APIClient()
    fresh.credentials(HTTP_AUTHORIZATION=f"Bearer {secret}")
    assert fresh.get("/api/v1/whoami/").json() == {"name": "ci", "operator": False, "tenant": "owner"}
    assert owner_client.delete(f"/api/v1/api-keys/{made.json()['id']}/").status_code == 204
    assert fresh.get("/api/v1/whoami/").status_code == 401
    assert ApiKey.objects.filter(pk=made.json()["id"], revoked_at__isnull=False).exists()


def test_a_tenant_cannot_mint_keys_for_another_tenant(owner_client, other):
    response = owner_client.post("/api/v1/api-keys/", {"name": "x", "tenant": "other"}, format="json")
    assert response.status_code == 400
    assert response.json()["fields"]["tenant"]["value"] == "other"
    assert not ApiKey.objects.filter(name="x").exists()


def test_a_tenant_cannot_mint_operator_keys(owner_client):
    made = owner_client.post("/api/v1/api-keys/", {"name": "sneaky", "tenant": None}, format="json")
    assert made.status_code == 201
    assert made.json()["is_operator"] is False and made.json()["tenant"] == "owner"


def test_operators_mint_operator_keys(operator_client):
    made = operator_client.post("/api/v1/api-keys/", {"name": "prober"}, format="json")
    assert made.status_code == 201
    assert made.json()["is_operator"] is True
