"""Autoscaler actuation on synthetic time: samples -> buckets -> decisions -> the cluster, with
the lease, the no-data rule, wake from zero and the pod mirror. The cluster here records what
it is told (`Recorder`); tests/test_autoscaling_stack.py runs the real agent, router and Celery."""

from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest
from django.db.models import Q
from django.utils import timezone

from controlplane import autoscaler_config, drivers, pods, scaling
from controlplane.endpoints import samples
from controlplane.endpoints.models import Endpoint, Lease, LoadBucket, LoadMinute, Pod
from controlplane.oncall.models import Event
from dataplane.cluster.driver import ClusterError, Deployment, PodState
from dataplane.wire.load_samples import QueueSample, RouterSecond, TrafficSample
from tests.conftest import latencies

NOW = datetime(2026, 11, 29, 12, 0, 0, tzinfo=UTC)
TS = int(NOW.timestamp())  # a multiple of 5


class Recorder:
    """A cluster that keeps what it is told, and the pods a test gives it."""

    def __init__(self, pods=(), fail=False):
        self.applied: dict[str, Deployment] = {}
        self.calls: list[tuple] = []
        self.pods = list(pods)
        self.fail = fail

    def apply(self, deployments):
        if self.fail:
            raise ClusterError("agent unreachable")
        self.applied = {d.name: d for d in deployments}
        self.calls.append(("apply", len(deployments)))

    def scale(self, name, replicas):
        self.calls.append(("scale", name, replicas))

    def set_target_concurrency(self, name, target):
        self.calls.append(("target", name, target))

    def list_pods(self):
        return self.pods


def buckets(
    endpoint,
    seconds_back,
    *,
    in_flight=0.0,
    mu=0.0,
    requests=0,
    p99=None,
    queue=0.0,
    until_s_ago=0,
    request_mu=0.01,
):
    """5-second buckets covering the last `seconds_back` seconds before NOW (or before
    `until_s_ago` seconds before it), the MU in requests of `request_mu` each."""
    LoadBucket.objects.bulk_create(
        LoadBucket(
            endpoint=endpoint,
            end=end,
            seconds=5,
            in_flight=in_flight,
            mu_per_minute=mu,
            mu_squared_per_minute=mu * request_mu,
            requests=requests,
            queue_depth=queue,
            p99_latency_s=p99,
            errors=0,
            throttled=0,
            ready_replicas=endpoint.ready_replicas,
            desired_replicas=endpoint.desired_replicas,
        )
        for end in range(TS - seconds_back + 5, TS - until_s_ago + 1, 5)
    )


@pytest.fixture
def chat(owner, make_endpoint):
    e = make_endpoint(owner, "chat", max_provisioned_concurrency=80)  # target 8: 1..10 replicas
    assert (e.desired_replicas, e.replica_bounds) == (1, (1, 10))
    return e


# --- samples into buckets


def test_a_slot_of_router_seconds_becomes_one_bucket(publish_seconds, chat):
    # The slot ending at TS covers seconds TS-5..TS-1. Two routers reported each second, each
    # half of it: in flight 2.0 each second, 30 requests and 6 MU in all, latencies of 29
    # requests in the 0.5-1 s bucket (index 7) and one in 5-10 s (index 10); at the end, 3
    # requests of 1.5 MU wait for a pod.
    half = TrafficSample(chat.pk, "owner", requests=3, inflight=1.0, mu=0.6)
    seconds = {s: [[half], [half]] for s in range(TS - 5, TS)}
    slow = replace(half, latency_buckets=latencies({7: 29, 10: 1}))
    seconds[TS - 1] = [[slow, QueueSample(chat.pk, queued=3, queued_mu=1.5)], [half]]
    publish_seconds(seconds)
    scaling.horizontal_pass(None, NOW + timedelta(seconds=samples.LAG_S))
    b = LoadBucket.objects.get(endpoint=chat, end=TS)
    assert (b.seconds, b.requests) == (5, 30)
    assert b.in_flight == pytest.approx(5 * 2.0 / 5)  # at pods
    assert b.queued == pytest.approx(3 / 5)  # waiting for one, apart
    assert b.backlog_mu == 1.5  # what waits for a pod at the slot's end
    assert b.mu_per_minute == pytest.approx(6 / 5 * 60)  # 72 MU/min
    assert b.queue_depth == 3
    # p50: rank 15 of 30 lies in (0.5, 1] -> 0.5 + 0.5 x 15/29; p99: rank 29.7 in (5, 10] -> 8.5
    assert b.p50_latency_s == pytest.approx(0.5 + 0.5 * 15 / 29)
    assert b.p99_latency_s == pytest.approx(5 + 5 * 0.7)
    chat.refresh_from_db()
    assert chat.used_mu_per_minute == pytest.approx(6.0)  # 6 MU in the last minute


def test_squares_no_requests_can_have_read_as_the_least_they_can(publish_seconds, chat):
    # Redis sums what routers write, unchecked. Per second: a router whose 3 requests of 0.6 MU
    # carry 0.12 MU^2 in all, each 0.2 MU would be 0.04, so 0.12 is the least (all of one size);
    # a lying router's 0.01 beside it. The lie reads as the least for 6 requests of 1.2 MU
    # (0.24), never steadier. In the next slot, in a rollout, a router from before the squares
    # (MU, no squares, no squared requests) beside an honest one: its MU came without squares,
    # so the bucket's squares are not known (0), though the honest router's are in Redis.
    honest = TrafficSample(
        chat.pk, "owner", requests=3, inflight=1.0, mu=0.6, mu_squared=0.12, squared_requests=3
    )
    liar = replace(honest, mu_squared=0.01)
    old = replace(honest, mu_squared=0.0, squared_requests=0)
    publish_seconds(
        {s: [[honest], [liar]] for s in range(TS - 10, TS - 5)}
        | {s: [[honest], [old]] for s in range(TS - 5, TS)}
    )
    scaling.horizontal_pass(None, NOW + timedelta(seconds=samples.LAG_S))
    lied, rollout = (LoadBucket.objects.get(endpoint=chat, end=end) for end in (TS - 5, TS))
    assert lied.mu_squared_per_minute == pytest.approx(1.2**2 / 6 * 60)  # 0.24 MU^2 a second
    assert (rollout.mu_per_minute, rollout.mu_squared_per_minute) == (pytest.approx(72.0), 0.0)


def test_seconds_no_router_reported_are_missing_not_idle(publish_seconds, chat):
    publish_seconds({TS - 3: [[]]})  # one second of the slot TS-5..TS-1 was reported
    scaling.horizontal_pass(None, NOW + timedelta(seconds=samples.LAG_S))
    b = LoadBucket.objects.get(endpoint=chat, end=TS)
    assert (b.seconds, b.in_flight, b.requests) == (1, 0.0, 0)
    # The slot before it had no report at all: no bucket, so no decision reads it as idle.
    assert not LoadBucket.objects.filter(end=TS - 5).exists()


def test_without_redis_routers_post_their_seconds(settings, operator_client, owner_client, chat):
    settings.REDIS_URL = ""
    rows = (TrafficSample(chat.pk, "acme", inflight=4.0, requests=2, mu=0.5),)
    for s in range(TS - 5, TS):
        body = RouterSecond(s, rows, "router-a").to_json()
        answer = operator_client.post("/api/v1/load-samples/", body, format="json")
        assert answer.status_code == 201 and answer.json() == {"stored": 1}
    scaling.horizontal_pass(None, NOW + timedelta(seconds=samples.LAG_S))
    b = LoadBucket.objects.get(endpoint=chat, end=TS)
    assert (b.seconds, b.in_flight, b.requests, b.mu_per_minute) == (5, 4.0, 10, pytest.approx(30.0))
    bad = {**RouterSecond(TS, (), "router-a").to_json(), "second": "now"}
    bad = operator_client.post("/api/v1/load-samples/", bad, format="json")
    assert bad.status_code == 400 and bad.json()["fields"]["second"]["value"] == "now"
    assert (
        owner_client.post(
            "/api/v1/load-samples/", RouterSecond(1, (), "r").to_json(), format="json"
        ).status_code
        == 403
    )


def test_load_samples_body_that_is_not_an_object_is_a_400(operator_client):
    answer = operator_client.post("/api/v1/load-samples/", [{"second": 1, "rows": []}], format="json")
    assert answer.status_code == 400 and "must be a JSON object" in str(answer.json()), answer.json()


# --- horizontal decisions reach the cluster


def test_load_scales_up_capped_per_tick_with_the_numbers_in_the_event(chat):
    # 30 in flight against 80 % of 8 per replica needs 4.69 replicas -> 5 (from 1 a tick may
    # reach max(1 x 10, 1 + 4) = 10).
    buckets(chat, 20, in_flight=30.0, mu=10.0, requests=50)
    cluster = Recorder()
    report = scaling.horizontal_pass(cluster, NOW)
    assert (report.decided, report.changed, report.failed) == (1, 1, 0)
    chat.refresh_from_db()
    assert chat.desired_replicas == 5 and cluster.applied[f"ep-{chat.pk}-v1"].replicas == 5
    event = Event.objects.get(kind="scale", endpoint=chat)
    assert event.message.startswith("chat: scaled 1 -> 5: 4.7 replicas needed over the last 20 s.")
    assert (
        "10.0 MU/min (its busiest 10 s) and 30.0 in flight: 0.12 replicas by MU, 4.69 by requests"
        in event.message
    )
    assert (event.detail["from"], event.detail["to"], event.detail["rule"]) == (1, 5, "load")
    d = cluster.applied[f"ep-{chat.pk}-v1"]
    assert d.args[-2:] == ("--served-model-name", "chat") and d.labels["endpoint"] == str(chat.pk)


def test_a_raised_minimum_scales_up_and_its_event_names_the_minimum(chat):
    # 15 s of samples and no load (a collector just restarted): enough to decide on, too few to
    # shed a replica. The minimum raised to 2 (16 provisioned, 8 a replica) is what scales it,
    # and its event says so, not the load's "no scale-down yet".
    buckets(chat, 15)
    Endpoint.objects.filter(pk=chat.pk).update(min_provisioned_concurrency=16)
    scaling.horizontal_pass(Recorder(), NOW)
    chat.refresh_from_db()
    assert chat.desired_replicas == 2
    event = Event.objects.get(kind="scale", endpoint=chat)
    assert event.message.startswith("chat: scaled 1 -> 2: raised to the minimum 2. Over the last 20 s:")
    assert "no scale-down" not in event.message
    assert (event.detail["from"], event.detail["to"], event.detail["rule"]) == (1, 2, "minimum")


def test_scale_events_quote_the_window_and_figure_their_decision_used(chat):
    # The endpoint's own windows: up on 30 s, down on 90 s. 24 in flight for the last 30 s
    # against 80 % of 8 a replica: 3.75 -> 4. Then 15 s at 2 in flight: over the last 30 s
    # (15 x 24 + 15 x 2) / 30 = 13, 2.03 -> 3, and arrivals (10 MU/min) need little. Both events
    # quote the same arrivals figure over the same 90 s, and each its own need.
    chat.autoscaler = {"scale_up_window_s": 30, "scale_down_window_s": 90}
    chat.save()
    buckets(chat, 300, in_flight=2.0, mu=10.0, requests=5, until_s_ago=30)
    buckets(chat, 30, in_flight=24.0, mu=10.0, requests=5)
    scaling.horizontal_pass(Recorder(), NOW)
    up = Event.objects.get(kind="scale", endpoint=chat)
    assert up.detail["need"] == pytest.approx(3.75) and up.detail["window_s"] == 30
    assert up.message.startswith("chat: scaled 1 -> 4: 3.8 replicas needed over the last 30 s.")
    assert "3.75 by requests" in up.message
    LoadBucket.objects.bulk_create(
        LoadBucket(
            endpoint=chat, end=end, seconds=5, in_flight=2.0, mu_per_minute=10.0,
            mu_squared_per_minute=0.1, requests=5, queue_depth=0.0, errors=0, throttled=0,
            ready_replicas=0, desired_replicas=4,
        )
        for end in range(TS + 5, TS + 16, 5)
    )  # fmt: skip
    scaling.horizontal_pass(Recorder(), NOW + timedelta(seconds=15))
    down = Event.objects.filter(kind="scale", endpoint=chat).latest("id")
    assert down.detail["down_need"] == pytest.approx(13 / 6.4) and down.detail["down_window_s"] == 90
    assert down.message.startswith("chat: scaled 4 -> 3: at most 2.1 replicas needed over the last 90 s.")
    assert "2.03 by requests" in down.message
    arrivals = f"over the last 90 s, arrivals: up to {up.detail['arrivals_need']:.2f};"
    assert up.detail["arrivals_need"] == down.detail["arrivals_need"] > 0
    assert arrivals in up.message and arrivals in down.message


@pytest.mark.parametrize("burst_memory_s", [0.0, 900.0])
def test_the_pass_reads_back_as_far_as_the_burst_memory(chat, burst_memory_s):
    # A burst 500-600 s ago (1,000 MU/min: 10 replicas), 300 MU/min since (3.75 -> 4). With
    # burst_memory_s 900 it holds 1,000 x 30 / 35 = 857 MU/min, capped at 1.75 x 3.75 = 6.6
    # replicas: 7 stay. The pass must load that far back; it loaded its windows' 90 s or the
    # 300-s grace, not the memory.
    chat.autoscaler = {"burst_memory_s": burst_memory_s}
    chat.desired_replicas = 10
    chat.save()
    buckets(chat, 600, in_flight=40.0, mu=1000.0, requests=500, until_s_ago=500)
    buckets(chat, 500, in_flight=0.5, mu=300.0, requests=50)
    scaling.horizontal_pass(Recorder(), NOW)
    chat.refresh_from_db()
    assert (chat.desired_replicas >= 6) == (burst_memory_s > 0), chat.desired_replicas


def test_a_series_of_bursts_at_one_level_is_kept_on_the_row_and_held_past_the_memory(
    chat, owner, make_endpoint
):
    # 100 MU/min with seven 20-s bursts at 700, 50 s apart, the last from 400 to 380 s before
    # NOW: a series for 320 s, longer than the 300-s memory; each burst needs 233 MU x 60 / 25 =
    # 560 MU/min, 5.6 replicas. The passes that see them recur keep the series on the row
    # (Endpoint.burst_series), each adding the bursts it sees; 280 s after the last pass the
    # memory holds one burst and the hold alone would be capped at 1.75 x 100 / 80 -> 3, but the
    # series, one level, holds its 5.6 -> 6 until 300 s after its last burst. A steady endpoint
    # keeps none.
    steady = make_endpoint(owner, "steady", max_provisioned_concurrency=80)
    buckets(steady, 1200, in_flight=0.5, mu=100.0, requests=50)
    buckets(chat, 1200, in_flight=0.5, mu=100.0, requests=50)
    starts = range(TS - 700, TS - 399, 50)
    LoadBucket.objects.filter(
        Q.create([Q(end__gt=s, end__lte=s + 20) for s in starts], connector=Q.OR), endpoint=chat
    ).update(mu_per_minute=700.0)
    chat.desired_replicas = 6
    chat.save()
    scaling.horizontal_pass(Recorder(), NOW - timedelta(seconds=560))
    chat.refresh_from_db()
    assert [row[:2] for row in chat.burst_series] == [[s, s + 20] for s in starts[:3]]
    scaling.horizontal_pass(Recorder(), NOW - timedelta(seconds=360))
    chat.refresh_from_db()
    steady.refresh_from_db()
    assert [row[:2] for row in chat.burst_series] == [[s, s + 20] for s in starts]
    assert steady.burst_series is None
    scaling.horizontal_pass(Recorder(), NOW - timedelta(seconds=100))
    chat.refresh_from_db()
    assert chat.desired_replicas == 6 and len(chat.burst_series) == 7
    Endpoint.objects.filter(pk=chat.pk).update(desired_replicas=7)
    scaling.horizontal_pass(Recorder(), NOW - timedelta(seconds=95))
    held = Event.objects.filter(kind="scale", endpoint=chat).latest("id")
    assert held.detail["series_held"] == pytest.approx(5.6) and held.detail["to"] == 6
    assert "a series of bursts at one level holds 5.6 replicas for 300 s after its last" in held.message
    # 300 s after its last burst the series is over: gone from the row, the fleet sheds it.
    scaling.horizontal_pass(Recorder(), NOW - timedelta(seconds=75))
    chat.refresh_from_db()
    assert chat.burst_series is None and chat.desired_replicas < 6


@pytest.mark.parametrize("stored", [[[1.0, 2.0]], [["a", 2.0, 3.0]], {"runs": 1}, [[9.0, 1.0, 5.0]]])
def test_a_burst_series_no_pass_wrote_is_begun_anew_and_stops_no_other_endpoint(
    chat, owner, make_endpoint, stored
):
    other = make_endpoint(owner, "other", max_provisioned_concurrency=80)
    for e in (chat, other):
        buckets(e, 400, in_flight=0.5, mu=300.0, requests=50)
    Endpoint.objects.filter(pk=chat.pk).update(burst_series=stored, desired_replicas=1)
    Endpoint.objects.filter(pk=other.pk).update(desired_replicas=1)
    scaling.horizontal_pass(Recorder(), NOW)
    chat.refresh_from_db()
    other.refresh_from_db()
    assert chat.burst_series is None and (chat.desired_replicas, other.desired_replicas) == (4, 4)


def test_a_calm_endpoint_is_planned_at_a_full_replica(chat, owner, make_endpoint, monkeypatch):
    # 300 MU/min for 40 minutes against 100 per replica: 300 / 80 = 3.75 -> 4 by default. With
    # calm_history_s 1800 the pass judges the spans since the last pass and keeps the result
    # (Endpoint.calm_since); it loads no more buckets than another endpoint for that.
    chat.autoscaler = {"calm_history_s": 1800}
    chat.save()
    other = make_endpoint(owner, "other", max_provisioned_concurrency=80)
    for e in (chat, other):
        buckets(e, 2400, in_flight=0.5, mu=300.0, requests=50)
    horizons, load = [], scaling.load_history
    monkeypatch.setattr(scaling, "load_history", lambda h, ts: horizons.append(h) or load(h, ts))
    # Judged for the first time: on what the pass loads, its calm starting at the first bucket.
    # Made so 30 minutes ago (a pass then found it judged since), it is calm: planned at a full
    # replica, 3.
    Lease.objects.create(name=scaling.HORIZONTAL, cursor=TS - 5)
    scaling.horizontal_pass(Recorder(), NOW)
    chat.refresh_from_db()
    other.refresh_from_db()
    assert horizons[-1][chat.pk] == horizons[-1][other.pk] < 400
    assert chat.calm_since is not None and NOW - chat.calm_since < timedelta(seconds=400)
    # The other is judged too, for the quiet margin (on by default), on the same buckets.
    assert (chat.desired_replicas, other.desired_replicas) == (4, 4) and other.calm_since == chat.calm_since
    Endpoint.objects.filter(pk=chat.pk).update(calm_since=NOW - timedelta(seconds=1800))
    later = NOW + timedelta(seconds=5)
    scaling.horizontal_pass(Recorder(), later)
    chat.refresh_from_db()
    assert chat.calm_since == NOW - timedelta(seconds=1800) and chat.desired_replicas == 3
    assert "calm for 1800 s" in Event.objects.filter(kind="scale", endpoint=chat).latest("id").message
    assert horizons[-1][chat.pk] == horizons[-1][other.pk]
    # A burst (a 10-s span at 1,100 MU/min, 3.7x the 300 s before) restarts the calm at its end,
    # and the margins are back: 1,100 / 80 = 13.75 replicas.
    LoadBucket.objects.filter(endpoint=chat, end__gt=TS - 5).update(mu_per_minute=1100.0)
    LoadBucket.objects.create(
        endpoint=chat, end=TS + 5, seconds=5, in_flight=0.5, mu_per_minute=1100.0,
        mu_squared_per_minute=11.0, requests=50, queue_depth=0.0, errors=0, throttled=0,
        ready_replicas=0, desired_replicas=3,
    )  # fmt: skip
    scaling.horizontal_pass(Recorder(), later + timedelta(seconds=5))
    chat.refresh_from_db()
    assert chat.calm_since == later
    message = Event.objects.filter(kind="scale", endpoint=chat).latest("id").message
    assert "13.8 replicas needed over the last 20 s" in message and "calm" not in message
    # Turned off, and the quiet margin too, nothing is kept; turned on again, it is judged anew.
    Endpoint.objects.filter(pk=chat.pk).update(autoscaler={"quiet_margin": 1.0})
    scaling.horizontal_pass(Recorder(), later + timedelta(seconds=10))
    chat.refresh_from_db()
    assert chat.calm_since is None


@pytest.mark.parametrize("request_mu, replicas", [(0.01, 3), (3.0, 4)])
def test_a_calm_endpoint_of_long_prompts_keeps_its_margins(chat, request_mu, replicas):
    # 300 MU/min for 40 minutes, no burst, calm for 1,800 s. In requests of 0.01 MU it is planned
    # at a full replica (3); in requests of 3 MU (long prompts) the work of 5 s varies by
    # sqrt(900 / 60 x 5) / 25 = 0.35 > 0.1 (calm.work_spread_over): the margins stay, 300 / 80 -> 4.
    # The squares come from the buckets the pass loads (LoadBucket.mu_squared_per_minute).
    chat.autoscaler = {"calm_history_s": 1800}
    chat.calm_since = NOW - timedelta(seconds=1800)
    chat.desired_replicas = 3
    chat.save()
    buckets(chat, 2400, in_flight=0.5, mu=300.0, requests=50, request_mu=request_mu)
    Lease.objects.create(name=scaling.HORIZONTAL, cursor=TS - 5)
    scaling.horizontal_pass(Recorder(), NOW)
    chat.refresh_from_db()
    assert chat.desired_replicas == replicas and chat.calm_since == NOW - timedelta(seconds=1800)
    if request_mu == 3.0:  # the scale event says why the margins stay (but the quiet margin)
        message = Event.objects.get(kind="scale", endpoint=chat).message
        assert (
            "calm for 1800 s, but its work varies 0.35 over 5 s, above 0.1:"
            " planned at 0.90 of a replica, not a full one" in message
        )


@pytest.mark.parametrize("quiet_s, replicas", [(1790, 6), (1800, 5)])
def test_half_an_hour_without_a_burst_halves_the_margin(chat, quiet_s, replicas):
    # No overrides: 450 MU/min for 40 minutes from 4 replicas, 450 / 80 = 5.6 -> 6 with the
    # whole margin; once its calm (kept for every endpoint) is 1,800 s old, 450 / 90 = 5.0 -> 5.
    chat.calm_since = NOW - timedelta(seconds=quiet_s)
    chat.desired_replicas = 4
    chat.save()
    buckets(chat, 2400, in_flight=0.5, mu=450.0, requests=50)
    Lease.objects.create(name=scaling.HORIZONTAL, cursor=TS - 5)
    scaling.horizontal_pass(Recorder(), NOW)
    chat.refresh_from_db()
    assert chat.desired_replicas == replicas and chat.calm_since == NOW - timedelta(seconds=quiet_s)
    message = Event.objects.get(kind="scale", endpoint=chat).message
    assert ("no burst for 1800 s: planned at 0.90 of a replica" in message) == (replicas == 5)


def test_two_ticks_at_once_decide_once(chat):
    buckets(chat, 20, in_flight=30.0)
    assert scaling.horizontal_pass(Recorder(), NOW).changed == 1
    # The same tick again (a second beat, a second replica): the lease ran 0 s ago -> skipped.
    assert scaling.horizontal_pass(Recorder(), NOW) is None
    assert scaling.horizontal_pass(Recorder(), NOW + timedelta(seconds=2)) is None
    assert scaling.horizontal_pass(Recorder(), NOW + timedelta(seconds=3)) is not None
    assert Event.objects.filter(kind="scale").count() == 1


def test_the_beat_interval_is_the_passes_cadence(settings, chat):
    # Beat every 2 s: each tick runs its pass (a lease from the 5-s default skipped every other).
    settings.AUTOSCALER_HORIZONTAL_INTERVAL_S = 2.0
    ran = [scaling.horizontal_pass(Recorder(), NOW + timedelta(seconds=t)) is not None for t in (0, 2, 4, 6)]
    assert ran == [True, True, True, True]
    assert autoscaler_config.config_for(chat).tick_s == 2.0
    # ... and a second beat within the same tick is still skipped.
    assert scaling.horizontal_pass(Recorder(), NOW + timedelta(seconds=6.5)) is None


def test_the_vertical_cadence_and_window_come_from_the_setting(settings, chat):
    settings.AUTOSCALER_VERTICAL_INTERVAL_S = 10.0
    assert autoscaler_config.config_for(chat).vertical_tick_s == 10.0
    assert scaling.vertical_pass(Recorder(), NOW) is not None
    assert scaling.vertical_pass(Recorder(), NOW + timedelta(seconds=4)) is None
    assert scaling.vertical_pass(Recorder(), NOW + timedelta(seconds=10)) is not None


def test_a_crashed_pass_holds_the_lease_until_it_expires(chat):
    Lease.objects.create(
        name=scaling.HORIZONTAL, holder="dead-worker", expires_at=NOW + timedelta(seconds=30)
    )
    assert scaling.horizontal_pass(Recorder(), NOW) is None
    assert scaling.horizontal_pass(Recorder(), NOW + timedelta(seconds=31)) is not None


def test_no_samples_no_decision_never_zero(owner, make_endpoint):
    idle = make_endpoint(owner, "idle", scale_to_zero_enabled=True, max_provisioned_concurrency=8)
    idle.desired_replicas = 1
    idle.save()
    cluster = Recorder()
    report = scaling.horizontal_pass(cluster, NOW)
    assert (report.decided, report.changed) == (0, 0)
    idle.refresh_from_db()
    assert idle.desired_replicas == 1 and cluster.applied[f"ep-{idle.pk}-v1"].replicas == 1


def test_a_refusing_cluster_changes_nothing_and_says_so(chat):
    buckets(chat, 20, in_flight=30.0)
    report = scaling.horizontal_pass(Recorder(fail=True), NOW)
    assert (report.changed, report.failed) == (0, 1)
    chat.refresh_from_db()
    assert chat.desired_replicas == 1
    (event,) = Event.objects.filter(kind="scale")
    assert event.severity == "warning" and "agent unreachable" in event.message


def test_idle_for_the_grace_period_scales_to_zero(owner, make_endpoint):
    e = make_endpoint(owner, "nightly", scale_to_zero_enabled=True, max_provisioned_concurrency=8)
    e.desired_replicas = 1
    e.save()
    buckets(e, 330)  # 5.5 min of zeros, reported by routers: idle for the 300 s grace
    scaling.horizontal_pass(Recorder(), NOW)
    e.refresh_from_db()
    assert (e.desired_replicas, e.state) == (0, "scaled_to_zero")


def test_a_peak_that_came_at_this_time_on_previous_days_raises_the_floor_ahead(chat):
    # The predictive minimum on. 12:05-12:10 peaked at 6 replicas' worth on both previous days
    # (6 x 80 % of the profile's MU/min per replica); now, at 12:00, the load is quiet (10 % of a
    # replica: need 1). The forecast looks 300 s ahead (forecast_lead_s): the floor becomes 6.
    chat.autoscaler = {"predictive_min": True}
    chat.save()
    per_replica = float(chat.profile.mu_per_replica_minute)
    LoadMinute.objects.bulk_create(
        LoadMinute(endpoint=chat, end=TS - day * 86400 + 300 + 60 * m, mu_per_minute=6 * 0.8 * per_replica)
        for day in (1, 2)
        for m in range(1, 6)
    )
    buckets(chat, 300, in_flight=0.5, mu=0.1 * per_replica, requests=5)
    scaling.horizontal_pass(Recorder(), NOW)
    chat.refresh_from_db()
    assert chat.desired_replicas == 6
    event = Event.objects.get(kind="scale", endpoint=chat)
    assert "scaled 1 -> 6: a recurring peak is due: raised to the predicted minimum 6." in event.message
    assert event.detail["rule"] == "predicted minimum"
    # The minute that ended at 11:59 is recorded for tomorrow's forecast, once.
    assert LoadMinute.objects.get(endpoint=chat, end=TS - 60).mu_per_minute == pytest.approx(
        0.1 * per_replica
    )
    scaling.horizontal_pass(Recorder(), NOW + timedelta(seconds=5))
    assert LoadMinute.objects.filter(endpoint=chat, end__gt=TS - 3600).count() == 1


def test_without_the_predictive_minimum_no_minute_is_kept_and_the_floor_stays(chat):
    per_replica = float(chat.profile.mu_per_replica_minute)
    LoadMinute.objects.bulk_create(
        LoadMinute(endpoint=chat, end=TS - day * 86400 + 360, mu_per_minute=6 * 0.8 * per_replica)
        for day in (1, 2)
    )
    buckets(chat, 300, in_flight=0.5, mu=0.1 * per_replica, requests=5)
    scaling.horizontal_pass(Recorder(), NOW)
    chat.refresh_from_db()
    assert chat.desired_replicas == 1
    assert not LoadMinute.objects.filter(endpoint=chat, end__gt=TS - 3600).exists()


# --- wake from zero


def test_a_router_wakes_an_endpoint_at_zero_at_once(monkeypatch, operator_client, owner, make_endpoint):
    e = make_endpoint(owner, "nightly", scale_to_zero_enabled=True, max_provisioned_concurrency=8)
    assert e.desired_replicas == 0
    cluster = Recorder()
    monkeypatch.setattr(drivers, "driver", lambda: cluster)
    answer = operator_client.post(f"/api/v1/endpoints/{e.pk}/wake/")
    assert answer.status_code == 202 and answer.json()["desired_replicas"] == 1
    assert cluster.calls == [("scale", f"ep-{e.pk}-v1", 1)]
    assert Event.objects.get(kind="scale", endpoint=e).detail["to"] == 1
    # Again while it starts: nothing more to do.
    assert operator_client.post(f"/api/v1/endpoints/{e.pk}/wake/").status_code == 200
    assert len(cluster.calls) == 1
    # The idle history says zero, but the request that woke it is still held: keep the replica.
    buckets(e, 330)
    scaling.horizontal_pass(cluster, timezone.now())
    e.refresh_from_db()
    assert e.desired_replicas == 1


def test_wake_refusals_say_why(monkeypatch, operator_client, other_client, owner, make_endpoint):
    always_on = make_endpoint(owner, "always-on")
    Endpoint.objects.filter(pk=always_on.pk).update(desired_replicas=0)
    answer = operator_client.post(f"/api/v1/endpoints/{always_on.pk}/wake/")
    assert answer.status_code == 409 and "does not scale to zero" in answer.json()["detail"]
    nightly = make_endpoint(owner, "nightly", scale_to_zero_enabled=True)
    answer = operator_client.post(f"/api/v1/endpoints/{nightly.pk}/wake/")  # CLUSTER_DRIVER=none
    assert answer.status_code == 409 and "CLUSTER_DRIVER=none" in answer.json()["detail"]
    assert answer.json()["error"] == "no_cluster_driver"  # a configuration, not an outage: no 5xx
    assert other_client.post(f"/api/v1/endpoints/{nightly.pk}/wake/").status_code == 404

    def refuse(name, replicas):
        raise ClusterError("agent unreachable")

    cluster = Recorder()
    cluster.scale = refuse
    monkeypatch.setattr(drivers, "driver", lambda: cluster)
    answer = operator_client.post(f"/api/v1/endpoints/{nightly.pk}/wake/")
    assert answer.status_code == 503 and "agent unreachable" in answer.json()["detail"]
    nightly.refresh_from_db()
    assert nightly.desired_replicas == 0 and not Event.objects.filter(endpoint=nightly).exists()


# --- vertical


def test_slow_replicas_get_a_smaller_target(chat):
    Endpoint.objects.filter(pk=chat.pk).update(ready_replicas=2, target_concurrency_per_replica=16)
    buckets(chat, 30, in_flight=20.0, p99=9.5)  # p99 9.5 s > 90 % of the 10 s SLO, all 6 buckets
    cluster = Recorder()
    report = scaling.vertical_pass(cluster, NOW)
    assert (report.decided, report.changed) == (1, 1)
    assert cluster.calls == [("target", f"ep-{chat.pk}-v1", 12)]  # 16 x 0.75
    chat.refresh_from_db()
    assert chat.target_concurrency_per_replica == 12
    assert "16 -> 12" in Event.objects.get(kind="concurrency").message


def test_per_endpoint_settings_are_checked_naming_key_and_value(owner_client, chat):
    bad = owner_client.patch(f"/api/v1/endpoints/{chat.pk}/", {"autoscaler": {"tolerance": 2}}, format="json")
    assert bad.status_code == 400 and "tolerance=2" in str(bad.json())
    unknown = owner_client.patch(f"/api/v1/endpoints/{chat.pk}/", {"autoscaler": {"speed": 1}}, format="json")
    assert unknown.status_code == 400 and "'speed'" in str(unknown.json())
    # An integer past a float's range is out of range too (it was an OverflowError: a 500).
    huge = owner_client.patch(
        f"/api/v1/endpoints/{chat.pk}/", {"autoscaler": {"quiet_after_s": 10**400}}, format="json"
    )
    assert huge.status_code == 400 and "quiet_after_s=1000" in str(huge.json())
    for key, setting in [
        ("tick_s", "AUTOSCALER_HORIZONTAL_INTERVAL_S"),
        ("vertical_tick_s", "AUTOSCALER_VERTICAL_INTERVAL_S"),
    ]:
        cadence = owner_client.patch(f"/api/v1/endpoints/{chat.pk}/", {"autoscaler": {key: 1}}, format="json")
        assert cadence.status_code == 400, cadence.json()
        assert f"'{key}' cannot be set per endpoint" in str(cadence.json()) and setting in str(cadence.json())
    ok = owner_client.patch(
        f"/api/v1/endpoints/{chat.pk}/", {"autoscaler": {"target_utilisation": 0.5}}, format="json"
    )
    assert ok.status_code == 200 and ok.json()["autoscaler"] == {"target_utilisation": 0.5}
    # 16 in flight against 50 % of 8 per replica needs 4.00 replicas (the default 80 %: 2.5 -> 3).
    buckets(chat, 20, in_flight=16.0)
    scaling.horizontal_pass(Recorder(), NOW)
    chat.refresh_from_db()
    assert chat.desired_replicas == 4
    message = Event.objects.get(kind="scale").message
    assert "4.0 replicas needed over the last 20 s" in message and "4.00 by requests" in message


def test_a_tenant_cannot_make_the_pass_read_a_day_of_history(owner_client, chat, settings, monkeypatch):
    """Every pass loads each endpoint's horizon of buckets: the windows a tenant sets are bounded
    together, by the pass's limit and by what is kept."""
    url = f"/api/v1/endpoints/{chat.pk}/"
    for overrides in [
        {"burst_memory_s": 86400},
        {"burst_memory_s": 3000, "pod_start_s": 900},  # neither alone is over: together they are
        {"scale_to_zero_grace_s": 1e9},
    ]:
        bad = owner_client.patch(url, {"autoscaler": overrides}, format="json")
        assert bad.status_code == 400, bad.json()
        text = str(bad.json())
        assert all(f"{k}={v!r}" in text for k, v in overrides.items()) and "at most 3600 s" in text, text
    assert owner_client.patch(url, {"autoscaler": {"burst_memory_s": 1800}}, format="json").status_code == 200
    settings.LOAD_BUCKET_RETENTION_S = 1800  # kept less than the burst memory reads: refused too
    kept = owner_client.patch(url, {"autoscaler": {"burst_memory_s": 1790}}, format="json")  # + 50 s
    assert kept.status_code == 400 and "at most 1800 s" in str(kept.json())
    # The calm history is judged a pass at a time, so it reads no further back: a day is allowed,
    # and even the first pass (no cursor yet) reads only the collector's catch-up and the 310 s
    # before it.
    assert (
        owner_client.patch(url, {"autoscaler": {"calm_history_s": 86400}}, format="json").status_code == 200
    )
    horizons, load = [], scaling.load_history
    monkeypatch.setattr(scaling, "load_history", lambda h, ts: horizons.append(h) or load(h, ts))
    scaling.horizontal_pass(Recorder(), NOW)
    assert horizons[-1][chat.pk] <= samples.MAX_CATCH_UP_S + 2 * samples.BUCKET_S + 310


def test_stored_settings_no_longer_valid_fall_back_to_the_defaults(chat, caplog):
    """Settings stored before a limit or a setting changed do not fail every endpoint's pass."""
    stored = {"burst_memory_s": 86400, "target_utilisation": 0.5}
    Endpoint.objects.filter(pk=chat.pk).update(autoscaler=stored)
    buckets(chat, 20, in_flight=16.0)
    with caplog.at_level("WARNING", logger="controlplane.scaling"):
        scaling.horizontal_pass(Recorder(), NOW)
    chat.refresh_from_db()
    assert chat.desired_replicas == 3  # 16 in flight at the default 80 % of 8 (0.5 would ask 4)
    assert f"endpoint {chat.pk}: stored autoscaler settings refused" in caplog.text
    assert "burst_memory_s=86400" in caplog.text


# --- the pod mirror


def test_cluster_pods_become_the_routing_tables_pods(chat):
    Pod.objects.create(endpoint=chat, name="registered-by-hand", url="http://127.0.0.1:9", ready=True)
    Endpoint.objects.filter(pk=chat.pk).update(desired_replicas=2)
    cluster = Recorder(
        pods=[
            PodState(f"ep-{chat.pk}-v1-1", f"ep-{chat.pk}-v1", "http://127.0.0.1:7001", True),
            PodState(f"ep-{chat.pk}-v1-2", f"ep-{chat.pk}-v1", "http://127.0.0.1:7002", False),
            PodState("other-1", "other", "http://127.0.0.1:7003", True),  # not ours
        ]
    )
    assert pods.sync_pods(cluster) == 2
    chat.refresh_from_db()
    assert (chat.ready_replicas, chat.state) == (1, "scaling")
    names = set(Pod.objects.values_list("name", flat=True))
    assert names == {"registered-by-hand", f"ep-{chat.pk}-v1-1", f"ep-{chat.pk}-v1-2"}
    cluster.pods = [PodState(f"ep-{chat.pk}-v1-2", f"ep-{chat.pk}-v1", "http://127.0.0.1:7002", True)]
    assert pods.sync_pods(cluster) == 2  # one gone, one ready
    chat.refresh_from_db()
    assert (chat.ready_replicas, chat.state) == (1, "scaling")
    assert set(Pod.objects.values_list("name", "ready")) == {
        ("registered-by-hand", True),
        (f"ep-{chat.pk}-v1-2", True),
    }
