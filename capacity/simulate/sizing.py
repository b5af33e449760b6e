"""What a request costs a replica, from the perf model alone: the router's MU price and the
oracle's per-minute replica counts. Pure.

A request of p prompt and o output tokens, in a batch of B, takes this share of a replica's
engine time (perf_model.steady_state_requests_per_s, per request):

    seconds = p x prefill_per_token_s + (o - 1) x decode_per_seq_s + o x step_base_s / B

Priced so that one replica-minute at a full batch is 100 MU (1 MU = 0.6 engine seconds):
alpha = prefill_per_token_s x 100/60, beta = (decode_per_seq_s + step_base_s / B) x 100/60,
gamma = 0 (the -decode_per_seq_s of the first token is dropped, under 1 %). Worked numbers,
h100-llama-8b, B = 256: alpha = 6.67e-5, beta = 1.39e-4 MU per token; the Azure trace's mean
request (1,155 in, 211 out) is 0.106 MU, so a replica serves ~940 a minute (15.7 QPS).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from capacity.simulate.traces import Arrival
from capacity.units import CostModel
from dataplane.runtime.perf_model import EngineProfile

MU_PER_REPLICA_MINUTE = 100.0  # by construction of `cost_model_for`
SECONDS_PER_MU = 60.0 / MU_PER_REPLICA_MINUTE


def full_batch(profile: EngineProfile, trace: Sequence[Arrival]) -> int:
    """The batch a busy replica runs for this trace's mean shape: slots and KV bound it."""
    if not trace:
        return profile.max_num_seqs
    total = sum(sum(fit_shape(profile, a.prompt_tokens, a.output_tokens)) for a in trace)
    mean_kv = max(1.0, total / len(trace))
    return max(1, min(profile.max_num_seqs, int(profile.kv_capacity_tokens // mean_kv)))


def cost_model_for(profile: EngineProfile, batch: int) -> CostModel:
    scale = 1.0 / SECONDS_PER_MU
    return CostModel(
        alpha=profile.prefill_per_token_s * scale,
        beta=(profile.decode_per_seq_s + profile.step_base_s / batch) * scale,
        gamma=0.0,
    )


def fit_shape(profile: EngineProfile, prompt: int, output: int) -> tuple[int, int]:
    """(prompt, output) cut to the model's context, keeping the prompt's tail as a deployment
    with --max-model-len would have to: 14,050 in + 300 out at 8,192 -> 7,892 in + 300 out."""
    output = max(1, min(output, profile.max_model_len - 1))
    prompt = max(1, min(prompt, profile.max_model_len - output))
    return prompt, output


def oracle_schedule(
    profile: EngineProfile,
    trace: Sequence[Arrival],
    margin: float = 0.85,
    window_s: float = 10.0,
) -> list[int]:
    """The fewest replicas each minute needs: the busiest `window_s` of the minute, in replicas
    of engine time at a full batch, divided by `margin` (< 1 leaves room for Poisson bursts and
    imperfect balancing; the fleet measures whether it was enough). Worked numbers: 1,200
    requests in a 10 s window at 0.0636 engine seconds each -> 7.6 replicas busy / 0.85 -> 9."""
    if not 0 < margin <= 1:
        raise ValueError(f"oracle margin={margin!r} must be in (0, 1]")
    if not trace:
        return []
    batch = full_batch(profile, trace)
    cost = cost_model_for(profile, batch)
    windows: dict[int, float] = {}
    for a in trace:
        prompt, output = fit_shape(profile, a.prompt_tokens, a.output_tokens)
        key = int(a.time_s // window_s)
        windows[key] = windows.get(key, 0.0) + cost.cost(prompt, output) * SECONDS_PER_MU
    minutes = int(trace[-1].time_s // 60) + 1
    per_minute = [0] * minutes
    for key, seconds in windows.items():
        minute = min(int(key * window_s // 60), minutes - 1)
        per_minute[minute] = max(per_minute[minute], math.ceil(seconds / window_s / margin))
    return per_minute
