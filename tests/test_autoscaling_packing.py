"""The autoscaler's scale-ups follow the packed ledger: a replica that does not pack onto the
pool's nodes is never asked for, even where the pool's GPUs as one heap would hold it. The real
horizontal pass on synthetic time (tests/test_autoscaling_room.py's pattern)."""

from controlplane import scaling
from controlplane.capacity.models import GpuPool, ModelProfile, ProvisionedAllowance
from controlplane.oncall.models import Event
from tests.test_autoscaling import NOW, TS, Recorder
from tests.test_autoscaling_room import load


def test_a_scale_up_stops_at_the_replicas_that_pack(owner, make_endpoint, h100):
    # 2 nodes x 8 GPUs and a 5-GPU model: 16 GPUs hold three replicas as a heap, the nodes two.
    pool = GpuPool.objects.create(name="tp5-pool", gpu_type=h100, region="r", gpu_count=16, gpus_per_node=8)
    tp5 = ModelProfile.objects.create(
        model="tp5", gpu_type=h100, alpha=0, beta=0, gamma=1, gpus_per_replica=5
    )
    chat = make_endpoint(owner, "chat", profile=tp5, pool=pool, max_provisioned_concurrency=80)
    assert chat.desired_replicas == 1
    load(chat, TS)  # 30 in flight at 80 % of 8 per replica: 5 replicas wanted
    cluster = Recorder()
    scaling.horizontal_pass(cluster, NOW)
    chat.refresh_from_db()
    assert chat.desired_replicas == 2 and cluster.applied[f"ep-{chat.pk}-v1"].replicas == 2
    (warning,) = Event.objects.filter(endpoint=chat, severity="warning")
    assert "wants 5 replicas, clamped to 2" in warning.message
    assert "2 nodes x 8 GPUs" in warning.message
    assert (warning.detail["room_replicas"], warning.detail["gpus_per_node"]) == (2, 8)


def test_a_small_model_fills_the_gpus_a_wide_one_strands(owner, make_endpoint, h100):
    # The 5-GPU endpoint holds one replica per node; a 1-GPU endpoint grows into the 3 + 3 left.
    pool = GpuPool.objects.create(name="mixed", gpu_type=h100, region="r", gpu_count=16, gpus_per_node=8)
    tp5 = ModelProfile.objects.create(
        model="tp5", gpu_type=h100, alpha=0, beta=0, gamma=1, gpus_per_replica=5
    )
    ProvisionedAllowance.objects.create(tenant=owner, pool=pool, gpus=16)  # 10 GPUs of minimum, unsold
    make_endpoint(
        owner, "wide", profile=tp5, pool=pool, min_provisioned_concurrency=16, max_provisioned_concurrency=16
    )
    small = make_endpoint(owner, "small", pool=pool, max_provisioned_concurrency=80)
    load(small, TS, in_flight=60.0)  # 60 / (0.8 x 8): 10 replicas wanted
    cluster = Recorder()
    scaling.horizontal_pass(cluster, NOW)
    small.refresh_from_db()
    assert small.desired_replicas == 6
