"""Strict input: a write naming a field the API does not take (unknown, or read-only) is a 400
naming it, with the value sent, and changes nothing."""

import pytest

from controlplane.api.serializers import StrictInput
from controlplane.api.urls import router
from controlplane.api.views import RolloutCommand
from controlplane.capacity.models import GpuPool, GpuType, ModelProfile, Reservation
from controlplane.endpoints.models import Endpoint, Pod
from controlplane.oncall.models import Event
from controlplane.selling import sell
from controlplane.tenants.models import ApiKey, Tenant
from tests.conftest import endpoint_body


def refused(answer) -> dict:
    assert answer.status_code == 400, answer.content
    body = answer.json()
    assert body["error"] == "invalid", body
    return body["fields"]


def test_an_unknown_field_in_a_create_is_a_400_and_nothing_is_made(owner_client, pool, small_model):
    answer = owner_client.post("/api/v1/endpoints/", endpoint_body(colour="red"), format="json")
    assert refused(answer) == {"colour": {"errors": ["unknown field"], "value": "red"}}
    assert not Endpoint.objects.exists()


def test_a_typo_is_named_beside_the_field_it_left_out(owner_client, pool, small_model):
    body = endpoint_body()
    body["max_provisioned_concurency"] = body.pop("max_provisioned_concurrency")
    fields = refused(owner_client.post("/api/v1/endpoints/", body, format="json"))
    assert fields["max_provisioned_concurency"] == {
        "errors": ["unknown field; did you mean 'max_provisioned_concurrency'?"],
        "value": 64,
    }
    assert fields["max_provisioned_concurrency"]["errors"] == ["This field is required."]
    assert not Endpoint.objects.exists()


@pytest.mark.parametrize(
    "field",
    ["id", "desired_replicas", "ready_replicas", "state", "version", "created_at", "min_replicas", "rollout"],
)
def test_a_patch_of_a_read_only_field_is_a_400_and_changes_nothing(owner_client, owner, make_endpoint, field):
    endpoint = make_endpoint(owner, "chat")
    value = {"created_at": "2020-01-01T00:00:00Z", "state": "ready", "rollout": None}.get(field, 9)
    answer = owner_client.patch(
        f"/api/v1/endpoints/{endpoint.pk}/", {field: value, "max_provisioned_concurrency": 32}, format="json"
    )
    assert refused(answer) == {field: {"errors": ["read-only field"], "value": value}}
    endpoint.refresh_from_db()
    assert (endpoint.max_provisioned_concurrency, endpoint.desired_replicas, endpoint.state) == (
        16,
        1,
        "pending",
    )


def test_the_rollout_command_takes_only_its_action(owner_client, owner, make_endpoint):
    endpoint = make_endpoint(owner, "chat")
    answer = owner_client.post(
        f"/api/v1/endpoints/{endpoint.pk}/rollout/", {"action": "abort", "force": True}, format="json"
    )
    assert refused(answer) == {"force": {"errors": ["unknown field"], "value": True}}


def test_a_body_that_is_not_an_object_is_still_named(owner_client, pool, small_model):
    answer = owner_client.post("/api/v1/endpoints/", [endpoint_body()], format="json")
    assert answer.status_code == 400 and "Expected a dictionary" in answer.json()["detail"], answer.json()


@pytest.fixture
def one_of_each(owner, make_endpoint, h100):
    endpoint = make_endpoint(owner, "chat")
    sell(endpoint, mu_per_minute=10, best_effort_allowed=True, sold_by="ops")
    Pod.objects.create(endpoint=endpoint, name="chat-1", url="http://127.0.0.1:9000", ready=True)
    return endpoint


@pytest.mark.parametrize(
    ("method", "url", "body"),
    [
        ("patch", "/api/v1/tenants/{owner}/", {"display_name": "Owner"}),
        ("post", "/api/v1/api-keys/", {"name": "ci"}),
        ("patch", "/api/v1/gpu-types/{gpu_type}/", {"memory_gib": 80}),
        ("patch", "/api/v1/pools/{pool}/", {"gpu_count": 8}),
        ("patch", "/api/v1/model-profiles/{profile}/", {"alpha": 0.0004}),
        ("patch", "/api/v1/endpoints/{endpoint}/", {"max_provisioned_concurrency": 16}),
        ("patch", "/api/v1/pods/{pod}/", {"ready": False}),
        ("patch", "/api/v1/reservations/{reservation}/", {"mu_per_minute": 10}),
        ("post", "/api/v1/events/", {"kind": "hang", "severity": "info", "pod": "p", "message": "m"}),
    ],
)
def test_every_resource_refuses_an_unknown_field(operator_client, one_of_each, method, url, body):
    ids = {
        "owner": Tenant.objects.get(name="owner").pk,
        "gpu_type": GpuType.objects.get().pk,
        "pool": GpuPool.objects.get().pk,
        "profile": ModelProfile.objects.get().pk,
        "endpoint": one_of_each.pk,
        "pod": Pod.objects.get().pk,
        "reservation": Reservation.objects.get().pk,
    }
    send = getattr(operator_client, method)
    assert send(url.format(**ids), body, format="json").status_code in (200, 201)  # the body itself is fine
    counts = [m.objects.count() for m in (ApiKey, Event)]
    answer = send(url.format(**ids), {**body, "colour": "red"}, format="json")
    assert refused(answer) == {"colour": {"errors": ["unknown field"], "value": "red"}}
    assert [m.objects.count() for m in (ApiKey, Event)] == counts  # nothing made


def test_every_write_serializer_is_strict():
    writers = [
        viewset.serializer_class
        for _, viewset, _ in router.registry
        if getattr(viewset, "serializer_class", None)
        and any(hasattr(viewset, m) for m in ("create", "update", "partial_update"))
    ]
    assert len(writers) >= 9
    assert [s.__name__ for s in writers if not issubclass(s, StrictInput)] == []
    assert issubclass(RolloutCommand, StrictInput)
