"""Endpoint CRUD and its validation: clear errors naming field and value, nothing half-written."""

import pytest

from controlplane.endpoints.models import Endpoint
from tests.conftest import endpoint_body


def test_create_read_update_delete(owner_client, pool, small_model):
    created = owner_client.post("/api/v1/endpoints/", endpoint_body(), format="json")
    assert created.status_code == 201, created.content
    body = created.json()
    assert body["tenant"] == "owner"
    assert body["pool"] == "use1-h100"  # the only H100 pool, chosen for us
    assert body["target_concurrency_per_replica"] == 8
    # min 8 at 8 per replica -> 1 replica; max 64 -> 8 replicas.
    assert (body["min_replicas"], body["max_replicas"], body["desired_replicas"]) == (1, 8, 1)
    assert body["state"] == "pending" and body["reserved_mu_per_minute"] == 0

    url = f"/api/v1/endpoints/{body['id']}/"
    assert owner_client.get(url).json()["name"] == "chat"
    patched = owner_client.patch(url, {"max_provisioned_concurrency": 128}, format="json")
    assert patched.status_code == 200 and patched.json()["max_replicas"] == 16
    assert owner_client.delete(url).status_code == 204
    assert owner_client.get(url).status_code == 404


def test_read_only_fields_are_not_writable(owner_client, make_endpoint, owner):
    endpoint = make_endpoint(owner, "chat")
    answer = owner_client.patch(
        f"/api/v1/endpoints/{endpoint.pk}/", {"ready_replicas": 9, "state": "ready"}, format="json"
    )
    assert answer.status_code == 400 and set(answer.json()["fields"]) == {"ready_replicas", "state"}
    endpoint.refresh_from_db()
    assert (endpoint.ready_replicas, endpoint.state) == (0, "pending")


@pytest.mark.parametrize(
    ("overrides", "field", "message"),
    [
        (
            {"min_provisioned_concurrency": 10, "max_provisioned_concurrency": 4},
            "min_provisioned_concurrency",
            "min_provisioned_concurrency (10) must not exceed max_provisioned_concurrency (4)",
        ),
        ({"min_provisioned_concurrency": -1}, "min_provisioned_concurrency", "greater than or equal to 0"),
        ({"max_provisioned_concurrency": 0}, "max_provisioned_concurrency", "greater than or equal to 1"),
        (
            {"target_concurrency_per_replica": 0},
            "target_concurrency_per_replica",
            "greater than or equal to 1",
        ),
        ({"gpu_type": "tpu-v5"}, "gpu_type", "unknown GPU type 'tpu-v5' (known: h100-80gb)"),
        ({"model": "gpt-9"}, "model", "no model profile for 'gpt-9' on h100-80gb (profiled there: llama-8b)"),
        ({"name": "Bad Name!"}, "name", "lowercase letters"),
        ({"name": ""}, "name", "may not be blank"),
        ({"scale_to_zero_enabled": "perhaps"}, "scale_to_zero_enabled", "valid boolean"),
    ],
)
def test_bad_input_names_the_field_and_value(owner_client, pool, small_model, overrides, field, message):
    response = owner_client.post("/api/v1/endpoints/", endpoint_body(**overrides), format="json")
    assert response.status_code == 400, response.content
    error = response.json()
    assert error["error"] == "invalid"
    assert field in error["fields"]
    assert message in " ".join(error["fields"][field]["errors"])
    if field in overrides:
        assert error["fields"][field]["value"] == overrides[field]
    assert not Endpoint.objects.exists()


def test_missing_fields_are_named(owner_client, pool, small_model):
    response = owner_client.post("/api/v1/endpoints/", {"name": "x"}, format="json")
    assert response.status_code == 400
    assert {"model", "gpu_type", "min_provisioned_concurrency", "max_provisioned_concurrency"} <= set(
        response.json()["fields"]
    )


def test_a_duplicate_name_in_one_tenant_is_refused_but_another_tenant_may_reuse_it(
    owner_client, other_client, pool, small_model
):
    assert owner_client.post("/api/v1/endpoints/", endpoint_body(), format="json").status_code == 201
    again = owner_client.post("/api/v1/endpoints/", endpoint_body(), format="json")
    assert again.status_code == 400
    assert "tenant 'owner' already has an endpoint named 'chat'" in again.json()["detail"]
    assert other_client.post("/api/v1/endpoints/", endpoint_body(), format="json").status_code == 201
    assert Endpoint.objects.count() == 2


def test_a_pool_of_another_gpu_type_is_refused(owner_client, pool, small_model, l40s):
    from controlplane.capacity.models import GpuPool

    GpuPool.objects.create(name="l40s-pool", gpu_type=l40s, region="r", gpu_count=4)
    response = owner_client.post("/api/v1/endpoints/", endpoint_body(pool="l40s-pool"), format="json")
    assert response.status_code == 400
    assert "holds l40s-48gb GPUs, not h100-80gb" in response.json()["fields"]["pool"]["errors"][0]


def test_no_pool_of_the_gpu_type_is_a_clear_error(owner_client, small_model):
    response = owner_client.post("/api/v1/endpoints/", endpoint_body(), format="json")
    assert response.status_code == 400
    assert response.json()["fields"]["gpu_type"]["errors"] == ["no GPU pool holds h100-80gb GPUs"]


def test_the_roomiest_pool_is_chosen(owner_client, h100, small_model, owner):
    from controlplane.capacity.models import GpuPool
    from controlplane.selling import save_endpoint, sell

    busy = GpuPool.objects.create(name="a-busy", gpu_type=h100, region="r", gpu_count=8)
    GpuPool.objects.create(name="b-free", gpu_type=h100, region="r", gpu_count=4)
    filler = Endpoint(
        tenant=owner,
        name="filler",
        profile=small_model,
        pool=busy,
        max_provisioned_concurrency=8,
        target_concurrency_per_replica=8,
    )
    save_endpoint(filler)
    sell(filler, mu_per_minute=600, best_effort_allowed=True, sold_by="t")  # busy: 2 GPUs free
    response = owner_client.post("/api/v1/endpoints/", endpoint_body(), format="json")
    assert response.json()["pool"] == "b-free"  # 4 free beats 2 free


def test_malformed_json_and_wrong_content_type(owner_client, pool, small_model):
    broken = owner_client.post("/api/v1/endpoints/", '{"name": "x",', content_type="application/json")
    assert broken.status_code == 400
    assert broken.json()["error"] == "parse_error" and "JSON parse error" in broken.json()["detail"]
    form = owner_client.post("/api/v1/endpoints/", "name=x", content_type="application/x-www-form-urlencoded")
    assert form.status_code == 415
    assert form.json()["error"] == "unsupported_media_type"
    assert not Endpoint.objects.exists()


def test_a_tenant_cannot_create_for_another_tenant(owner_client, other, pool, small_model):
    response = owner_client.post("/api/v1/endpoints/", endpoint_body(tenant="other"), format="json")
    assert response.status_code == 400
    assert response.json()["fields"]["tenant"]["value"] == "other"
    assert not Endpoint.objects.exists()


def test_operators_create_for_a_named_tenant(operator_client, owner, pool, small_model):
    missing = operator_client.post("/api/v1/endpoints/", endpoint_body(), format="json")
    assert missing.status_code == 400
    assert "operators must name the tenant" in missing.json()["detail"]
    made = operator_client.post("/api/v1/endpoints/", endpoint_body(tenant="owner"), format="json")
    assert made.status_code == 201 and made.json()["tenant"] == "owner"
    unknown = operator_client.post(
        "/api/v1/endpoints/", endpoint_body(tenant="ghost", name="b"), format="json"
    )
    assert unknown.status_code == 400 and unknown.json()["fields"]["tenant"]["value"] == "ghost"


def test_an_endpoint_cannot_change_tenant(operator_client, owner, other, make_endpoint):
    endpoint = make_endpoint(owner, "chat")
    response = operator_client.patch(f"/api/v1/endpoints/{endpoint.pk}/", {"tenant": "other"}, format="json")
    assert response.status_code == 400
    endpoint.refresh_from_db()
    assert endpoint.tenant == owner


def test_filters_by_model_gpu_state_and_search(operator_client, owner, other, make_endpoint, big_model):
    make_endpoint(owner, "chat")
    make_endpoint(owner, "big-chat", profile=big_model)
    make_endpoint(other, "search", state="ready")

    def names(query):
        response = operator_client.get(f"/api/v1/endpoints/?{query}")
        assert response.status_code == 200, response.content
        return sorted(e["name"] for e in response.json()["results"])

    assert names("model=llama-70b") == ["big-chat"]
    assert names("gpu_type=h100-80gb") == ["big-chat", "chat", "search"]
    assert names("gpu_type=l40s-48gb") == []
    assert names("state=ready") == ["search"]
    assert names("tenant=owner&search=big") == ["big-chat"]
    bad = operator_client.get("/api/v1/endpoints/?state=exploded")
    assert bad.status_code == 400 and "state" in bad.json()["fields"]


def test_numbered_pages_keep_their_order_and_count_without_gaps_or_repeats(
    operator_client, owner, make_endpoint
):
    for i in range(7):
        make_endpoint(owner, f"e{i}")
    seen, url = [], "/api/v1/endpoints/?page=1&page_size=3"  # as clients before cursors asked
    while url:
        page = operator_client.get(url).json()
        assert page["count"] == 7
        seen += [e["name"] for e in page["results"]]
        url = page["next"]
        assert url is None or "page=" in url
    assert seen == [f"e{i}" for i in reversed(range(7))]  # newest first


def test_a_listed_endpoint_reads_as_its_own_answer_and_as_its_declared_fields(
    operator_client, owner_client, owner, other, make_endpoint, h100
):
    """A list reads its page as plain rows (no model instance), an endpoint's own answer its
    instance: every endpoint of a varied fleet (reserved, a canary in progress, scale to zero
    with autoscaler settings, another tenant's) reads the same in each list (cursor, ?page=N,
    a tenant's), in its own answer, and as DRF makes it from the declared fields, so the schema
    says what is sent."""
    import json

    from rest_framework import serializers as drf
    from rest_framework.renderers import JSONRenderer

    from controlplane.api.serializers import EndpointSerializer
    from controlplane.capacity.models import ModelProfile
    from controlplane.endpoints.models import Rollout
    from controlplane.selling import sell
    from controlplane.tenants.models import Principal

    plain = make_endpoint(owner, "plain", used_mu_per_minute=12.5)
    renamed = owner_client.patch(f"/api/v1/endpoints/{plain.pk}/", {"name": "renamed"}, format="json")
    assert renamed.status_code == 200, renamed.content
    sell(make_endpoint(owner, "reserved"), mu_per_minute=30, best_effort_allowed=True, sold_by="t")
    make_endpoint(owner, "sleepy", scale_to_zero_enabled=True, autoscaler={"target_utilisation": 0.6})
    canary = make_endpoint(owner, "canary", min_provisioned_concurrency=16, max_provisioned_concurrency=16)
    ModelProfile.objects.create(model="llama-8b-v2", gpu_type=h100, alpha=0.0004, beta=0.004, gamma=0.02)
    rolled = owner_client.patch(
        f"/api/v1/endpoints/{canary.pk}/", {"model": "llama-8b-v2", "canary_percent": 50}, format="json"
    )
    assert rolled.status_code == 200, rolled.content
    Rollout.objects.filter(endpoint=canary).update(phase="canary")  # its new pods ready: held until promoted
    make_endpoint(other, "theirs")

    operator_list = operator_client.get("/api/v1/endpoints/").json()["results"]
    assert operator_list == operator_client.get("/api/v1/endpoints/", {"page": 1}).json()["results"]
    assert [e["name"] for e in operator_list] == ["theirs", "canary", "sleepy", "reserved", "renamed"]
    owner_list = owner_client.get("/api/v1/endpoints/").json()["results"]
    assert owner_list == operator_list[1:]
    declared = EndpointSerializer(context={"principal": Principal(tenant=None, is_operator=True, name="t")})
    for listed in operator_list:  # as JSON text: == on dicts would pass 1 for True, keys out of order
        own = operator_client.get(f"/api/v1/endpoints/{listed['id']}/").json()
        instance = Endpoint.objects.with_related().get(pk=listed["id"])
        by_fields = json.loads(
            JSONRenderer().render(drf.ModelSerializer.to_representation(declared, instance))
        )
        assert json.dumps(listed) == json.dumps(own) == json.dumps(by_fields), listed["name"]
    theirs, canary_row, sleepy, reserved, renamed_row = operator_list
    assert canary_row["rollout"]["replicas"] == {"1": 1, "2": 1}
    assert canary_row["rollout"]["phase"] == "canary" and canary_row["rollout"]["hold_until"]
    assert sleepy["autoscaler"] == {"target_utilisation": 0.6} and sleepy["min_replicas"] == 0
    assert reserved["reserved_mu_per_minute"] == 30 and theirs["tenant"] == "other"
    assert (renamed_row["served_model_name"], renamed_row["used_mu_per_minute"]) == ("plain", 12.5)
