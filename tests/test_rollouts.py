"""Rollouts in the control plane: a new model is a new version, rolled out by the autoscaler's
passes (both deployments declared, the routers' traffic split moving as pods get ready), with
a canary, promote, abort and the rollback of a version that never gets ready."""

from datetime import UTC, datetime, timedelta

import pytest
from django.utils import timezone

from controlplane import scaling
from controlplane.capacity.models import ModelProfile
from controlplane.endpoints.models import Endpoint, Pod, Rollout
from controlplane.oncall.models import Event
from controlplane.selling import sell
from controlplane.tenants.models import Tenant
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
    """A ready pod of `version`, as sync_pods would register it."""
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
    tick(t0 + timedelta(seconds=3595))
    assert Rollout.objects.get().phase == "canary"  # holds, up to ROLLOUT_MAX_HOLD_S (3600 s)
    promoted = owner_client.post(
        f"/api/v1/endpoints/{chat.pk}/rollout/", {"action": "promote"}, format="json"
    )
    assert promoted.status_code == 202
    tick(t0 + timedelta(seconds=3598))
    assert dict(table(operator_client, chat).traffic) == {"1": 0, "2": 100}


def declared(now):
    """One pass (as beat runs it): the replicas each deployment is declared at."""
    cluster = Recorder()
    scaling.horizontal_pass(cluster, now)
    return {name: d.replicas for name, d in cluster.applied.items()}


def capacity(client):
    (row,) = client.get("/api/v1/capacity/", {"nodes": "true"}).json()
    return row


def test_a_canary_runs_and_commits_each_version_at_its_share(
    owner_client, operator_client, owner, make_endpoint, newer
):
    """The Contract: while a canary runs, /api/v1/capacity/ counts both versions' replicas as
    committed, each its share of the endpoint's replicas, and the cluster runs the same. Measured
    before: both versions ran at all 4 replicas and the ledger counted only the new version's 4."""
    chat = make_endpoint(owner, "chat", min_provisioned_concurrency=32, max_provisioned_concurrency=32)  # 4
    ready_pod(chat, 1)
    assert capacity(operator_client)["committed_replicas"] == 4
    body = {"model": "llama-8b-v2", "canary_percent": 50}
    changed = owner_client.patch(f"/api/v1/endpoints/{chat.pk}/", body, format="json")
    assert changed.status_code == 200, changed.content
    # Starting: the old version serves all of it (4), the new one starts the half it will take (2).
    assert changed.json()["rollout"]["replicas"] == {"1": 4, "2": 2}
    t0 = timezone.now()
    assert declared(t0) == {f"ep-{chat.pk}-v1": 4, f"ep-{chat.pk}-v2": 2}
    row = capacity(operator_client)
    assert (row["committed_replicas"], row["committed_gpus"]) == (6, 6)
    for n in (1, 2):
        ready_pod(chat, 2, n)
    # Canary at 50 %: 2 and 2, both committed, both placed in the node grid under their versions.
    assert declared(t0 + timedelta(seconds=5)) == {f"ep-{chat.pk}-v1": 2, f"ep-{chat.pk}-v2": 2}
    assert Rollout.objects.get().phase == "canary"
    row = capacity(operator_client)
    assert (row["committed_replicas"], row["committed_gpus"], row["free_gpus"]) == (4, 4, 4)
    placed = sorted((r["endpoint_id"], r["endpoint"], r["model"]) for r in row["nodes"][0]["replicas"])
    assert (
        placed
        == [(chat.pk, "owner/chat v1", "llama-8b")] * 2 + [(chat.pk, "owner/chat v2", "llama-8b-v2")] * 2
    )
    # The console's capacity page shows the same figures.
    console = member_client("ops", operator=True)
    page = console.get("/console/capacity/").content.decode()
    grid = console.get(f"/console/capacity/pools/{chat.pool_id}/nodes/").content.decode()
    assert '<td class="num committed">4</td>' in page and 'title="owner/chat v2 · llama-8b-v2"' in grid
    # Promoted: the new version starts the rest (4) beside the old one's 2, then the old one drains.
    assert (
        owner_client.post(
            f"/api/v1/endpoints/{chat.pk}/rollout/", {"action": "promote"}, format="json"
        ).status_code
        == 202
    )
    assert declared(t0 + timedelta(seconds=10)) == {f"ep-{chat.pk}-v1": 2, f"ep-{chat.pk}-v2": 4}
    assert capacity(operator_client)["committed_replicas"] == 6
    for n in (3, 4):
        ready_pod(chat, 2, n)
    assert declared(t0 + timedelta(seconds=15)) == {f"ep-{chat.pk}-v1": 1, f"ep-{chat.pk}-v2": 4}
    assert declared(t0 + timedelta(seconds=30)) == {f"ep-{chat.pk}-v2": 4}
    assert capacity(operator_client)["committed_replicas"] == 4
    messages = list(Event.objects.filter(kind="rollout").order_by("id").values_list("message", "detail"))
    assert "starts 2 more replicas" in messages[1][0] and messages[1][1]["replicas"] == {"1": 2, "2": 4}


def test_a_rollout_that_does_not_fit_the_pool_is_409_oversold_naming_both_versions(
    owner_client, operator_client, owner, make_endpoint, newer
):
    """6 replicas of 1 GPU in the 8-GPU pool: a canary of 50 % starts 3 new beside the 6 old
    (9 > 8), refused with the pool's figures; 25 % starts 2 (8): accepted."""
    chat = make_endpoint(owner, "chat", min_provisioned_concurrency=48, max_provisioned_concurrency=48)
    url = f"/api/v1/endpoints/{chat.pk}/"
    refusals = [
        client.patch(url, {"model": "llama-8b-v2", "canary_percent": 50}, format="json")
        for client in (owner_client, operator_client)
    ]
    assert [r.status_code for r in refusals] == [409, 409]
    tenant, operator = (r.json() for r in refusals)
    named = ("error", "pool", "asked_replicas", "fit_replicas", "replacing_replicas")
    assert [tenant[k] for k in named] == ["oversold", "use1-h100", 3, 2, 0]
    assert tenant["rollout"] == {
        "new_version": 2, "old_version": 1, "old_model": "llama-8b", "old_replicas": 6,
        "old_gpus_per_replica": 1, "old_gpus": 6, "old_replacing_replicas": 6,
    }  # fmt: skip
    assert tenant["detail"] == (
        "pool 'use1-h100' cannot place this. It has 8 GPUs (1 node x 8 GPUs). This needs 3 replicas of 1 GPU"
        " (3 GPUs, 300 MU/min) for version 2, beside version 1's 6 replicas of 1 GPU (a rollout commits both"
        " versions); at most 2 fit"
    )
    assert "committed_gpus" not in tenant  # the tenant's view, as for any oversold
    assert operator["committed_gpus"] == capacity(operator_client)["committed_gpus"] == 6
    # Nothing was written: no rollout, the old model and version.
    chat.refresh_from_db()
    assert (Rollout.objects.count(), chat.version, chat.profile.model) == (0, 1, "llama-8b")
    fits = owner_client.patch(url, {"model": "llama-8b-v2", "canary_percent": 25}, format="json")
    assert fits.status_code == 200 and fits.json()["rollout"]["replicas"] == {"1": 6, "2": 2}
    assert capacity(operator_client)["committed_replicas"] == 8


def test_a_rollout_beyond_the_quota_is_409_counting_both_versions(owner_client, owner, make_endpoint, newer):
    """The tenant's quota counts both versions at each bound: 2 to 4 replicas are 4 to 8 GPUs
    while a rollout with no canary starts (both at all of it), over a quota of 6."""
    chat = make_endpoint(owner, "chat", min_provisioned_concurrency=16, max_provisioned_concurrency=32)
    Tenant.objects.filter(pk=owner.pk).update(gpu_quota=6)
    url = f"/api/v1/endpoints/{chat.pk}/"
    refused = owner_client.patch(url, {"model": "llama-8b-v2"}, format="json")
    assert refused.status_code == 409
    body = refused.json()
    assert (body["error"], body["gpu_quota"], body["bound"], body["asked_gpus"], body["rollout"]) == (
        "over_quota", 6, "max", 8, True,
    )  # fmt: skip
    assert (
        "this endpoint's max replicas (both versions of its rollout, each its share) take 8 GPUs"
        in body["detail"]
    )
    # A canary of 50 % asks 4 + 2 at the maximum: within 6.
    assert (
        owner_client.patch(url, {"model": "llama-8b-v2", "canary_percent": 50}, format="json").status_code
        == 200
    )


def test_a_promote_needs_room_for_the_rest_of_the_new_version(
    owner_client, operator_client, owner, other, make_endpoint, newer
):
    """A canary of 50 % on 4 replicas commits 2 + 2 and leaves room another endpoint may take;
    its promote then needs 2 + 4: a 409 naming what it asked, the canary holding as it was. An
    abort needs no room (it ends what the rollout added)."""
    chat = make_endpoint(owner, "chat", min_provisioned_concurrency=32, max_provisioned_concurrency=32)
    theirs = make_endpoint(other, "theirs")
    url = f"/api/v1/endpoints/{chat.pk}/"
    assert (
        owner_client.patch(url, {"model": "llama-8b-v2", "canary_percent": 50}, format="json").status_code
        == 200
    )
    for n in (1, 2):
        ready_pod(chat, 2, n)
    t0 = timezone.now()
    declared(t0)
    assert Rollout.objects.get().phase == "canary"
    sell(theirs, mu_per_minute=300, best_effort_allowed=True, sold_by="ops")  # 3 of the 4 left
    refused = owner_client.post(f"{url}rollout/", {"action": "promote"}, format="json")
    assert refused.status_code == 409
    body = refused.json()
    assert (body["asked_replicas"], body["replacing_replicas"], body["fit_replicas"]) == (4, 2, 3)
    assert body["rollout"]["old_replicas"] == 2
    assert (
        "for version 2, where the endpoint commits 2 replicas (2 GPUs) now, beside version 1's 2 replicas"
        in (body["detail"])
    )
    assert not Rollout.objects.get().promoted
    assert owner_client.post(f"{url}rollout/", {"action": "abort"}, format="json").status_code == 202
    assert declared(t0 + timedelta(seconds=5)) == {f"ep-{chat.pk}-v1": 4, f"ep-{theirs.pk}-v1": 1}
    assert capacity(operator_client)["committed_replicas"] == 7


def test_a_canary_held_past_its_hold_is_aborted_with_an_event(
    settings, owner_client, operator_client, owner, make_endpoint, newer
):
    """ROLLOUT_MAX_HOLD_S on a virtual clock: the canary holds until then, then goes back to the
    old version (the safe end: it needs no room and nobody said the new one is good), with a
    warning event, and the ledger counts the old version alone again."""
    settings.ROLLOUT_MAX_HOLD_S = 600
    chat = make_endpoint(owner, "chat", min_provisioned_concurrency=16, max_provisioned_concurrency=16)  # 2
    url = f"/api/v1/endpoints/{chat.pk}/"
    owner_client.patch(url, {"model": "llama-8b-v2", "canary_percent": 20}, format="json")
    ready_pod(chat, 2)
    t0 = timezone.now()
    assert declared(t0) == {f"ep-{chat.pk}-v1": 2, f"ep-{chat.pk}-v2": 1}
    rollout = owner_client.get(url).json()["rollout"]
    assert rollout["phase"] == "canary"
    assert rollout["hold_until"] == (
        Rollout.objects.get().phase_since + timedelta(seconds=600)
    ).isoformat().replace("+00:00", "Z")
    assert declared(t0 + timedelta(seconds=595)) == {f"ep-{chat.pk}-v1": 2, f"ep-{chat.pk}-v2": 1}
    assert capacity(operator_client)["committed_replicas"] == 3
    assert declared(t0 + timedelta(seconds=600)) == {f"ep-{chat.pk}-v1": 2}
    chat.refresh_from_db()
    assert (chat.version, chat.profile.model, Rollout.objects.get().phase) == (1, "llama-8b", "rolled_back")
    event = Event.objects.filter(kind="rollout").latest("id")
    assert event.severity == "warning" and event.message.endswith(
        "canary held at 20% for 600 s, past the most a canary holds (600 s): aborted, traffic back on the"
        " old version"
    )
    assert capacity(operator_client)["committed_replicas"] == 2
    assert owner_client.get(url).json()["rollout"] is None


def test_the_autoscaler_grows_a_rollout_only_as_far_as_both_versions_fit(
    owner, make_endpoint, newer, owner_client
):
    """A canary of 50 % in the 8-GPU pool: the endpoint's desired replicas may grow while both
    versions' shares pack (4 + 4), not to the 10 its load asks."""
    from tests.test_autoscaling import TS
    from tests.test_autoscaling_room import load

    chat = make_endpoint(owner, "chat", max_provisioned_concurrency=80)  # 1 to 10 replicas
    owner_client.patch(
        f"/api/v1/endpoints/{chat.pk}/", {"model": "llama-8b-v2", "canary_percent": 50}, format="json"
    )
    ready_pod(chat, 2)
    now = datetime.fromtimestamp(TS, UTC)
    declared(now - timedelta(seconds=5))
    assert Rollout.objects.get().phase == "canary"
    load(chat, TS, in_flight=60.0)  # 60 / (0.8 x 8): 10 replicas wanted
    assert declared(now) == {f"ep-{chat.pk}-v1": 4, f"ep-{chat.pk}-v2": 4}
    chat.refresh_from_db()
    assert chat.desired_replicas == 8
    event = Event.objects.get(kind="scale", severity="warning")
    assert "wants 10 replicas, clamped to 8" in event.message


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
