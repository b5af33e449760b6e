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
import operator
import random
from collections.abc import Sequence
from itertools import repeat

from capacity.simulate.arrivals import Arrival, Trace
from capacity.simulate.replica import Replica, Request
from capacity.units import MU_PER_REPLICA_MINUTE, CostModel
from dataplane.runtime.perf_model import EngineProfile

SECONDS_PER_MU = 60.0 / MU_PER_REPLICA_MINUTE


def full_batch(profile: EngineProfile, trace: Sequence[Arrival]) -> int:
    """The batch a busy replica runs for this trace's mean shape: slots and KV bound it."""
    if not trace:
        return profile.max_num_seqs
    columns = trace if isinstance(trace, Trace) else Trace(trace)
    # fit_shape keeps prompt + output within max_model_len: for p, o >= 1 its KV is
    # min(p + o, max_model_len); summed in C, as a day of a large fleet has 10^8 arrivals.
    sums = map(operator.add, columns.prompts, columns.outputs)
    total = sum(map(min, sums, repeat(profile.max_model_len)))
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


def slo_capacity_mu_per_s(
    profile: EngineProfile,
    trace: Sequence[Arrival],
    first_token_s: float,
    per_output_token_s: float,
    seed: int = 0,
    seconds: float = 300.0,
    batch: int | None = None,  # full_batch(profile, trace), when the caller has it
) -> float:
    """The MU per second one replica serves with the p99 of latency / deadline <= 1, found by
    bisection on Poisson arrivals of this trace's shapes through one simulated replica (what the
    capacity benchmark measures on a GPU). At a full batch the h100 profile serves 15.7 QPS of
    the Azure mix, but prefill stalls stretch each decode step, and the SLO holds only to ~12
    QPS: the fleet's "100 MU/min" is not a replica's capacity at the SLO; this is."""
    rng = random.Random(seed)
    # A sample of 2,000 shapes (the same ones as sampling the fitted list: `sample` draws indices).
    rows = rng.sample(range(len(trace)), 2000) if len(trace) > 2000 else range(len(trace))
    shapes = [fit_shape(profile, trace[i].prompt_tokens, trace[i].output_tokens) for i in rows]
    cost = cost_model_for(profile, batch or full_batch(profile, trace))
    mean_mu = sum(cost.cost(p, o) for p, o in shapes) / len(shapes)

    def p99_ratio(rate: float) -> float:
        r = random.Random(seed)
        replica = Replica(profile, 0, ready_at=0.0, started_at=0.0)
        ratios: list[float] = []
        t, seq = 0.0, 0
        while True:
            t += r.expovariate(rate)
            if t >= seconds:
                break
            done = replica.advance_to(t)
            prompt, output = shapes[r.randrange(len(shapes))]
            deadline = first_token_s + per_output_token_s * output
            replica.submit(Request(t, prompt, output, deadline, 0.0, seq), t)
            seq += 1
            ratios.extend((q.finished_s - q.arrival_s) / q.deadline_s for q in done if q.arrival_s > 20.0)
        if len(replica.waiting) > max(5.0, rate):  # a backlog still growing: not sustainable
            return math.inf
        ratios.extend((q.finished_s - q.arrival_s) / q.deadline_s for q in replica.advance_to(math.inf))
        ratios.sort()
        return ratios[min(len(ratios) - 1, math.ceil(0.99 * len(ratios)) - 1)] if ratios else 0.0

    lo, hi = 0.0, 1.1 / (mean_mu * SECONDS_PER_MU)  # requests/s: 110 % of the full-batch rate
    for _ in range(12):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if p99_ratio(mid) <= 1.0 else (lo, mid)
    return max(lo, 1e-9) * mean_mu


def oracle_schedule(
    profile: EngineProfile,
    trace: Sequence[Arrival],
    capacity_mu_per_s: float,
    margin: float = 0.9,
    window_s: float = 10.0,
    batch: int | None = None,  # full_batch(profile, trace), when the caller has it
) -> list[int]:
    """The fewest replicas each minute needs: the busiest `window_s` of the minute, in MU/s,
    over a replica's capacity at the SLO x `margin` (< 1 leaves room for Poisson bursts and
    imperfect balancing; the fleet measures whether it was enough). Worked numbers: 1,200
    requests of 0.106 MU in a 10 s window is 12.7 MU/s; at 0.2 MU/s per replica x 0.9 -> 71."""
    if not 0 < margin <= 1:
        raise ValueError(f"oracle margin={margin!r} must be in (0, 1]")
    if not trace:
        return []
    cost = cost_model_for(profile, batch or full_batch(profile, trace))
    columns = trace if isinstance(trace, Trace) else Trace(trace)
    windows: dict[int, float] = {}
    for t, prompt, output in zip(columns.times, columns.prompts, columns.outputs, strict=True):
        prompt, output = fit_shape(profile, prompt, output)
        key = int(t // window_s)
        windows[key] = windows.get(key, 0.0) + cost.cost(prompt, output)
    minutes = int(trace[-1].time_s // 60) + 1
    per_minute = [0] * minutes
    for key, mu in windows.items():
        minute = min(int(key * window_s // 60), minutes - 1)
        per_minute[minute] = max(per_minute[minute], math.ceil(mu / window_s / (capacity_mu_per_s * margin)))
    return per_minute
