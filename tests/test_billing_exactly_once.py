"""Billed == served, never twice, across failures and retries at every step (a property test).

Three routers (two with a spool, one holding its seconds in memory alone) meter seconds of
two endpoints' traffic; each second goes through the real delivery (dataplane.router.delivery)
to the real sink: the control plane's /api/v1/load-samples/ view through the router's own
client (without Redis), or the Redis script (with it); the real collector bills them. Between
any two steps anything may fail: a post refused before it reaches the sink, a post the sink
applied whose answer is lost (a timeout after the commit), a database error inside the sink,
the collector dying inside its billing transaction (before its first statement, or between the
endpoints' hours and the tenants') or after it committed (before it could move its lease or
delete the billing stream's entries), a spooled router killed and started again on its spool.
Then everything heals: every metered second is in usage exactly once, per endpoint and UTC
hour, in its endpoint's day and in its tenant's hour and day."""

import asyncio
import contextlib
import os
from collections import Counter
from datetime import UTC, datetime

import pytest
from django.db import DatabaseError
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from redis.asyncio import Redis
from redis.exceptions import ConnectionError as RedisConnectionError
from rest_framework.test import APIClient

from controlplane.endpoints import collector, samples, usage
from controlplane.endpoints.models import (
    Lease,
    RouterMark,
    RouterSample,
    TenantUsageDay,
    TenantUsageHour,
    UsageDay,
    UsageHour,
)
from controlplane.tenants.models import ApiKey
from dataplane.router.control_plane import ControlPlaneClient
from dataplane.router.delivery import Delivery, Spool
from dataplane.router.metering import publish
from dataplane.wire.load_samples import ROW_TTL_S, RouterSecond, TrafficSample
from tests.conftest import forget_metering

START = int(datetime(2026, 11, 29, 10, 58, 0, tzinfo=UTC).timestamp())  # two minutes before an hour
ROUTERS = 3  # 0 and 1 spool their seconds, 2 holds them in memory alone
SPOOLED = (0, 1)
FIGURES = ("requests", "mu", "tokens_in", "tokens_out")

traffic = st.tuples(
    st.integers(0, 1),  # endpoint
    st.integers(1, 5),  # requests
    st.integers(0, 12),  # MU in quarters (exact in binary: sums do not depend on their order)
    st.integers(0, 400),  # tokens in
    st.integers(0, 90),  # tokens out
)
steps = st.lists(
    st.one_of(
        st.tuples(st.just("serve"), st.integers(0, ROUTERS - 1), st.lists(traffic, max_size=3)),
        st.tuples(
            st.just("deliver"), st.integers(0, ROUTERS - 1), st.sampled_from([None, "before", "late", "db"])
        ),
        st.tuples(st.just("collect"), st.sampled_from([None, "billing", "between", "after_commit"])),
        st.tuples(st.just("restart"), st.sampled_from(SPOOLED)),
        st.tuples(st.just("wait"), st.integers(1, 120)),  # seconds, across the hour now and then
    ),
    min_size=10,
    max_size=60,
)


def drive(coro):
    """Run a coroutine that never waits (the posted path: the test client answers at once) to its
    end, outside any event loop: Django's calls stay on the test's connection and transaction."""
    try:
        coro.send(None)
    except StopIteration as done:
        return done.value
    raise AssertionError("the sink waited on something")


@pytest.fixture
def world(settings, owner, other, make_endpoint, metrics, tmp_path):
    chat, rival = make_endpoint(owner, "chat"), make_endpoint(other, "rival")
    _, key = ApiKey.issue(name="router", tenant=None)
    return {
        "endpoints": (chat, rival),
        "key": key,
        "tmp": tmp_path,
        "settings": settings,
        "runs": iter(range(10**6)),
    }


class Scenario:
    """One example: three routers, the sink, the collector, the faults to inject next."""

    def __init__(self, world, sink: str) -> None:
        self.sink = sink
        self.endpoints = world["endpoints"]
        self.send_fault: str | None = None
        self.redis: Redis | None = None  # the routers' client, within a deliver step's loop
        api = APIClient(raise_request_exception=False)

        async def fetch(url, method, headers, body, timeout):
            answer = api.generic(
                method,
                url.removeprefix("http://cp"),
                body,
                "application/json",
                HTTP_AUTHORIZATION=headers["authorization"],
            )
            return answer.status_code, {}, answer.content

        self.control_plane = ControlPlaneClient("http://cp", world["key"], fetch, 5.0)
        run = next(world["runs"])
        self.spools = {i: world["tmp"] / f"run-{run}" / f"spool-{i}" for i in SPOOLED}
        self.incarnation = Counter[int]()
        self.routers = [self.start(i) for i in range(ROUTERS)]
        self.served = Counter[tuple[int, int, str]]()
        self.now = START
        self.passes = 0

    def start(self, i: int) -> Delivery:
        self.incarnation[i] += 1
        spool = Spool(str(self.spools[i])) if i in self.spools else None
        return Delivery(self.send, f"router-{i}-{self.incarnation[i]}", 1 << 20, spool, 1 << 20)

    async def send(self, posted: RouterSecond) -> None:
        fault, self.send_fault = self.send_fault, None
        if fault == "before":
            raise (ConnectionRefusedError if self.sink == "posted" else RedisConnectionError)("refused")
        if fault == "db" and self.sink == "redis":  # the script errs: nothing applied
            raise RedisConnectionError("Error while reading from socket")
        if fault == "db":  # the view's store fails mid-transaction: a 500
            with patched(RouterSample.objects, "bulk_create"):
                await self.control_plane.post_samples(posted)
            return
        if self.sink == "posted":
            await self.control_plane.post_samples(posted)
        else:
            assert self.redis is not None
            await publish(self.redis, posted, ROW_TTL_S)
        if fault == "late":
            raise TimeoutError("the answer did not come within 5 s")

    def serve(self, i: int, rows) -> None:
        self.now += 1
        sampled = tuple(
            TrafficSample(
                self.endpoints[e].pk,
                self.endpoints[e].tenant.name,
                requests=n,
                mu=q / 4,
                tokens_in=tin,
                tokens_out=tout,
            )
            for e, n, q, tin, tout in rows
        )
        self.routers[i].add(sampled, self.now)
        hour = self.routers[i].last_second // 3600 * 3600
        for s in sampled:
            for field in FIGURES:
                self.served[(s.endpoint, hour, field)] += getattr(s, field)

    def deliver(self, i: int, fault: str | None) -> None:
        self.send_fault = fault
        if self.sink == "posted":
            drive(self.routers[i].deliver())
            return

        async def with_redis() -> None:
            self.redis = Redis.from_url(os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/15"))
            try:
                await self.routers[i].deliver()
            finally:
                await self.redis.aclose()

        asyncio.run(with_redis())

    def collect(self, fault: str | None = None) -> None:
        self.passes += 1
        when = datetime.fromtimestamp(self.now + 5 * self.passes, UTC)
        if fault is None:
            assert collector.collect_pass(when) is not None
            return
        # Dead inside its billing transaction, or after it committed: before it could release its
        # lease (and, with Redis, delete the billed entries). Its lease expires.
        stages = {
            "billing": [(usage, "record")],
            "between": [(usage, "_add")],  # after the endpoints' hours, before their days
            "after_commit": [(Lease, "release"), (redis_client(), "xdel")],
        }[fault]
        with contextlib.ExitStack() as stack:
            for owner, name in stages:
                stack.enter_context(patched(owner, name))
            if fault == "between":  # crashes only where there was something to bill
                with contextlib.suppress(DatabaseError):
                    collector.collect_pass(when)
            else:
                with pytest.raises(DatabaseError):
                    collector.collect_pass(when)
        Lease.objects.filter(name=collector.COLLECTOR).update(expires_at=None)

    def wait(self, seconds: int) -> None:
        self.now += seconds

    def restart(self, i: int) -> None:
        """Killed: what it held is in its spool and nowhere else; a new process takes it over."""
        spool = self.routers[i].spool
        assert spool is not None
        spool.close()  # the kernel's doing when a process dies
        self.routers[i] = self.start(i)


@contextlib.contextmanager
def patched(owner, name: str):
    """`owner.name` raises a database error while the block runs (usage._add: its second call
    in a transaction, the tenants' hours)."""
    real = getattr(owner, name)
    calls = Counter[str]()

    def crash(*args, **kwargs):
        calls["all"] += 1
        if name == "_add" and calls["all"] % 2:
            return real(*args, **kwargs)
        raise DatabaseError("server closed the connection unexpectedly")

    setattr(owner, name, crash)
    try:
        yield
    finally:
        setattr(owner, name, real)


def redis_client():
    return samples.redis_client(os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/15"))


def run(world, sink: str, plan) -> None:
    """One example on a fresh ledger: the plan's steps, then everything healed and delivered,
    and usage compared with what was served."""
    settings = world["settings"]
    settings.REDIS_URL = os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/15") if sink == "redis" else ""
    for model in (UsageHour, UsageDay, TenantUsageHour, TenantUsageDay, RouterSample, RouterMark, Lease):
        model.objects.all().delete()
    forget_metering(redis_client())
    scenario = Scenario(world, sink)
    for step in plan:
        getattr(scenario, step[0])(*step[1:])
    for i, router in enumerate(scenario.routers):
        scenario.deliver(i, None)
        assert not router.held
    scenario.collect()
    scenario.collect()
    billed = Counter[tuple[int, int, str]]()
    for row in UsageHour.objects.all():
        for field in FIGURES:
            billed[(row.endpoint_id, row.start, field)] += getattr(row, field)
    assert +billed == +scenario.served
    tenant_of = {e.pk: e.tenant_id for e in scenario.endpoints}
    served = {model: Counter[tuple[int, int, str]]() for model in (UsageDay, TenantUsageHour, TenantUsageDay)}
    for (endpoint_id, hour, field), value in scenario.served.items():
        served[UsageDay][(endpoint_id, hour // 86400 * 86400, field)] += value
        served[TenantUsageHour][(tenant_of[endpoint_id], hour, field)] += value
        served[TenantUsageDay][(tenant_of[endpoint_id], hour // 86400 * 86400, field)] += value
    for model, expected in served.items():
        stored = Counter[tuple[int, int, str]]()
        for row in model.objects.all():
            key = row.endpoint_id if model is UsageDay else row.tenant_id
            for field in FIGURES:
                stored[(key, row.start, field)] += getattr(row, field)
        assert +stored == +expected, model.__name__


@pytest.mark.parametrize("sink", ["posted", "redis"])
def test_billed_is_served_never_twice_whatever_fails(world, sink):
    @settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
    @given(plan=steps)
    def check(plan):
        run(world, sink, plan)

    check()
