"""A minute meets the SLO only when its requests' TTFT p99 and ITL p99 are within their
deadlines as well as end to end (capacity.benchmark.config.Slo's 5 s to the first token and
0.1 s per answer token; the first token's deadline adds the prompt's own prefill; the
end-to-end deadline is the first token's + 0.1 s per answer token). On synthetic
time, one replica of the tiny profile (steps of 10 ms + 1 ms a sequence + 0.1 ms a prompt
token, 4 slots, 2,048 tokens of KV), held by a policy that never scales."""

from dataclasses import replace

import pytest

from capacity.simulate.fleet import Fleet, FleetConfig
from capacity.simulate.policies import ScalingPolicy
from capacity.simulate.replica import Request, end_to_end_deadline_s, slo_ratios
from capacity.simulate.sizing import chunk_within_itl
from engine_model.profiles import get_profile

TINY = get_profile("tiny-test")


def play(arrivals: list[tuple[float, int, int]], config: FleetConfig, until: float = 75.0) -> Fleet:
    fleet = Fleet(TINY, ScalingPolicy(), config, batch=4, static_peak_replicas=1)
    now, k = 0.0, 0
    while now < until:
        now += 0.5
        while k < len(arrivals) and arrivals[k][0] < now:
            t, prompt, output = arrivals[k]
            fleet.arrive(t, prompt, output, k)
            k += 1
        fleet.tick(now, counting=True)
    fleet._close_minutes(float("inf"))
    return fleet


def test_slo_ratios_are_end_to_end_first_token_and_mean_gap():
    # The end-to-end deadline is the first token's (5 s + its prefill, 1,000 x 40 us) + 0.1 s a token.
    deadline = end_to_end_deadline_s(5.0, 0.1, get_profile("h100-llama-8b"), 1_000, 13)  # 40 us a token
    assert deadline == pytest.approx(6.34)
    req = Request(0.0, 1_000, 13, deadline_s=deadline, mu=0.0)
    req.first_token_s, req.finished_s = 1.2, 4.8
    e2e, ttft, itl = slo_ratios(req, 5.0, 0.1, 0.000_04)
    assert (
        e2e == pytest.approx(4.8 / 6.34) and ttft == pytest.approx(1.2 / 5.04) and itl == pytest.approx(3.0)
    )
    one = Request(0.0, 100, 1, deadline_s=5.1, mu=0.0)
    one.first_token_s = one.finished_s = 2.0
    assert slo_ratios(one, 5.0, 0.1, 0.0)[2] == 0.0  # one token: no gap to miss


def test_the_first_token_deadline_leaves_a_long_prompt_its_own_prefill():
    """126k tokens at 40 us is 5.04 s of prefill alone: the deadline is 5 s of queueing on top."""
    req = Request(0.0, 126_000, 2, deadline_s=5.2, mu=0.0)
    req.first_token_s, req.finished_s = 6.0, 6.01
    assert slo_ratios(req, 5.0, 0.1, 0.000_04)[1] == pytest.approx(6.0 / 10.04)


def test_a_queue_that_delays_the_first_token_misses_though_long_answers_end_in_time():
    """Eight requests of 300-token answers at once on 4 slots: the last four wait for the first
    four (1 + 299 steps of 14 ms, ~4.2 s), so their first token comes ~4.2 s late; end to end
    ~8.4 s against 5 + 30 = 35 s. With a TTFT deadline of 3 s the minute misses; with 5 s it
    meets: the TTFT deadline decides the minute, not the end-to-end one."""
    burst = [(10.0, 10, 300)] * 8
    strict = play(burst, FleetConfig(slo_first_token_s=3.0))
    requests, worst, ttft, itl = strict.minute_p99[0]
    assert requests == 8 and ttft > 1.0 and worst == ttft
    assert itl < 1.0 and strict.ratios.value(0.99) < 0.5  # end to end: well within
    relaxed = play(burst, FleetConfig(slo_first_token_s=5.0))
    assert relaxed.minute_p99[0][1] <= 1.0


def test_decode_steps_stretched_by_prompt_chunks_miss_the_itl_within_the_end_to_end_deadline():
    """A request decodes 40 tokens while 512-token prompts (one chunk each, 10 + 1 + 51 ms a
    step) keep arriving beside it: its steps take ~62 ms against 11 ms alone. With an ITL
    deadline of 0.05 s a token the minute misses on the ITL alone (end to end it is within
    5 + 0.05 x 40 = 7 s); alone, the same request meets it."""
    decoder = [(5.0, 10, 40)]
    chunks = [(5.0 + 0.06 * i, 500, 1) for i in range(1, 60)]
    config = FleetConfig(slo_per_output_token_s=0.05)
    crowded = play(decoder + chunks, config)
    requests, worst, _, itl = crowded.minute_p99[0]
    assert requests == 60 and itl > 1.0 and worst == itl
    assert crowded.ratios.value(0.99) < 1.0  # end to end: within
    alone = play(decoder, config)
    assert alone.minute_p99[0][1] <= 1.0 and alone.minute_p99[0][3] < 0.5


def test_the_deployment_chunks_prefill_within_the_itl_deadline():
    """h100-llama-8b's 8,192-token chunk makes a 334-ms step beside every decoder, 3.3x a
    0.1-s ITL; halved until the step fits: 2,048 (88 ms). A chunk already within it stays."""
    h100 = get_profile("h100-llama-8b")
    assert chunk_within_itl(h100, 0.1).max_batched_tokens == 2048
    assert chunk_within_itl(h100, 0.4).max_batched_tokens == 8192
    assert chunk_within_itl(TINY, 0.1).max_batched_tokens == 512  # 10 + 51 ms
    assert chunk_within_itl(h100, 0.001).max_batched_tokens == h100.max_num_seqs  # never below a batch
    # A step that prefills costing 15 ms more: 2,048 makes 103 ms, over 0.1 s; 1,024 (62 ms).
    priced = replace(h100, prefill_step_s=0.015)
    assert chunk_within_itl(priced, 0.1).max_batched_tokens == 1024
