"""A rename through the API: the endpoint's pods keep the name it was created under (its
deployment does not change, so no pod restarts), the routing table carries both names, the
published copy is withdrawn so routers take the new name at their next poll, and a second
endpoint may take the old name, with pods of its own."""

from controlplane.endpoints import routing
from controlplane.endpoints.deployments import deployment
from controlplane.endpoints.models import Endpoint
from tests.api.test_routing_table_published import table_redis  # noqa: F401 (a fixture)
from tests.conftest import endpoint_body


def test_a_rename_keeps_the_served_name_and_the_deployment(owner_client, owner, make_endpoint):
    chat = make_endpoint(owner, "chat")
    assert chat.served_model_name == "chat"
    before = deployment(chat)
    answer = owner_client.patch(f"/api/v1/endpoints/{chat.pk}/", {"name": "assistant"}, format="json")
    assert answer.status_code == 200, answer.json()
    assert (answer.json()["name"], answer.json()["served_model_name"]) == ("assistant", "chat")
    renamed = Endpoint.objects.get(pk=chat.pk)
    assert deployment(renamed) == before  # same arguments: the driver restarts nothing
    assert before.args[before.args.index("--served-model-name") + 1] == "chat"
    # A second endpoint takes the old name: its own pods serve it, its own deployment.
    second = owner_client.post("/api/v1/endpoints/", endpoint_body(name="chat"), format="json")
    assert second.status_code == 201, second.json()
    table = {e.id: e for e in routing.routing_table().endpoints}
    assert (table[chat.pk].name, table[chat.pk].served_model_name) == ("assistant", "chat")
    assert (table[second.json()["id"]].name, table[second.json()["id"]].served_model_name) == ("chat", "chat")
    # and the API does not take a served name: it is the pods', not the tenant's to set
    refused = owner_client.patch(f"/api/v1/endpoints/{chat.pk}/", {"served_model_name": "x"}, format="json")
    assert refused.status_code == 400 and "served_model_name" in refused.json()["fields"]


def test_a_rename_withdraws_the_published_table_and_queues_its_publication(
    table_redis,  # noqa: F811 (the fixture)
    owner_client,
    operator_client,
    owner,
    make_endpoint,
    monkeypatch,
    django_capture_on_commit_callbacks,
):
    from controlplane.endpoints import tasks

    chat = make_endpoint(owner, "chat")
    routing.publish(table_redis)
    queued: list[dict] = []
    monkeypatch.setattr(tasks.publish_routing_table, "delay", lambda **kw: queued.append(kw))
    with django_capture_on_commit_callbacks(execute=True):  # not a rename: nothing withdrawn
        owner_client.patch(
            f"/api/v1/endpoints/{chat.pk}/", {"max_provisioned_concurrency": 32}, format="json"
        )
    assert table_redis.hget(routing.PUBLISHED_KEY, "version") is not None and queued == []
    with django_capture_on_commit_callbacks(execute=True):
        owner_client.patch(f"/api/v1/endpoints/{chat.pk}/", {"name": "assistant"}, format="json")
    assert table_redis.hget(routing.PUBLISHED_KEY, "version") is None and queued == [{"force": True}]
    # Until the task publishes again, a poll builds the table: the new name is in it already.
    (entry,) = operator_client.get("/api/v1/routing-table/").json()["endpoints"]
    assert (entry["name"], entry["served_model_name"]) == ("assistant", "chat")
