"""Celery tasks of the capacity app: thin wrappers over plain functions."""

from celery import shared_task
from django.db import transaction
from django.utils import timezone

from capacity.models import CapacitySnapshot, GpuPool, pool_ledgers


def record_snapshots(now=None) -> int:
    """Write one CapacitySnapshot per pool; returns how many were written."""
    now = now or timezone.now()
    pools = list(GpuPool.objects.all())
    ledgers = pool_ledgers(pools)
    with transaction.atomic():
        CapacitySnapshot.objects.bulk_create(
            CapacitySnapshot(
                pool=pool,
                at=now,
                have_gpus=float(ledger.have_gpus),
                sold_gpus=float(ledger.sold_gpus),
                used_gpus=float(ledger.used_gpus),
                have_mu_per_minute=float(ledger.have_mu_per_minute),
                sold_mu_per_minute=float(ledger.sold_mu_per_minute),
                used_mu_per_minute=float(ledger.used_mu_per_minute),
            )
            for pool in pools
            for ledger in [ledgers[pool.pk]]
        )
    return len(pools)


@shared_task
def record_capacity_snapshot() -> int:
    return record_snapshots()
