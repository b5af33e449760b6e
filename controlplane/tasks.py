"""Celery tasks above the apps: the autoscaler's passes (controlplane.scaling) and the pod
mirror (controlplane.pods) on the cluster driver (controlplane.drivers), the ledger snapshots
(controlplane.selling refreshes each pool's ledger first) and the benchmarks
(controlplane.profile_benchmarks); thin wrappers over plain functions.

Each keeps the name it was registered under in its app's tasks module before it moved here
(controlplane.capacity.tasks.*, controlplane.endpoints.tasks.*), which CELERY_BEAT_SCHEDULE and
any task already queued name. Found by Celery's autodiscovery: controlplane is an installed app.
"""

from datetime import datetime

from celery import shared_task
from django.utils import timezone

from capacity.autoscaler.forecast import HISTORY_S
from controlplane import drivers, pods, profile_benchmarks, scaling
from controlplane.capacity import snapshots
from controlplane.capacity.models import CapacitySnapshot, GpuPool, ModelProfile
from controlplane.endpoints.models import LoadMinute
from controlplane.pool_ledgers import refresh_pools


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


@shared_task(name="controlplane.capacity.tasks.record_capacity_snapshot")
def record_capacity_snapshot() -> int:
    return record_snapshots()


@shared_task(name="controlplane.capacity.tasks.benchmark_due_profiles")
def benchmark_due_profiles() -> int:
    """Beat: queue a benchmark for every due profile; returns how many were queued."""
    due = list(profile_benchmarks.due_profiles(timezone.now()).values_list("pk", flat=True))
    for profile_id in due:
        run_profile_benchmark.delay(profile_id)
    return len(due)


@shared_task(name="controlplane.capacity.tasks.run_profile_benchmark")
def run_profile_benchmark(profile_id: int) -> str:
    """Benchmark one profile unless it is no longer due or another worker has it (safe twice)."""
    if not profile_benchmarks.claim(profile_id, timezone.now()):
        return "not due, or claimed elsewhere"
    profile = ModelProfile.objects.select_related("gpu_type").get(pk=profile_id)
    return profile_benchmarks.run_benchmark(profile).status


@shared_task(name="controlplane.endpoints.tasks.autoscale_horizontal")
def autoscale_horizontal() -> str:
    """Beat, every 5 s: decide replicas from the load buckets, declare them to the cluster."""
    now = timezone.now()
    report = scaling.horizontal_pass(drivers.driver(), now)
    if report is None:
        return "another pass holds the lease, or one ran less than half a tick ago"
    LoadMinute.objects.filter(end__lt=now.timestamp() - HISTORY_S).delete()  # older than any forecast reads
    return f"{report.decided} decided, {report.changed} changed, {report.failed} refused by the cluster"


@shared_task(name="controlplane.endpoints.tasks.autoscale_vertical")
def autoscale_vertical() -> str:
    """Beat, every 30 s: retune target concurrency per replica."""
    cluster = drivers.driver()
    if cluster is None:
        return "no cluster driver: nothing to retune"
    report = scaling.vertical_pass(cluster, timezone.now())
    if report is None:
        return "another pass holds the lease, or one ran less than half a tick ago"
    return f"{report.decided} decided, {report.changed} changed, {report.failed} refused by the cluster"


@shared_task(name="controlplane.endpoints.tasks.sync_pods")
def sync_pods() -> int:
    """Beat, every second: the cluster's pods and readiness into Pod rows (what routers route to)."""
    cluster = drivers.driver()
    return 0 if cluster is None else pods.sync_pods(cluster)  # ClusterError: the task fails, logged
