"""The fleet's replica (event-driven) against the perf model's own step-by-step driver."""

import itertools
import random
from dataclasses import replace

import pytest

from capacity.simulate.replica import Replica, Request
from engine_model import perf_model as pm
from engine_model.profiles import get_profile


def _poisson(rate: float, n: int, prompt: int, output: int, seed: int = 1) -> list[tuple[float, int, int]]:
    rng = random.Random(seed)
    t, out = 0.0, []
    for _ in range(n):
        t += rng.expovariate(rate)
        out.append((t, prompt, output))
    return out


def _both(
    prof: pm.EngineProfile, arrivals: list[tuple[float, int, int]]
) -> tuple[list[pm.Completion], list[Request]]:
    """The same arrivals through the perf model's own driver and through one replica."""
    reference = pm.simulate(
        prof, [pm.Arrival(t, pm.SimRequest(str(k), p, o)) for k, (t, p, o) in enumerate(arrivals)]
    )
    replica = Replica(prof, 0, ready_at=0.0, started_at=0.0)
    done: list[Request] = []
    for k, (t, p, o) in enumerate(arrivals):
        done += replica.advance_to(t)
        replica.submit(Request(t, p, o, deadline_s=1.0, mu=1.0, seq=k), t)
    done += replica.advance_to(float("inf"))
    return reference, done


@pytest.mark.parametrize(
    ("profile", "prompt", "output", "rate"),
    [
        ("h100-llama-8b", 512, 128, 20.0),  # a busy batch of ~35
        ("h100-llama-8b", 2000, 50, 5.0),  # prefill-heavy
        ("h100-llama-8b", 100, 300, 50.0),  # decode-heavy, 256 slots full
        ("tiny-test", 374, 128, 20.0),  # overloaded: KV and slots queue requests
    ],
)
def test_replica_latencies_equal_perf_model_simulate(profile, prompt, output, rate):
    reference, done = _both(get_profile(profile), _poisson(rate, 300, prompt, output))
    expected = sorted(c.finished_s - c.arrival_s for c in reference)
    got = sorted(r.finished_s - r.arrival_s for r in done)

    # Same arithmetic, same order of admission: equal to rounding.
    assert got == pytest.approx(expected, rel=1e-9, abs=1e-9)


@pytest.mark.parametrize(("context_s", "step_s"), [(0.0, 0.0), (2e-9, 0.0), (2e-9, 0.003)])
@pytest.mark.parametrize("threshold", [0, 512])
def test_replica_equals_perf_model_with_long_prompts_among_short(threshold, context_s, step_s):
    """Long prompts among short ones, vLLM's --long-prefill-token-threshold off and on: with it
    the short prompts behind a long one prefill in the same steps and finish first, so the
    replica's prefilling requests leave out of order; the same arithmetic either way, a prompt
    token's cost growing with its context (prefill_context_s) or not, a step that prefills
    costing more than its tokens (prefill_step_s) or not."""
    prof = replace(
        get_profile("h100-llama-8b"),
        max_batched_tokens=2048,
        long_prefill_token_threshold=threshold,
        prefill_context_s=context_s,
        prefill_step_s=step_s,
    )
    rng = random.Random(3)
    arrivals = [(t, rng.choice((12_000, 300, 150)), o) for t, _, o in _poisson(6.0, 300, 0, 40)]
    reference, done = _both(prof, arrivals)
    got = [x for r in sorted(done, key=lambda r: r.seq) for x in (r.first_token_s, r.finished_s)]
    ref = sorted(reference, key=lambda c: int(c.request_id))
    assert got == pytest.approx([x for c in ref for x in (c.first_token_s, c.finished_s)], rel=1e-9, abs=1e-9)
    # Overtaken: a request admitted after another had its first token before it (capped only).
    firsts = [r.first_token_s for r in sorted(done, key=lambda r: r.seq)]
    overtaken = any(a > b for a, b in itertools.pairwise(firsts))
    assert overtaken == bool(threshold)


def test_replica_throughput_matches_steady_state_closed_form():
    """8 requests of (512 in, 128 out) always in flight on an H100 profile: the closed form says
    1 / (128 x 6 ms / 8 + 127 x 60 us + 512 x 40 us) = 1 / 0.1250 s = 8.0 requests/s."""
    prof = get_profile("h100-llama-8b")
    expected = pm.steady_state_requests_per_s(prof, 512, 128, batch=8)
    assert expected == pytest.approx(8.0, rel=0.01)
    replica = Replica(prof, 0, ready_at=0.0, started_at=0.0)
    for k in range(8):
        replica.submit(Request(0.0, 512, 128, 1.0, 1.0, k), 0.0)
    finished, seq, t = 0, 8, 0.0
    while t < 60.0:
        t += 0.05
        for req in replica.advance_to(t):
            finished += 1 if req.finished_s > 10.0 else 0  # after the first cycle settles
            replica.submit(Request(req.finished_s, 512, 128, 1.0, 1.0, seq), req.finished_s)
            seq += 1
    assert finished / (60.0 - 10.0) == pytest.approx(expected, rel=0.10)
