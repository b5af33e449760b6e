"""The on-call page for people who are paged: groups, the default view, actions, runbooks."""

import re
from datetime import UTC, datetime, timedelta
from pathlib import Path

from django.conf import settings

from controlplane.oncall.models import SETTLE, Event, EventGroup
from tests.console.conftest import member_client

ROOT = Path(settings.BASE_DIR)


def group_rows(html: str) -> list[str]:
    body = re.search(r'<tbody id="group-rows">(.*?)</tbody>', html, re.S)
    assert body, "no groups table"
    return re.findall(r'<tr id="group-\d+".*?</tr>', body.group(1), re.S)


def test_two_hundred_repeats_are_one_group_and_barely_grow_the_page(operator_web, owner, make_endpoint):
    """The contract: 200 warnings of one kind on one endpoint, messages differing only in numbers,
    are one group written x200, and the page grows by no more than 10 KB."""
    chat = make_endpoint(owner, "chat")
    Event.record("scale", "chat: replicas 1 -> 2: load", endpoint=chat)  # info: not in the default view
    before = operator_web.get("/console/oncall/").content
    now = datetime.now(UTC)
    for i in range(200):
        Event.record(
            "restart",
            f"pod ep-{chat.pk}-v1-{i} container pod restarted (restart #{i + 1}): OOMKilled, exit code 137"
            f" after {i * 1.7:.1f} s",
            endpoint=chat, severity="warning", pod=f"ep-{chat.pk}-v1-{i}",
            time=now - timedelta(minutes=200 - i),
        )  # fmt: skip
    after = operator_web.get("/console/oncall/").content
    rows = group_rows(after.decode())
    assert len(rows) == 1 and "\u00d7200" in rows[0] and 'data-kind="restart"' in rows[0]
    assert len(after) - len(before) <= 10_240, len(after) - len(before)
    print(f"200 repeats: one group, the page {len(before)} -> {len(after)} bytes")
    assert "replicas 1 -&gt; 2" not in after.decode()  # the info event
    everything = operator_web.get("/console/oncall/?severity=any").content.decode()
    assert "replicas 1 -&gt; 2" in everything and len(group_rows(everything)) == 2
    # its events, one click away: the group's link filters the event list
    group = EventGroup.objects.get(kind="restart")
    # The list shows settled events only (recorded SETTLE ago: none can be overtaken); these were
    # just written, so they are given the age they would have by the time on-call clicks.
    Event.objects.filter(group=group).update(recorded_at=datetime.now(UTC) - SETTLE - timedelta(seconds=1))
    listed = operator_web.get(f"/console/oncall/?group={group.pk}").content.decode()
    assert listed.count('<tr id="event-') == 50  # a page of the tail


def test_the_sparkline_is_an_inline_svg_drawn_without_script_or_style(operator_web, owner):
    now = datetime.now(UTC)
    for hours_ago in (0, 0, 0, 5):
        Event.record("hang", "hung", tenant=owner, severity="critical", time=now - timedelta(hours=hours_ago))
    (row,) = group_rows(operator_web.get("/console/oncall/").content.decode())
    svg = re.search(r'<svg class="spark"[^>]*aria-label="4 in 24 h"><polyline points="([^"]+)"/></svg>', row)
    assert svg, row
    ys = [float(p.split(",")[1]) for p in svg.group(1).split()]
    assert len(ys) == 24 and ys[-1] == 1 and abs(ys[-6] - (17 - 16 / 3)) < 1e-3 and ys.count(17) == 22
    assert "style=" not in row and "<script" not in row


def test_open_groups_come_first_critical_before_warning(operator_web, owner):
    acked = Event.record("hang", "old hang", tenant=owner, severity="critical").group
    acked.acknowledge("opal", datetime.now(UTC))
    Event.record("restart", "restarted", tenant=owner, severity="warning")
    Event.record("crash_loop", "looping", tenant=owner, severity="critical")
    kinds = [
        re.search(r'data-kind="(\w+)"', r).group(1)
        for r in group_rows(operator_web.get("/console/oncall/").content.decode())
    ]
    assert kinds == ["crash_loop", "restart", "hang"]


def test_operators_acknowledge_resolve_and_silence_a_group(operator_web, owner):
    group = Event.record("hang", "hung", tenant=owner, severity="critical").group
    acked = operator_web.post(f"/console/oncall/groups/{group.pk}/ack/")
    assert acked.status_code == 200 and "acked by opal" in acked.content.decode()
    assert acked["HX-Trigger"] == "group-changed"
    silenced = operator_web.post(
        f"/console/oncall/groups/{group.pk}/silence/", {"minutes": "60", "reason": "node drained, rma filed"}
    )
    assert (
        "silenced until" in silenced.content.decode()
        and "node drained, rma filed" in silenced.content.decode()
    )
    group.refresh_from_db()
    assert group.silenced_by == "opal" and group.silenced(datetime.now(UTC) + timedelta(minutes=59))
    assert not group.silenced(datetime.now(UTC) + timedelta(minutes=61))
    resolved = operator_web.post(f"/console/oncall/groups/{group.pk}/resolve/")
    assert "resolved by opal" in resolved.content.decode()
    group.refresh_from_db()
    assert group.state == "resolved"


def test_a_silence_needs_a_listed_duration_and_a_reason(operator_web, owner):
    group = Event.record("hang", "hung", tenant=owner, severity="critical").group
    refused = [
        ({"minutes": "60"}, "reason"),
        ({"minutes": "7", "reason": "x"}, "minutes"),
        ({"minutes": "soon", "reason": "x"}, "minutes"),
        ({"minutes": "60", "reason": "r" * 301}, "reason"),
    ]
    for data, field in refused:
        answer = operator_web.post(f"/console/oncall/groups/{group.pk}/silence/", data)
        assert answer.status_code == 400 and f"{field}:" in answer.content.decode(), data
    group.refresh_from_db()
    assert group.silenced_until is None


def test_group_actions_need_an_operator_and_a_csrf_token(owner, other):
    group = Event.record("hang", "hung", tenant=owner, severity="critical").group
    olivia = member_client("olivia", tenant=owner)
    oscar = member_client("oscar", tenant=other)
    for action in ("ack", "resolve", "silence"):
        for client in (olivia, oscar):  # its own group, another tenant's: refused alike, before any lookup
            assert (
                client.post(
                    f"/console/oncall/groups/{group.pk}/{action}/", {"minutes": 60, "reason": "x"}
                ).status_code
                == 403
            )
        assert olivia.post(f"/console/oncall/groups/999999/{action}/").status_code == 403
    strict = member_client("carol", operator=True, enforce_csrf=True)
    assert strict.post(f"/console/oncall/groups/{group.pk}/ack/").status_code == 403
    group.refresh_from_db()
    assert (group.state, group.silenced_until) == ("open", None)
    assert "group-actions" not in olivia.get("/console/oncall/").content.decode()


def test_a_hostile_tenant_sees_none_of_anothers_groups(owner, other, make_endpoint):
    theirs = make_endpoint(owner, "owner-secret-chat")
    Event.record("restart", "pod ep-1-v1-1 restarted", endpoint=theirs, severity="warning", pod="owner-pod-1")
    group = EventGroup.objects.get()
    oscar = member_client("oscar", tenant=other)
    pages = [
        oscar.get("/console/oncall/"),
        oscar.get(f"/console/oncall/?endpoint={theirs.pk}"),
        oscar.get(f"/console/oncall/?endpoint={theirs.pk + 1000}"),
        oscar.get("/console/oncall/?tenant=owner&severity=any&state=open"),
        oscar.get("/console/oncall/?pod=owner-pod-1"),
        oscar.get(f"/console/oncall/groups/?endpoint={theirs.pk}"),
        oscar.get(f"/console/oncall/?group={group.pk}"),
    ]
    for page in pages:
        html = page.content.decode()
        asked = page.request["QUERY_STRING"]
        for secret in ("owner-secret-chat", "owner-pod-1", f'id="group-{group.pk}"', "restarted"):
            if secret not in asked:  # the filter form shows what was asked, nothing more
                assert secret not in html, (asked, secret)
    # another tenant's endpoint id is refused exactly as one that does not exist
    errors = [re.search(r'<p class="error".*?</p>', p.content.decode(), re.S) for p in pages[1:3]]
    assert errors[0] and errors[1] and errors[0].group(0) == errors[1].group(0)


def test_the_owner_sees_its_pods_restarts_and_hangs_without_addresses(owner_web, owner, make_endpoint):
    chat = make_endpoint(owner, "chat")
    Event.record("hang", "engine hung: probe to http://10.0.3.7:8000 unanswered", endpoint=chat,
                 severity="critical", pod="ep-1-v1-1")  # fmt: skip
    Event.record("restart", "pod ep-1-v1-1 restarted", endpoint=chat, severity="warning", pod="ep-1-v1-1")
    html = owner_web.get("/console/oncall/").content.decode()
    assert len(group_rows(html)) == 2 and "ep-1-v1-1" in html
    assert "10.0.3.7" not in html and "&lt;internal address&gt;" in html


def test_every_kind_links_a_runbook_shipped_in_docs(owner_web):
    for kind in Event.Kind.values:
        path = ROOT / "docs" / "runbooks" / f"{kind}.md"
        text = path.read_text()
        for section in ("## What it means", "## What to check", "## What to do"):
            assert section in text, (kind, section)
        page = owner_web.get(f"/console/oncall/runbooks/{kind}/")
        assert page.status_code == 200 and "What to check" in page.content.decode()
    assert owner_web.get("/console/oncall/runbooks/passwd/").status_code == 404
    assert owner_web.get("/console/oncall/runbooks/..%2F..%2Fsettings/").status_code == 404


def test_the_group_table_refreshes_alone(operator_web, owner):
    Event.record("hang", "hung", tenant=owner, severity="critical")
    partial = operator_web.get(
        "/console/oncall/groups/?severity=critical", HTTP_HX_REQUEST="true"
    ).content.decode()
    assert partial.startswith('<table class="grid groups">') and len(group_rows(partial)) == 1
    page = operator_web.get("/console/oncall/").content.decode()
    assert 'hx-get="/console/oncall/groups/?severity=warning&amp;severity=critical"' in page


def test_who_silenced_a_group_and_why_is_for_operators_only(owner_web, operator_web, owner, make_endpoint):
    chat = make_endpoint(owner, "chat")
    e = Event.record("hang", "probe unanswered", endpoint=chat, severity="warning")
    e.group.silence("opal", datetime.now(UTC) + timedelta(hours=1), "INTERNAL: node gpu-17 flaky, OPS-42")
    (tenant_row,) = group_rows(owner_web.get("/console/oncall/").content.decode())
    assert "silenced until" in tenant_row and "OPS-42" not in tenant_row and "opal" not in tenant_row
    (operator_row,) = group_rows(operator_web.get("/console/oncall/").content.decode())
    assert "by opal: INTERNAL: node gpu-17 flaky, OPS-42" in operator_row


def test_the_owner_reads_no_ipv6_or_cluster_host_name_of_its_pods(owner_web, owner, make_endpoint):
    chat = make_endpoint(owner, "chat")
    message = "probe to [fd00:10:244::17]:8000 failed; peer fd00:10:244::18 via "
    message += "ep-1-v1-1.tenant-1.svc.cluster.local at 16:07:30"
    Event.record("hang", message, endpoint=chat, severity="critical")
    html = owner_web.get("/console/oncall/").content.decode()
    assert "fd00" not in html and "svc.cluster.local" not in html and "16:07:30" in html


def test_the_default_view_is_the_unresolved_then_what_was_resolved_today(operator_web, owner):
    now = datetime.now(UTC)
    Event.record("hang", "open hang", tenant=owner, severity="warning")
    today = Event.record("restart", "resolved an hour ago", tenant=owner, severity="critical").group
    today.resolve("opal", now - timedelta(hours=1))
    old = Event.record("crash_loop", "resolved two days ago", tenant=owner, severity="critical").group
    old.resolve("opal", now - timedelta(days=2))

    def kinds(query: str) -> list[str]:
        rows = group_rows(operator_web.get(f"/console/oncall/{query}").content.decode())
        return [re.search(r'data-kind="(\w+)"', row).group(1) for row in rows]

    assert kinds("") == ["hang", "restart"]  # the open warning before the resolved critical
    assert kinds("?state=resolved") == ["crash_loop", "restart"]  # asked for: every resolved one
    assert kinds("?state=open&state=resolved") == ["hang", "crash_loop", "restart"]


def test_the_attention_panels_read_a_bounded_number_of_events_and_say_so(
    operator_web, owner, make_endpoint, monkeypatch
):
    from controlplane.console.views import oncall

    monkeypatch.setattr(oncall, "ATTENTION_EVENTS", 3)
    chat = make_endpoint(owner, "chat")
    for _ in range(4):
        Event.record("hang", "hung", endpoint=chat, severity="critical", pod="chat-0")
    Event.record("restart", "restarted", endpoint=chat, pod="chat-0")
    html = operator_web.get("/console/oncall/attention/").content.decode()
    assert '<b class="count">3+</b>' in html  # four unacknowledged criticals, counted up to three
    assert "Repeated hangs" in html and "\u00d73" in html  # the newest three hangs
    assert "Counted over the newest 3 events of each kind" in html
    assert "24 h, the newest 3" not in html  # one restart: that panel is whole
