"""The simulated replica in the production-like regimes, on synthetic time: chunked prefill
stretches the steps of requests decoding beside a long prompt (their inter-token latency), and
long contexts are bounded by the KV cache, not by slots."""

import pytest

from capacity.simulate.replica import Replica, Request
from engine_model.profiles import get_profile

H100 = get_profile("h100-llama-8b")


def test_a_long_prompt_stretches_every_step_of_a_decoding_neighbour():
    """One request decodes alone (6.06 ms a token); a 81,910-token prompt then arrives: its 10
    chunks of 8,191 (the step's budget less the decoder's one token) make 10 steps of
    6 + 0.06 + 8,191 x 0.04 = 333.7 ms, so the neighbour's next 10 tokens take 3.34 s, not 61 ms.
    vLLM's chunked prefill does the same: a decode shares its step with a prompt chunk."""
    rep = Replica(H100, 0, ready_at=0.0, started_at=0.0)
    neighbour = Request(0.0, 100, 1000, 105.0, 0.0, 0)
    rep.submit(neighbour, 0.0)
    rep.advance_to(1.0)
    started, tokens = rep.clock, rep.decode_steps
    long = Request(started, 81_910, 10, 6.0, 0.0, 1)
    rep.submit(long, started)
    rep.advance_to(started + 3.5)
    assert long.first_token_s - started == pytest.approx(10 * (0.006 + 0.000_06) + 81_910 * 0.000_04)
    # The neighbour got one token per step: 10 in those 3.34 s (0.33 s each, its deadline's
    # 0.1 s per token three times over), then decodes at ~6 ms a token again.
    stretched = long.first_token_s - started
    assert rep.decode_steps - tokens == 10 + round((rep.clock - long.first_token_s) / 0.006_12)
    assert stretched / 10 > 3 * 0.1


def test_long_contexts_are_bounded_by_the_kv_cache_not_slots():
    """40 requests of 12,000 + 500 tokens: 400,000 // 12,500 = 32 fit the KV cache at once;
    the other 8 wait (the engine's real queue), though 256 slots are free."""
    rep = Replica(H100, 0, ready_at=0.0, started_at=0.0)
    for k in range(40):
        rep.submit(Request(0.0, 12_000, 500, 60.0, 0.0, k), 0.0)
    rep.advance_to(0.001)
    assert rep.running() == 32 and len(rep.waiting) == 8 and rep.blocked() == 8
    assert rep.kv_usage() == pytest.approx(32 * 12_500 / 400_000)


def test_a_128k_context_fits_an_h100_replica_when_deployed_for_it():
    from dataclasses import replace

    long = replace(H100, max_model_len=131_072)
    rep = Replica(long, 0, ready_at=0.0, started_at=0.0)
    req = Request(0.0, 130_000, 1000, 200.0, 0.0, 0)
    rep.submit(req, 0.0)
    rep.advance_to(float("inf"))
    # 16 chunks of 8,192 (the last shorter) at 40 us a token: ~5.3 s to the first token.
    assert req.first_token_s == pytest.approx(16 * 0.006 + 130_000 * 0.000_04, rel=0.01)
