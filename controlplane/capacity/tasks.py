"""Celery tasks of the capacity app: thin wrappers over plain functions."""

from datetime import datetime

from celery import shared_task
from django.utils import timezone

from controlplane.capacity import profile_benchmarks, snapshots
from controlplane.capacity.models import CapacitySnapshot, GpuPool, ModelProfile
from controlplane.selling import refresh_pools


def record_snapshots(now: datetime | None = None) -> int:
    """Store every pool's ledger afresh and write one CapacitySnapshot of each, added to its
    CapacityHour in the same transaction, then delete those past their retention; returns how
    many were written. Every minute, so a write that changed a pool without its refresh (none
    should) is in its stored ledger within one."""
    now = now or timezone.now()
    pools = list(GpuPool.objects.all())
    ledgers = {}
    for pool in pools:  # one pool's lock at a time: a sale waits for one pool's refresh at most
        ledgers.update(refresh_pools([pool.pk]))
    snapshots.write(
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
    snapshots.prune(now)
    return len(pools)


@shared_task
def record_capacity_snapshot() -> int:
    return record_snapshots()


@shared_task
def benchmark_due_profiles() -> int:
    """Beat: queue a benchmark for every due profile; returns how many were queued."""
    due = list(profile_benchmarks.due_profiles(timezone.now()).values_list("pk", flat=True))
    for profile_id in due:
        run_profile_benchmark.delay(profile_id)
    return len(due)


@shared_task
def run_profile_benchmark(profile_id: int) -> str:
    """Benchmark one profile unless it is no longer due or another worker has it (safe twice)."""
    if not profile_benchmarks.claim(profile_id, timezone.now()):
        return "not due, or claimed elsewhere"
    profile = ModelProfile.objects.select_related("gpu_type").get(pk=profile_id)
    return profile_benchmarks.run_benchmark(profile).status
