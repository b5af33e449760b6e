"""The autoscaler never asks the cluster for more replicas than the pool's GPUs hold beside what
its other endpoints commit or hold, and says so once per clamp episode. The real horizontal pass
on synthetic time, as in tests/test_autoscaling.py (the cluster records what it is told)."""

from datetime import timedelta

import pytest
from django.db import transaction

from controlplane import pods, scaling
from controlplane.capacity.models import ProvisionedAllowance
from controlplane.endpoints.models import Endpoint, Lease, LoadBucket
from controlplane.oncall.models import Event
from dataplane.cluster.driver import ClusterError
from tests.test_autoscaling import NOW, TS, Recorder, buckets


def load(endpoint, until, seconds_back=60, in_flight=30.0):
    """5-second buckets of `in_flight` concurrent requests over `seconds_back` seconds to `until`."""
    LoadBucket.objects.bulk_create(
        [
            LoadBucket(
                endpoint=endpoint, end=end, seconds=5, in_flight=in_flight, mu_per_minute=10.0,
                requests=50, queue_depth=0, errors=0, throttled=0, ready_replicas=1, desired_replicas=1,
            )
            for end in range(until - seconds_back + 5, until + 1, 5)
        ],
        ignore_conflicts=True,
    )  # fmt: skip


@pytest.fixture
def crowded(owner, make_endpoint):
    """8 GPUs: 'batch' commits 5 minimum replicas (5 GPUs); 'chat' (1..10 replicas) has 1."""
    batch = make_endpoint(owner, "batch", min_provisioned_concurrency=40, max_provisioned_concurrency=40)
    chat = make_endpoint(owner, "chat", max_provisioned_concurrency=80)
    assert (batch.desired_replicas, chat.desired_replicas) == (5, 1)
    return batch, chat


def test_a_scale_up_is_clamped_to_the_free_gpus_with_one_warning_per_episode(crowded):
    batch, chat = crowded
    # 30 in flight at 80 % of 8 per replica needs 5 replicas; 8 - 5 GPUs leave room for 3.
    load(chat, TS)
    cluster = Recorder()
    scaling.horizontal_pass(cluster, NOW)
    chat.refresh_from_db()
    assert chat.desired_replicas == 3 and cluster.applied[f"ep-{chat.pk}-v1"].replicas == 3
    assert chat.clamped_since == NOW
    (warning,) = Event.objects.filter(endpoint=chat, severity="warning")
    assert warning.kind == "scale" and "wants 5 replicas, clamped to 3" in warning.message
    # The scale itself: the decision's need, then what the pool held it at, and why.
    scaled = Event.objects.get(endpoint=chat, severity="info")
    assert scaled.message.startswith(
        "chat: scaled 1 -> 3: 4.7 replicas needed over the last 20 s, held at 3: no room for more in"
        " pool use1-h100. Pool use1-h100 has 1 nodes x 8 GPUs and its other endpoints commit or hold 5 GPUs"
    ), scaled.message
    assert (scaled.detail["asked"], scaled.detail["to"], scaled.detail["rule"]) == (5, 3, "load")
    assert warning.detail["clamp"] == "start" and warning.detail["pool"] == "use1-h100"
    assert (warning.detail["have_gpus"], warning.detail["others_gpus"], warning.detail["room_replicas"]) == (
        8,
        5,
        3,
    )
    # The next ticks want the same and are held the same: no second warning.
    for tick in (1, 2):
        load(chat, TS + 5 * tick)
        scaling.horizontal_pass(cluster, NOW + timedelta(seconds=5 * tick))
    chat.refresh_from_db()
    assert chat.desired_replicas == 3
    assert Event.objects.filter(endpoint=chat, severity="warning").count() == 1
    # batch's minimum drops to 1 replica: chat fits, and the episode ends with one info event.
    Endpoint.objects.filter(pk=batch.pk).update(min_provisioned_concurrency=0, desired_replicas=1)
    load(chat, TS + 15)
    scaling.horizontal_pass(cluster, NOW + timedelta(seconds=15))
    chat.refresh_from_db()
    assert chat.desired_replicas == 5 and chat.clamped_since is None
    (ended,) = Event.objects.filter(endpoint=chat, detail__clamp="end")
    assert ended.severity == "info" and "no longer clamped" in ended.message


def test_two_endpoints_growing_in_one_pass_never_ask_more_than_the_pool(owner, make_endpoint):
    a = make_endpoint(owner, "a", max_provisioned_concurrency=80)
    b = make_endpoint(owner, "b", max_provisioned_concurrency=80)
    load(a, TS)
    load(b, TS)
    cluster = Recorder()
    scaling.horizontal_pass(cluster, NOW)
    asked = {name: d.replicas for name, d in cluster.applied.items()}
    assert asked == {f"ep-{a.pk}-v1": 5, f"ep-{b.pk}-v1": 3}  # 8 of 8 GPUs


def test_a_reservation_keeps_its_gpus_from_other_endpoints(owner, make_endpoint, big_model):
    # The 70B endpoint runs 1 replica (4 GPUs) but its 200 MU/min reservation commits 8: all of them.
    from controlplane.selling import sell

    reserved = make_endpoint(owner, "reserved", profile=big_model, scale_to_zero_enabled=True)
    sell(reserved, mu_per_minute=200, best_effort_allowed=True, sold_by="t")
    chat = make_endpoint(owner, "chat", scale_to_zero_enabled=True, max_provisioned_concurrency=80)
    Endpoint.objects.filter(pk=chat.pk).update(desired_replicas=0)
    load(chat, TS)
    scaling.horizontal_pass(Recorder(), NOW)
    chat.refresh_from_db()
    assert chat.desired_replicas == 0
    assert Event.objects.filter(endpoint=chat, detail__clamp="start", detail__room_replicas=0).exists()


def test_a_wake_with_no_free_gpu_is_refused_naming_the_pool(owner, make_endpoint):
    make_endpoint(owner, "full", min_provisioned_concurrency=64, max_provisioned_concurrency=64)  # 8 GPUs
    idle = make_endpoint(owner, "idle", scale_to_zero_enabled=True)
    assert idle.desired_replicas == 0
    cluster = Recorder()
    with pytest.raises(ClusterError, match="pool use1-h100 has no room"):
        pods.wake(idle, cluster, NOW)
    assert cluster.calls == []


def test_a_lower_target_that_needs_more_minimum_replicas_than_the_pool_holds_is_held(
    owner, make_endpoint, pool
):
    """A lower target concurrency raises the minimum replicas (48 at 16 per replica: 3; at 12: 4),
    which is committed capacity: the vertical pass may not raise it past the pool."""
    steady = make_endpoint(
        owner, "steady", min_provisioned_concurrency=48, max_provisioned_concurrency=48,
        target_concurrency_per_replica=16,
    )  # fmt: skip
    make_endpoint(owner, "batch", min_provisioned_concurrency=40, max_provisioned_concurrency=40)  # 5 GPUs
    Endpoint.objects.filter(pk=steady.pk).update(ready_replicas=3)
    buckets(steady, 30, in_flight=20.0, p99=9.5)  # slow replicas: the decider wants 16 x 0.75 = 12
    cluster = Recorder()
    assert scaling.vertical_pass(cluster, NOW).changed == 0
    steady.refresh_from_db()
    assert steady.target_concurrency_per_replica == 16 and cluster.calls == []
    # With room for a fourth replica (nine 1-GPU nodes, and an allowance for minimum replicas
    # beyond the default one node) it goes through.
    pool.gpu_count, pool.gpus_per_node = 9, 1
    pool.save()
    ProvisionedAllowance.objects.create(tenant=owner, pool=pool, gpus=9)
    Lease.objects.filter(name=scaling.VERTICAL).update(last_run_at=None)  # the same 30 s again
    assert scaling.vertical_pass(cluster, NOW).changed == 1
    steady.refresh_from_db()
    assert steady.target_concurrency_per_replica == 12 and steady.replica_bounds == (4, 4)


def test_a_minimum_raised_after_the_vertical_pass_read_the_endpoint_is_checked_at_the_new_target(
    owner, make_endpoint, owner_client
):
    """The pass reads the endpoint (1 replica at 16); a PATCH raises its minimum to 48 (3 replicas
    at 16: 5 + 3 of 8 GPUs fit); the pass then lowers the target to 12: 48 at 12 is 4 replicas,
    9 GPUs. The check under the locks sees the raised minimum and holds the target at 16."""
    from controlplane import selling

    steady = make_endpoint(
        owner, "steady", min_provisioned_concurrency=16, max_provisioned_concurrency=16,
        target_concurrency_per_replica=16,
    )  # fmt: skip
    make_endpoint(owner, "batch", min_provisioned_concurrency=40, max_provisioned_concurrency=40)  # 5 GPUs
    read_by_the_pass = Endpoint.objects.with_related().get(pk=steady.pk)
    raised = owner_client.patch(
        f"/api/v1/endpoints/{steady.pk}/",
        {"min_provisioned_concurrency": 48, "max_provisioned_concurrency": 48},
        format="json",
    )
    assert raised.status_code == 200, raised.content
    with transaction.atomic():
        assert selling.allowed_target(read_by_the_pass, 12) == 16


def test_a_patch_of_another_field_keeps_what_the_autoscaler_wrote(
    owner, make_endpoint, owner_client, monkeypatch
):
    """The PATCH reads its endpoint, then the autoscaler writes desired_replicas, clamped_since and
    state; saving the PATCH writes only the fields it sets."""
    from controlplane.api import views

    chat = make_endpoint(owner, "chat", max_provisioned_concurrency=80)
    read = views.EndpointViewSet.get_object

    def read_then_the_autoscaler_writes(self):
        endpoint = read(self)
        Endpoint.objects.filter(pk=chat.pk).update(
            desired_replicas=3, clamped_since=NOW, state=Endpoint.State.SCALING
        )
        return endpoint

    monkeypatch.setattr(views.EndpointViewSet, "get_object", read_then_the_autoscaler_writes)
    patched = owner_client.patch(
        f"/api/v1/endpoints/{chat.pk}/", {"max_provisioned_concurrency": 72}, format="json"
    )
    assert patched.status_code == 200, patched.content
    chat.refresh_from_db()
    assert chat.max_provisioned_concurrency == 72
    assert (chat.desired_replicas, chat.clamped_since, chat.state) == (3, NOW, Endpoint.State.SCALING)
