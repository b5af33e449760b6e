"""A tenant's hour of usage is its endpoints' hours added (deleted endpoints' too), written in
the transaction that writes them, so a crash between the two statements bills neither."""

import random

import pytest
from django.db import DatabaseError, connection
from django.db.migrations.executor import MigrationExecutor
from django.db.models import Sum

from controlplane.endpoints import usage
from controlplane.endpoints.models import TenantUsageHour, UsageHour
from controlplane.selling import delete_endpoint
from dataplane.wire.load_samples import EndpointSecond

HOUR = 1_795_161_600  # a UTC hour's start
FIGURES = usage.FIGURES


def tenant_hours() -> dict[tuple[int, int], tuple[float, ...]]:
    return {
        (row[0], row[1]): tuple(row[2:])
        for row in TenantUsageHour.objects.values_list("tenant_id", "start", *FIGURES)
    }


def endpoint_hours_added() -> dict[tuple[int, int], tuple[float, ...]]:
    rows = UsageHour.objects.values_list("tenant_id", "start").annotate(*(Sum(f) for f in FIGURES)).order_by()
    return {(row[0], row[1]): tuple(row[2:]) for row in rows}


def second(rng: random.Random) -> EndpointSecond:
    # MU in quarters: exact in binary, so the sums do not depend on their order
    return EndpointSecond(
        requests=rng.randint(0, 5), mu=rng.randint(0, 40) / 4, tokens_in=rng.randint(0, 900),
        tokens_out=rng.randint(0, 90), throttled=rng.randint(0, 2), errors=rng.randint(0, 1),
    )  # fmt: skip


def test_a_tenants_hour_is_its_endpoints_hours_added(owner, other, make_endpoint):
    rng = random.Random(4)
    chat, batch, gone = (make_endpoint(owner, name) for name in ("chat", "batch", "gone"))
    rival = make_endpoint(other, "rival")
    ids = [chat.pk, batch.pk, gone.pk, rival.pk, 99_999]  # the last never was an endpoint
    delete_endpoint(gone)  # its late seconds bill its tenant still
    for _ in range(40):  # batches as the collector bills them, an hour billed over many
        usage.record(
            (rng.choice(ids), HOUR + rng.randrange(3 * 3600), second(rng)) for _ in range(rng.randint(1, 30))
        )
    added = endpoint_hours_added()
    assert tenant_hours() == added
    assert {tenant for tenant, _ in added} == {owner.pk, other.pk}
    assert len(added) == 6  # two tenants, three hours
    assert UsageHour.objects.filter(tenant=owner).values("endpoint_id").distinct().count() == 3


def test_a_crash_between_the_endpoints_hours_and_the_tenants_bills_neither(owner, make_endpoint, monkeypatch):
    chat = make_endpoint(owner, "chat")
    usage.record([(chat.pk, HOUR, EndpointSecond(requests=1, mu=2.0))])
    real = usage._add

    def crash_on_tenants(model, *args):
        if model is TenantUsageHour:
            raise DatabaseError("server closed the connection unexpectedly")
        return real(model, *args)

    monkeypatch.setattr(usage, "_add", crash_on_tenants)
    with pytest.raises(DatabaseError):
        usage.record([(chat.pk, HOUR, EndpointSecond(requests=5, mu=7.0))])
    assert list(UsageHour.objects.values_list("requests", "mu")) == [(1, 2.0)]
    assert list(TenantUsageHour.objects.values_list("requests", "mu")) == [(1, 2.0)]


@pytest.mark.django_db(transaction=True)
def test_existing_usage_is_summed_into_tenants_hours():
    before = [("endpoints", "0017_router_marks_and_billed_samples")]
    executor = MigrationExecutor(connection)
    executor.migrate(before)
    old = MigrationExecutor(connection).loader.project_state(before).apps
    tenants = [old.get_model("tenants", "Tenant").objects.create(name=n) for n in ("acme", "beta")]
    hour = old.get_model("endpoints", "UsageHour").objects
    for endpoint_id, tenant, start, mu, requests in [
        (1, tenants[0], HOUR, 1.5, 3),
        (2, tenants[0], HOUR, 2.0, 4),  # another endpoint of acme's, deleted or not
        (1, tenants[0], HOUR + 3600, 0.25, 1),
        (3, tenants[1], HOUR, 9.0, 10),
    ]:
        hour.create(
            endpoint_id=endpoint_id, endpoint_name=f"e{endpoint_id}", tenant=tenant, start=start, mu=mu,
            requests=requests, throttled=1,
        )  # fmt: skip

    executor = MigrationExecutor(connection)
    executor.migrate(executor.loader.graph.leaf_nodes())

    assert {
        (tenant, start): (mu, requests, throttled)
        for tenant, start, mu, requests, throttled in TenantUsageHour.objects.values_list(
            "tenant__name", "start", "mu", "requests", "throttled"
        )
    } == {
        ("acme", HOUR): (3.5, 7, 2),
        ("acme", HOUR + 3600): (0.25, 1, 1),
        ("beta", HOUR): (9.0, 10, 1),
    }
