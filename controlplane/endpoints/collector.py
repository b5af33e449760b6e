"""The collect stage: the routers' seconds into load buckets (the autoscaler's input) and into
usage (billing), under a lease of its own.

Celery beat runs `collect_pass` every AUTOSCALER_HORIZONTAL_INTERVAL_S (the `collect_load` task),
and the horizontal pass runs one before it decides, so that a decision sees the slot that has
just ended (a second pass within half a tick of another is skipped). Nothing of the deciders or
the actuators runs inside it: their failures never touch billing, and they read what it wrote
(LoadBucket rows, and its lease's cursor: the last bucket end collected).

Each pass writes the buckets of the slots that ended since its cursor (controlplane.endpoints.
samples.collect, one transaction), then bills whatever routers sent and was not billed yet,
whatever became of the buckets (each source's `bill`, one transaction per batch, each second
once however late it came). The cursor moves only once the buckets are committed: a pass that
fails before leaves its slots to the next.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from django.conf import settings
from django.db import transaction

from controlplane.endpoints import samples
from controlplane.endpoints.models import Endpoint, Lease

COLLECTOR = "collector"
# Batches of samples.BILL_BATCH billed per pass at most, so a pass ends well within its lease
# (LEASE_TTL_S) after a long outage: 10 x 10,000 router seconds, then the next pass goes on.
MAX_BILL_BATCHES = 10


@dataclass(frozen=True)
class CollectReport:
    collected: int  # the last bucket end collected, unix s (the cursor)
    billed: int  # router seconds (Redis) or posted rows (the database) billed


def collected_through() -> int:
    """The end of the last slot the collector has written buckets for, unix s (0: none yet)."""
    return Lease.objects.filter(name=COLLECTOR).values_list("cursor", flat=True).first() or 0


def collect_pass(now: datetime) -> CollectReport | None:
    """Write the buckets of the slots ended since the last pass, then bill what is not billed
    yet. None when another pass holds the lease or one ran less than half a tick ago."""
    lease = Lease.take(COLLECTOR, now, settings.AUTOSCALER_HORIZONTAL_INTERVAL_S / 2)
    if lease is None:
        return None
    src = samples.source()
    cursor, billed = lease.cursor, 0
    try:
        with transaction.atomic():
            endpoints = list(Endpoint.objects.order_by("id"))
            cursor = samples.collect(src, lease.cursor, now.timestamp(), endpoints)
    finally:  # billing, whatever became of the buckets
        try:
            for _ in range(MAX_BILL_BATCHES):
                done = src.bill(now)
                billed += done
                if done < samples.BILL_BATCH:
                    break
        finally:
            lease.release(now, cursor)
    return CollectReport(cursor, billed)
