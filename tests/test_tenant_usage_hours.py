"""An endpoint's day of usage is its hours added, a tenant's hour or day its endpoints' hours
added (deleted endpoints' too), each written in the transaction that writes the hours, so a
crash between the statements bills none of them; the migrations add up the hours there were."""

import random

import pytest
from django.db import DatabaseError, connection
from django.db.migrations.executor import MigrationExecutor
from django.db.models import F, Sum
from django.db.models.functions import Mod

from controlplane.endpoints import usage
from controlplane.endpoints.models import TenantUsageDay, TenantUsageHour, UsageDay, UsageHour
from controlplane.selling import delete_endpoint
from dataplane.wire.load_samples import EndpointSecond

HOUR = 1_795_212_000  # a UTC hour's start, 22:00
FIGURES = usage.FIGURES


def tenant_periods(model) -> dict[tuple[int, int], tuple[float, ...]]:
    return {
        (row[0], row[1]): tuple(row[2:]) for row in model.objects.values_list("tenant_id", "start", *FIGURES)
    }


def days() -> dict[tuple[int, str, int, int], tuple[float, ...]]:
    return {
        tuple(row[:4]): tuple(row[4:])
        for row in UsageDay.objects.values_list(
            "endpoint_id", "endpoint_name", "tenant_id", "start", *FIGURES
        )
    }


def hours_by_day() -> dict[tuple[int, str, int, int], tuple[float, ...]]:
    added: dict[tuple[int, str, int, int], list[float]] = {}
    for endpoint_id, name, tenant_id, start, *figures in UsageHour.objects.values_list(
        "endpoint_id", "endpoint_name", "tenant_id", "start", *FIGURES
    ):
        total = added.setdefault((endpoint_id, name, tenant_id, start // 86400 * 86400), [0] * len(FIGURES))
        for i, value in enumerate(figures):
            total[i] += value
    return {key: tuple(total) for key, total in added.items()}


def endpoint_hours_added(period: int = 3600) -> dict[tuple[int, int], tuple[float, ...]]:
    rows = (
        UsageHour.objects.annotate(period=F("start") - Mod(F("start"), period))
        .values_list("tenant_id", "period")
        .annotate(*(Sum(f) for f in FIGURES))
        .order_by()
    )
    return {(row[0], row[1]): tuple(row[2:]) for row in rows}


def second(rng: random.Random) -> EndpointSecond:
    # MU in quarters: exact in binary, so the sums do not depend on their order
    return EndpointSecond(
        requests=rng.randint(0, 5), mu=rng.randint(0, 40) / 4, tokens_in=rng.randint(0, 900),
        tokens_out=rng.randint(0, 90), throttled=rng.randint(0, 2), errors=rng.randint(0, 1),
    )  # fmt: skip


def test_a_day_and_a_tenants_hour_are_their_hours_added(owner, other, make_endpoint):
    rng = random.Random(4)
    chat, batch, gone = (make_endpoint(owner, name) for name in ("chat", "batch", "gone"))
    rival = make_endpoint(other, "rival")
    ids = [chat.pk, batch.pk, gone.pk, rival.pk, 99_999]  # the last never was an endpoint
    delete_endpoint(gone)  # its late seconds bill its tenant still
    for _ in range(40):  # batches as the collector bills them, an hour billed over many
        usage.record(  # two hours of one day, two of the next
            (rng.choice(ids), HOUR + rng.randrange(4 * 3600), second(rng)) for _ in range(rng.randint(1, 30))
        )
    assert days() == hours_by_day()
    assert {start for *_, start in days()} == {HOUR // 86400 * 86400, HOUR // 86400 * 86400 + 86400}
    added = endpoint_hours_added()
    assert tenant_periods(TenantUsageHour) == added
    assert tenant_periods(TenantUsageDay) == endpoint_hours_added(86400)
    assert {tenant for tenant, _ in added} == {owner.pk, other.pk}
    assert len(added) == 8  # two tenants, four hours
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
    for periods in (UsageHour, UsageDay, TenantUsageHour, TenantUsageDay):
        assert list(periods.objects.values_list("requests", "mu")) == [(1, 2.0)]


@pytest.mark.django_db(transaction=True)
def test_existing_usage_is_summed_into_days_and_tenants_hours_and_days():
    before = [("endpoints", "0017_router_marks_and_billed_samples")]  # before the days and the tenants' hours
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
    day = HOUR // 86400 * 86400
    assert set(TenantUsageDay.objects.values_list("tenant__name", "start", "mu", "requests")) == {
        ("acme", day, 3.75, 8),
        ("beta", day, 9.0, 10),
    }
    assert {
        (endpoint_id, start): (name, tenant, mu, requests)
        for endpoint_id, start, name, tenant, mu, requests in UsageDay.objects.values_list(
            "endpoint_id", "start", "endpoint_name", "tenant__name", "mu", "requests"
        )
    } == {
        (1, day): ("e1", "acme", 1.75, 4),
        (2, day): ("e2", "acme", 2.0, 4),
        (3, day): ("e3", "beta", 9.0, 10),
    }
