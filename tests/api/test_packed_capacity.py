"""Whole replicas on node shapes, through the API on PostgreSQL: the issue's Contract numbers,
pool shapes, minimum raises, regions, and the node grid, each figure the same in /capacity/,
the console and the 409."""

import pytest

from controlplane.capacity.models import GpuPool, ModelProfile, ProvisionedAllowance
from controlplane.endpoints.models import Endpoint
from tests.conftest import endpoint_body


@pytest.fixture
def five_gpu(operator_client, h100, owner):
    """The Contract's fleet: a pool of 16 GPUs at 8 per node, a model of 5 GPUs and 100 MU/min
    per replica, both made through the API."""
    pool = operator_client.post(
        "/api/v1/pools/",
        {
            "name": "use1-16",
            "gpu_type": h100.name,
            "region": "us-east-1",
            "gpu_count": 16,
            "gpus_per_node": 8,
        },
        format="json",
    )
    assert pool.status_code == 201, pool.content
    assert (pool.json()["gpus_per_node"], pool.json()["node_count"]) == (8, 2)
    profile = operator_client.post(
        "/api/v1/model-profiles/",
        {
            "model": "tp5",
            "gpu_type": h100.name,
            "alpha": 0.001,
            "beta": 0.01,
            "gamma": 0.1,
            "mu_per_replica_minute": 100,
            "gpus_per_replica": 5,
        },
        format="json",
    )
    assert profile.status_code == 201, profile.content
    # The Contract's fields, taken and returned (on write and on read).
    assert (profile.json()["gpus_per_replica"], profile.json()["mu_per_replica_minute"]) == (5, 100)
    (listed,) = [
        p for p in operator_client.get("/api/v1/model-profiles/").json()["results"] if p["model"] == "tp5"
    ]
    assert (listed["gpus_per_replica"], listed["mu_per_replica_minute"]) == (5, 100)
    (listed,) = [p for p in operator_client.get("/api/v1/pools/").json()["results"] if p["name"] == "use1-16"]
    assert listed["gpus_per_node"] == 8
    # The owner may commit minimum replicas beyond its reservations in all of it (the default
    # allowance is one node): these tests are about what packs.
    allowance = {"tenant": owner.name, "pool": "use1-16", "gpus": 16}
    assert operator_client.post("/api/v1/allowances/", allowance, format="json").status_code == 201
    return GpuPool.objects.get(name="use1-16")


def new_endpoint(client, name, **fields):
    body = endpoint_body(
        name=name, model="tp5", min_provisioned_concurrency=0, max_provisioned_concurrency=8,
        scale_to_zero_enabled=True, **fields,
    )  # fmt: skip
    response = client.post("/api/v1/endpoints/", body, format="json")
    assert response.status_code == 201, response.content
    return response.json()


def sell(client, endpoint_id, mu_per_minute):
    return client.post(
        "/api/v1/reservations/", {"endpoint": endpoint_id, "mu_per_minute": mu_per_minute}, format="json"
    )


def capacity_of(client, pool):
    """The pool's row with its nodes (read live), whose figures are those /capacity/ lists (stored)."""
    listed = next(row for row in client.get("/api/v1/capacity/").json() if row["pool"] == pool)
    row = client.get(f"/api/v1/capacity/{listed['id']}/", {"nodes": "true"}).json()
    assert {k: v for k, v in row.items() if k != "nodes"} == listed
    return row


def test_contract_200_packs_and_300_does_not(five_gpu, operator_client, owner_client):
    chat = new_endpoint(owner_client, "chat")
    assert sell(operator_client, chat["id"], 200).status_code == 201  # 2 replicas, one per node
    refused = operator_client.patch(
        f"/api/v1/reservations/{_reservation_id(chat)}/", {"mu_per_minute": 300}, format="json"
    )
    assert refused.status_code == 409, refused.content
    body = refused.json()
    # Three 5-GPU replicas are 15 of 16 GPUs, but two 8-GPU nodes hold two.
    assert (body["error"], body["pool"], body["asked_replicas"], body["asked_gpus_per_replica"]) == (
        "oversold",
        "use1-16",
        3,
        5,
    )
    assert (body["fit_replicas"], body["replacing_replicas"], body["node_count"], body["gpus_per_node"]) == (
        2,
        2,
        2,
        8,
    )
    assert "It has 16 GPUs (2 nodes x 8 GPUs)" in body["detail"]
    assert (
        "This needs 3 replicas of 5 GPUs (15 GPUs, 300 MU/min), where the endpoint commits 2"
        in body["detail"]
    )
    assert body["detail"].endswith("; at most 2 fit")
    # One number per thing: the 409's pool figures are /capacity/'s.
    shown = capacity_of(operator_client, "use1-16")
    figures = ["have_gpus", "committed_replicas", "committed_gpus", "sold_replicas", "sold_gpus", "free_gpus",
               "stranded_gpus", "headroom_gpus", "sold_mu_per_minute"]  # fmt: skip
    for figure in figures:
        assert body[figure] == shown[figure], figure
    assert (shown["sold_replicas"], shown["free_gpus"], shown["stranded_gpus"]) == (2, 6, 6)
    # A fresh sale of 300 is refused the same way.
    other = new_endpoint(owner_client, "other")
    fresh = sell(operator_client, other["id"], 300)
    assert fresh.status_code == 409 and (fresh.json()["asked_replicas"], fresh.json()["fit_replicas"]) == (
        3,
        0,
    )


def _reservation_id(endpoint):
    from controlplane.capacity.models import Reservation

    return Reservation.objects.get(endpoint_id=endpoint["id"]).pk


def test_contract_300_on_one_endpoint_is_409_at_once(five_gpu, operator_client, owner_client):
    chat = new_endpoint(owner_client, "chat")
    refused = sell(operator_client, chat["id"], 300)
    assert refused.status_code == 409
    assert (refused.json()["asked_replicas"], refused.json()["fit_replicas"]) == (3, 2)


def test_contract_two_endpoints_of_50_sell_two_replicas(five_gpu, operator_client, owner_client):
    for name in ("a", "b"):
        assert sell(operator_client, new_endpoint(owner_client, name)["id"], 50).status_code == 201
    row = capacity_of(operator_client, "use1-16")
    assert (row["sold_replicas"], row["sold_gpus"], row["sold_mu_per_minute"]) == (2, 10, 100)
    assert (row["committed_replicas"], row["committed_gpus"]) == (2, 10)
    # The pool is full for this model: one replica per node, 3 GPUs stranded on each.
    (model,) = row["models"]
    assert (model["model"], model["more_replicas"], model["have_replicas"]) == ("tp5", 0, 2)
    assert [sorted(r["endpoint"] for r in node["replicas"]) for node in row["nodes"]] == [
        ["owner/a"],
        ["owner/b"],
    ]
    assert [node["free_gpus"] for node in row["nodes"]] == [3, 3]


def test_a_minimum_raise_that_does_not_pack_is_409_naming_pool_and_replicas(five_gpu, owner_client):
    chat = new_endpoint(owner_client, "chat", target_concurrency_per_replica=8)
    url = f"/api/v1/endpoints/{chat['id']}/"
    assert (
        owner_client.patch(
            url, {"min_provisioned_concurrency": 16, "max_provisioned_concurrency": 64}, format="json"
        ).status_code
        == 200
    )  # 2
    refused = owner_client.patch(url, {"min_provisioned_concurrency": 17}, format="json")  # 3 replicas
    assert refused.status_code == 409
    body = refused.json()
    assert (body["pool"], body["asked_replicas"], body["replacing_replicas"], body["fit_replicas"]) == (
        "use1-16",
        3,
        2,
        2,
    )
    assert Endpoint.objects.get(pk=chat["id"]).min_provisioned_concurrency == 16


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"gpu_count": 12, "gpus_per_node": 8}, "gpus_per_node"),  # 1.5 nodes
        ({"gpu_count": 16, "gpus_per_node": 0}, "gpus_per_node"),
        ({"gpu_count": 16, "gpus_per_node": -8}, "gpus_per_node"),
        ({"gpu_count": 16, "gpus_per_node": 10**9}, "gpus_per_node"),
        ({"gpu_count": 16, "gpus_per_node": "eight"}, "gpus_per_node"),
        ({"gpu_count": 16, "gpus_per_node": 8.5}, "gpus_per_node"),
        ({"gpu_count": 16, "gpus_per_node": None}, "gpus_per_node"),
        ({"gpu_count": 16, "cpu_millicores_per_node": -1}, "cpu_millicores_per_node"),
        ({"gpu_count": 10**9, "gpus_per_node": 1}, "gpu_count"),  # a billion nodes
    ],
)
def test_pool_shapes_are_validated_naming_the_field(operator_client, h100, body, field):
    response = operator_client.post(
        "/api/v1/pools/", {"name": "p", "gpu_type": h100.name, "region": "r", **body}, format="json"
    )
    assert response.status_code == 400, response.content
    assert field in response.json()["fields"]
    assert not GpuPool.objects.exists()


def test_a_pool_without_a_shape_gets_the_largest_node_of_at_most_8_that_divides_it(operator_client, h100):
    made = operator_client.post(
        "/api/v1/pools/", {"name": "p", "gpu_type": h100.name, "region": "r", "gpu_count": 12}, format="json"
    )
    assert made.status_code == 201 and (made.json()["gpus_per_node"], made.json()["node_count"]) == (6, 2)
    # A count that is not whole nodes of the current shape is refused, naming gpu_count.
    url = f"/api/v1/pools/{made.json()['id']}/"
    odd = operator_client.patch(url, {"gpu_count": 14}, format="json")
    assert odd.status_code == 400 and "gpu_count" in odd.json()["fields"]
    assert operator_client.patch(url, {"gpu_count": 18}, format="json").json()["node_count"] == 3


def test_a_shape_that_strands_a_committed_replica_is_refused(five_gpu, operator_client, owner_client):
    sell(operator_client, new_endpoint(owner_client, "chat")["id"], 100)
    url = f"/api/v1/pools/{five_gpu.pk}/"
    refused = operator_client.patch(url, {"gpus_per_node": 4}, format="json")  # 4 nodes x 4: no 5-GPU room
    assert refused.status_code == 409 and refused.json()["unplaced_replicas"] == 1
    assert "It has 16 GPUs (4 nodes x 4 GPUs)" in refused.json()["detail"]
    assert refused.json()["detail"].endswith("It cannot place 1 replica of the 1 committed")
    five_gpu.refresh_from_db()
    assert five_gpu.gpus_per_node == 8


@pytest.fixture
def regions(h100, big_model):
    """us-east-1: a full-ish pool and a roomier one; eu-west-1: one pool; 4-GPU model."""
    for name, region, count in [
        ("east-a", "us-east-1", 8),
        ("east-b", "us-east-1", 16),
        ("west", "eu-west-1", 8),
    ]:
        GpuPool.objects.create(name=name, gpu_type=h100, region=region, gpu_count=count, gpus_per_node=8)
    return big_model


def big_body(name, **fields):
    return endpoint_body(
        name=name,
        model="llama-70b",
        min_provisioned_concurrency=8,
        max_provisioned_concurrency=8,
        target_concurrency_per_replica=8,
        **fields,
    )


def test_a_region_preference_picks_the_roomiest_pool_there(regions, owner_client):
    made = owner_client.post(
        "/api/v1/endpoints/", big_body("a", region_preference="us-east-1"), format="json"
    )
    assert made.status_code == 201, made.content
    assert (made.json()["pool"], made.json()["region_preference"]) == ("east-b", "us-east-1")  # 4 fit vs 2
    west = owner_client.post(
        "/api/v1/endpoints/", big_body("b", region_preference="eu-west-1"), format="json"
    )
    assert west.json()["pool"] == "west"


def fill_west(client, **fields):
    """eu-west-1 holds two 4-GPU replicas; a third endpoint there does not fit."""
    for name in ("a", "b"):
        made = client.post(
            "/api/v1/endpoints/", big_body(name, region_preference="eu-west-1", **fields), format="json"
        )
        assert made.status_code == 201, made.content


def test_a_region_without_room_is_409_saying_what_exists_elsewhere(regions, operator_client, owner):
    # An operator's view: every pool of the GPU type and what fits in it.
    fill_west(operator_client, tenant=owner.name)
    refused = operator_client.post(
        "/api/v1/endpoints/", big_body("c", region_preference="eu-west-1", tenant=owner.name), format="json"
    )
    assert refused.status_code == 409, refused.content
    body = refused.json()
    assert (body["error"], body["region"], body["asked_replicas"], body["gpus_per_replica"]) == (
        "no_placement",
        "eu-west-1",
        1,
        4,
    )
    assert {p["pool"]: (p["region"], p["fit_replicas"]) for p in body["pools"]} == {
        "east-a": ("us-east-1", 2),
        "east-b": ("us-east-1", 4),
        "west": ("eu-west-1", 0),
    }
    assert (body["pool"], body["fit_replicas"], body["regions_that_fit"]) == ("west", 0, ["us-east-1"])
    assert "east-b in us-east-1 (4)" in body["detail"]
    nowhere = operator_client.post(
        "/api/v1/endpoints/", big_body("d", region_preference="ap-south-1", tenant=owner.name), format="json"
    )
    assert nowhere.status_code == 409 and "no h100-80gb pool is in ap-south-1" in nowhere.json()["detail"]
    assert Endpoint.objects.count() == 2


def test_a_tenants_no_placement_names_its_region_and_where_it_fits_not_other_pools(regions, owner_client):
    # A tenant's view: its region's pool, the replicas asked, what fits there and the regions
    # where they would fit; not other pools' names or free capacity.
    fill_west(owner_client)
    refused = owner_client.post(
        "/api/v1/endpoints/", big_body("c", region_preference="eu-west-1"), format="json"
    )
    assert refused.status_code == 409, refused.content
    body = refused.json()
    assert body == {
        "error": "no_placement",
        "detail": (
            "no h100-80gb pool in region 'eu-west-1' places 1 replica(s) of llama-70b (4 GPUs each):"
            " 0 fit in pool west; they would fit in region(s) us-east-1"
        ),
        "region": "eu-west-1",
        "model": "llama-70b",
        "gpu_type": "h100-80gb",
        "asked_replicas": 1,
        "gpus_per_replica": 4,
        "pool": "west",
        "fit_replicas": 0,
        "regions_that_fit": ["us-east-1"],
    }
    nowhere = owner_client.post(
        "/api/v1/endpoints/", big_body("d", region_preference="ap-south-1"), format="json"
    ).json()
    assert (nowhere["pool"], nowhere["fit_replicas"], nowhere["regions_that_fit"]) == (None, 0, ["us-east-1"])
    assert nowhere["detail"].endswith(
        ": no h100-80gb pool is in ap-south-1; they would fit in region(s) us-east-1"
    )
    for seen in (body, nowhere):
        assert "east-a" not in str(seen) and "east-b" not in str(seen) and "pools" not in seen
    assert Endpoint.objects.count() == 2


@pytest.mark.parametrize(
    "region",
    [
        "US-EAST-1",
        "us east 1",
        "../etc",
        "<script>alert(1)</script>",
        "-east",
        "a" * 64,
        "us-east-1\n",
        " us-east-1",
        "é",
        [],
        {},
    ],
)
def test_hostile_region_preferences_are_400_naming_the_field(regions, owner_client, region):
    refused = owner_client.post("/api/v1/endpoints/", big_body("a", region_preference=region), format="json")
    assert refused.status_code == 400, refused.content
    assert "region_preference" in refused.json()["fields"]
    assert not Endpoint.objects.exists()


def test_a_named_pool_outside_the_preferred_region_is_400(regions, owner_client):
    refused = owner_client.post(
        "/api/v1/endpoints/", big_body("a", pool="west", region_preference="us-east-1"), format="json"
    )
    assert refused.status_code == 400 and "pool" in refused.json()["fields"]


def test_setting_a_region_later_moves_the_endpoint_there(regions, owner_client):
    made = owner_client.post("/api/v1/endpoints/", big_body("a", pool="west"), format="json").json()
    moved = owner_client.patch(
        f"/api/v1/endpoints/{made['id']}/", {"region_preference": "us-east-1"}, format="json"
    )
    assert moved.status_code == 200 and moved.json()["pool"] == "east-b"


def test_the_console_shows_the_node_grid_stranded_gpus_and_what_still_fits(operator_client, h100, owner):
    """2 nodes x 8: two 5-GPU replicas and a 2-GPU one pack as [5+2, 5], leaving 1 and 3 GPUs
    free: 2 of them stranded (no mix of 2s and 5s fills 1 or 3), one more 2-GPU replica fits and
    no 5-GPU one, even after moves (4 free GPUs)."""
    from controlplane.selling import save_endpoint
    from tests.console.conftest import member_client

    pool = GpuPool.objects.create(name="frag", gpu_type=h100, region="r", gpu_count=16, gpus_per_node=8)
    profiles = {
        g: ModelProfile.objects.create(
            model=f"tp{g}", gpu_type=h100, alpha=0, beta=0, gamma=1, gpus_per_replica=g
        )
        for g in (2, 5)
    }
    ProvisionedAllowance.objects.create(tenant=owner, pool=pool, gpus=16)  # beyond the default node
    for name, g in [("e5a", 5), ("e5b", 5), ("e2", 2)]:
        save_endpoint(
            Endpoint(tenant=owner, name=name, profile=profiles[g], pool=pool, min_provisioned_concurrency=8,
                     max_provisioned_concurrency=8, target_concurrency_per_replica=8)
        )  # fmt: skip
    row = capacity_of(operator_client, "frag")
    assert [node["free_gpus"] for node in row["nodes"]] == [1, 3]
    assert [sorted(r["endpoint"] for r in node["replicas"]) for node in row["nodes"]] == [
        ["owner/e2", "owner/e5a"],
        ["owner/e5b"],
    ]
    assert (row["free_gpus"], row["stranded_gpus"], row["headroom_gpus"]) == (4, 2, 2)
    assert {m["model"]: m["more_replicas"] for m in row["models"]} == {"tp2": 1, "tp5": 0}
    console = member_client("opal", operator=True)
    page = console.get("/console/capacity/").content.decode()  # the pool's grid opens from it
    assert f'hx-get="/console/capacity/pools/{pool.pk}/nodes/"' in page
    grid = console.get(f"/console/capacity/pools/{pool.pk}/nodes/", HTTP_HX_REQUEST="true").content.decode()
    assert '<div class="node-grid" data-pool="frag">' in grid
    assert '<span class="stranded">2</span> stranded' in grid and 'title="owner/e5a · tp5"' in grid
    assert '<tr data-model="tp5">' in grid and "no room, even after moves" in grid
    assert "fits as placed" in grid
