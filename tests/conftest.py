"""Fixtures: a small fleet, an owner tenant, a second tenant that must see nothing of the
first, and an operator, each with an API client holding its own key."""

import pytest
from rest_framework.test import APIClient

from controlplane.capacity.models import GpuPool, GpuType, ModelProfile, ProvisionedAllowance
from controlplane.endpoints.models import Endpoint
from controlplane.selling import save_endpoint
from controlplane.tenants.models import ApiKey, Tenant
from dataplane.wire import load_samples

# The test tiers. `make test` runs every test; `make test-fast` (the inner loop) leaves out the ones
# marked with these (pyproject.toml's markers): servers and processes, Chromium, a Celery worker,
# vLLM, schemathesis. tests/test_tiers.py checks the hook below, the modules' own marks and the
# Makefile's expression against this list.
SLOW_MARKERS = ("stack", "browser", "celery", "vllm", "own_vllm_pod", "schemathesis")

# Fixtures that start a server or processes: a test that uses one, even through another fixture
# (item.fixturenames is the whole closure), is marked `stack` here, so that a new test cannot land
# in the fast tier by forgetting a mark. Fixtures of one module that start processes (a module's
# `sim`, `engine`, `stack`...) are not named here: their module carries `pytestmark`, or their
# tests `@pytest.mark.stack`, which tests/test_tiers.py checks by reading every test module.
PROCESS_FIXTURES = frozenset(
    {
        "live_server",  # pytest-django's server (threads) on a transactional database
        "start_sim",  # tests/runtime/conftest.py: simulated engines as subprocesses
        "tiny_model",  # tests/runtime/conftest.py: makes a model for real vLLM
        "real_pod",  # tests/runtime/conftest.py: a real vLLM pod
    }
)


@pytest.hookimpl(tryfirst=True)  # before pytest's own hook deselects by -m
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if PROCESS_FIXTURES.intersection(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.stack)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]):
    """Each phase's report on its test (``item.rep_call``...): a fixture's teardown can tell
    whether the test failed, to print the log of a process it started (test_web_server)."""
    report = yield
    setattr(item, f"rep_{report.when}", report)
    return report


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


# The tenants' own quota, set as an operator would: the default is the fleet's GPUs
# (tenant_limits.default_gpu_quota), 8 in these fixtures, which would refuse most endpoints' maximum
# replicas before the checks a test is about. Tests of the default make a tenant without one.
QUOTA = 256


@pytest.fixture
def owner(db):
    return Tenant.objects.create(name="owner", gpu_quota=QUOTA)


@pytest.fixture
def other(db):
    return Tenant.objects.create(name="other", gpu_quota=QUOTA)


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
        save_endpoint(endpoint)
        return endpoint

    return make


@pytest.fixture
def grow_fleet(make_endpoint, h100):
    """`grow_fleet(n)`: n more tenants, each with a pool, a profile, a reserved endpoint, an
    allowance, a pod, an API key and events, so that list pages have more rows of every kind."""
    from datetime import UTC, datetime

    from controlplane.endpoints.models import Pod
    from controlplane.oncall.models import Event
    from controlplane.pool_ledgers import refresh_pools
    from controlplane.selling import sell

    settled = datetime(2026, 1, 1, tzinfo=UTC)

    def grow(n: int) -> None:
        for i in range(n):
            tenant = Tenant.objects.create(name=f"t{i}-{n}")
            pool = GpuPool.objects.create(name=f"p{i}-{n}", gpu_type=h100, region="r", gpu_count=100)
            profile = ModelProfile.objects.create(model=f"m{i}-{n}", gpu_type=h100, alpha=0, beta=0, gamma=1)
            endpoint = make_endpoint(tenant, f"e{i}", profile=profile, pool=pool)
            sell(endpoint, mu_per_minute=10, best_effort_allowed=True, sold_by="t")
            ProvisionedAllowance.objects.create(tenant=tenant, pool=pool, gpus=8)
            ApiKey.issue(name=f"k{i}", tenant=tenant)
            Pod.objects.create(
                endpoint=endpoint, name=f"pod-{i}-{n}", url="http://127.0.0.1:9000", ready=True
            )
            refresh_pools([pool.pk])  # as the pod sync does after its writes
            pod = f"pod-{i}-{n}"
            Event.record("hang", "x", endpoint=endpoint, pod=pod, recorded_at=settled, severity="critical")
            Event.record("restart", "x", endpoint=endpoint, pod=pod, recorded_at=settled)
            Event.record("scale", "x", endpoint=endpoint, detail={"replicas": i + 1}, recorded_at=settled)

    return grow


@pytest.fixture
def grow_tenant(make_endpoint, h100):
    """`grow_tenant(tenant, n)`: n more endpoints of that tenant, each reserved, with a pod and
    events (a critical hang and a restart on its pod, a scale), in a pool of its own, so that the
    tenant's own pages have more rows of every kind."""
    from datetime import UTC, datetime

    from controlplane.endpoints.models import Pod
    from controlplane.oncall.models import Event
    from controlplane.selling import sell

    settled = datetime(2026, 1, 1, tzinfo=UTC)

    def grow(tenant: Tenant, n: int) -> None:
        pool, _ = GpuPool.objects.get_or_create(
            name=f"{tenant.name}-pool", defaults={"gpu_type": h100, "region": "r", "gpu_count": 1000}
        )
        start = Endpoint.objects.filter(tenant=tenant).count()
        for i in range(start, start + n):
            endpoint = make_endpoint(tenant, f"{tenant.name}-e{i}", pool=pool)
            sell(endpoint, mu_per_minute=10, best_effort_allowed=True, sold_by="t")
            pod = f"{tenant.name}-pod-{i}"
            Pod.objects.create(endpoint=endpoint, name=pod, url="http://127.0.0.1:9000", ready=True)
            Event.record("hang", "x", endpoint=endpoint, pod=pod, recorded_at=settled, severity="critical")
            Event.record("restart", "x", endpoint=endpoint, pod=pod, recorded_at=settled)
            Event.record("scale", "x", endpoint=endpoint, detail={"replicas": i + 1}, recorded_at=settled)

    return grow


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


@pytest.fixture(autouse=True, scope="session")
def _published_tables_redis():
    import os

    import redis

    client = redis.Redis.from_url(os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/15"))
    yield client
    client.close()


@pytest.fixture(autouse=True)
def _no_routing_table_published_by_another_test(_published_tables_redis):
    """A routing table that another test's beat published (with Redis the beat builds it every
    second) holds that test's keys and endpoints, and the view would serve it for
    ROUTING_TABLE_STALE_AFTER_S: each test starts without one."""
    from redis.exceptions import RedisError

    from controlplane.endpoints.routing import PUBLISHED_KEY

    try:
        _published_tables_redis.delete(PUBLISHED_KEY)
    except (RedisError, OSError):
        pass  # no Redis here: nothing can have been published either


@pytest.fixture
def metrics():
    """The routers' metering keys in the test Redis (REDIS_URL), removed after the test."""
    import os

    import redis

    client = redis.Redis.from_url(os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/15"))
    forget_metering(client)
    yield client
    forget_metering(client)
    client.close()


def forget_metering(client) -> None:
    """Remove every router's seconds from a Redis: their rows, heartbeats, marks, billing stream."""
    patterns = (load_samples.load_key("*", "*"), load_samples.routers_key("*"), load_samples.acked_key("*"))
    for pattern in patterns:
        for key in client.scan_iter(pattern):
            client.delete(key)
    client.delete(load_samples.BILLING_STREAM)


@pytest.fixture
def publish_seconds(metrics):
    """Publish router seconds to the test Redis the way routers do (metering.publish):
    ``publish_seconds({second: [router 1's samples, router 2's samples, ...]})``, each call's
    routers new ones (a router's seconds go out in order, once)."""
    import asyncio
    import itertools
    import os

    from redis.asyncio import Redis

    from dataplane.router.config import RouterConfig
    from dataplane.router.metering import publish

    ttl_s = RouterConfig().metrics_ttl_s  # the routers' default
    calls = itertools.count()

    def write(seconds: dict[int, list[list[load_samples.Sample]]]) -> None:
        call = next(calls)

        async def go() -> None:
            client = Redis.from_url(os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/15"))
            try:
                for second, routers in sorted(seconds.items()):
                    for i, samples in enumerate(routers):
                        posted = load_samples.RouterSecond(second, tuple(samples), f"test-router-{call}-{i}")
                        assert await publish(client, posted, ttl_s)
            finally:
                await client.aclose()

        asyncio.run(go())

    return write


def latencies(counts: dict[int, int]) -> tuple[int, ...]:
    """A sample's latency histogram: {6: 1} is one request in LATENCY_BUCKETS_S[6]."""
    return tuple(counts.get(i, 0) for i in range(len(load_samples.NO_LATENCIES)))


@pytest.fixture
def standin():
    """The stand-in Kubernetes API server (tests/cluster/kube_standin.py) on 127.0.0.1."""
    from tests.cluster.kube_standin import KubeStandIn

    s = KubeStandIn().start()
    yield s
    s.stop()
