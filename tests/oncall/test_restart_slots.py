"""Restarts on the on-call page counted per endpoint and replica slot, not per pod name: a
crash-looping replica whose pod gets a new name each time it is replaced is one row with its
count and last reason, not a row of "1 restart" per name."""

import re
from datetime import UTC, datetime, timedelta

from controlplane.oncall import grouping
from controlplane.oncall.models import Event
from dataplane.cluster.agent import Agent
from dataplane.cluster.driver import Deployment, PodState


def restart_rows(html: str) -> dict[str, str]:
    """The restarts panel's rows, by slot."""
    table = re.search(r'<table class="grid restarts">(.*?)</table>', html, re.S)
    assert table, "no restarts table"
    return dict(re.findall(r'<tr data-slot="([^"]+)">(.*?)</tr>', table.group(1), re.S))


def test_pods_of_one_slot_are_one_row_with_their_summed_count_and_last_reason(
    operator_web, owner, make_endpoint
):
    chat = make_endpoint(owner, "chat")
    now = datetime.now(UTC)
    slot = f"ep-{chat.pk}-v1-r0"
    for i in range(30):  # the agent replaces the pod each time: a new serial, the same slot
        pod = f"{slot}-{i + 1}"
        Event.record("restart", f"pod {pod} restarted: exit code {i}", endpoint=chat, severity="warning",
                     pod=pod, time=now - timedelta(minutes=30 - i))  # fmt: skip
    other = f"ep-{chat.pk}-v1-r1-40"
    Event.record("restart", f"pod {other} restarted: OOMKilled", endpoint=chat, severity="warning", pod=other)
    rows = restart_rows(operator_web.get("/console/oncall/attention/").content.decode())
    assert set(rows) == {slot, f"ep-{chat.pk}-v1-r1"}
    assert '<td class="num">30</td>' in rows[slot] and "30 pods" in rows[slot]
    assert f"pod {slot}-30 restarted: exit code 29" in rows[slot]  # the last reason
    assert '<td class="num">1</td>' in rows[f"ep-{chat.pk}-v1-r1"]
    assert list(rows) == [slot, f"ep-{chat.pk}-v1-r1"]  # most restarts first


def test_a_kubernetes_deployments_pods_count_in_their_deployment_per_endpoint(
    operator_web, owner, make_endpoint
):
    chat, code = make_endpoint(owner, "chat"), make_endpoint(owner, "code")
    for pod in ("chat-7d9f5c8b6-x2k4q", "chat-7d9f5c8b6-p9zvt", "chat-5c8b6d9f7-bb2kq"):
        Event.record("restart", f"pod {pod} restarted", endpoint=chat, severity="warning", pod=pod)
    Event.record("restart", "restarted", endpoint=code, severity="warning", pod="chat-7d9f5c8b6-m4n5p")
    html = operator_web.get("/console/oncall/").content.decode()
    table = re.search(r'<table class="grid restarts">(.*?)</table>', html, re.S)
    assert table
    rows = re.findall(r'<tr data-slot="chat">(.*?)</tr>', table.group(1), re.S)
    assert len(rows) == 2  # one slot name, two endpoints: two rows
    assert '<td class="num">3</td>' in rows[0] and "chat" in rows[0]
    assert '<td class="num">1</td>' in rows[1] and "code" in rows[1]


def test_a_tenant_sees_its_slots_reason_without_fleet_addresses(owner_web, owner, make_endpoint):
    chat = make_endpoint(owner, "chat")
    pod = f"ep-{chat.pk}-v1-r0-3"
    Event.record("restart", f"pod {pod} restarted: liveness failed (http://10.0.3.7:8001/livez 503)",
                 endpoint=chat, severity="warning", pod=pod)  # fmt: skip
    rows = restart_rows(owner_web.get("/console/oncall/").content.decode())
    assert f"ep-{chat.pk}-v1-r0" in rows and "liveness failed" in rows[f"ep-{chat.pk}-v1-r0"]
    assert "10.0.3.7" not in rows[f"ep-{chat.pk}-v1-r0"]


class Pods:
    """The agent's pod supervisor, keeping names only: every pod started is ready at once."""

    def __init__(self) -> None:
        self.names: list[str] = []

    def start_pod(self, launch) -> None:
        self.names.append(launch.name)

    def stop_pod(self, name: str) -> None:
        self.names.remove(name)

    def list_pods(self):
        return [PodState(n, "", "", ready=True) for n in self.names]


def test_the_agent_starts_a_pod_in_a_gone_pods_slot_which_the_page_counts_as_one():
    clock = [0.0]
    pods = Pods()
    agent = Agent(pods, drain_delay_s=0.0, clock=lambda: clock[0])  # type: ignore[arg-type]
    agent.apply([Deployment("ep-7-v1", 2)])
    agent.reconcile_once()
    first = sorted(agent.replicas)
    assert [grouping.replica_slot(n) for n in first] == ["ep-7-v1-r0", "ep-7-v1-r1"]
    agent.replicas[first[0]].retiring_since = clock[0]  # slot 0's pod goes, as a dead one's would
    clock[0] += 1
    agent.reconcile_once()  # retired, and a pod started in its place
    agent.reconcile_once()
    (replacement,) = set(agent.replicas) - set(first)
    assert replacement != first[0] and grouping.replica_slot(replacement) == "ep-7-v1-r0"
