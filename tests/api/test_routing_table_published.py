"""With Redis the routing table is built once a second and served from Redis: a poll does not
build it. What the view serves from the copy is what it would build; a stale copy (its builder
down) is not served, and the view builds the table itself."""

import json
import os

import pytest
import redis

from controlplane.endpoints import routing
from controlplane.endpoints.models import Pod
from dataplane.wire.routing_table import RoutingTable, channel


@pytest.fixture
def table_redis(settings):
    url = os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/15")
    settings.REDIS_URL = url
    # A copy is stale 10 s after its build: a stall of this 2-core machine that long between a
    # publish and the poll after it (CI builds .venv-vllm beside the suite) would make the view
    # build the table and fail a test of the copy. The tests' copies stay fresh for a minute.
    settings.ROUTING_TABLE_STALE_AFTER_S = 60.0
    client = redis.Redis.from_url(url)
    client.delete(routing.PUBLISHED_KEY, *client.keys(routing.body_key("*")))
    yield client
    client.delete(routing.PUBLISHED_KEY, *client.keys(routing.body_key("*")))
    client.close()


def test_the_view_serves_the_published_copy_and_its_version_is_announced(
    table_redis, operator_client, owner, make_endpoint, monkeypatch
):
    chat = make_endpoint(owner, "chat")
    Pod.objects.create(endpoint=chat, name="chat-0", url="http://127.0.0.1:9001", ready=True)
    built = operator_client.get("/api/v1/routing-table/")  # no copy yet: built by the view
    listener = table_redis.pubsub(ignore_subscribe_messages=True)
    listener.subscribe(channel(table_redis))
    listener.get_message(timeout=1)  # the subscription's confirmation
    version = routing.publish(table_redis)
    announced = listener.get_message(timeout=2)
    listener.close()
    assert announced is not None and announced["data"].decode() == version
    assert built["ETag"] == f'"{version}"'
    # From here on a poll reads the copy: building the table would fail the test.
    monkeypatch.setattr(routing, "routing_table", lambda: pytest.fail("the view built the table"))
    copy = operator_client.get("/api/v1/routing-table/")
    assert copy.status_code == 200 and copy["ETag"] == built["ETag"]
    assert RoutingTable.from_json(json.loads(copy.content)) == RoutingTable.from_json(built.json())
    same = operator_client.get("/api/v1/routing-table/", HTTP_IF_NONE_MATCH=built["ETag"])
    assert same.status_code == 304 and same["ETag"] == built["ETag"]


def test_a_change_is_served_once_published_and_a_stale_copy_is_not_served(
    table_redis, operator_client, owner, make_endpoint, settings
):
    chat = make_endpoint(owner, "chat")
    first = routing.publish(table_redis)
    Pod.objects.create(endpoint=chat, name="chat-0", url="http://127.0.0.1:9001", ready=True)
    # Until the next build the copy is the table: at most a second behind (the beat's period).
    assert operator_client.get("/api/v1/routing-table/")["ETag"] == f'"{first}"'
    second = routing.publish(table_redis)
    assert second != first
    answer = operator_client.get("/api/v1/routing-table/", HTTP_IF_NONE_MATCH=f'"{first}"')
    assert answer.status_code == 200 and answer["ETag"] == f'"{second}"'
    (entry,) = RoutingTable.from_json(json.loads(answer.content)).endpoints
    assert [p.name for p in entry.pods] == ["chat-0"]
    # The builder stopped longer ago than ROUTING_TABLE_STALE_AFTER_S: the view builds.
    stale_at = (
        float(table_redis.hget(routing.PUBLISHED_KEY, "built_at")) - settings.ROUTING_TABLE_STALE_AFTER_S - 1
    )
    routing.publish(table_redis, now=stale_at)
    Pod.objects.create(endpoint=chat, name="chat-1", url="http://127.0.0.1:9002", ready=True)
    fresh = operator_client.get("/api/v1/routing-table/", HTTP_IF_NONE_MATCH=f'"{second}"')
    assert fresh.status_code == 200
    pods = RoutingTable.from_json(fresh.json()).endpoints[0].pods
    assert [p.name for p in pods] == ["chat-0", "chat-1"]
    # Redis away: the view builds the table, as without Redis.
    settings.REDIS_URL = "redis://127.0.0.1:1/0"
    assert operator_client.get("/api/v1/routing-table/")["ETag"] == fresh["ETag"]


def test_the_beat_builds_once_a_second_or_twice_a_builds_time_apart(table_redis, owner, make_endpoint):
    make_endpoint(owner, "chat")
    assert routing.due(None, 0.0, 1000.0, 1.0)  # never built
    assert not routing.due(1000.0, 0.2, 1000.9, 1.0) and routing.due(1000.0, 0.2, 1001.0, 1.0)
    # 10,000 endpoints: a 2.25 s build; the next 4.5 s after it, not a second
    assert not routing.due(1000.0, 2.25, 1004.4, 1.0) and routing.due(1000.0, 2.25, 1004.5, 1.0)
    first = routing.publish_due(table_redis, 2000.0, 1.0)
    assert first is not None and routing.publish_due(table_redis, 2000.5, 1.0) is None
    table_redis.hset(routing.PUBLISHED_KEY, "build_s", "3.0")  # as if that build took 3 s
    assert routing.publish_due(table_redis, 2005.9, 1.0) is None
    assert routing.publish_due(table_redis, 2006.0, 1.0) == first


def test_a_revoked_key_withdraws_the_copy_and_queues_its_publication(
    table_redis, operator_client, owner, monkeypatch, django_capture_on_commit_callbacks
):
    from controlplane.endpoints import tasks
    from controlplane.tenants.models import ApiKey, hash_secret

    key, secret = ApiKey.issue(name="app", tenant=owner)
    routing.publish(table_redis)
    queued: list[dict] = []
    monkeypatch.setattr(tasks.publish_routing_table, "delay", lambda **kw: queued.append(kw))
    with django_capture_on_commit_callbacks(execute=True):
        key.revoke()
    assert table_redis.hget(routing.PUBLISHED_KEY, "version") is None and queued == [{"force": True}]
    # Until the task publishes again, a poll builds the table: the key is already gone from it.
    table = RoutingTable.from_json(operator_client.get("/api/v1/routing-table/").json())
    assert table == routing.routing_table() and hash_secret(secret) not in table.api_keys


def test_a_build_that_read_before_a_revocation_does_not_bring_the_key_back(
    table_redis, operator_client, owner, monkeypatch, django_capture_on_commit_callbacks
):
    from controlplane.endpoints import tasks
    from controlplane.tenants.models import ApiKey, hash_secret

    key, secret = ApiKey.issue(name="app", tenant=owner)
    routing.publish(table_redis)
    monkeypatch.setattr(tasks.publish_routing_table, "delay", lambda **kw: None)
    real = routing.routing_table

    def build_across_the_revocation() -> RoutingTable:
        table = real()  # the beat's build has read the database (2 s at 10,000 endpoints) ...
        with django_capture_on_commit_callbacks(execute=True):
            key.revoke()  # ... when the key is revoked and the copy withdrawn
        return table

    monkeypatch.setattr(routing, "routing_table", build_across_the_revocation)
    listener = table_redis.pubsub(ignore_subscribe_messages=True)
    listener.subscribe(channel(table_redis))
    listener.get_message(timeout=1)
    assert routing.publish(table_redis) is None  # it writes nothing and announces nothing
    assert listener.get_message(timeout=0.5) is None
    monkeypatch.setattr(routing, "routing_table", real)
    assert (
        hash_secret(secret)
        not in RoutingTable.from_json(operator_client.get("/api/v1/routing-table/").json()).api_keys
    )
    version = tasks.publish_routing_table(force=True)  # the publication the withdrawal queued
    assert (
        version == routing.routing_table().version
        and listener.get_message(timeout=2)["data"].decode() == version
    )
    listener.close()
    served = RoutingTable.from_json(operator_client.get("/api/v1/routing-table/").json())
    assert served.version == version and hash_secret(secret) not in served.api_keys
    # Two builders at once: one that read before the build now there does not replace it.
    monkeypatch.setattr(table_redis, "time", lambda: (1, 0))
    assert routing.publish(table_redis) is None
