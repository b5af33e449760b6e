"""The capacity summary and every write that could oversell a pool behind the ledger's back."""

from controlplane.capacity.models import GpuPool
from controlplane.endpoints.models import Endpoint, Pod
from controlplane.pool_ledgers import refresh_pools
from controlplane.selling import sell


def test_capacity_summary_with_worked_numbers(operator_client, owner, make_endpoint, big_model):
    # 8 H100s; chat (1 GPU/replica) 200 MU/min = 2 GPUs, 150 used; big (4 GPUs/replica) 100 = 4 GPUs.
    chat = make_endpoint(owner, "chat")
    big = make_endpoint(owner, "big", profile=big_model)
    sell(chat, mu_per_minute=200, best_effort_allowed=True, sold_by="t")
    sell(big, mu_per_minute=100, best_effort_allowed=True, sold_by="t")
    Endpoint.objects.filter(pk=chat.pk).update(used_mu_per_minute=150)
    # Running replicas hold GPUs: 2 ready pods of chat (1 GPU each), 1 of big (4), 1 not ready.
    for endpoint, name, ready in [
        (chat, "c0", True),
        (chat, "c1", True),
        (chat, "c2", False),
        (big, "b0", True),
    ]:
        Pod.objects.create(endpoint=endpoint, name=name, url="http://127.0.0.1:9", ready=ready)
    refresh_pools([chat.pool_id])  # as the autoscaler's pass and the pod sync do after their writes
    (row,) = operator_client.get("/api/v1/capacity/").json()
    assert row["pool"] == "use1-h100" and row["gpu_type"] == "h100-80gb"
    # chat commits max(2 GPUs sold, 1 min replica), big max(4 sold, 1 replica of 4 GPUs).
    assert (row["have_gpus"], row["committed_gpus"], row["sold_gpus"], row["headroom_gpus"]) == (8, 6, 6, 2)
    assert row["used_gpus"] == 2 * 1 + 1 * 4
    assert (row["committed_mu_per_minute"], row["sold_mu_per_minute"], row["used_mu_per_minute"]) == (
        300,
        300,
        150,
    )
    # The mean of what each model alone fills the pool with (800, 200) and still has room for (200, 0).
    assert (row["have_mu_per_minute"], row["headroom_mu_per_minute"]) == (500, 100)
    assert row["oversold"] is False
    models = {m["model"]: m for m in row["models"]}
    # In whole replicas: the 2 free GPUs hold two more 8B replicas and no 4-GPU 70B one.
    assert (models["llama-8b"]["more_replicas"], models["llama-8b"]["headroom_mu_per_minute"]) == (2, 200)
    assert (models["llama-70b"]["more_replicas"], models["llama-70b"]["headroom_mu_per_minute"]) == (0, 0)
    detail = operator_client.get(f"/api/v1/capacity/{row['id']}/").json()
    assert detail == row
    assert operator_client.get("/api/v1/capacity/?gpu_type=l40s-48gb").json() == []


def test_shrinking_a_pool_below_what_is_sold_is_refused(operator_client, owner, make_endpoint, pool):
    chat = make_endpoint(owner, "chat")
    sell(chat, mu_per_minute=600, best_effort_allowed=True, sold_by="t")
    # (5 GPUs are whole nodes of 1 GPU; 5 of 8-GPU nodes would be refused with a 400 first)
    refused = operator_client.patch(
        f"/api/v1/pools/{pool.pk}/", {"gpu_count": 5, "gpus_per_node": 1}, format="json"
    )
    assert refused.status_code == 409
    assert refused.json()["have_gpus"] == 5 and refused.json()["sold_gpus"] == 6
    pool.refresh_from_db()
    assert pool.gpu_count == 8
    assert (
        operator_client.patch(
            f"/api/v1/pools/{pool.pk}/", {"gpu_count": 6, "gpus_per_node": 1}, format="json"
        ).status_code
        == 200
    )


def test_repricing_a_profile_that_would_oversell_is_refused(
    operator_client, owner, make_endpoint, small_model
):
    chat = make_endpoint(owner, "chat")
    sell(chat, mu_per_minute=600, best_effort_allowed=True, sold_by="t")
    # 2 GPUs per replica would make 600 MU/min take 12 of 8 GPUs.
    refused = operator_client.patch(
        f"/api/v1/model-profiles/{small_model.pk}/", {"gpus_per_replica": 2}, format="json"
    )
    assert refused.status_code == 409 and refused.json()["sold_gpus"] == 12
    small_model.refresh_from_db()
    assert small_model.gpus_per_replica == 1


def test_switching_a_reserved_endpoint_to_a_bigger_model_is_refused(
    owner_client, owner, make_endpoint, big_model
):
    chat = make_endpoint(owner, "chat")
    sell(chat, mu_per_minute=300, best_effort_allowed=True, sold_by="t")  # 3 GPUs; 70B needs 12
    refused = owner_client.patch(f"/api/v1/endpoints/{chat.pk}/", {"model": "llama-70b"}, format="json")
    assert refused.status_code == 409
    assert refused.json()["asked_gpus"] == 12
    chat.refresh_from_db()
    assert chat.profile.model == "llama-8b"


def test_moving_a_reserved_endpoint_needs_room_in_the_new_pool(
    owner_client, operator_client, owner, make_endpoint, h100
):
    GpuPool.objects.create(name="tiny", gpu_type=h100, region="r", gpu_count=2)
    chat = make_endpoint(owner, "chat")
    sell(chat, mu_per_minute=300, best_effort_allowed=True, sold_by="t")
    # Only an operator moves a reserved endpoint (tests/api/test_region_moves.py), and only where it packs.
    refused = operator_client.patch(f"/api/v1/endpoints/{chat.pk}/", {"pool": "tiny"}, format="json")
    assert refused.status_code == 409 and refused.json()["pool"] == "tiny"
    protected = owner_client.patch(f"/api/v1/endpoints/{chat.pk}/", {"pool": "tiny"}, format="json")
    assert protected.status_code == 409 and protected.json()["error"] == "protected"
    assert list(protected.json()["fields"]) == ["pool"]


def test_deleting_what_is_in_use_is_a_409(operator_client, owner, make_endpoint, pool, small_model, h100):
    make_endpoint(owner, "chat")
    for url in [
        f"/api/v1/pools/{pool.pk}/",
        f"/api/v1/model-profiles/{small_model.pk}/",
        f"/api/v1/gpu-types/{h100.pk}/",
        f"/api/v1/tenants/{owner.pk}/",
    ]:
        response = operator_client.delete(url)
        assert response.status_code == 409, url
        assert response.json()["error"] == "protected"
    assert GpuPool.objects.filter(pk=pool.pk).exists()


def test_operators_manage_the_fleet(operator_client):
    assert (
        operator_client.post(
            "/api/v1/gpu-types/",
            {"name": "a100-80gb", "memory_gib": 80, "hourly_cost_usd": "1.80"},
            format="json",
        ).status_code
        == 201
    )
    pool = operator_client.post(
        "/api/v1/pools/",
        {"name": "euw-a100", "gpu_type": "a100-80gb", "region": "eu-west-1", "gpu_count": 16},
        format="json",
    )
    assert pool.status_code == 201, pool.content
    profile = operator_client.post(
        "/api/v1/model-profiles/",
        {"model": "qwen-7b", "gpu_type": "a100-80gb", "alpha": 0.001, "beta": 0.01, "gamma": 0.05},
        format="json",
    )
    assert profile.status_code == 201 and profile.json()["mu_per_replica_minute"] == 100
    dup = operator_client.post(
        "/api/v1/model-profiles/",
        {"model": "qwen-7b", "gpu_type": "a100-80gb", "alpha": 0, "beta": 0, "gamma": 0},
        format="json",
    )
    assert dup.status_code == 400 and "already exists" in dup.json()["detail"]
    negative = operator_client.post(
        "/api/v1/model-profiles/",
        {"model": "x", "gpu_type": "a100-80gb", "alpha": -1, "beta": 0, "gamma": 0},
        format="json",
    )
    assert negative.status_code == 400 and negative.json()["fields"]["alpha"]["value"] == -1
    unknown = operator_client.post(
        "/api/v1/pools/", {"name": "p", "gpu_type": "nope", "region": "r", "gpu_count": 1}, format="json"
    )
    assert unknown.status_code == 400 and unknown.json()["fields"]["gpu_type"]["value"] == "nope"
