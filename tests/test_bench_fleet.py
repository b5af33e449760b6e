"""The benchmarks' fleet loader (bench/fleet.py) at a tiny size, on the test database: the rows it
promises, what the product reads of them (pools no sale check would refuse, events in the groups
EventGroup.fold would put them in, keys that authenticate), and the product writing on after it.
The loader COPYs whole tables past the models' save() logic, so a model that changes under it
must fail here, not in a benchmark that nobody runs."""

import importlib.util
from pathlib import Path

import pytest
from django.db.models import Count, F, Sum

from controlplane import pool_ledgers
from controlplane.capacity.models import CapacitySnapshot, GpuPool, Reservation
from controlplane.endpoints.models import Endpoint, LoadBucket, Pod, Rollout, UsageHour
from controlplane.oncall import grouping
from controlplane.oncall.models import Event, EventGroup
from controlplane.tenants.models import ApiKey, Tenant

spec = importlib.util.spec_from_file_location(
    "fleet", Path(__file__).resolve().parent.parent / "bench" / "fleet.py"
)
assert spec is not None and spec.loader is not None
fleet = importlib.util.module_from_spec(spec)
spec.loader.exec_module(fleet)

pytestmark = pytest.mark.django_db(transaction=True)  # the loader commits its own transaction

TINY = fleet.FleetSize(endpoints=50, tenants=5, events=200)


@pytest.fixture
def loaded():
    return fleet.load(TINY)


def test_a_tiny_fleet_has_the_rows_of_its_size(loaded):
    assert (Endpoint.objects.count(), Tenant.objects.count(), Event.objects.count()) == (50, 5, 200)
    assert GpuPool.objects.count() == 20
    assert ApiKey.objects.count() == 5 + 1
    assert Reservation.objects.count() == loaded.counts["reservations"] > 0
    assert Rollout.objects.active().count() == fleet.ROLLOUTS
    assert Pod.objects.filter(ready=True).count() == loaded.counts["pods"] > 0
    assert UsageHour.objects.count() == loaded.counts["usage hours"] > 0
    assert LoadBucket.objects.values("endpoint").distinct().count() == len(loaded.load_sampled)
    assert CapacitySnapshot.objects.count() == 20 * fleet.SNAPSHOT_HOURS * 60
    # every endpoint in a pool of its GPU type, and every tenant with a key that signs in
    assert not Endpoint.objects.exclude(pool__gpu_type=F("profile__gpu_type")).exists()
    assert ApiKey.authenticate(loaded.operator_key).is_operator
    assert {ApiKey.authenticate(k).tenant.name for k in loaded.tenant_keys} == {
        f"tenant-{t}" for t in range(5)
    }


def test_no_pool_of_the_fleet_is_oversold(loaded):
    pools = list(GpuPool.objects.all())
    ledgers = pool_ledgers.pool_ledgers(pools)
    assert [p.name for p in pools if ledgers[p.pk].oversold] == []
    assert all(ledgers[p.pk].committed_gpus > 0 for p in pools)
    full = [ledgers[pk] for pk in loaded.full_pool_ids]
    # the nearly full pools have about FULL_POOL_FREE_GPUS left: a few sales fit, then refusals
    assert all(0 < ledger.free_gpus < fleet.FULL_POOL_FREE_GPUS + fleet.GPUS_PER_NODE for ledger in full)


def test_events_are_folded_as_the_product_folds_them(loaded):
    assert not Event.objects.filter(group=None).exists()
    counted = dict(Event.objects.values_list("group").annotate(n=Count("id")).order_by())
    assert dict(EventGroup.objects.values_list("pk", "count")) == counted
    assert EventGroup.objects.aggregate(n=Sum("count"))["n"] == 200
    for event in Event.objects.select_related("group")[:50]:
        pattern = grouping.normalise(event.message)
        subject = grouping.subject(event.endpoint_id, event.endpoint_name, event.pod)
        assert event.group.pattern == pattern
        assert event.group.fingerprint == grouping.fingerprint(event.kind, event.tenant_id, subject, pattern)
    # at most one unresolved group per problem (the product's constraint held through the COPY)
    unresolved = EventGroup.objects.unresolved().values("fingerprint").annotate(n=Count("id"))
    assert not unresolved.filter(n__gt=1).exists()


def test_the_product_writes_on_after_the_load(loaded):
    """Ids the loader gave explicitly are behind their sequences: new rows take the next ones."""
    tenant = Tenant.objects.create(name="after-the-load")
    assert tenant.pk == 6
    endpoint = Endpoint.objects.order_by("pk").last()
    event = Event.record("restart", "pod endpoint-49-v1-0 restarted (restart #1)", endpoint=endpoint)
    assert event.group.pk > 0 and event.pk > 200
