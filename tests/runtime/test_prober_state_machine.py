"""The prober's pure decisions on a fake clock, alone and against the performance model."""

from __future__ import annotations

from dataclasses import replace

import pytest

from dataplane.runtime.prober import Prober, ProberConfig
from engine_model import perf_model as pm
from engine_model.profiles import TINY_TEST

CFG = ProberConfig(
    idle_interval_s=5,
    completion_deadline_s=20,
    failure_threshold=3,
    startup_timeout_s=60,
    scrape_interval_s=1,
)


def started(t: float = 0.0, total: float = 0) -> Prober:
    prober = Prober(CFG, t)
    prober.observe(t, total)
    return prober


def test_starting_engine_is_live_but_not_ready_until_it_answers() -> None:
    prober = Prober(CFG, 0.0)
    prober.observe(1.0, None)
    status = prober.status(30.0)
    assert (status.live, status.ready) == (True, False)
    assert not prober.should_probe(30.0)
    prober.observe(31.0, 0)
    assert prober.status(31.0).ready


def test_engine_that_never_answers_fails_liveness_after_startup_timeout() -> None:
    prober = Prober(CFG, 0.0)
    assert prober.status(59.9).live
    assert not prober.status(60.0).live


def test_probes_only_when_idle() -> None:
    prober = started()
    prober.observe(4.0, 0)
    assert not prober.should_probe(4.9)
    assert prober.should_probe(5.0)  # 5 s without progress
    prober.probe_sent(5.0)
    assert not prober.should_probe(6.0)  # one probe in flight at a time
    prober.probe_result(5.1, ok=True, latency=0.1)
    assert not prober.should_probe(9.0)  # the probe's success is progress
    prober.observe(8.0, 3)  # real completions
    assert not prober.should_probe(12.9) and prober.should_probe(13.0)


def test_consecutive_failed_probes_mean_hung_and_progress_clears_it() -> None:
    prober = started()
    for i, t in enumerate((5.0, 10.0, 15.0)):
        assert prober.status(t).live
        prober.probe_sent(t)
        prober.probe_result(t + 0.01, ok=False, latency=0.01)  # e.g. 500 or refused
        assert prober.consecutive_failures == i + 1
    status = prober.status(15.02)
    assert (status.live, status.ready) == (False, False)
    assert "3 probes failed" in status.reason
    prober.observe(16.0, 0)  # a scrape without progress does not clear it
    assert not prober.status(16.0).live
    prober.observe(17.0, 1)  # the counter moved: the engine works again
    assert prober.status(17.0).live


def test_probe_waiting_past_the_deadline_means_hung_and_stays_hung() -> None:
    # Engine hangs right after t=0: probe at t=5 s, still unanswered at 25 s -> hung.
    prober = started()
    prober.probe_sent(5.0)
    assert prober.status(24.9).live
    assert not prober.status(25.0).live
    prober.probe_result(25.0, ok=False, latency=20.0)  # the I/O layer gave up on it
    assert not prober.status(25.1).live  # latched: 1 failure < 3, but still hung
    prober.probe_sent(30.0)
    prober.probe_result(30.2, ok=True, latency=0.2)
    assert prober.status(30.2).live


def test_slow_but_successful_probe_counts_as_failure() -> None:
    prober = started()
    prober.probe_sent(5.0)
    prober.probe_result(26.0, ok=True, latency=21.0)
    assert prober.consecutive_failures == 1


def test_config_rejects_bad_values() -> None:
    with pytest.raises(ValueError, match="failure_threshold"):
        ProberConfig(failure_threshold=0)
    with pytest.raises(ValueError, match="idle_interval_s"):
        ProberConfig(idle_interval_s=0)


# --- Against the performance model: an engine at 100 % load, and a hung one. -------------------

# Steps of 0.1 s + 2 ms per sequence and 480-token outputs: a request runs ~51 s, and with 4
# slots a request completes only every ~13 s on average -- longer than the 5 s idle interval,
# so the prober does probe, and its probe waits up to ~13 s for a slot behind a full batch.
SLOW = replace(TINY_TEST, name="slow", step_base_s=0.1, decode_per_seq_s=0.002)


def run_engine_with_prober(
    config: ProberConfig,
    seconds: float,
    clients: int,
    hang_at: float | None = None,
    count_tokens: bool = True,
) -> tuple[list[tuple[float, bool]], list[float], Prober]:
    """Fake-clock loop: ``clients`` closed-loop clients keep the engine full; the prober
    scrapes every scrape_interval (finished requests, plus generated tokens if
    ``count_tokens``) and probes at top priority as the pod would. Returns (time, live)
    samples, probe latencies, and the prober."""
    state = pm.EngineState()
    t, next_scrape, n = 0.0, 0.0, 0
    success = tokens = 0
    probe: tuple[pm.SimRequest, float] | None = None
    prober = Prober(config, 0.0)
    samples: list[tuple[float, bool]] = []
    latencies: list[float] = []
    for _ in range(clients):
        pm.submit(state, pm.SimRequest(f"r{n}", 20, 480, priority=0))
        n += 1
    for _ in range(1_000_000):
        if t >= seconds:
            break
        hung = hang_at is not None and t >= hang_at
        result = None if hung else pm.step(SLOW, state)
        step_end = t + (result.duration_s if result else config.scrape_interval_s)
        while next_scrape <= step_end:  # scrapes that fall within this step see old counts
            prober.observe(next_scrape, success + (tokens if count_tokens else 0))
            if probe and next_scrape - probe[1] >= config.completion_deadline_s:
                pm.abort(state, probe[0].request_id)  # the HTTP deadline cancels it
                prober.probe_result(next_scrape, ok=False, latency=next_scrape - probe[1])
                probe = None
            if prober.should_probe(next_scrape):
                req = pm.SimRequest(f"probe{n}", 1, config.probe_max_tokens, priority=config.probe_priority)
                n += 1
                pm.submit(state, req)
                prober.probe_sent(next_scrape)
                probe = (req, next_scrape)
            samples.append((next_scrape, prober.status(next_scrape).live))
            next_scrape += config.scrape_interval_s
        t = step_end
        if result is None:
            continue
        tokens += len(result.emitted)
        for req in result.finished:
            success += 1
            if probe and req is probe[0]:
                latencies.append(t - probe[1])
                prober.probe_result(t, ok=True, latency=t - probe[1])
                probe = None
            else:
                pm.submit(state, pm.SimRequest(f"r{n}", 20, 480, priority=0))  # keep it full
                n += 1
    return samples, latencies, prober


def test_saturated_engine_whose_tokens_advance_is_never_hung_nor_probed() -> None:
    # 8 clients on 4 slots: the batch is always full and 4 requests always wait (100 % load),
    # for 10 simulated minutes, with a completion deadline (10 s) far shorter than a request
    # (~51 s). Generated tokens advance every step, which is progress: never hung, and no
    # probe adds load to the busy engine.
    config = replace(CFG, completion_deadline_s=10.0)
    samples, latencies, _ = run_engine_with_prober(config, seconds=600, clients=8)
    assert len(samples) >= 600
    assert all(live for _, live in samples)
    assert latencies == []


def test_saturated_engine_counting_completions_only_is_probed_and_never_hung() -> None:
    # The same load, but the prober sees finished requests only. The first 4 requests run in
    # lockstep and finish together every ~51 s, so the engine looks idle for ~51 s at a time:
    # the prober probes, and its top-priority probe overtakes the 4 waiting requests, taking
    # the next free slot (<= ~51 s), never waiting behind the queue (~100 s). With a deadline
    # above the slot wait (60 s) the pod is never declared hung.
    config = replace(CFG, completion_deadline_s=60.0)
    samples, latencies, _ = run_engine_with_prober(config, seconds=600, clients=8, count_tokens=False)
    assert all(live for _, live in samples)
    assert len(latencies) >= 5
    assert max(latencies) < 52


def test_hung_engine_is_declared_within_the_deadline() -> None:
    # Same saturated engine; it stops making progress at t=120 s. Worst case: the last
    # progress is at 120 s, the prober probes 5 s later and the probe waits 20 s -> hung by
    # 145 s, plus at most one scrape interval (1 s) of detection delay.
    samples, _, prober = run_engine_with_prober(CFG, seconds=300, clients=8, hang_at=120)
    assert all(live for t, live in samples if t < 120)
    first_dead = min(t for t, live in samples if not live)
    assert (
        120 + CFG.idle_interval_s
        <= first_dead
        <= 120 + CFG.idle_interval_s + CFG.completion_deadline_s + CFG.scrape_interval_s
    )
    assert all(not live for t, live in samples if t >= first_dead)
    assert "no progress" in prober.status(300).reason
