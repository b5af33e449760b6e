"""A pod's address belongs to the fleet: a tenant reading its endpoints' pods through the API
sees their names and readiness, never where they listen; an operator sees the url."""

from __future__ import annotations

from controlplane.endpoints.models import Pod

ADDRESS = "http://10.1.2.3:8000"


def test_a_tenant_sees_its_pods_without_their_address(owner, owner_client, operator_client, make_endpoint):
    endpoint = make_endpoint(owner, "chat")
    pod = Pod.objects.create(endpoint=endpoint, name="chat-0", url=ADDRESS, ready=True)
    listed = owner_client.get("/api/v1/pods/")
    assert listed.status_code == 200
    (row,) = listed.json()["results"]
    assert row["name"] == "chat-0" and row["ready"] is True
    assert "url" not in row
    one = owner_client.get(f"/api/v1/pods/{pod.pk}/")
    assert one.status_code == 200 and "url" not in one.json()
    for answer in (listed, one):
        assert b"10.1.2.3" not in answer.content
    # the operator's view keeps it
    (ops_row,) = operator_client.get("/api/v1/pods/").json()["results"]
    assert ops_row["url"] == ADDRESS


def test_an_operator_registers_a_pod_with_its_address(owner, operator_client, make_endpoint):
    endpoint = make_endpoint(owner, "chat")
    unplaced = {"endpoint": endpoint.pk, "name": "chat-1"}
    missing = operator_client.post("/api/v1/pods/", unplaced, format="json")
    assert missing.status_code == 400 and "url" in missing.json()["fields"]
    made = operator_client.post(
        "/api/v1/pods/", {"endpoint": endpoint.pk, "name": "chat-1", "url": ADDRESS}, format="json"
    )
    assert made.status_code == 201 and made.json()["url"] == ADDRESS
