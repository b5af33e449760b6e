"""A process of the embedded stack that died, as `make run`'s supervisor records it: an on-call
event (a warning restart, a critical crash loop) whose log tail the operator's page shows, and
that no tenant sees."""

import io

import pytest
from django.core.management import CommandError, call_command

from controlplane.oncall.models import SETTLE, Event

TAIL = "[2026-12-05 12:00:00,000: CRITICAL/MainProcess] Unrecoverable error: JSONDecodeError('x')"


def record(monkeypatch, *args: str, tail: str = TAIL) -> None:
    monkeypatch.setattr("sys.stdin", io.StringIO(f"Traceback (most recent call last):\n{tail}\n"))
    call_command("record_stack_event", *args, stdout=io.StringIO())


@pytest.mark.django_db
def test_a_death_is_an_event_with_its_log_on_the_operators_page_and_not_a_tenants(
    monkeypatch, operator_web, owner_web
):
    record(monkeypatch, "celery", "--exit-code", "1", "--ran-s", "130", "--restart-in-s", "1",
           "--restarts", "1", "--log", "var/celery.log")  # fmt: skip
    event = Event.objects.get(kind="restart")
    assert (event.severity, event.pod, event.tenant_id) == ("warning", "stack-celery", None)
    assert event.detail["log_tail"][-1] == TAIL and event.detail["exit_code"] == 1
    Event.objects.filter(pk=event.pk).update(recorded_at=event.recorded_at - 2 * SETTLE)  # settled: listed
    page = operator_web.get("/console/oncall/?view=events").content.decode()
    assert "celery of the embedded stack exited with code 1" in page
    assert "Unrecoverable error: JSONDecodeError(&#x27;x&#x27;)" in page  # escaped, in the row
    assert "the end of var/celery.log" in page
    assert "Unrecoverable error" not in owner_web.get("/console/oncall/?view=events").content.decode()


@pytest.mark.django_db
def test_quick_deaths_in_a_row_are_a_critical_crash_loop_in_one_group(monkeypatch):
    for restarts in (3, 4):
        record(monkeypatch, "router", "--exit-code", "-9", "--ran-s", "0.4",
               "--restart-in-s", str(2**restarts), "--restarts", str(restarts), "--crash-loop")  # fmt: skip
    events = Event.objects.filter(kind="crash_loop")
    assert [e.severity for e in events] == ["critical", "critical"]
    assert "router of the embedded stack was killed by signal 9" in events[0].message
    assert events[0].group_id == events[1].group_id and events[0].group.count == 2


@pytest.mark.django_db
def test_a_process_name_out_of_bounds_is_refused_naming_it(monkeypatch):
    with pytest.raises(CommandError, match="process must be 1-40 characters"):
        record(
            monkeypatch,
            "x" * 41,
            "--exit-code",
            "1",
            "--ran-s",
            "1",
            "--restart-in-s",
            "1",
            "--restarts",
            "1",
        )


@pytest.mark.django_db
def test_a_stack_death_alone_puts_the_attention_panel_in_alarm_naming_the_process(
    monkeypatch, operator_web, owner_web
):
    calm = operator_web.get("/console/oncall/attention/").content.decode()
    assert 'class="attention "' in calm and "stack-celery" not in calm
    for restarts in (1, 2):
        record(monkeypatch, "celery", "--exit-code", "1", "--ran-s", "130", "--restart-in-s", "1",
               "--restarts", str(restarts), "--log", "var/celery.log")  # fmt: skip
    panel = operator_web.get("/console/oncall/attention/").content.decode()
    attention = panel.split("</section>")[0]
    assert 'class="attention alarm"' in attention  # no critical: the warning restarts alone
    assert "own processes died" in attention and "stack-celery</a> \u00d72" in attention
    page = operator_web.get("/console/oncall/").content.decode()
    assert "No problems under these filters" not in page and "stack-celery" in page
    tenant = owner_web.get("/console/oncall/attention/").content.decode()
    assert "stack-celery" not in tenant and 'class="attention "' in tenant  # the fleet's, not a tenant's
