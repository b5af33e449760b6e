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
The price is linear in the tokens, as the router's CostModel is: a prompt token's cost growing
with its context (prefill_context_s) and a step's own price for prefilling (prefill_step_s),
both 0 in the shipped profiles, are not in it.
"""

from __future__ import annotations

import bisect
import math
import operator
import random
from collections.abc import Sequence
from dataclasses import replace
from itertools import repeat

from capacity.simulate.arrivals import Arrival, as_trace
from capacity.simulate.replica import Replica, Request, end_to_end_deadline_s, p99, slo_ratios
from capacity.units import MU_PER_REPLICA_MINUTE, CostModel
from engine_model.perf_model import EngineProfile

SECONDS_PER_MU = 60.0 / MU_PER_REPLICA_MINUTE


def full_batch(profile: EngineProfile, trace: Sequence[Arrival]) -> int:
    """The batch a busy replica runs for this trace's mean shape: slots and KV bound it."""
    if not trace:
        return profile.max_num_seqs
    columns = as_trace(trace)
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


def chunk_within_itl(profile: EngineProfile, itl_s: float) -> EngineProfile:
    """The profile deployed with the largest power-of-two chunk (vLLM's --max-num-batched-tokens,
    at least --max-num-seqs) whose prefill step (its base, its tokens and the price of a step
    that prefills) stays within the ITL deadline: a request decoding beside a full chunk waits
    one such step for its next token. Worked numbers,
    h100-llama-8b at 0.1 s: 6 ms + 8,192 x 40 us = 334 ms per step beside a chunk (3.3x the
    deadline); 2,048 -> 88 ms, so 2,048. vLLM's own advice for inter-token latency is the same
    knob: fewer batched tokens a step. A profile whose chunk already fits keeps it."""
    chunk, fixed = profile.max_batched_tokens, profile.step_base_s + profile.prefill_step_s
    while chunk > profile.max_num_seqs and fixed + chunk * profile.prefill_per_token_s > itl_s:
        chunk //= 2
    return replace(profile, max_batched_tokens=max(chunk, profile.max_num_seqs))


def deployed(profile: EngineProfile, itl_s: float, long_prefill_token_threshold: int = 0) -> EngineProfile:
    """The profile as the CLI and the bench deploy it: the chunk within the ITL deadline
    (`chunk_within_itl`) and vLLM's --long-prefill-token-threshold (0, vLLM's default: none)."""
    return replace(
        chunk_within_itl(profile, itl_s), long_prefill_token_threshold=long_prefill_token_threshold
    )


# The most replicas the capacity measurement routes across: past ~8, two random choices among
# them spread a heavy-tailed prompt as well as among more (measured: longctx 1.27, 1.45, 1.71
# MU/s per replica on 1, 4, 8), and each bisection step costs a replica's simulation more.
BALANCED_FLEET_MAX = 8
LUMP_S = 1.0  # copies of one request within this are one lump (below the router's 1-s bucket)


def lumps(
    trace: Sequence[Arrival], rng: random.Random, count: int = 2000
) -> list[tuple[int, int, list[float]]]:
    """A sample of the trace's lumps: (prompt, output, offsets of its copies from the first).
    A lump is the arrivals of one shape within LUMP_S of its first (an amplified trace's
    copies, a client's fan-out of one prompt), drawn from rows with no copy in the LUMP_S before,
    so each lump is drawn once. Worked numbers: an x20 amplified trace -> lumps of ~20 within
    1 s; the Azure hour itself -> lumps of 1."""
    columns = as_trace(trace)
    times, prompts, outputs = columns.times, columns.prompts, columns.outputs
    out: list[tuple[int, int, list[float]]] = []
    for _ in range(20 * count):
        if len(out) >= count:
            break
        i = rng.randrange(len(times))
        shape = (prompts[i], outputs[i])
        before = bisect.bisect_left(times, times[i] - LUMP_S)
        if any((prompts[j], outputs[j]) == shape for j in range(before, i)):
            continue
        after = bisect.bisect_left(times, times[i] + LUMP_S)
        offsets = [times[j] - times[i] for j in range(i, after) if (prompts[j], outputs[j]) == shape]
        out.append((shape[0], shape[1], offsets))
    return out


def slo_capacity_mu_per_s(
    profile: EngineProfile,
    trace: Sequence[Arrival],
    first_token_s: float,
    per_output_token_s: float,
    seed: int = 0,
    seconds: float = 300.0,
    batch: int | None = None,  # full_batch(profile, trace), when the caller has it
    replicas: int | None = None,  # the fleet measured on; None: the one the trace's mean needs
) -> float:
    """The MU per second a replica serves with the p99s of TTFT, ITL and latency within their
    deadlines (`replica.slo_ratios`, scored as the fleet scores a minute), found by
    bisection on Poisson arrivals of this trace's lumps (`lumps`) through a simulated fleet
    routed as the router routes (two random choices, the one with the lower `Replica.load_mu`). At a
    full batch the h100 profile serves 15.7 QPS of the Azure mix, but prefill stalls stretch
    each decode step, and the SLO holds only to ~12 QPS: the fleet's "100 MU/min" is not a
    replica's capacity at the SLO; this is.

    On one replica, every heavy-tailed prompt (an 85k-token one is 3.4 s of prefill) stalls
    every request there; in a fleet the router sends the next ones elsewhere, so a replica of
    a fleet serves more at the SLO than a lone one (long contexts: 1.31 -> 1.58 MU/s on 8),
    and sizing a fleet on the lone rate over-sized it 1.7x. So it is measured on the fleet the
    trace's mean load needs at the lone rate (`replicas` None), at most BALANCED_FLEET_MAX. A
    fleet spreads Poisson arrivals but not 20 copies of a prompt within a second that all
    prefill at once; drawn one by one, the fleet's rate over-sold prefill-heavy lumps (1.53
    MU/s on 8 against 1.13 with its lumps), so lumps arrive as the trace has them."""
    rng = random.Random(seed)
    sample = [(fit_shape(profile, p, o), offsets) for p, o, offsets in lumps(trace, rng)]
    cost = cost_model_for(profile, batch or full_batch(profile, trace))
    requests = sum(len(offsets) for _, offsets in sample)
    mean_mu = sum(cost.cost(*shape) * len(offsets) for shape, offsets in sample) / requests
    lump_size = requests / len(sample)

    def p99_ratio(rate: float, n: int) -> float:
        r = random.Random(seed)
        fleet = [Replica(profile, i, ready_at=0.0, started_at=0.0) for i in range(n)]
        arrivals: list[tuple[float, int, int]] = []
        t = 0.0
        while True:
            t += r.expovariate(rate * n / lump_size)
            if t >= seconds:
                break
            (prompt, output), offsets = sample[r.randrange(len(sample))]
            arrivals.extend((t + d, prompt, output) for d in offsets)
        arrivals.sort()
        ratios: list[tuple[float, float, float]] = []
        for seq, (t, prompt, output) in enumerate(arrivals):
            a, b = r.sample(fleet, 2) if n > 1 else (fleet[0], fleet[0])
            for rep in (a, b) if a is not b else (a,):
                ratios.extend(
                    slo_ratios(q, first_token_s, per_output_token_s, profile.prefill_per_token_s)
                    for q in rep.advance_to(t)
                    if q.arrival_s > 20.0
                )
            deadline = end_to_end_deadline_s(first_token_s, per_output_token_s, profile, prompt, output)
            best = a if a.load_mu() <= b.load_mu() else b
            best.submit(Request(t, prompt, output, deadline, cost.cost(prompt, output), seq), t)
        if sum(len(rep.waiting) for rep in fleet) > n * max(5.0, rate):  # a growing backlog
            return math.inf
        for rep in fleet:
            ratios.extend(
                slo_ratios(q, first_token_s, per_output_token_s, profile.prefill_per_token_s)
                for q in rep.advance_to(math.inf)
                if q.arrival_s > 20.0
            )
        # The fleet's rule for a minute: the worst of the three p99s (end to end, TTFT, ITL).
        return max((p99([r[k] for r in ratios]) for k in range(3)), default=0.0) if ratios else 0.0

    def bisect_rate(n: int) -> float:
        lo, hi = 0.0, 1.1 / (mean_mu * SECONDS_PER_MU)  # requests/s: 110 % of the full-batch rate
        for _ in range(12):
            mid = (lo + hi) / 2
            lo, hi = (mid, hi) if p99_ratio(mid, n) <= 1.0 else (lo, mid)
        return max(lo, 1e-9) * mean_mu

    if replicas is None:
        lone = bisect_rate(1)
        span = max(trace[-1].time_s - trace[0].time_s, 1.0)
        demand = mean_mu * len(trace) / span  # MU/s, the trace's mean
        replicas = min(BALANCED_FLEET_MAX, max(1, math.ceil(demand / lone)))
        if replicas == 1:
            return lone
    return bisect_rate(max(1, replicas))


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
    columns = as_trace(trace)
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
