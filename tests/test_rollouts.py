"""Rollouts in the control plane: a new model is a new version, rolled out by the autoscaler's
passes (both deployments declared, the routers' traffic split moving as pods get ready), with
a canary, promote, abort and the rollback of a version that never gets ready."""

from datetime import timedelta

import pytest
from django.utils import timezone

from controlplane.capacity.models import ModelProfile
from controlplane.endpoints import scaling
from controlplane.endpoints.models import Endpoint, Pod, Rollout
from controlplane.oncall.models import Event
from dataplane.wire.routing_table import RoutingTable
from tests.console.conftest import member_client
from tests.test_autoscaling import Recorder


@pytest.fixture
def chat(owner, make_endpoint):
    return make_endpoint(owner, "chat")  # 1 replica, version 1, llama-8b


@pytest.fixture
def newer(h100):
    return ModelProfile.objects.create(
        model="llama-8b-v2", gpu_type=h100, alpha=0.0004, beta=0.004, gamma=0.02
    )


def table(operator_client, endpoint):
    """The endpoint as routers read it from the routing table."""
    doc = operator_client.get("/api/v1/routing-table/").json()
    return next(e for e in RoutingTable.from_json(doc).endpoints if e.id == endpoint.pk)


def ready_pod(endpoint, version, n=1):
    Pod.objects.create(
        endpoint=endpoint,
        name=f"ep-{endpoint.pk}-v{version}-{n}",
        url=f"http://127.0.0.1:{9000 + n}",
        ready=True,
        version=version,
    )


def tick(now):
    cluster = Recorder()
    scaling.horizontal_pass(cluster, now)
    return sorted(cluster.applied)


def test_a_new_model_rolls_out_with_no_gap_in_serving_pods(owner_client, operator_client, chat, newer):
    ready_pod(chat, 1)
    answer = owner_client.patch(f"/api/v1/endpoints/{chat.pk}/", {"model": "llama-8b-v2"}, format="json")
    assert answer.status_code == 200
    assert answer.json()["version"] == 2 and answer.json()["rollout"]["phase"] == "starting"
    t0 = timezone.now()
    # Both versions run; all traffic stays on v1 while v2 starts.
    assert tick(t0) == [f"ep-{chat.pk}-v1", f"ep-{chat.pk}-v2"]
    assert dict(table(operator_client, chat).traffic) == {"1": 100, "2": 0}
    ready_pod(chat, 2)
    assert tick(t0 + timedelta(seconds=5)) == [f"ep-{chat.pk}-v1", f"ep-{chat.pk}-v2"]
    routed = table(operator_client, chat)
    assert dict(routed.traffic) == {"1": 0, "2": 100}  # v1 drains: no new request, in-flight ones finish
    assert {p.version for p in routed.pods} == {"1", "2"}
    # After the 10 s drain, v1 goes.
    assert tick(t0 + timedelta(seconds=15)) == [f"ep-{chat.pk}-v2"]
    rollout = Rollout.objects.get()
    assert rollout.phase == "done"
    messages = list(Event.objects.filter(kind="rollout").order_by("id").values_list("message", flat=True))
    assert len(messages) == 2 and "100% of traffic on the new version" in messages[0]
    assert messages[1].endswith("old version removed: rollout done")


def test_a_canary_holds_ninety_ten_until_promoted(owner_client, operator_client, chat, newer):
    body = {"model": "llama-8b-v2", "canary_percent": 10}
    assert owner_client.patch(f"/api/v1/endpoints/{chat.pk}/", body, format="json").status_code == 200
    ready_pod(chat, 2)
    t0 = timezone.now()
    tick(t0)
    assert dict(table(operator_client, chat).traffic) == {"1": 90, "2": 10}
    tick(t0 + timedelta(seconds=3600))
    assert Rollout.objects.get().phase == "canary"  # holds however long
    promoted = owner_client.post(
        f"/api/v1/endpoints/{chat.pk}/rollout/", {"action": "promote"}, format="json"
    )
    assert promoted.status_code == 202
    tick(t0 + timedelta(seconds=3605))
    assert dict(table(operator_client, chat).traffic) == {"1": 0, "2": 100}


def test_a_version_that_never_gets_ready_is_rolled_back(settings, owner_client, chat, newer):
    settings.ROLLOUT_READY_DEADLINE_S = 60
    owner_client.patch(f"/api/v1/endpoints/{chat.pk}/", {"model": "llama-8b-v2"}, format="json")
    t0 = timezone.now()
    tick(t0)
    # The deadline passes with no v2 pod ready: back to v1 and its model, v2 undeclared.
    assert tick(t0 + timedelta(seconds=61)) == [f"ep-{chat.pk}-v1"]
    chat.refresh_from_db()
    assert (chat.version, chat.profile.model) == (1, "llama-8b")
    event = Event.objects.get(kind="rollout")
    assert event.severity == "critical" and "0 of 1 new pods ready after 60 s: rolled back" in event.message


def test_one_rollout_at_a_time_and_abort(owner_client, other_client, chat, newer, h100):
    ModelProfile.objects.create(model="llama-8b-v3", gpu_type=h100, alpha=0, beta=0.004, gamma=0)
    url = f"/api/v1/endpoints/{chat.pk}/"
    owner_client.patch(url, {"model": "llama-8b-v2"}, format="json")
    again = owner_client.patch(url, {"model": "llama-8b-v3"}, format="json")
    assert again.status_code == 400 and "a rollout to version 2 is in progress" in again.json()["detail"]
    assert other_client.post(f"{url}rollout/", {"action": "abort"}, format="json").status_code == 404
    bad = owner_client.post(f"{url}rollout/", {"action": "pause"}, format="json")
    assert bad.status_code == 400 and bad.json()["fields"]["action"]["value"] == "pause"
    assert owner_client.post(f"{url}rollout/", {"action": "abort"}, format="json").status_code == 202
    tick(timezone.now())
    chat.refresh_from_db()
    assert (chat.version, chat.profile.model, Rollout.objects.get().phase) == (1, "llama-8b", "rolled_back")
    assert owner_client.post(f"{url}rollout/", {"action": "abort"}, format="json").status_code == 404
    # Versions only grow: the next attempt is version 3, not a second version 2.
    assert owner_client.patch(url, {"model": "llama-8b-v3"}, format="json").json()["version"] == 3


def test_the_console_form_changes_the_model_through_the_same_rollout(owner, chat, newer):
    owner_web = member_client("olivia", tenant=owner)
    Endpoint.objects.filter(pk=chat.pk).update(desired_replicas=1)
    body = {
        "name": "chat",
        "model": "llama-8b-v2",
        "gpu_type": "h100-80gb",
        "pool": "",
        "min_provisioned_concurrency": "0",
        "max_provisioned_concurrency": "16",
        "target_concurrency_per_replica": "8",
        "routing_policy": "p2c-mu",
    }
    assert owner_web.post(f"/console/endpoints/{chat.pk}/edit/", body).status_code == 302
    assert Rollout.objects.get(endpoint=chat).to_version == 2
    page = owner_web.get(f"/console/endpoints/{chat.pk}/").content.decode()
    assert "v2 <span" in page and "starting: 0% on v2" in page and "rollout from v1 (llama-8b)" in page
