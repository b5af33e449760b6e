"""The routing table carries each tenant's keys' epoch, not its keys: it is as large with 300 keys
as with 3, and a new key leaves its version alone; routers look keys up one by one at
``/api/v1/routing-table/keys/<sha256>/`` (operators only), and a revocation moves the tenant's
epoch (a new version: routers drop what they kept of that tenant's keys)."""

import hashlib

from controlplane.tenants.models import ApiKey, hash_secret
from dataplane.wire.routing_table import KeyEpoch, KeyLookup, RoutingTable


def lookup(client, digest: str):
    return client.get(f"/api/v1/routing-table/keys/{digest}/")


def test_a_key_is_looked_up_by_its_digest(operator_client, owner_client, owner, other):
    found = lookup(operator_client, hash_secret(owner_client.secret))
    assert found.status_code == 200
    assert KeyLookup.from_json(found.json()) == KeyLookup(
        hash_secret(owner_client.secret), "owner", KeyEpoch(owner.pk, 0)
    )
    missing = lookup(operator_client, hashlib.sha256(b"mu_nobody").hexdigest())
    assert missing.status_code == 404 and missing.json()["error"] == "not_found"
    # an operator's key is not for routing
    assert lookup(operator_client, hash_secret(operator_client.secret)).status_code == 404
    bad = lookup(operator_client, "not-a-digest")
    assert bad.status_code == 400 and "digest" in bad.json()["fields"]
    assert lookup(owner_client, hash_secret(owner_client.secret)).status_code == 403  # operators only


def test_a_revoked_key_is_not_found_and_moves_its_tenant_s_epoch(operator_client, owner_client, owner, other):
    _, spare = ApiKey.issue(name="spare", tenant=owner)
    first = operator_client.get("/api/v1/routing-table/")
    assert RoutingTable.from_json(first.json()).key_epochs["owner"] == KeyEpoch(owner.pk, 0)
    ApiKey.objects.get(secret_hash=hash_secret(spare)).revoke()
    assert lookup(operator_client, hash_secret(spare)).status_code == 404
    after = operator_client.get("/api/v1/routing-table/", HTTP_IF_NONE_MATCH=first["ETag"])
    assert after.status_code == 200  # a new version: routers drop owner's keys they kept
    epochs = RoutingTable.from_json(after.json()).key_epochs
    assert epochs == {"owner": KeyEpoch(owner.pk, 1), "other": KeyEpoch(other.pk, 0)}
    still = KeyLookup.from_json(lookup(operator_client, hash_secret(owner_client.secret)).json())
    assert still.epoch == KeyEpoch(owner.pk, 1)  # its epoch read with it


def test_the_table_does_not_grow_with_keys(operator_client, owner, make_endpoint, settings):
    settings.API_KEY_CREATIONS_PER_HOUR = 1000
    settings.API_KEYS_PER_TENANT_MAX = 1000
    make_endpoint(owner, "chat")
    for i in range(3):
        ApiKey.issue(name=f"k{i}", tenant=owner)
    three = operator_client.get("/api/v1/routing-table/")
    for i in range(3, 300):
        ApiKey.issue(name=f"k{i}", tenant=owner)
    same = operator_client.get("/api/v1/routing-table/", HTTP_IF_NONE_MATCH=three["ETag"])
    assert same.status_code == 304  # 297 new keys: no router downloads anything
    hundreds = operator_client.get("/api/v1/routing-table/")
    print(f"routing table with 3 keys: {len(three.content)} B, with 300 keys: {len(hundreds.content)} B")
    assert len(hundreds.content) == len(three.content)
