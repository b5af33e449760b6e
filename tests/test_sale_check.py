"""The sale check's short path (pool_ledgers.alike_allocations: the pool's other endpoints grouped by what
their replicas are counted from, packed beside the change) answers as the whole ledger does
(capacity.ledger.check_change on pool_ledgers.pool_ledgers): the same yes or no, the same replicas
that fit, on generated pools of mixed TP sizes, several seeds."""

import random

import pytest

from capacity.ledger import Oversold, as_json_number, check_change
from controlplane import pool_ledgers, selling, tenant_limits
from controlplane.capacity.models import GpuPool, ModelProfile, Reservation
from controlplane.endpoints.models import Endpoint
from controlplane.tenants.models import Tenant


def refusal(check, *args):
    try:
        check(*args)
    except Oversold as refused:
        return refused.fit_replicas, refused.ledger.committed_replicas
    return None


def tensor_parallel_profiles(h100) -> list[ModelProfile]:
    """A model on 1, 2, 4 and 8 GPUs a replica, each 1 MU a request."""
    return [
        ModelProfile.objects.create(
            model=f"tp{g}", gpu_type=h100, alpha=0, beta=0, gamma=1, gpus_per_replica=g
        )
        for g in (1, 2, 4, 8)
    ]


def fill_to_eight_sevenths(pool: GpuPool) -> None:
    """Nodes for about 8/7 of what the pool commits: full enough that some asks are refused."""
    committed = pool_ledgers.pool_ledgers([pool])[pool.pk].committed_gpus
    GpuPool.objects.filter(pk=pool.pk).update(gpu_count=8 * -(-committed // 7))


@pytest.mark.parametrize("seed", [1, 2, 3, 4])
def test_the_short_path_answers_as_the_whole_ledger(h100, seed):
    rng = random.Random(seed)
    pool = GpuPool.objects.create(name="p", gpu_type=h100, gpu_count=8, gpus_per_node=8)
    profiles = tensor_parallel_profiles(h100)
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
    fill_to_eight_sevenths(pool)
    pool.refresh_from_db()
    assert not pool_ledgers.pool_ledgers([pool])[pool.pk].oversold
    refused = 0
    for endpoint in rng.sample(list(Endpoint.objects.with_related()), 12):
        current = getattr(getattr(endpoint, "reservation", None), "mu_per_minute", 0)
        asked = tenant_limits.commitment(endpoint, rng.choice([200, 400, 800, 1600]))
        replacing = tenant_limits.commitment(endpoint, current)
        ledger = pool_ledgers.pool_ledgers([pool])[pool.pk]
        whole = refusal(check_change, "p", ledger, str(endpoint.pk), endpoint.profile.model, asked, replacing)
        short = refusal(selling.ensure_change, pool, endpoint, asked, replacing)
        assert short == whole, (endpoint.name, asked, replacing)
        refused += whole is not None
    assert 0 < refused < 12  # both answers were exercised


@pytest.mark.parametrize("seed", [5, 6, 7])
def test_a_refusal_carries_the_whole_ledgers_figures(h100, seed):
    """The refused check builds its 409's ledger from the rows it read for the check (one query,
    no names): each figure the 409 shows, and each model's, is the one pool_ledgers.pool_ledgers
    gives for that pool, with metered MU, ready pods (and not-ready ones, not counted) and the
    changed endpoint's own sale and pods in it."""
    from controlplane.api.errors import LEDGER_FIGURES, oversold_body
    from controlplane.endpoints.models import Pod

    rng = random.Random(seed)
    pool = GpuPool.objects.create(name="p", gpu_type=h100, gpu_count=64, gpus_per_node=8)
    elsewhere = GpuPool.objects.create(name="q", gpu_type=h100, gpu_count=64, gpus_per_node=8)
    profiles = tensor_parallel_profiles(h100)
    tenant = Tenant.objects.create(name="t", gpu_quota=10_000)
    endpoints = Endpoint.objects.bulk_create(
        Endpoint(
            tenant=tenant, name=f"e{i}", profile=rng.choice(profiles),
            pool=rng.choice([pool, pool, elsewhere]),
            min_provisioned_concurrency=rng.choice([0, 8, 16]), max_provisioned_concurrency=64,
            target_concurrency_per_replica=8, scale_to_zero_enabled=False,
            used_mu_per_minute=rng.choice([0.0, 12.5, 40.25, 100.0]),
        )
        for i in range(30)
    )  # fmt: skip
    Reservation.objects.bulk_create(
        Reservation(endpoint=e, mu_per_minute=rng.choice([50, 100, 150, 250]), sold_by="t")
        for e in endpoints
        if rng.random() < 0.4
    )
    Pod.objects.bulk_create(
        Pod(endpoint=e, name=f"{e.name}-{j}", url="http://127.0.0.1:9", ready=j < 2)
        for e in endpoints
        for j in range(rng.choice([0, 1, 3]))
    )
    mine = next(e for e in Endpoint.objects.with_related().filter(pool=pool) if e.pods.filter(ready=True))
    current = getattr(getattr(mine, "reservation", None), "mu_per_minute", 0)
    with pytest.raises(Oversold) as refused:
        selling.ensure_change(
            pool, mine, tenant_limits.commitment(mine, 100_000), tenant_limits.commitment(mine, current)
        )
    whole = pool_ledgers.pool_ledgers([pool])[pool.pk]
    assert whole.used_gpus > 0 and whole.sold_mu_per_minute > 0 and whole.used_mu_per_minute > 0
    body = oversold_body(refused.value)
    assert {name: body[name] for name in LEDGER_FIGURES} == {
        name: as_json_number(getattr(whole, name)) for name in LEDGER_FIGURES
    }
    assert refused.value.ledger.models == whole.models
    assert refused.value.ledger.default_mu_per_gpu == whole.default_mu_per_gpu
    assert refused.value.ledger.packing.free_per_node == whole.packing.free_per_node


@pytest.mark.parametrize("seed", [8, 9, 10])
def test_rollouts_in_the_pool_are_counted_alike_on_both_paths(h100, seed):
    """Endpoints whose rollout runs commit each version its share of the larger of what they
    commit and hold, of its own shape; the old version's ready pods are its own. The sale
    check's grouped read counts them as pool_ledgers.pool_ledgers does: the same answers on the
    other endpoints' sales, a refusal's figures the whole ledger's, and the committed replicas
    what selling.endpoint_commitments says per endpoint."""
    from controlplane.api.errors import LEDGER_FIGURES, oversold_body
    from controlplane.endpoints.models import Pod, Rollout

    rng = random.Random(seed)
    pool = GpuPool.objects.create(name="p", gpu_type=h100, gpu_count=64, gpus_per_node=8)
    profiles = tensor_parallel_profiles(h100)
    tenant = Tenant.objects.create(name="t", gpu_quota=10_000)
    endpoints = Endpoint.objects.bulk_create(
        Endpoint(
            tenant=tenant, name=f"e{i}", profile=rng.choices(profiles, weights=[6, 3, 2, 1])[0], pool=pool,
            min_provisioned_concurrency=rng.choice([0, 8, 16]), max_provisioned_concurrency=64,
            target_concurrency_per_replica=8, desired_replicas=rng.choice([0, 1, 2, 4]), version=2,
        )
        for i in range(24)
    )  # fmt: skip
    Reservation.objects.bulk_create(
        Reservation(endpoint=e, mu_per_minute=rng.choice([50, 100, 250]), sold_by="t")
        for e in endpoints
        if rng.random() < 0.3
    )
    rolling = rng.sample(endpoints, 8)
    for e in rolling:
        phase, canary, promoted = rng.choice(
            [("starting", 0, False), ("starting", 50, False), ("starting", 10, True), ("canary", 10, False),
             ("canary", 50, False), ("draining", 0, False)]
        )  # fmt: skip
        new = {"starting": canary if promoted else 0, "canary": canary, "draining": 100}[phase]
        Rollout.objects.create(
            endpoint=e, from_version=1, to_version=2, to_profile=e.profile, phase=phase, new_percent=new,
            from_profile=rng.choice([p for p in profiles if p != e.profile]), canary_percent=canary,
            promoted=promoted,
        )  # fmt: skip
    Pod.objects.bulk_create(
        Pod(endpoint=e, name=f"{e.name}-{v}-{j}", url="http://127.0.0.1:9", ready=True, version=v)
        for e in endpoints
        for v in ((1, 2) if e in rolling else (2,))
        for j in range(rng.choice([0, 1, 2]))
    )
    fill_to_eight_sevenths(pool)
    pool.refresh_from_db()
    whole = pool_ledgers.pool_ledgers([pool])[pool.pk]
    assert not whole.oversold
    by_endpoint = Endpoint.objects.with_related()
    assert whole.committed_replicas == sum(
        v.commitment.replicas
        for e in by_endpoint
        for v in selling.endpoint_commitments(
            e, getattr(getattr(e, "reservation", None), "mu_per_minute", 0), pool_ledgers.running_rollout(e)
        )
    )
    assert whole.used_gpus > 0
    answers = []
    for endpoint in rng.sample([e for e in by_endpoint if e not in rolling], 10):
        current = getattr(getattr(endpoint, "reservation", None), "mu_per_minute", 0)
        asked = tenant_limits.commitment(endpoint, rng.choice([400, 1600, 3200]))
        replacing = tenant_limits.commitment(endpoint, current)
        answer = refusal(check_change, "p", whole, str(endpoint.pk), endpoint.profile.model, asked, replacing)
        try:
            selling.ensure_change(pool, endpoint, asked, replacing)
            short = None
        except Oversold as refused:
            short = refused.fit_replicas, refused.ledger.committed_replicas
            body = oversold_body(refused)
            assert {name: body[name] for name in LEDGER_FIGURES} == {
                name: as_json_number(getattr(whole, name)) for name in LEDGER_FIGURES
            }
        assert short == answer, endpoint.name
        answers.append(answer)
    assert any(answers) and not all(answers)  # both answers were exercised


@pytest.mark.django_db(transaction=True)
def test_the_sale_lock_takes_the_tenant_before_the_pool(h100):
    """A sale (selling.check_sale) locks both rows in one statement in the order every writer takes
    them (tenant, then pool): while the pool is held elsewhere, the waiting sale already holds
    its tenant, as locked_tenant then locked_pools would."""
    import threading

    import psycopg
    from django.db import connection

    if connection.vendor != "postgresql":
        pytest.skip("row locks need PostgreSQL (SQLite serialises all writers anyway)")
    tenant = Tenant.objects.create(name="t")
    pool = GpuPool.objects.create(name="p", gpu_type=h100, gpu_count=8, gpus_per_node=8)
    s = connection.settings_dict
    conninfo = psycopg.conninfo.make_conninfo(
        dbname=s["NAME"], user=s["USER"], password=s["PASSWORD"] or None, host=s["HOST"], port=s["PORT"]
    )
    holder, seller, probe = (psycopg.connect(conninfo) for _ in range(3))
    holder.execute("SELECT 1 FROM capacity_gpupool WHERE id = %s FOR UPDATE", [pool.pk])
    waiting = threading.Thread(target=seller.execute, args=(pool_ledgers.lock_sql(), [tenant.pk, pool.pk]))
    waiting.start()
    try:
        # Until the seller waits on the pool, the tenant is free; then it is held.
        held = False
        for _ in range(500):
            try:
                probe.execute("SELECT 1 FROM tenants_tenant WHERE id = %s FOR UPDATE NOWAIT", [tenant.pk])
                probe.rollback()
            except psycopg.errors.LockNotAvailable:
                probe.rollback()
                held = True
                break
            waiting.join(timeout=0.01)
        assert held and waiting.is_alive()  # the tenant is held, the pool still awaited
        holder.rollback()
        waiting.join(timeout=10)
        assert not waiting.is_alive()
    finally:
        holder.close()  # frees the seller, should the assertions fail first
        waiting.join(timeout=10)
        for conn in (seller, probe):
            conn.close()
