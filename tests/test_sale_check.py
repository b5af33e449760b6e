"""The sale check's short path (selling.pool_demands: the pool's other endpoints grouped by what
their replicas are counted from, packed beside the change) answers as the whole ledger does
(capacity.ledger.check_change on selling.pool_ledgers): the same yes or no, the same replicas
that fit, on generated pools of mixed TP sizes, several seeds."""

import random

import pytest

from capacity.ledger import Oversold, check_change
from controlplane import selling
from controlplane.capacity.models import GpuPool, ModelProfile, Reservation
from controlplane.endpoints.models import Endpoint
from controlplane.tenants.models import Tenant


def refusal(check, *args):
    try:
        check(*args)
    except Oversold as refused:
        return refused.fit_replicas, refused.ledger.committed_replicas
    return None


@pytest.mark.parametrize("seed", [1, 2, 3, 4])
def test_the_short_path_answers_as_the_whole_ledger(h100, seed):
    rng = random.Random(seed)
    pool = GpuPool.objects.create(name="p", gpu_type=h100, gpu_count=8, gpus_per_node=8)
    profiles = [
        ModelProfile.objects.create(
            model=f"tp{g}", gpu_type=h100, alpha=0, beta=0, gamma=1, gpus_per_replica=g
        )
        for g in (1, 2, 4, 8)
    ]
    tenant = Tenant.objects.create(name="t", gpu_quota=10_000)
    endpoints = Endpoint.objects.bulk_create(
        Endpoint(
            tenant=tenant, name=f"e{i}", profile=rng.choices(profiles, weights=[6, 3, 2, 1])[0], pool=pool,
            min_provisioned_concurrency=rng.choice([0, 8, 8, 16]), max_provisioned_concurrency=64,
            target_concurrency_per_replica=8, scale_to_zero_enabled=False,
        )
        for i in range(20)
    )  # fmt: skip
    Reservation.objects.bulk_create(
        Reservation(endpoint=e, mu_per_minute=rng.choice([50, 100, 150, 250]), sold_by="t")
        for e in endpoints
        if rng.random() < 0.3
    )
    # Nodes for about 8/7 of what is committed: full enough that some asks are refused.
    committed = selling.pool_ledgers([pool])[pool.pk].committed_gpus
    GpuPool.objects.filter(pk=pool.pk).update(gpu_count=8 * -(-committed // 7))
    pool.refresh_from_db()
    assert not selling.pool_ledgers([pool])[pool.pk].oversold
    refused = 0
    for endpoint in rng.sample(list(Endpoint.objects.with_related()), 12):
        current = getattr(getattr(endpoint, "reservation", None), "mu_per_minute", 0)
        asked = selling.commitment(endpoint, rng.choice([200, 400, 800, 1600]))
        replacing = selling.commitment(endpoint, current)
        ledger = selling.pool_ledgers([pool])[pool.pk]
        whole = refusal(check_change, "p", ledger, str(endpoint.pk), endpoint.profile.model, asked, replacing)
        short = refusal(selling.ensure_change, pool, endpoint, asked, replacing)
        assert short == whole, (endpoint.name, asked, replacing)
        refused += whole is not None
    assert 0 < refused < 12  # both answers were exercised
