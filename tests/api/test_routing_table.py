"""The routing table routers pull: contents, scoping to operators, and ETag revalidation."""

from capacity.units import CostModel
from controlplane.endpoints.models import Pod
from controlplane.selling import sell
from controlplane.tenants.models import ApiKey, hash_secret
from dataplane.wire.routing_table import KeyEpoch, ReservedRate, RoutingTable


def test_the_table_lists_endpoints_pricing_pods_and_keys(operator_client, owner_client, owner, make_endpoint):
    chat = make_endpoint(owner, "chat")
    sell(chat, mu_per_minute=300, best_effort_allowed=False, sold_by="t")
    Pod.objects.create(endpoint=chat, name="chat-1", url="http://127.0.0.1:9002", ready=False)
    Pod.objects.create(endpoint=chat, name="chat-0", url="http://127.0.0.1:9001", ready=True)
    response = operator_client.get("/api/v1/routing-table/")
    assert response.status_code == 200
    table = RoutingTable.from_json(response.json())
    (entry,) = table.endpoints
    assert entry.tenant == "owner" and entry.name == "chat" and entry.model == "llama-8b"
    assert entry.policy == "p2c-mu"
    assert entry.coefficients == CostModel(0.0004, 0.004, 0.02)
    assert entry.reservation == ReservedRate(300, best_effort_allowed=False)
    assert [p.name for p in entry.pods] == ["chat-0", "chat-1"]
    # Keys are looked up one by one (routing-table/keys/<sha256>/), not carried
    assert table.api_keys == {} and table.key_epochs == {"owner": KeyEpoch(owner.pk, 0)}


def test_only_operators_read_it(owner_client):
    assert owner_client.get("/api/v1/routing-table/").status_code == 403


def test_etag_answers_304_until_something_changes(operator_client, owner, make_endpoint, owner_client):
    chat = make_endpoint(owner, "chat")
    first = operator_client.get("/api/v1/routing-table/")
    etag = first["ETag"]
    assert etag == f'"{RoutingTable.from_json(first.json()).version}"'
    same = operator_client.get("/api/v1/routing-table/", HTTP_IF_NONE_MATCH=etag)
    assert same.status_code == 304 and same["ETag"] == etag
    chat.target_concurrency_per_replica = 4  # the vertical autoscaler moved
    chat.save()
    changed = operator_client.get("/api/v1/routing-table/", HTTP_IF_NONE_MATCH=etag)
    assert changed.status_code == 200 and changed["ETag"] != etag
    # Revoking a key changes the table too.
    ApiKey.objects.get(secret_hash=hash_secret(owner_client.secret)).revoke()
    assert (
        operator_client.get("/api/v1/routing-table/", HTTP_IF_NONE_MATCH=changed["ETag"]).status_code == 200
    )


def test_pods_are_registered_by_operators_and_read_by_their_tenant(
    operator_client, owner_client, other_client, owner, make_endpoint
):
    chat = make_endpoint(owner, "chat")
    made = operator_client.post(
        "/api/v1/pods/",
        {"endpoint": chat.pk, "name": "chat-0", "url": "http://127.0.0.1:9001"},
        format="json",
    )
    assert made.status_code == 201, made.content
    assert owner_client.get("/api/v1/pods/").json()["results"][0]["name"] == "chat-0"
    assert other_client.get("/api/v1/pods/").json()["results"] == []
    bad = operator_client.post(
        "/api/v1/pods/", {"endpoint": chat.pk, "name": "x", "url": "not a url"}, format="json"
    )
    assert bad.status_code == 400 and bad.json()["fields"]["url"]["value"] == "not a url"
    assert (
        owner_client.post(
            "/api/v1/pods/", {"endpoint": chat.pk, "name": "y", "url": "http://127.0.0.1:1"}, format="json"
        ).status_code
        == 403
    )
