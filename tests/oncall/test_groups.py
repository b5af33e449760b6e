"""Events fold into groups as they are written, by every writer's path (record, save, bulk)."""

from datetime import UTC, datetime, timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from controlplane.oncall.models import Event, EventGroup

T0 = datetime(2026, 11, 29, 3, tzinfo=UTC)


def test_repeats_fold_with_their_count_first_and_last_time(owner, make_endpoint):
    chat = make_endpoint(owner, "chat")
    for i in range(5):
        Event.record(
            "restart", f"pod ep-{chat.pk}-v1-{i} restarted (restart #{i + 1}): OOMKilled, exit code 137",
            endpoint=chat, pod=f"ep-{chat.pk}-v1-{i}", severity="warning", time=T0 + timedelta(minutes=i),
        )  # fmt: skip
    Event.record("restart", "pod x restarted: Error, exit code 1", endpoint=chat, severity="warning", time=T0)
    oom, error = EventGroup.objects.order_by("-count")
    assert (oom.count, oom.first_at, oom.last_at, oom.tenant, oom.endpoint) == (
        5, T0, T0 + timedelta(minutes=4), owner, chat,
    )  # fmt: skip
    assert oom.pod == f"ep-{chat.pk}-v1-4" and "restart #5" in oom.message  # the latest
    assert error.count == 1
    assert set(Event.objects.filter(group=oom).values_list("pod", flat=True)) == {
        f"ep-{chat.pk}-v1-{i}" for i in range(5)
    }


def test_a_worse_repeat_reopens_an_acknowledged_group(owner):
    first = Event.record("benchmark", "fit refused: R2 0.81", tenant=owner, severity="warning")
    group = first.group
    group.acknowledge("opal", T0)
    assert group.state == "acknowledged"
    Event.record("benchmark", "fit refused: R2 0.42", tenant=owner, severity="critical")
    group.refresh_from_db()
    assert (group.state, group.severity, group.count) == ("open", "critical", 2)


def test_acknowledging_a_group_acknowledges_its_events(owner):
    events = [Event.record("hang", f"hung {i} s", tenant=owner, severity="critical") for i in range(3)]
    group = events[0].group
    assert group.acknowledge("opal", T0) is True
    assert group.acknowledge("carol", T0) is False  # the first acknowledgement stands
    assert set(Event.objects.values_list("acknowledged_by", flat=True)) == {"opal"}


def test_after_a_group_is_resolved_the_next_repeat_opens_a_new_one(owner):
    first = Event.record("hang", "hung 30 s", tenant=owner, severity="critical")
    assert first.group.resolve("opal", T0) is True
    assert first.group.resolve("opal", T0) is False
    again = Event.record("hang", "hung 45 s", tenant=owner, severity="critical")
    assert again.group_id != first.group_id and again.group.count == 1
    assert EventGroup.objects.filter(state="resolved").count() == 1


def test_quiet_groups_resolve_on_their_own(owner, settings):
    settings.ONCALL_RESOLVE_AFTER_S = 600
    now = datetime.now(UTC)
    old = Event.record("hang", "hung", tenant=owner, severity="critical", time=now - timedelta(seconds=601))
    fresh = Event.record(
        "restart", "restarted", tenant=owner, severity="warning", time=now - timedelta(seconds=5)
    )
    assert EventGroup.resolve_quiet(now) == 1
    old.group.refresh_from_db()
    fresh.group.refresh_from_db()
    assert (old.group.state, old.group.resolved_by, fresh.group.state) == (
        "resolved",
        "auto: no repeat",
        "open",
    )


def test_the_autoscalers_bulk_writes_fold_too(owner, make_endpoint):
    chat = make_endpoint(owner, "chat")
    Event.objects.bulk_create(
        [
            Event(kind="scale", tenant=owner, endpoint=chat, message=f"chat: replicas {i} -> {i + 1}")
            for i in range(4)
        ]
    )
    (group,) = EventGroup.objects.all()
    assert group.count == 4 and Event.objects.filter(group=group).count() == 4


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("severity", ["critical", "info"])  # folded in Python; in one statement
def test_two_writers_of_one_new_problem_make_one_group(owner, severity):
    """Both find no group and both create one: the constraint lets one win, the other counts in."""
    import threading

    from django.db import connection

    barrier = threading.Barrier(2)
    errors = []

    def write(i):
        try:
            barrier.wait(5)
            Event.record("hang", f"hung {i} s", tenant=owner, severity=severity)
        except Exception as exc:  # reported below
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=write, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert not errors
    assert list(EventGroup.objects.values_list("count", flat=True)) == [2]


def test_one_crash_across_a_workloads_pods_is_one_group(owner):
    for i in range(12):  # the endpoint is gone from the report: only the pods name the problem
        pod = f"ep-7-v1-{i}"
        Event.record("restart", f"pod {pod} restarted: Error, exit code 1", pod=pod, severity="warning")
    other = "ep-9-v1-0"
    Event.record("restart", f"pod {other} restarted: Error, exit code 1", pod=other, severity="warning")
    assert sorted(EventGroup.objects.values_list("count", flat=True)) == [1, 12]  # endpoint 9's is another


# An info event whose group is info too (or new) is folded and written in one statement; any
# other goes through EventGroup.fold. Both must leave the same group.
GROUP_FIELDS = [f.name for f in EventGroup._meta.concrete_fields if f.name not in ("id", "fingerprint")]


def info_repeats(owner, chat):
    """Scale events of one endpoint, their times out of order: the latest keeps message and pod."""
    for minutes, pod in ((5, "a"), (2, "b"), (9, "c"), (9, "d"), (1, "e")):
        Event.record(
            "scale", f"chat: replicas {minutes} -> {minutes + 1}", endpoint=chat, pod=pod,
            time=T0 + timedelta(minutes=minutes),
        )  # fmt: skip
    return list(EventGroup.objects.values(*GROUP_FIELDS))


def test_an_info_event_is_folded_and_written_in_one_statement_as_fold_would(
    owner, make_endpoint, monkeypatch
):
    chat = make_endpoint(owner, "chat")
    with CaptureQueriesContext(connection) as queries:
        event = Event.record("scale", "chat: replicas 1 -> 2", endpoint=chat, time=T0)
    assert len(queries) == 1, [q["sql"] for q in queries]
    assert Event.objects.get(pk=event.pk).group_id == event.group_id == EventGroup.objects.get().pk
    Event.objects.all().delete()
    EventGroup.objects.all().delete()

    in_one = info_repeats(owner, chat)
    assert Event.objects.count() == 5 and Event.objects.filter(group__isnull=True).count() == 0
    Event.objects.all().delete()
    EventGroup.objects.all().delete()
    monkeypatch.setattr(Event, "_fold_and_insert", lambda self: False)
    in_python = info_repeats(owner, chat)
    assert in_one == in_python
    (group,) = in_python
    assert (group["count"], group["first_at"], group["last_at"], group["pod"]) == (
        5, T0 + timedelta(minutes=1), T0 + timedelta(minutes=9), "d",
    )  # fmt: skip


def test_an_info_repeat_of_a_warning_group_is_folded_in_python(owner):
    warned = Event.record("benchmark", "fit refused: R2 0.81", tenant=owner, severity="warning")
    info = Event.record("benchmark", "fit refused: R2 0.42", tenant=owner)
    group = EventGroup.objects.get()
    assert (group.count, group.severity, group.message) == (2, "warning", "fit refused: R2 0.42")
    assert list(Event.objects.order_by("id").values_list("pk", "group_id")) == [
        (warned.pk, group.pk), (info.pk, group.pk),
    ]  # fmt: skip


def test_an_info_repeat_after_its_group_is_resolved_opens_a_new_one(owner):
    first = Event.record("reservation", "opal sold 100 MU/min on chat (was 0)", tenant=owner)
    assert first.group.resolve("opal", T0) is True
    again = Event.record("reservation", "opal sold 300 MU/min on chat (was 100)", tenant=owner)
    assert again.group_id != first.group_id and again.group.count == 1
    assert sorted(EventGroup.objects.values_list("state", flat=True)) == ["open", "resolved"]


def test_an_info_event_with_its_own_id_or_a_naive_time_is_folded_in_python(owner):
    Event(kind="scale", tenant=owner, message="chat: replicas 1 -> 2", time=T0, pk=987_654).save()
    assert Event.objects.get().pk == 987_654 and EventGroup.objects.get().count == 1
    naive = T0.replace(tzinfo=None)
    with pytest.raises(TypeError):  # as fold refuses it: an aware last_at and a naive time
        Event.record("scale", "chat: replicas 2 -> 3", tenant=owner, time=naive)
