"""Scenario tests of the horizontal decider on synthetic time, with worked numbers."""

import math
from dataclasses import replace

import pytest

from capacity.autoscaler import AutoscalerConfig, Bucket, EndpointSpec, Rule, calm, decide, series
from capacity.autoscaler.horizontal import lookback_s, quiet_utilisation
from capacity.autoscaler.window import Timeline, aggregate, in_window
from capacity.autoscaler.wording import explain

T0 = 1_000_000.0


def steady(mu, in_flight=0.0, start=T0 - 300, end=T0, requests=10, request_mu=0.01):
    """5-second buckets of a constant load from start to end, in requests of `request_mu` each
    (their squares sum to mu x request_mu per minute)."""
    t, out = start + 5, []
    while t <= end:
        out.append(
            Bucket(
                end=t, seconds=5, in_flight=in_flight, mu_per_minute=mu, requests=requests,
                mu_squared_per_minute=mu * request_mu,
            )
        )  # fmt: skip
        t += 5
    return out


def spec(current, **kw):
    base = dict(min_replicas=1, max_replicas=50, current_replicas=current, target_concurrency_per_replica=8)
    return EndpointSpec(**{**base, **kw})


def test_need_is_the_larger_of_mu_and_concurrency():
    # 40 MU/min vs 80 % of 100 -> 0.5; 30 in flight vs 80 % of 8 = 6.4 -> 4.69 -> 5 replicas.
    decision = decide(spec(5), steady(40, in_flight=30), T0)
    assert decision.need == pytest.approx(30 / 6.4)
    assert decision.replicas == 5


def test_requests_waiting_at_the_router_count_up_to_twice_those_in_flight_unless_they_drain():
    # A closed loop of 24 clients against 1 pod of target 8: 8 at the pod, 16 waiting.
    # (8 + 16) / 6.4 = 3.75 -> 4 replicas.
    def waiting(queued, in_flight):
        return [replace(b, queued=queued) for b in steady(10, in_flight=in_flight)]

    decision = decide(spec(1), waiting(16.0, 8), T0)
    assert decision.need == pytest.approx(3.75) and decision.replicas == 4
    assert "8.0 in flight + 16.0 waiting" in explain(decision)
    # 100 clients: (8 + 2 x 8) / 6.4 -> 4; at 4 pods, 32 and 68 waiting: (32 + 64) / 6.4 -> 15.
    assert decide(spec(1), waiting(92.0, 8), T0).replicas == 4
    assert decide(spec(4), waiting(68.0, 32), T0).replicas == 15
    # An open-loop burst waiting for pods: 5 at the pod, 40 waiting -> (5 + 10) / 6.4 = 2.34,
    # not (5 + 40) / 6.4 = 7.03: its arrivals (the MU rule) and backlog size it instead.
    assert decide(spec(1), waiting(40.0, 5), T0).need == pytest.approx(15 / 6.4)
    # Its pods are up and the queue drains: 40, 30, 20, 10 waiting over the last 20 s (mean 25,
    # the latest bucket under 90 % of it) -> not counted: 40 / 6.4 = 6.25, not 80 / 6.4 = 12.5.
    draining = steady(10, in_flight=40)
    queues = (40.0, 30.0, 20.0, 10.0)
    draining[-4:] = [replace(b, queued=q) for b, q in zip(draining[-4:], queues, strict=True)]
    decision = decide(spec(7), draining, T0)
    assert decision.need == pytest.approx(40 / 6.4) and "waiting" in explain(decision)


def test_scale_up_follows_the_last_20_seconds():
    # Quiet at 80 MU/min (1 replica) for 5 min, then 20 s at 700 MU/min: 700 / 80 = 8.75 -> 9,
    # within one tick's cap of max(1 x 10, 1 + 4) = 10.
    buckets = steady(80, end=T0 - 20) + steady(700, start=T0 - 20)
    decision = decide(spec(1), buckets, T0)
    assert decision.need == pytest.approx(8.75)
    assert decision.replicas == 9
    # 10 s at 2,000 MU/min after 10 s at 80: the MU rule reads the window's busiest 10 s, not
    # its mean ((2000 + 80) / 2 / 80 = 13): 2000 / 80 = 25 replicas, capped at 10 this tick;
    # the next tick (cap max(100, 14)) reaches 25.
    burst = steady(80, end=T0 - 10) + steady(2000, start=T0 - 10)
    decision = decide(spec(1), burst, T0)
    assert decision.need == pytest.approx(25) and decision.replicas == 10
    assert "at most 10 this tick" in explain(decision)
    burst += steady(2000, start=T0, end=T0 + 10)
    assert decide(spec(10), burst, T0 + 10).replicas == 25


def test_the_mu_rule_sizes_for_the_busiest_10_seconds_and_remembers_it():
    """Prefill-heavy traffic in lumps: 5 s at 400 MU/min, 5 s at 80, in turn. The mean (240) asks
    3 replicas of 80; a replica then saturates its prefill in every lump, and every decode step
    beside it carries an 8,192-token chunk (334 ms on an H100, 3x a 0.1 s/token deadline). The
    busiest 10 s (one lump and one lull: 240) asks the same 3: bursts shorter than the span are
    averaged; two lumps in a row (400) ask 5, and the scale-down window remembers them."""
    lumpy = []
    for k, b in enumerate(steady(80, end=T0)):
        lumpy.append(replace(b, mu_per_minute=400.0 if k % 2 else 80.0))
    assert decide(spec(3), lumpy, T0).need == pytest.approx(3.0)
    lumps = lumpy[:-3] + [replace(b, mu_per_minute=400.0) for b in lumpy[-3:-1]] + lumpy[-1:]
    decision = decide(spec(3), lumps, T0)
    assert decision.need == pytest.approx(5.0) and decision.replicas == 5
    later = lumps + steady(80, start=T0, end=T0 + 40)
    held = decide(spec(5), later, T0 + 40)
    assert held.replicas == 5 and held.down_need == pytest.approx(5.0)
    gone = later + steady(80, start=T0 + 40, end=T0 + 65)
    # Past the window the lumps only hold 1.75 x the need now (see the burst hold below): 2.
    assert decide(spec(5), gone, T0 + 65).replicas == 2
    off = AutoscalerConfig(burst_memory_s=0.0)
    assert decide(spec(5, config=off), gone, T0 + 65).replicas == 1


def test_scale_down_waits_for_the_highest_need_of_60_seconds():
    # 700 MU/min until 30 s ago, then 80: the 10-s span that ended then, all 700 MU/min, is in
    # the 60-s memory: 700 / 80 = 8.75 -> hold 9.
    buckets = steady(700, end=T0 - 30) + steady(80, start=T0 - 30)
    decision = decide(spec(9), buckets, T0)
    assert decision.replicas == 9 and decision.down_need == pytest.approx(8.75)
    later = buckets + steady(80, start=T0, end=T0 + 45)
    assert decide(spec(9), later, T0 + 25).replicas == 9
    # At T0 + 30 that span has left; the highest is the next, a bucket of 700 and one of 80:
    # 390 / 80 = 4.9 -> 5. At T0 + 40 no span of the window holds a 700 bucket: 80 / 80 = 1
    # replica, and the 700 past it holds 1.75 x that (the burst hold below): 2.
    decision = decide(spec(9), later, T0 + 30)
    assert decision.replicas == 5 and decision.down_need == pytest.approx(390 / 80)
    decision = decide(spec(5), later, T0 + 40)
    assert decision.replicas == 2 and "60 s" in explain(decision)
    off = AutoscalerConfig(burst_memory_s=0.0)
    assert decide(spec(5, config=off), later, T0 + 40).replicas == 1


def test_a_past_burst_holds_what_would_serve_it_again_before_pods_are_ready():
    # A 20-s burst at 1,600 MU/min ending 120 s ago, 400 MU/min before and since: 400 / 80 = 5
    # replicas now. The 60-s window has forgotten it; the hold has not: served again within the
    # TTFT's 5 s of waiting, its 20 s (533 MU) need 533 x 60 / 25 = 1,280 MU/min, 12.8 replicas
    # at a full replica's 100 (its 30 s: 600 MU / 35 s, 10.3); capped at 1.75 x 5 = 8.75 -> 9.
    # Decode-heavy fan-outs recur minutes apart, and one within a pod start is served only by
    # what stands (docs/evaluation/autoscaler.md).
    buckets = steady(400, end=T0 - 140) + steady(1600, start=T0 - 140, end=T0 - 120)
    buckets += steady(400, start=T0 - 120)
    decision = decide(spec(12), buckets, T0)
    assert decision.down_need == pytest.approx(8.75) and decision.replicas == 9
    # A smaller burst (800) holds its own 6.4, under the cap -> 7; without the hold, 5.
    small = steady(400, end=T0 - 140) + steady(800, start=T0 - 140, end=T0 - 120)
    small += steady(400, start=T0 - 120)
    assert decide(spec(12), small, T0).down_need == pytest.approx(6.4)
    assert decide(spec(12), small, T0).replicas == 7
    off = AutoscalerConfig(burst_memory_s=0.0)
    assert decide(spec(12, config=off), buckets, T0).replicas == 5
    # 300 s after it, spans of up to 30 s that end within the memory still hold part of it;
    # once none does (by 325 s), 5.
    later = buckets + steady(400, start=T0, end=T0 + 205)
    assert decide(spec(9), later, T0 + 180).replicas > 5
    assert decide(spec(9), later, T0 + 205).replicas == 5
    # Steady traffic holds r x 30 / 35 of itself: never more than the window does.
    assert decide(spec(5), steady(400, start=T0 - 400), T0).down_need == pytest.approx(5.0)


def test_a_short_dip_never_scales_down():
    # 20 s of silence inside steady traffic: the scale-down window remembers the traffic.
    buckets = steady(350, end=T0 - 20) + steady(0, start=T0 - 20, requests=0)
    assert decide(spec(5), buckets, T0).replicas == 5


def test_within_the_tolerance_band_nothing_moves():
    # Need 840 / 80 = 10.5 replicas with 10 running: 5 % over, inside the 10 % band.
    assert decide(spec(10), steady(840), T0).replicas == 10
    # Need 896 / 80 = 11.2: outside the band.
    assert decide(spec(10), steady(896), T0).replicas == 12


def test_clamped_to_the_provisioned_bounds():
    assert decide(spec(3, max_replicas=4), steady(7000), T0).replicas == 4
    decision = decide(spec(3, min_replicas=3), steady(7), T0 + 0)
    assert decision.replicas == 3 and "minimum 3" in explain(decision)


def test_scale_to_zero_only_when_allowed_and_idle_past_the_grace_period():
    idle = steady(0, requests=0, start=T0 - 300)
    assert decide(spec(1, min_replicas=0, scale_to_zero_enabled=True), idle, T0).replicas == 0
    assert decide(spec(1, min_replicas=0, scale_to_zero_enabled=False), idle, T0).replicas == 1
    # One request 100 s ago keeps the replica.
    touched = [*idle[:40], Bucket(idle[40].end, 5, 0.0, 0.5, requests=1), *idle[41:]]
    assert decide(spec(1, min_replicas=0, scale_to_zero_enabled=True), touched, T0).replicas == 1


def test_no_samples_means_no_decision_not_zero():
    decision = decide(spec(4, min_replicas=0, scale_to_zero_enabled=True), [], T0)
    assert decision.replicas is None and "no decision" in explain(decision)
    stale = steady(100, end=T0 - 60)  # the router stopped reporting a minute ago
    assert decide(spec(4, min_replicas=0, scale_to_zero_enabled=True), stale, T0).replicas is None


def test_scale_from_zero_takes_the_first_request():
    buckets = [*steady(0, requests=0, end=T0 - 5), Bucket(T0, 5, in_flight=1.0, mu_per_minute=3, requests=1)]
    decision = decide(spec(0, min_replicas=0, scale_to_zero_enabled=True), buckets, T0)
    assert decision.replicas == 1


def test_the_predicted_minimum_raises_the_floor():
    decision = decide(spec(2, predicted_min_replicas=8), steady(70), T0)
    assert decision.replicas == 8 and "predicted minimum" in explain(decision)


def test_per_endpoint_overrides():
    # At 50 % target utilisation 350 MU/min needs 7 replicas instead of 350 / 80 = 4.4 -> 5.
    cfg = AutoscalerConfig.from_overrides({"target_utilisation": 0.5})
    assert decide(spec(7, config=cfg), steady(350), T0).replicas == 7
    assert decide(spec(5), steady(350), T0).replicas == 5


def with_backlog(buckets, mu):
    """The same buckets, the last one ending with `mu` MU waiting at the router."""
    return [*buckets[:-1], replace(buckets[-1], backlog_mu=mu)]


def test_a_backlog_at_the_router_is_planned_to_drain_in_30_seconds():
    # 80 MU/min arrive (1 replica) and 100 MU wait at the router: draining them in 30 s is
    # 200 MU/min more, (80 + 200) / 80 = 3.5 -> 4. The window's backlog is its latest bucket's.
    buckets = with_backlog(steady(80), 100.0)
    buckets[-2] = replace(buckets[-2], backlog_mu=300.0)  # 5 s earlier: more waited, some left
    decision = decide(spec(1), buckets, T0)
    assert decision.need == pytest.approx(3.5)
    assert decision.replicas == 4
    # Drained in 60 s instead: (80 + 100) / 80 = 2.25 -> 3.
    slow = AutoscalerConfig.from_overrides({"backlog_drain_s": 60.0})
    assert decide(spec(1, config=slow), buckets, T0).replicas == 3


def test_steady_traffic_is_planned_at_the_target_utilisation():
    # 450 MU/min for 5 min against 100 per replica: 450 / 80 = 5.63 -> 6, however smooth the
    # spans (no margin is dropped for smoothness alone: that was measured to lose minutes).
    assert decide(spec(5), steady(450), T0).replicas == 6
    # 30 s at 300 then 30 s at 600: the scale-down window's needs too: 600 / 80 = 7.5 -> 8.
    lumpy = steady(300, end=T0 - 30) + steady(600, start=T0 - 30)
    decision = decide(spec(8), lumpy, T0)
    assert decision.need == pytest.approx(7.5) and decision.down_need == pytest.approx(7.5)
    assert decision.replicas == 8


CAPPED = AutoscalerConfig(burst_recurrence_s=0.0)  # a series' hold capped as any burst's


def bursts(starts, seconds=20, base=400, peak=2800, start=T0 - 300, end=T0, dip=None):
    """5-second buckets of `base` MU/min, at `peak` within `seconds` after each of `starts`
    (at `base` again in the bucket ending `dip` s after each start)."""

    def mu(t):
        within = [s for s in starts if s < t <= s + seconds]
        return peak if within and (dip is None or t != within[0] + dip) else base

    return [b for t in range(int(start) + 5, int(end) + 1, 5) for b in steady(mu(t), start=t - 5, end=t)]


def test_bursts_in_a_series_recur_and_bursts_minutes_apart_do_not():
    from capacity.autoscaler.series import recurring

    # 20-s bursts at 7x every 50 s: 30 s of base between them, under a minute: a series, each
    # burst 2,800 x 20 / 60 = 933 MU, needing 933 x 60 / (20 + 5) = 2,240 MU/min.
    series = bursts(range(int(T0) - 290, int(T0), 50))
    assert recurring(series, T0, AutoscalerConfig()) == pytest.approx(2240)
    assert recurring(series, T0, CAPPED) == 0  # off
    # The same bursts 4 minutes apart (220 s between), a chance pair 30 s apart (one gap is no
    # series), once, or no burst.
    assert recurring(bursts([T0 - 290, T0 - 50]), T0, AutoscalerConfig()) == 0
    assert recurring(bursts([T0 - 100, T0 - 50]), T0, AutoscalerConfig()) == 0
    assert recurring(bursts([T0 - 100]), T0, AutoscalerConfig()) == 0
    assert recurring(steady(400), T0, AutoscalerConfig()) == 0
    # Bursts on an idle endpoint have no base to stand out from.
    assert recurring(bursts(range(int(T0) - 290, int(T0), 50), base=0), T0, AutoscalerConfig()) == 0
    # A series is over once base load lasts eight times its mean gap: bursts 10 s apart, the
    # last ending 75 s ago still recur; 85 s ago, no longer.
    ended = bursts(range(int(T0) - 285, int(T0) - 90, 30))  # the last from T0 - 105 to T0 - 85
    assert recurring(ended, T0 - 10, AutoscalerConfig()) > 0
    assert recurring(ended, T0, AutoscalerConfig()) == 0
    # ... or once its memory holds fewer than three of its bursts: 30 s apart, the last ending
    # 190 s ago (eight gaps would be 240 s), two of them within the last 300 s.
    ended = bursts(range(int(T0) - 290, int(T0), 50))  # the last from T0 - 40 to T0 - 20
    later = ended + steady(400, start=T0, end=T0 + 175)
    assert recurring(later, T0 + 170, AutoscalerConfig()) == pytest.approx(2240)
    assert recurring(later, T0 + 175, AutoscalerConfig()) == 0


def test_a_series_needs_what_its_tallest_burst_needed():
    from capacity.autoscaler.series import recurring

    # One burst of the series at 3x the others' height: the series needs its 6,720 (its next
    # burst comes before new pods do, and may be as tall), not the others' 2,240.
    tall = [replace(b, mu_per_minute=8400) if b.mu_per_minute == 2800 and b.end <= T0 - 260 else b
            for b in bursts(range(int(T0) - 290, int(T0), 50))]  # fmt: skip
    assert recurring(tall, T0, AutoscalerConfig()) == pytest.approx(6720)
    # A 5-s dip within each 40-s burst is no gap: one run each, its length and work the burst's
    # (7 buckets at 2,800 and the dip's at 400: 1,667 MU over 40 s: 1,667 x 60 / 45 = 2,222).
    dipped = bursts(range(int(T0) - 290, int(T0), 60), seconds=40, dip=20)
    assert recurring(dipped, T0, AutoscalerConfig()) == pytest.approx((7 * 2800 + 400) * 5 / 45)


def test_a_series_is_judged_on_time_not_on_the_buckets_that_came():
    from capacity.autoscaler.series import recurring

    # A slot no router reported is no bucket. An ended series (the last burst ending 85 s ago,
    # bursts 10 s apart) whose base since has every other slot missing has still been silent
    # for 85 s, over eight times its gaps: it is over, as with every bucket there.
    ended = bursts(range(int(T0) - 285, int(T0) - 90, 30))
    holey = [b for b in ended if b.end <= T0 - 85 or b.end % 10 == 0]
    assert len(holey) < len(ended) and recurring(holey, T0 - 10, AutoscalerConfig()) > 0
    assert recurring(ended, T0, AutoscalerConfig()) == recurring(holey, T0, AutoscalerConfig()) == 0
    # Bursts 100 s apart (80 s of base between them) with 30 s of each gap unreported: no series.
    starts = [T0 - 290, T0 - 190, T0 - 90]
    gappy = [b for b in bursts(starts) if not any(s + 40 < b.end <= s + 70 for s in starts)]
    assert recurring(gappy, T0, AutoscalerConfig()) == 0


def test_lumps_of_a_sparse_endpoints_noise_are_no_series():
    from capacity.autoscaler.series import recurring

    # 60 MU/min with a bucket at 170 every 20 s: runs of one 5-s bucket, shorter than the 10 s a
    # burst is judged over: lumps, not a series. Planned at 0.8 as without the rule, and its
    # events say nothing of bursts recurring.
    lumps = [b for t in range(int(T0) - 295, int(T0) + 1, 5)
             for b in steady(170 if t % 20 == 0 else 60, start=t - 5, end=t)]  # fmt: skip
    assert recurring(lumps, T0, AutoscalerConfig()) == 0
    decision = decide(spec(2), lumps, T0)
    assert not decision.figures.recurring and decision.figures.utilisation == pytest.approx(0.8)
    capped = decide(spec(2, config=CAPPED), lumps, T0)
    assert (decision.replicas, decision.need, decision.figures.held) == (
        capped.replicas,
        capped.need,
        capped.figures.held,
    )
    assert "recurring" not in explain(decision)
    # Two buckets at 170 every 30 s are 10-s runs: a series.
    longer = [b for t in range(int(T0) - 295, int(T0) + 1, 5)
              for b in steady(170 if t % 30 in (0, 5) else 60, start=t - 5, end=t)]  # fmt: skip
    assert recurring(longer, T0, AutoscalerConfig()) > 0


def test_recurring_bursts_are_held_past_the_cap_and_planned_at_a_full_replica():
    # A series whose last burst ended 115 s ago: 400 MU/min now, 400 / 80 = 5 replicas. Capped,
    # the hold is 1.75 x 5 = 8.75 -> 9; recurring, it is what its bursts needed: a 20-s burst at
    # 2,800 MU/min served again within 5 s of waiting, 933 MU x 60 / 25 = 2,240 MU/min, 22.4
    # replicas -> 23; and the need is planned at a full replica (the held fleet is the margin):
    # 400 / 100 = 4.
    series = bursts(range(int(T0) - 285, int(T0) - 130, 50))
    capped = decide(spec(30, config=CAPPED), series, T0)
    assert capped.figures.held == pytest.approx(8.75) and not capped.figures.recurring
    assert capped.replicas == 9
    decision = decide(spec(30), series, T0)
    assert decision.figures.recurring and decision.figures.utilisation == pytest.approx(1.0)
    assert decision.need == pytest.approx(4.0)
    assert decision.figures.held == pytest.approx(22.4) and decision.replicas == 23
    assert "bursts recurring within the last 300 s hold 22.4 replicas" in explain(decision)
    # Its first burst three times as tall: the series holds what that one needed, 67.2, past the
    # cap, until it leaves the memory; without the series rule the hold is capped at 8.75.
    tall = [replace(b, mu_per_minute=8400) if b.mu_per_minute == 2800 and b.end <= T0 - 260 else b
            for b in series]  # fmt: skip
    decision = decide(spec(80, max_replicas=100), tall, T0)
    assert decision.figures.held == pytest.approx(67.2) and decision.replicas == 68
    assert decide(spec(80, max_replicas=100, config=CAPPED), tall, T0).figures.held == pytest.approx(8.75)
    # An operator's lower target is raised to a full replica while bursts recur, as the default.
    lower = decide(spec(30, config=AutoscalerConfig(target_utilisation=0.6)), series, T0)
    assert lower.figures.utilisation == pytest.approx(1.0)


def carried_pass_by_pass(buckets, start, end, cfg=None, step=5.0):
    """The series of bursts carried as the passes carry it: every `step` s from `start` to
    `end`, each pass over only the buckets the decider reads back."""
    cfg, carried, now = cfg or AutoscalerConfig(), None, start
    while now <= end:
        seen = [b for b in buckets if now - lookback_s(cfg) < b.end <= now]
        carried, now = series.carried(carried, seen, now, cfg), now + step
    return carried


def test_a_series_of_one_level_is_held_past_the_memory_until_a_memory_passes_without_a_burst():
    # Seven 20-s bursts at 2,800 MU/min on 400, 50 s apart, from T0 - 650 to T0 - 330: a series
    # for 320 s, longer than the 300-s memory; each needs 933 MU x 60 / 25 = 2,240 MU/min. At
    # T0 - 60 the memory holds one of them: they no longer recur, and the hold is capped at 1.75
    # x 400 / 80 = 8.75 -> 9 replicas. Carried pass by pass, each burst counted once however
    # many passes saw it (growing, or cut at the memory's start), the series holds its level,
    # 22.4 -> 23, until 300 s after its last burst.
    history = bursts(range(int(T0) - 650, int(T0) - 349, 50), start=T0 - 1200, end=T0 + 60)
    assert series.recurring(history, T0 - 60, AutoscalerConfig()) == 0
    kept = carried_pass_by_pass(history, T0 - 900, T0 - 60)
    assert [(r.start, r.end) for r in kept.runs] == [
        (t, t + 20) for t in range(int(T0) - 650, int(T0) - 349, 50)
    ]
    assert kept.level(T0 - 60, AutoscalerConfig()) == pytest.approx(2240)
    assert decide(spec(30), history, T0 - 60).replicas == 9
    decision = decide(spec(30, series_level=2240.0), history, T0 - 60)
    assert decision.rule is Rule.BURST_HOLD and decision.replicas == 23
    assert decision.figures.carried == pytest.approx(22.4) and decision.figures.recurring
    held = "a series of bursts at one level holds 22.4 replicas for 300 s after its last"
    assert held in explain(decision)
    # A memory after its last burst, the series is over: nothing carried, nothing held.
    assert kept.level(T0 - 30, AutoscalerConfig()) == 0
    assert carried_pass_by_pass(history, T0 - 900, T0 - 30) is None
    # Stored as rows and read back, the same series.
    assert series.Series.of_rows(kept.rows()) == kept


def test_a_series_is_carried_only_once_longer_than_the_memory_and_at_one_level():
    # The first six bursts of the series above (270 s), or the last five: a cluster within one
    # memory, which the memory sees whole: not carried past it.
    for starts in (range(int(T0) - 650, int(T0) - 399, 50), range(int(T0) - 550, int(T0) - 349, 50)):
        cluster = bursts(starts, start=T0 - 1200, end=T0 + 60)
        assert carried_pass_by_pass(cluster, T0 - 900, T0 - 60) is None
    # All seven, the first three times as tall (6,720 > 2 x the median 2,240): not one level,
    # not carried; while they recur, the memory holds the tallest as before.
    seven = bursts(range(int(T0) - 650, int(T0) - 349, 50), start=T0 - 1200, end=T0 + 60)

    def first_at(mu):
        def first(b):
            return b.end <= T0 - 630 and b.mu_per_minute == 2800

        return [replace(b, mu_per_minute=mu) if first(b) else b for b in seven]

    mixed = first_at(8400)
    assert carried_pass_by_pass(mixed, T0 - 900, T0 - 60) is None
    assert carried_pass_by_pass(mixed, T0 - 900, T0 - 300).level(T0 - 300, AutoscalerConfig()) == 0
    # The first needing 1.77x the others' (a peak of 4,960: 3,968 MU/min): one level.
    level = first_at(400 + 2400 * 1.9)
    assert carried_pass_by_pass(level, T0 - 900, T0 - 60).level(T0 - 60, AutoscalerConfig()) > 2240
    # Off with the series rule.
    assert carried_pass_by_pass(level, T0 - 900, T0 - 60, CAPPED) is None


def test_a_carried_series_holds_its_level_planned_as_bursts_recurring():
    # 850 MU/min, steady: 850 / 80 = 10.6 -> 11 replicas. A series carried at 12 replicas
    # (1,200 MU/min) holds 12 from 14, planned at a full replica as while bursts recur (the
    # held fleet is the margin); it asks for none: from 11 it stays at 11.
    assert decide(spec(14), steady(850), T0).replicas == 11
    high = decide(spec(14, series_level=1200.0), steady(850), T0)
    assert high.replicas == 12 and high.rule is Rule.BURST_HOLD and high.figures.utilisation == 1.0
    assert decide(spec(11, series_level=1200.0), steady(850), T0).replicas == 11
    # Below the need (8.3 replicas), it holds nothing, and a burst's own need is asked without a
    # margin, as while bursts recur: 850 / 100 = 8.5 -> 9 (its pods come after it; keeping the
    # margin there cost 5 % more GPU-hours on b53 for no minute: docs/autoscaler.md).
    low = decide(spec(11, series_level=829.0), steady(850), T0)
    assert (low.replicas, low.need, low.figures.recurring) == (9, 8.5, True)
    assert "a series of bursts carried: planned at 1.00 of a replica" in explain(low)


def test_a_carried_series_ends_where_the_rule_is_off_or_its_clock_is_ahead():
    history = bursts(range(int(T0) - 650, int(T0) - 349, 50), start=T0 - 1200, end=T0 + 60)
    kept = carried_pass_by_pass(history, T0 - 900, T0 - 60)
    seen = in_window(history, T0 - 55, lookback_s(AutoscalerConfig()))
    assert series.carried(kept, seen, T0 - 55, AutoscalerConfig()) == kept
    # Turned off, or the hold's memory no longer past the scale-down window: nothing carried.
    for off in (CAPPED, AutoscalerConfig(burst_memory_s=60.0)):
        assert series.carried(kept, seen, T0 - 55, off) is None
    # Kept by a clock ahead of this one (its last burst ends after now): dropped, not held.
    assert series.carried(kept, [], T0 - 400, AutoscalerConfig()) is None
    # In a calm spell (an operator's calm history) the decider holds nothing, a level neither.
    calm_cfg = AutoscalerConfig(calm_history_s=1800.0, quiet_margin=1.0)
    quiet = decide(spec(30, config=calm_cfg, quiet_since=T0 - 3600, series_level=2240.0), steady(400), T0)
    assert quiet.figures.calm and quiet.figures.carried == 0 and quiet.replicas == 4
    # Stored rows that no pass wrote are refused, naming them.
    for rows in (
        [],
        [[1.0, 2.0]],
        [[None, 2.0, 3.0]],
        [["1.0", 2.0, 3.0]],
        [[True, 2.0, 3.0]],
        [[[1.0], 2.0, 3.0]],
        [[10**400, 10**400, 3.0]],
        [[1.0, 2.0, 3.0, 4.0]],
        [[1.0, 2.0, float("nan")]],
        [[5.0, 9.0, 1.0], [1.0, 2.0, 1.0]],
    ):
        with pytest.raises((TypeError, ValueError)):
            series.Series.of_rows(rows)


def test_a_timeline_s_bursts_are_found_once_per_time_and_rule(monkeypatch):
    """The pass asks for an endpoint's bursts twice (the series it carries, the decision): they
    are read off its buckets once, and asked at another time or by another rule, anew, as a
    fresh timeline would give them."""
    history = bursts(range(int(T0) - 650, int(T0) - 349, 50), start=T0 - 1200, end=T0 + 60)
    scans = []
    found = series._runs
    monkeypatch.setattr(series, "_runs", lambda *a: scans.append(a) or found(*a))
    timeline, cfg = Timeline(history), AutoscalerConfig()
    kept = series.carried(None, timeline, T0 - 300, cfg)
    decided = decide(spec(3, series_level=kept.level(T0 - 300, cfg)), timeline, T0 - 300)
    assert kept is not None and decided.figures.recurring and len(scans) == 1
    others = [(T0, cfg)] + [
        (T0 - 300, replace(cfg, **{name: value}))
        for name, value in (
            ("burst_ratio", 4.0),
            ("burst_memory_s", 200.0),
            ("peak_window_s", 20.0),
            ("burst_wait_s", 15.0),
        )
    ]
    for now, rule in [(T0 - 300, cfg), *others]:
        assert series.series_runs(timeline, now, rule) == series.series_runs(Timeline(history), now, rule)
    # each fresh timeline once; ours again at each other time or rule only
    assert len(scans) == 1 + (1 + len(others)) + len(others)


# An operator's calm history, on its own: the quiet margin (on by default) is tested apart.
CALM = AutoscalerConfig(calm_history_s=1800.0, quiet_margin=1.0)
MARGINS = AutoscalerConfig(quiet_margin=1.0)  # the default's margins, never cut


def judged(buckets, cfg=CALM, now=T0):
    """The calm history judged from nothing, over every bucket given."""
    return calm.quiet_since(None, buckets, -float("inf"), now, cfg)


def is_calm(buckets, cfg=CALM):
    return calm.is_calm(judged(buckets, cfg), T0, cfg)


def test_a_calm_history_is_one_without_a_span_above_two_and_a_half_times_the_five_minutes_before():
    # The docstring's numbers: 400 MU/min, then one 10-s span at 900 (2.25x): calm; at 1,100
    # (2.75x): a burst, and not calm until it is 1,800 s old.
    long = steady(400, start=T0 - 2400)

    def with_span(mu, age):
        return [replace(b, mu_per_minute=mu) if T0 - age - 10 < b.end <= T0 - age else b for b in long]

    assert is_calm(long) and judged(long) == T0 - 2400
    assert is_calm(with_span(900, 600))
    assert not is_calm(with_span(1100, 600)) and judged(with_span(1100, 600)) == T0 - 600
    assert not is_calm(with_span(1100, 1790))
    assert is_calm(with_span(1100, 1810))
    # Traffic from nothing is a burst; idle all along is calm; off, nothing is.
    assert not is_calm(steady(0, start=T0 - 2400, end=T0 - 600) + steady(400, start=T0 - 600))
    assert is_calm(steady(0, start=T0 - 2400))
    assert not is_calm(long, AutoscalerConfig())
    # A new endpoint (or one judged for the first time) is calm once its first bucket is
    # calm_history_s old; no bucket, nothing judged.
    assert not is_calm(steady(400, start=T0 - 1790))
    assert is_calm(steady(400, start=T0 - 1810))
    assert judged([]) is None and not calm.is_calm(None, T0, CALM)
    # The decider itself reads no more than without it; a judgement reads the spans since the
    # last one and the 310 s before them, at most the history's.
    assert lookback_s(CALM) == lookback_s(AutoscalerConfig()) == 300 + 30 + 20
    assert calm.lookback_s(CALM, after=T0 - 5, now=T0) == 5 + 300 + 10
    assert calm.lookback_s(CALM, after=0.0, now=T0) == 1800 + 300 + 10  # after a stall, or all
    # The quiet margin (on by default) needs the same judgement; with it off too, none.
    assert calm.lookback_s(AutoscalerConfig(), after=T0 - 5, now=T0) == 5 + 300 + 10
    assert calm.lookback_s(AutoscalerConfig(quiet_margin=1.0), after=T0 - 5, now=T0) == 0


def pass_by_pass(buckets, start, cfg=CALM, step=5.0):
    """The calm history judged as the passes do: every `step` s over only the buckets its
    lookback reaches, the first from nothing (over the history before it)."""
    since, after, now = None, -float("inf"), start
    while now <= T0:
        reach = now - calm.lookback_s(cfg, after, now)
        seen = [b for b in buckets if reach < b.end <= now]
        since, after, now = calm.quiet_since(since, seen, after, now, cfg), now, now + step
    return since


def test_judged_a_pass_at_a_time_the_calm_history_is_what_the_whole_history_says():
    # 400 MU/min for 80 minutes, a burst (a 10-s span at 1,100) 40 and 20 minutes ago: judged
    # every 5 s from 50 minutes ago, each pass reading only 315 s, the calm starts at the last
    # burst's end, as judged at once over everything.
    long = steady(400, start=T0 - 4800)
    bursts = [
        replace(b, mu_per_minute=1100)
        if T0 - 2410 < b.end <= T0 - 2400 or T0 - 1210 < b.end <= T0 - 1200
        else b
        for b in long
    ]
    assert pass_by_pass(bursts, start=T0 - 3000) == judged(bursts) == T0 - 1200
    assert pass_by_pass(long, start=T0 - 3000) == judged(long) == T0 - 4800
    # Judged every 30 s (a slow beat), the same.
    assert pass_by_pass(bursts, start=T0 - 3000, step=30.0) == T0 - 1200


def test_a_gap_in_the_samples_of_half_the_five_minutes_restarts_the_calm():
    # 400 MU/min for an hour, but no bucket from 30 to 27 minutes ago (a collector down for
    # 180 s): what came then is unknown, so the spans after it that cannot be judged (under 150 s
    # of the 300 s before them covered: until the span ending at T0 - 1465) restart the calm,
    # and 30 minutes later it is calm again.
    gap = [b for b in steady(400, start=T0 - 3600) if not T0 - 1800 < b.end <= T0 - 1620]
    since = pass_by_pass(gap, start=T0 - 3000)
    assert since == T0 - 1465 and not calm.is_calm(since, T0, CALM)
    assert calm.is_calm(since, since + 1800, CALM)
    # A gap of a minute leaves every span judged: calm throughout.
    short = [b for b in steady(400, start=T0 - 3600) if not T0 - 1800 < b.end <= T0 - 1740]
    assert pass_by_pass(short, start=T0 - 3000) == T0 - 3600


def test_a_calm_history_plans_at_a_full_replica_and_scales_up_without_the_band():
    # 450 MU/min for 40 min against 100 per replica: 450 / 80 -> 6 by default, 450 / 100 = 4.5
    # -> 5 when calm (the rate at the SLO and the busiest 10 s are the margins left).
    history = steady(450, start=T0 - 2400)
    assert decide(spec(5, config=MARGINS), history, T0).replicas == 6
    decision = decide(spec(5, config=CALM, quiet_since=judged(history)), history, T0)
    assert decision.need == pytest.approx(4.5) and decision.replicas == 5
    assert "calm for 1800 s: planned at a full replica" in explain(decision)
    # Not yet 1,800 s calm, or the calm history off: the default's margins.
    assert decide(spec(5, config=CALM, quiet_since=T0 - 1700), history, T0).replicas == 6
    assert decide(spec(5, config=MARGINS, quiet_since=T0 - 2400), history, T0).replicas == 6
    # 530 MU/min: 5.3 against 5 running is within the 10 % band, which holds by default; calm,
    # a need past the fleet is met at once: 6. The band still holds a scale-down: 5 at 4.6.
    banded = AutoscalerConfig(target_utilisation=1.0)
    assert decide(spec(5, config=banded), steady(530), T0).replicas == 5
    assert decide(spec(5, config=CALM, quiet_since=T0 - 2400), steady(530), T0).replicas == 6
    assert decide(spec(5, config=CALM, quiet_since=T0 - 2400), steady(460), T0).replicas == 5
    # A burst 10 minutes ago (a 10-s span at 4x): the default's margins, and its hold, are back.
    bursty = [replace(b, mu_per_minute=1800) if T0 - 610 < b.end <= T0 - 600 else b for b in history]
    decision = decide(spec(5, config=CALM, quiet_since=judged(bursty)), bursty, T0)
    assert decision.replicas == 6 and "calm" not in explain(decision)


def test_thirty_minutes_without_a_burst_halve_the_margin():
    # 450 MU/min for 40 min against 100 per replica, from 4: 450 / 80 = 5.6 -> 6 with the whole
    # margin; no burst for 1,800 s (by default), half of it: 450 / 90 = 5.0 -> 5.
    history = steady(450, start=T0 - 2400)
    quiet = judged(history, AutoscalerConfig())
    assert quiet == T0 - 2400
    decision = decide(spec(4, quiet_since=quiet), history, T0)
    assert decision.need == pytest.approx(5.0) and decision.replicas == 5
    assert "no burst for 1800 s: planned at 0.90 of a replica" in explain(decision)
    # 1,790 s without one, or the quiet margin off: the whole margin.
    assert decide(spec(4, quiet_since=T0 - 1790), history, T0).replicas == 6
    assert decide(spec(4, config=MARGINS, quiet_since=quiet), history, T0).replicas == 6
    # A burst 10 minutes ago (a 10-s span at 4x) restores it at once.
    bursty = [replace(b, mu_per_minute=1800) if T0 - 610 < b.end <= T0 - 600 else b for b in history]
    assert judged(bursty, AutoscalerConfig()) == T0 - 600
    decision = decide(spec(4, quiet_since=T0 - 600), bursty, T0)
    assert decision.replicas == 6 and "no burst" not in explain(decision)
    # The share kept is of the endpoint's own margin: an operator's 0.6 plans for 0.8.
    assert quiet_utilisation(AutoscalerConfig()) == pytest.approx(0.9)
    assert quiet_utilisation(AutoscalerConfig(target_utilisation=0.6)) == pytest.approx(0.8)
    assert quiet_utilisation(MARGINS) == pytest.approx(0.8)
    for bad in ({"quiet_margin": 1.5}, {"quiet_margin": -0.1}, {"quiet_after_s": 0}):
        with pytest.raises(ValueError, match=next(iter(bad))):
            AutoscalerConfig.from_overrides(bad)


def test_work_spread_is_the_variation_of_the_work_within_a_first_tokens_wait():
    # The docstring's numbers: 600 MU/min as 0.1-MU requests, or as one 10-MU request a second.
    fine = aggregate(steady(600, request_mu=0.1), T0, 60)
    assert calm.work_spread(fine, 5.0) == pytest.approx(math.sqrt(5) / 50)
    assert calm.work_spread(aggregate(steady(600, request_mu=10.0), T0, 60), 5.0) == pytest.approx(
        math.sqrt(500) / 50
    )
    assert calm.work_spread(aggregate(steady(0), T0, 60), 5.0) == 0.0
    # MU without its squares (a router from before them): not known to be steady.
    assert calm.work_spread(aggregate(steady(600, request_mu=0.0), T0, 60), 5.0) == math.inf


def test_a_calm_history_of_lumpy_work_keeps_the_margins():
    # 450 MU/min for 40 min, no burst. In requests of 0.3 MU the work within 5 s (37.5 MU)
    # varies by sqrt(0.3 x 37.5) / 37.5 = 0.089 <= 0.1: planned at a full replica, 5. In
    # requests of 0.45 MU (0.110) or of 3 MU, a long prompt's (0.283), the margins stay: 6.
    for request_mu, replicas in ((0.3, 5), (0.45, 6), (3.0, 6)):
        history = steady(450, start=T0 - 2400, request_mu=request_mu)
        decision = decide(spec(5, config=CALM, quiet_since=judged(history)), history, T0)
        assert decision.replicas == replicas, request_mu
        assert ("planned at a full replica" in explain(decision)) == (replicas == 5)
    # The scale event says why a calm history kept the margins.
    assert "but its work varies 0.28 over 5 s, above 0.1: margins kept" in explain(decision)
    # Without the squares the routers did not report, no calm either; nor where one bucket of
    # the window lacks them (an old router beside new ones), though the rest are steady.
    unknown = steady(450, start=T0 - 2400, request_mu=0.0)
    assert decide(spec(5, config=CALM, quiet_since=judged(unknown)), unknown, T0).replicas == 6
    mixed = steady(450, start=T0 - 2400, request_mu=0.3)
    mixed[-3] = replace(mixed[-3], mu_squared_per_minute=0.0)
    assert decide(spec(5, config=CALM, quiet_since=judged(mixed)), mixed, T0).replicas == 6
    # calm_max_spread bounds it: at 0.3 the 3-MU requests are steady enough.
    loose = replace(CALM, calm_max_spread=0.3)
    lumpy = steady(450, start=T0 - 2400, request_mu=3.0)
    assert decide(spec(5, config=loose, quiet_since=judged(lumpy, loose)), lumpy, T0).replicas == 5


def test_no_scale_down_while_a_backlog_waits():
    # 8 replicas asked for, 80 MU/min for 5 min (1 replica) and 10 MU still waiting at the router
    # (pods are starting): (80 + 20) / 80 = 1.25 -> 2 would do, but the fleet is behind: hold 8.
    decision = decide(spec(8), with_backlog(steady(80), 10.0), T0)
    assert decision.replicas == 8 and "backlog" in explain(decision)
    # Once nothing waits: 80 / 80 = 1.
    assert decide(spec(8), steady(80), T0).replicas == 1


def test_no_scale_down_before_the_down_window_is_covered():
    # A collector restarted 25 s ago: 80 MU/min (1 replica) against 10 running, but 25 s cover
    # 42 % of the 60-s window, under the 50 % needed: hold. At 30 s (50 %), scale down.
    decision = decide(spec(10), steady(80, start=T0 - 25), T0)
    assert decision.replicas == 10 and "cover 42%" in explain(decision)
    assert decide(spec(10), steady(80, start=T0 - 30), T0).replicas == 1


def test_the_down_window_remembers_arrivals_not_work_in_flight():
    # After a burst: 80 MU/min arrive all along, but until 30 s ago 64 requests were in flight
    # (its backlog, drained): 64 / 6.4 = 10 replicas then, 1 now. Work drained does not come
    # back, so 10 replicas go down to 1 at once.
    buckets = steady(80, in_flight=64, end=T0 - 30) + steady(80, in_flight=5, start=T0 - 30)
    decision = decide(spec(10), buckets, T0)
    assert decision.down_need == pytest.approx(1.0)
    assert decision.replicas == 1
    # The same 10 replicas' worth of arrivals (800 MU/min) 30 s ago are remembered: hold 10.
    buckets = steady(800, end=T0 - 30) + steady(80, in_flight=5, start=T0 - 30)
    assert decide(spec(10), buckets, T0).replicas == 10


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"target_utilisation": 1.5}, "target_utilisation=1.5 is out of range"),
        ({"tolerance": -0.1}, "tolerance=-0.1 is out of range"),
        ({"scale_down_window_s": 10.0}, "scale_down_window_s=10.0 is out of range"),
        ({"backlog_drain_s": 0}, "backlog_drain_s=0.0 is out of range"),
        ({"pod_start_s": -1}, "pod_start_s=-1.0 is out of range"),
        ({"smooth_spread": 0.2}, "unknown autoscaler setting 'smooth_spread'"),
        ({"calm_history_s": -1}, "calm_history_s=-1.0 is out of range"),
        ({"burst_ratio": 1}, "burst_ratio=1.0 is out of range"),
        ({"max_scale_up_step": 2.5}, "max_scale_up_step=2.5 must be an integer"),
        ({"predictive_min": "yes"}, "predictive_min='yes' must be true or false"),
        ({"target_utilisaton": 0.5}, "unknown autoscaler setting 'target_utilisaton'"),
        ({"latency_slo_s": float("nan")}, "latency_slo_s=nan is out of range"),
        ({"quiet_margin": 1.5}, "quiet_margin=1.5 is out of range"),
        ({"quiet_after_s": float("inf")}, "quiet_after_s=inf is out of range"),
        ({"quiet_after_s": 10**400}, "quiet_after_s=1000000.* is out of range"),
    ],
)
def test_invalid_settings_are_refused_naming_key_and_value(overrides, message):
    with pytest.raises(ValueError, match=message):
        AutoscalerConfig.from_overrides(overrides)


def test_a_scale_up_window_shorter_than_the_peak_span_is_read_whole():
    # An endpoint's override of a 5-s scale-up window stays valid: its span is the whole window.
    config = AutoscalerConfig.from_overrides({"scale_up_window_s": 5.0})
    buckets = steady(80, end=T0 - 5) + steady(400, start=T0 - 5)
    assert decide(spec(1, config=config), buckets, T0).need == pytest.approx(5.0)


def test_buckets_in_any_order_are_read_in_order_of_their_end():
    # A timeline puts buckets in order once; every window is then a slice of (now - s, now].
    ordered = steady(400, start=T0 - 100)
    ordered[-6:] = [replace(b, mu_per_minute=2000, queued=i) for i, b in enumerate(ordered[-6:])]
    shuffled = ordered[::2] + ordered[1::2]
    timeline = Timeline(shuffled)
    assert timeline.buckets == ordered and timeline.ends == [b.end for b in ordered]
    assert in_window(timeline, T0, 20) == in_window(shuffled, T0, 20) == ordered[-4:]
    assert in_window(timeline, T0 - 5, 10) == ordered[-3:-1]  # the end is in, the start out
    # The latest bucket's queue is the window's last, whatever order the buckets came in.
    assert aggregate(shuffled, T0, 20).queued_last == 5
    # Of equal ends, the last given is the latest (a collector's correction after its first).
    again = replace(ordered[-1], queued=9)
    assert aggregate([*shuffled, again], T0, 20).queued_last == 9
    assert Timeline([again, *ordered]).buckets[-2:] == [again, ordered[-1]]
    # It keeps its own list: the caller's, changed later, changes no window.
    given = list(ordered)
    kept = Timeline(given)
    given.insert(0, given.pop())
    assert in_window(kept, T0, 20) == ordered[-4:]
    # The decider reads the same from either.
    a, b = decide(spec(3), shuffled, T0), decide(spec(3), timeline, T0)
    assert (a.replicas, a.rule, a.need, a.down_need) == (b.replicas, b.rule, b.need, b.down_need)
    assert a.replicas == decide(spec(3), ordered, T0).replicas > 3
