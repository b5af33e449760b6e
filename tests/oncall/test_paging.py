"""Paging: Alertmanager webhook JSON to a real receiver on 127.0.0.1, once per group, resolved
when it clears, retried with backoff; and the contract with a real Celery worker."""

import os
import time
from datetime import UTC, datetime, timedelta

import pytest
from celery.contrib.testing.worker import start_worker

from controlplane.celery import app
from controlplane.oncall import paging
from controlplane.oncall.models import Event, EventGroup
from tests.oncall.receiver import Receiver

NOW = datetime(2026, 11, 29, 3, tzinfo=UTC)


@pytest.fixture
def receiver(settings):
    with Receiver() as r:
        settings.ONCALL_WEBHOOK_URL = r.url
        yield r


def test_a_critical_group_fires_once_and_resolves_once(receiver, owner, make_endpoint):
    chat = make_endpoint(owner, "chat")
    for i in range(3):
        Event.record("hang", f"engine hung: {i + 3} probes failed", endpoint=chat, severity="critical",
                     pod="ep-1-v1-1", time=NOW + timedelta(seconds=i))  # fmt: skip
        paging.deliver_due(NOW + timedelta(seconds=i))
    (fired,) = receiver.bodies
    assert fired["version"] == "4" and fired["status"] == "firing"
    (alert,) = fired["alerts"]
    assert alert["labels"] == {
        "alertname": "mu_hang", "severity": "critical", "kind": "hang", "tenant": "owner",
        "endpoint": "chat", "pod": "ep-1-v1-1", "group_id": str(Event.objects.first().group_id),
    }  # fmt: skip
    assert alert["annotations"]["summary"] == "engine hung: 3 probes failed"
    assert alert["annotations"]["runbook_url"] == "http://127.0.0.1:8000/console/oncall/runbooks/hang/"
    assert alert["startsAt"] == "2026-11-29T03:00:00Z" and alert["endsAt"] == "0001-01-01T00:00:00Z"
    assert alert["generatorURL"].startswith("http://127.0.0.1:8000/console/oncall/?group=")
    assert fired["text"].startswith("[FIRING] critical hang on owner/chat: engine hung: 3 probes failed")
    group = EventGroup.objects.get()
    group.resolve("opal", NOW + timedelta(minutes=5))
    paging.deliver_due(NOW + timedelta(minutes=5))
    paging.deliver_due(NOW + timedelta(minutes=6))
    assert [b["status"] for b in receiver.bodies] == ["firing", "resolved"]
    resolved = receiver.bodies[1]["alerts"][0]
    assert resolved["endsAt"] == "2026-11-29T03:05:00Z" and resolved["startsAt"] == alert["startsAt"]
    assert receiver.bodies[1]["text"].startswith("[RESOLVED]")


def test_warnings_page_only_when_asked_and_info_never(receiver, owner, settings):
    Event.record("restart", "restarted", tenant=owner, severity="warning")
    Event.record("scale", "replicas 1 -> 2", tenant=owner)
    assert paging.deliver_due(NOW) == 0 and receiver.bodies == []
    settings.ONCALL_PAGE_WARNINGS = True
    Event.record("restart", "restarted", tenant=owner, severity="warning")
    paging.deliver_due(NOW)
    assert [b["alerts"][0]["labels"]["severity"] for b in receiver.bodies] == ["warning"]


def test_a_silenced_group_does_not_page(receiver, owner):
    first = Event.record("benchmark", "sweep failed at shape (16, 1)", tenant=owner, severity="critical")
    first.group.silence("opal", datetime.now(UTC) + timedelta(hours=1), "known: GPU swapped")
    EventGroup.objects.filter(pk=first.group_id).update(page_due=False)  # silenced before delivery
    Event.record("benchmark", "sweep failed at shape (16, 16)", tenant=owner, severity="critical")
    paging.deliver_due(datetime.now(UTC))
    assert receiver.bodies == []


def test_a_silenced_warning_that_turns_critical_pages_and_the_silence_is_lifted(receiver, owner):
    first = Event.record("hang", "probe unanswered for 21 s", tenant=owner, severity="warning")
    first.group.silence("opal", datetime.now(UTC) + timedelta(days=7), "noisy warning")
    Event.record("hang", "probe unanswered for 33 s", tenant=owner, severity="warning")
    paging.deliver_due(datetime.now(UTC))
    assert receiver.bodies == []  # the silence holds while it is the problem that was silenced
    Event.record("hang", "probe unanswered for 95 s", tenant=owner, severity="critical")
    paging.deliver_due(datetime.now(UTC))
    assert [b["alerts"][0]["labels"]["severity"] for b in receiver.bodies] == ["critical"]
    group = EventGroup.objects.get(pk=first.group_id)
    assert group.state == "open" and group.silenced_until is None and group.silenced_by == "opal"
    assert group.silence_reason == "lifted when it rose from warning to critical; was: noisy warning"


def test_a_fired_warning_that_turns_critical_pages_again_with_the_new_severity(receiver, owner, settings):
    settings.ONCALL_PAGE_WARNINGS = True
    first = Event.record("hang", "probe unanswered for 21 s", tenant=owner, severity="warning")
    paging.deliver_due(NOW)
    Event.record("hang", "probe unanswered for 40 s", tenant=owner, severity="warning")
    paging.deliver_due(NOW)  # a repeat at the same severity is not news
    Event.record("hang", "probe unanswered for 95 s", tenant=owner, severity="critical")
    Event.record("hang", "probe unanswered for 99 s", tenant=owner, severity="critical")
    paging.deliver_due(NOW)
    labels = [b["alerts"][0]["labels"] for b in receiver.bodies]
    assert [(b["status"], x["severity"]) for b, x in zip(receiver.bodies, labels, strict=True)] == [
        ("firing", "warning"),
        ("firing", "critical"),
    ]
    assert {x["group_id"] for x in labels} == {str(first.group_id)}  # one alert, its labels changed


def test_a_failing_receiver_is_retried_with_backoff(owner, settings):
    with Receiver(fail_first=2) as receiver:
        settings.ONCALL_WEBHOOK_URL = receiver.url
        Event.record("crash_loop", "pod looping", tenant=owner, severity="critical")
        paging.deliver_due(NOW)
        group = EventGroup.objects.get()
        assert (group.page_attempts, group.page_retry_at) == (1, NOW + timedelta(seconds=5))
        assert "503" in group.page_error
        assert paging.deliver_due(NOW + timedelta(seconds=4)) == 0  # not yet due
        paging.deliver_due(NOW + timedelta(seconds=5))
        group.refresh_from_db()
        assert (group.page_attempts, group.page_retry_at) == (2, NOW + timedelta(seconds=15))
        paging.deliver_due(NOW + timedelta(seconds=15))
        group.refresh_from_db()
        assert (group.paged, group.page_due, group.page_attempts) == ("firing", False, 0)
        assert len(receiver.bodies) == 1
    assert [paging.backoff_s(a) for a in (1, 2, 3, 8, 20)] == [5, 10, 20, 600, 600]


def test_an_unreachable_receiver_is_retried_too(owner, settings):
    with Receiver() as gone:
        url = gone.url
    settings.ONCALL_WEBHOOK_URL = url  # nothing listens there now
    Event.record("hang", "hung", tenant=owner, severity="critical")
    paging.deliver_due(NOW)
    group = EventGroup.objects.get()
    assert group.page_due and group.page_attempts == 1 and group.page_error


def test_a_delivery_claimed_by_another_worker_is_not_sent_twice(receiver, owner):
    Event.record("hang", "hung", tenant=owner, severity="critical")
    group = EventGroup.objects.get()
    EventGroup.objects.filter(pk=group.pk).update(page_retry_at=NOW + timedelta(seconds=60))  # claimed
    assert paging.deliver_due(NOW) == 0 and receiver.bodies == []


@pytest.mark.stack
def test_a_bad_webhook_url_stops_the_start(monkeypatch):
    import subprocess
    import sys

    env = {**os.environ, "ONCALL_WEBHOOK_URL": "ftp://pager", "DJANGO_SETTINGS_MODULE": "tests.settings"}
    run = subprocess.run(
        [sys.executable, "-c", "import django; django.setup()"], env=env, capture_output=True, text=True
    )
    assert run.returncode != 0 and "ONCALL_WEBHOOK_URL='ftp://pager' must be an http://" in run.stderr


@pytest.mark.celery
@pytest.mark.django_db(transaction=True)
def test_a_critical_event_posted_to_the_api_reaches_the_webhook_through_a_real_worker(
    operator_client, owner, make_endpoint, settings
):
    """The contract: with ONCALL_WEBHOOK_URL set, a critical event POSTed to /api/v1/events/
    reaches the webhook within 15 s, its message in the body, through a real Celery worker."""
    chat = make_endpoint(owner, "chat")
    broker = os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/15")
    app.conf.broker_url = broker
    app.conf.broker_transport_options = {}
    try:
        app.control.purge()  # what earlier tests queued without a worker is not this one's to wait on
        with (
            Receiver() as receiver,
            start_worker(app, pool="solo", perform_ping_check=False, shutdown_timeout=10),
        ):
            settings.ONCALL_WEBHOOK_URL = receiver.url
            message = "engine hung: probe unanswered for 20.0 s (deadline 20 s) with no progress"
            started = time.monotonic()
            posted = operator_client.post(
                "/api/v1/events/",
                {
                    "kind": "hang",
                    "severity": "critical",
                    "pod": "ep-1-v1-1",
                    "message": message,
                    "endpoint": chat.pk,
                },
                format="json",
            )
            assert posted.status_code == 201, posted.content
            assert receiver.arrived.wait(15), "no page within 15 s"
            took = time.monotonic() - started
        assert message.encode() in receiver.raw[0] and receiver.bodies[0]["status"] == "firing"
        print(f"critical event to webhook: {took:.2f} s")
        assert EventGroup.objects.get().paged == "firing"
    finally:
        app.conf.broker_url = settings.CELERY_BROKER_URL
