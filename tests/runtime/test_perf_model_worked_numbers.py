"""The performance model gives the numbers its profile says, worked by hand in the comments."""

from __future__ import annotations

import pytest

from engine_model import perf_model as pm
from engine_model.profiles import H100_LLAMA_8B, TINY_TEST, get_profile

H100 = H100_LLAMA_8B


def req(rid: str, prompt: int, out: int, priority: int = 0) -> pm.SimRequest:
    return pm.SimRequest(rid, prompt, out, priority)


def test_solo_request_latency_on_h100() -> None:
    # Prompt 1,000 tokens fits one step (budget 8,192): TTFT = 6 ms + 1,000 x 0.04 ms = 46 ms.
    # Then 99 decode steps at batch 1: 99 x (6 + 0.06) ms = 599.94 ms -> e2e 645.94 ms.
    ttft, e2e = pm.solo_latency_s(H100, 1000, 100)
    assert ttft == pytest.approx(0.046)
    assert e2e == pytest.approx(0.64594)
    [done] = pm.simulate(H100, [pm.Arrival(0.0, req("a", 1000, 100))])
    assert done.first_token_s == pytest.approx(0.046)
    assert done.finished_s == pytest.approx(0.64594)
    assert done.output_tokens == 100


def test_chunked_prefill_spreads_a_long_prompt_over_steps() -> None:
    # tiny-test budget 512 tokens/step: a 1,200-token prompt takes chunks 512 + 512 + 176,
    # 3 steps: TTFT = 3 x 10 ms + 1,200 x 0.1 ms = 150 ms.
    ttft, _ = pm.solo_latency_s(TINY_TEST, 1200, 1)
    assert ttft == pytest.approx(0.150)
    big = pm.EngineProfile(**{**TINY_TEST.__dict__, "max_model_len": 2000, "kv_capacity_tokens": 4000})
    [done] = pm.simulate(big, [pm.Arrival(0.0, req("a", 1200, 1))])
    assert done.first_token_s == pytest.approx(0.150)


def test_a_prompt_tokens_cost_grows_with_its_context() -> None:
    # tiny-test with 1 us per token per token of context before it: a 1,200-token prompt in
    # chunks of 512, 512, 176 attends to 512x511/2 = 130,816 token-pairs in step 1, then
    # 512 x 512 + 130,816 = 392,960, then 176 x 1,024 + 176x175/2 = 195,624: 719,400 in all,
    # 1,200x1,199/2. TTFT = 150 ms as without it + 719.4 ms.
    big = pm.EngineProfile(
        **{**TINY_TEST.__dict__, "max_model_len": 2000, "kv_capacity_tokens": 4000, "prefill_context_s": 1e-6}
    )
    state = pm.EngineState()
    pm.submit(state, req("a", 1200, 1))
    steps = [pm.step(big, state) for _ in range(3)]
    assert [s.duration_s for s in steps if s] == pytest.approx(
        [0.010 + 0.0512 + 0.130816, 0.010 + 0.0512 + 0.392960, 0.010 + 0.0176 + 0.195624]
    )
    assert pm.solo_latency_s(big, 1200, 1)[0] == pytest.approx(0.150 + 0.7194)
    [done] = pm.simulate(big, [pm.Arrival(0.0, req("b", 1200, 1))])
    assert done.first_token_s == pytest.approx(0.150 + 0.7194)
    with pytest.raises(ValueError, match="prefill_context_s must be >= 0"):
        pm.EngineProfile(**{**big.__dict__, "prefill_context_s": -1e-9})


def test_a_step_that_prefills_costs_its_fixed_price_once() -> None:
    # tiny-test with 3 ms more for a step that prefills: two 300-token prompts in a 512 budget
    # take a step of 512 tokens (10 + 51.2 + 3 ms: both prompts, one price) and one of 88 with
    # the first prompt's answer decoding (10 + 1 + 8.8 + 3 ms); the decode steps after them pay
    # none of it (10 + 2 x 1 ms). solo_latency_s: a 1,200-token prompt, 3 chunks, 3 x 3 ms.
    big = pm.EngineProfile(
        **{**TINY_TEST.__dict__, "max_model_len": 2000, "kv_capacity_tokens": 4000, "prefill_step_s": 0.003}
    )
    state = pm.EngineState()
    pm.submit(state, req("a", 300, 3))
    pm.submit(state, req("b", 300, 3))
    steps = [pm.step(big, state) for _ in range(3)]
    assert [s.duration_s for s in steps if s] == pytest.approx(
        [0.010 + 0.0512 + 0.003, 0.010 + 0.001 + 0.0088 + 0.003, 0.010 + 0.002]
    )
    assert pm.solo_latency_s(big, 1200, 1)[0] == pytest.approx(0.150 + 3 * 0.003)
    [done] = pm.simulate(big, [pm.Arrival(0.0, req("c", 1200, 1))])
    assert done.first_token_s == pytest.approx(0.150 + 3 * 0.003)
    with pytest.raises(ValueError, match="prefill_step_s must be >= 0"):
        pm.EngineProfile(**{**big.__dict__, "prefill_step_s": -1e-9})


def test_mixed_step_cost() -> None:
    # Two requests decoding + one new 100-token prompt in the same step on tiny-test:
    # 10 ms + 2 x 1 ms + 100 x 0.1 ms = 22 ms.
    state = pm.EngineState()
    pm.submit(state, req("a", 10, 5))
    pm.submit(state, req("b", 10, 5))
    first = pm.step(TINY_TEST, state)
    assert first is not None and first.prefilled_tokens == 20  # both prefilled, 1st tokens
    pm.submit(state, req("c", 100, 5))
    mixed = pm.step(TINY_TEST, state)
    assert mixed is not None
    assert (mixed.decoding_seqs, mixed.prefilled_tokens) == (2, 100)
    assert mixed.duration_s == pytest.approx(0.022)


def test_vllm_s_long_prefill_threshold_leaves_the_budget_to_the_prompts_behind() -> None:
    # tiny-test: 512 tokens a step, 10 ms + 1 ms a decoder + 0.1 ms a prompt token. A 1,500-token
    # prompt and a 100-token one, two tokens each. Without a cap the first takes the budget:
    # 512, 512, 476 + 36 of the second (61.2 ms each), then its last 64 beside the first's
    # decode (17.4 ms): the short one's first token at 201 ms. Capped at 256 (vLLM's
    # --long-prefill-token-threshold), step 1 prefills 256 + 100: 45.6 ms.
    big = pm.EngineProfile(**{**TINY_TEST.__dict__, "max_model_len": 2000, "kv_capacity_tokens": 4000})
    capped = pm.EngineProfile(**{**big.__dict__, "long_prefill_token_threshold": 256})

    def first_tokens(profile: pm.EngineProfile) -> dict[str, float]:
        arrivals = [pm.Arrival(0.0, req("long", 1500, 2)), pm.Arrival(0.0, req("short", 100, 2))]
        return {c.request_id: c.first_token_s for c in pm.simulate(profile, arrivals)}

    assert first_tokens(big) == pytest.approx({"long": 3 * 0.0612, "short": 0.201})
    # The long prompt pays: 256 beside the short one's decode (36.6 ms); then, the short one
    # done, it is alone, nothing to starve, and uncapped as in vLLM: 512 (61.2), 476 (57.6).
    assert first_tokens(capped) == pytest.approx({"short": 0.0456, "long": 0.0456 + 0.0366 + 0.0612 + 0.0576})
    [alone] = pm.simulate(capped, [pm.Arrival(0.0, req("a", 1500, 1))])
    assert alone.first_token_s == pytest.approx(pm.solo_latency_s(big, 1500, 1)[0])
    with pytest.raises(
        ValueError, match=r"long_prefill_token_threshold must be in 0\.\.max_model_len 2000, got 2001"
    ):
        pm.EngineProfile(**{**big.__dict__, "long_prefill_token_threshold": 2001})


def closed_loop_rate(
    profile: pm.EngineProfile, prompt: int, out: int, batch: int, completions: int
) -> tuple[float, float]:
    """Keep ``batch`` requests in flight; (completed requests/s, mean e2e s) after warm-up."""
    state = pm.EngineState()
    started: dict[str, float] = {}
    now, n, done, e2e = 0.0, 0, 0, 0.0
    for _ in range(batch):
        pm.submit(state, req(f"r{n}", prompt, out))
        started[f"r{n}"] = now
        n += 1
    t_warm = None
    for _ in range(1_000_000):
        result = pm.step(profile, state)
        assert result is not None
        now += result.duration_s
        for r in result.finished:
            done += 1
            if done == batch:  # first generation completed: measure from here
                t_warm, done_warm = now, done
            elif t_warm is not None:
                e2e += now - started[r.request_id]
            pm.submit(state, req(f"r{n}", prompt, out))
            started[f"r{n}"] = now
            n += 1
        if t_warm is not None and done - done_warm >= completions:
            return (done - done_warm) / (now - t_warm), e2e / (done - done_warm)
    raise AssertionError("did not converge")


@pytest.mark.parametrize(
    ("batch", "expected_rps"),
    [
        # Shape 512 in / 128 out on H100. Per request: 128 x 6 ms / batch + 127 x 0.06 ms
        # + 512 x 0.04 ms = 768/batch + 7.62 + 20.48 ms.
        (1, 1 / 0.79610),  # 796.10 ms -> 1.256 req/s (161 output tokens/s)
        (8, 1 / 0.12410),  # 124.10 ms -> 8.058 req/s (1,031 output tokens/s)
        (16, 1 / 0.07610),  # 76.10 ms -> 13.14 req/s (1,682 output tokens/s)
    ],
)
def test_throughput_grows_with_batch_size_as_the_profile_says(batch: int, expected_rps: float) -> None:
    assert pm.steady_state_requests_per_s(H100, 512, 128, batch) == pytest.approx(expected_rps)
    rate, _ = closed_loop_rate(H100, 512, 128, batch, completions=5 * batch)
    assert rate == pytest.approx(expected_rps, rel=1e-6)


def test_a_prefill_steps_price_is_shared_by_the_prompts_in_it() -> None:
    """8 requests of (512 in, 128 out) in lockstep on an H100 with 2 ms more for a step that
    prefills: their prompts share one such step a cycle, so each request pays 2 / 8 ms more:
    124.10 + 0.25 = 124.35 ms."""
    profile = pm.EngineProfile(**{**H100.__dict__, "prefill_step_s": 0.002})
    assert pm.steady_state_requests_per_s(profile, 512, 128, 8) == pytest.approx(1 / 0.12435)
    rate, _ = closed_loop_rate(profile, 512, 128, 8, completions=40)
    assert rate == pytest.approx(1 / 0.12435, rel=1e-6)


def test_latency_grows_with_batch_size() -> None:
    # Batch 16 in lockstep: a 16 x 512 = 8,192-token prefill step (6 + 327.68 ms) and 127
    # decode steps at batch 16 (127 x 6.96 ms = 883.92 ms) -> e2e 1,217.6 ms, against
    # 796.1 ms alone: 16x the throughput for 1.53x the latency.
    _, e2e_16 = closed_loop_rate(H100, 512, 128, 16, completions=32)
    _, e2e_1 = closed_loop_rate(H100, 512, 128, 1, completions=4)
    assert e2e_1 == pytest.approx(0.7961)
    assert e2e_16 == pytest.approx(1.2176)


def test_request_shape_costs_prefill_and_decode_differently() -> None:
    # At batch 8 on H100, doubling the prompt (512 -> 1,024) adds 512 x 0.04 = 20.48 ms of
    # engine time per request, doubling the output (128 -> 256) adds 128 x 6/8 + 128 x 0.06
    # = 103.68 ms: output tokens cost ~5x input tokens here.
    base = 1 / pm.steady_state_requests_per_s(H100, 512, 128, 8)
    longer_prompt = 1 / pm.steady_state_requests_per_s(H100, 1024, 128, 8)
    longer_output = 1 / pm.steady_state_requests_per_s(H100, 512, 256, 8)
    assert longer_prompt - base == pytest.approx(0.02048)
    assert longer_output - base == pytest.approx(0.10368)


def test_kv_capacity_bounds_the_running_batch() -> None:
    # tiny-test: 2,048 KV tokens, 4 slots. 500 + 100 = 600 tokens per request -> 3 fit
    # (1,800); the 4th waits although a slot is free.
    assert pm.max_batch(TINY_TEST, 500, 100) == 3
    assert pm.max_batch(TINY_TEST, 400, 100) == 4  # 4 x 500 = 2,000 fits: slots bind
    state = pm.EngineState()
    for i in range(4):
        pm.submit(state, req(f"r{i}", 500, 100))
    pm.step(TINY_TEST, state)
    assert len(state.running) == 3 and len(state.waiting) == 1
    assert pm.kv_usage(TINY_TEST, state) == pytest.approx(1800 / 2048)


def test_priority_orders_the_waiting_queue() -> None:
    # 4 long requests fill tiny-test's 4 slots, finishing at different times; then a low
    # priority request arrives before a high priority one: the high one takes the first free
    # slot and finishes first; equal priorities keep arrival order.
    arrivals = [pm.Arrival(0.0, req(f"long{i}", 10, 20 + 10 * i)) for i in range(4)]
    arrivals += [
        pm.Arrival(0.001, req("low-a", 10, 5, priority=10)),
        pm.Arrival(0.001, req("low-b", 10, 5, priority=10)),
        pm.Arrival(0.002, req("high", 10, 5, priority=-5)),
    ]
    order = [c.request_id for c in pm.simulate(TINY_TEST, arrivals)]
    assert order.index("high") < order.index("low-a") < order.index("low-b")
    assert order.index("high") == 1  # right after long0 frees its slot


def test_profiles_validate_and_resolve_by_name() -> None:
    assert get_profile("l40s-llama-8b").step_base_s == pytest.approx(0.020)
    assert get_profile("h100-llama-8b", model="m").model == "m"
    with pytest.raises(ValueError, match="unknown profile"):
        get_profile("a100")
    with pytest.raises(ValueError, match="max_batched_tokens"):
        pm.EngineProfile(**{**TINY_TEST.__dict__, "max_batched_tokens": 2})
