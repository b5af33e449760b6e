"""Fixtures: a small fleet, an owner tenant, a second tenant that must see nothing of the
first, and an operator, each with an API client holding its own key."""

import pytest
from rest_framework.test import APIClient

from capacity.models import GpuPool, GpuType, ModelProfile
from controlplane.endpoints.models import Endpoint
from controlplane.tenants.models import ApiKey, Tenant


def client_for(tenant: Tenant | None, name: str = "test") -> APIClient:
    _, secret = ApiKey.issue(name=name, tenant=tenant)
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {secret}")
    client.secret = secret
    return client


@pytest.fixture
def h100(db):
    return GpuType.objects.create(name="h100-80gb", memory_gib=80, hourly_cost_usd="2.49")


@pytest.fixture
def l40s(db):
    return GpuType.objects.create(name="l40s-48gb", memory_gib=48, hourly_cost_usd="0.99")


@pytest.fixture
def pool(h100):
    """8 H100s: at 100 MU/min per 1-GPU replica, 800 MU/min of an 8B model."""
    return GpuPool.objects.create(name="use1-h100", gpu_type=h100, region="us-east-1", gpu_count=8)


@pytest.fixture
def small_model(h100):
    return ModelProfile.objects.create(
        model="llama-8b", gpu_type=h100, alpha=0.0004, beta=0.004, gamma=0.02, gpus_per_replica=1
    )


@pytest.fixture
def big_model(h100):
    """4 GPUs per replica: 100 MU/min costs 4 GPUs."""
    return ModelProfile.objects.create(
        model="llama-70b", gpu_type=h100, alpha=0.002, beta=0.02, gamma=0.1, gpus_per_replica=4
    )


@pytest.fixture
def owner(db):
    return Tenant.objects.create(name="owner")


@pytest.fixture
def other(db):
    return Tenant.objects.create(name="other")


@pytest.fixture
def owner_client(owner):
    return client_for(owner)


@pytest.fixture
def other_client(other):
    return client_for(other)


@pytest.fixture
def operator_client(db):
    return client_for(None, name="ops")


@pytest.fixture
def make_endpoint(pool, small_model):
    def make(tenant: Tenant, name: str, *, profile: ModelProfile | None = None, **fields) -> Endpoint:
        endpoint = Endpoint(
            tenant=tenant,
            name=name,
            profile=profile or small_model,
            pool=fields.pop("pool", pool),
            min_provisioned_concurrency=fields.pop("min_provisioned_concurrency", 0),
            max_provisioned_concurrency=fields.pop("max_provisioned_concurrency", 16),
            target_concurrency_per_replica=fields.pop("target_concurrency_per_replica", 8),
            **fields,
        )
        endpoint.save_checked()
        return endpoint

    return make


def endpoint_body(**overrides) -> dict:
    body = {
        "name": "chat",
        "model": "llama-8b",
        "gpu_type": "h100-80gb",
        "min_provisioned_concurrency": 8,
        "max_provisioned_concurrency": 64,
        "scale_to_zero_enabled": False,
    }
    body.update(overrides)
    return body
