"""Celery is wired: a real worker consumes from the real Redis broker and writes to PostgreSQL."""

import os
import time

import pytest
from celery.contrib.testing.worker import start_worker
from django.conf import settings

from controlplane.capacity.models import CapacitySnapshot
from controlplane.celery import app
from controlplane.tasks import record_capacity_snapshot, record_snapshots


def test_the_beat_schedule_names_registered_tasks():
    app.loader.import_default_modules()
    for entry in settings.CELERY_BEAT_SCHEDULE.values():
        assert entry["task"] in app.tasks, entry["task"]


def test_a_snapshot_records_each_pool(pool, owner, make_endpoint):
    from controlplane.selling import sell

    sell(make_endpoint(owner, "chat"), mu_per_minute=300, best_effort_allowed=True, sold_by="t")
    assert record_snapshots() == 1
    snapshot = CapacitySnapshot.objects.get()
    assert (snapshot.have_gpus, snapshot.sold_gpus, snapshot.sold_mu_per_minute) == (8, 3, 300)


@pytest.mark.celery
@pytest.mark.django_db(transaction=True)
def test_a_real_worker_runs_a_task_from_redis(pool):
    broker = os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/15")
    app.conf.broker_url = broker
    app.conf.broker_transport_options = {}
    try:
        with start_worker(app, pool="solo", perform_ping_check=False, shutdown_timeout=10):
            record_capacity_snapshot.delay()
            deadline = time.monotonic() + 20
            while not CapacitySnapshot.objects.exists() and time.monotonic() < deadline:
                time.sleep(0.05)  # waiting on another process's write, not faking time
        assert CapacitySnapshot.objects.filter(pool=pool, have_gpus=8).exists()
    finally:
        app.conf.broker_url = settings.CELERY_BROKER_URL
