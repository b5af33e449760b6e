"""Capacity snapshots and their hourly rollup, written together.

Each pool's ledger is snapshotted every minute (CapacitySnapshot) and added, in the same
transaction, to its hour's CapacityHour: one upsert for every pool that adds the figures to the
hour's sums and keeps the larger peak (INSERT ... ON CONFLICT DO UPDATE, on PostgreSQL and on
SQLite alike), so the rollup always equals what the snapshots of that hour add up to. The
capacity page reads snapshots for its minute charts (up to six hours) and the rollup beyond, and
for the forecast's four weeks of hourly peaks (controlplane.console.history). `prune` keeps
snapshots CAPACITY_SNAPSHOT_RETENTION_DAYS and hours CAPACITY_HOUR_RETENTION_DAYS.
"""

from collections.abc import Iterable
from datetime import datetime, timedelta

from django.conf import settings
from django.db import connection, transaction

from controlplane.capacity.models import CapacityHour, CapacitySnapshot

HOUR = 3600
BATCH = 100  # rows per statement: 700 parameters, within SQLite's limit as within PostgreSQL's
SUMS = ("have_mu_sum", "sold_mu_sum", "used_mu_sum")


def hour_of(at: datetime) -> int:
    """Unix seconds at the start of the UTC hour `at` falls in."""
    return int(at.timestamp()) // HOUR * HOUR


def write(snapshots: Iterable[CapacitySnapshot]) -> list[CapacitySnapshot]:
    """Store the snapshots and add them to their pools' hours, in one transaction."""
    rows = list(snapshots)
    hours: dict[tuple[int, int], list[float]] = {}
    for s in rows:
        total = hours.setdefault((s.pool_id, hour_of(s.at)), [0, 0.0, 0.0, 0.0, s.used_mu_per_minute])
        total[0] += 1
        total[1] += s.have_mu_per_minute
        total[2] += s.sold_mu_per_minute
        total[3] += s.used_mu_per_minute
        total[4] = max(total[4], s.used_mu_per_minute)
    with transaction.atomic():
        created = CapacitySnapshot.objects.bulk_create(rows, batch_size=BATCH)
        added = sorted(hours.items())  # in key order: two writers lock the rows in the same order
        for i in range(0, len(added), BATCH):
            _add_to_hours(added[i : i + BATCH])
    return created


def _add_to_hours(hours: list[tuple[tuple[int, int], list[float]]]) -> None:
    table = connection.ops.quote_name(CapacityHour._meta.db_table)
    columns = ("pool_id", "start", "snapshots", *SUMS, "used_mu_peak")
    added = ", ".join(f"{c} = {table}.{c} + excluded.{c}" for c in ("snapshots", *SUMS))
    # CASE, not GREATEST (PostgreSQL) or MAX (SQLite): the one spelling both read
    peak = (
        f"used_mu_peak = CASE WHEN excluded.used_mu_peak > {table}.used_mu_peak"
        f" THEN excluded.used_mu_peak ELSE {table}.used_mu_peak END"
    )
    values = ", ".join(["(" + ", ".join(["%s"] * len(columns)) + ")"] * len(hours))
    with connection.cursor() as cursor:
        cursor.execute(
            f"INSERT INTO {table} ({', '.join(columns)}) VALUES {values}"
            f" ON CONFLICT (pool_id, start) DO UPDATE SET {added}, {peak}",
            [v for (pool_id, start), total in hours for v in (pool_id, start, *total)],
        )


def prune(now: datetime) -> None:
    """Delete snapshots and hours past their retention (each statement on its own: a sweep
    that fails leaves them to the next)."""
    CapacitySnapshot.objects.filter(
        at__lt=now - timedelta(days=settings.CAPACITY_SNAPSHOT_RETENTION_DAYS)
    ).delete()
    kept_since = hour_of(now - timedelta(days=settings.CAPACITY_HOUR_RETENTION_DAYS))
    CapacityHour.objects.filter(start__lt=kept_since).delete()
