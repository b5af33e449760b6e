"""Plausibility checks of a sweep's rates, pure: which shapes the sweep measures again
(`implausible`, `slow_outliers`), in which order it gives them second looks (`slowest_first`),
and the rate each shape sustains at least, since more work is never served faster
(`at_least_larger`)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace

from capacity.benchmark.results import ShapeResult, shape_name
from capacity.fitting import MIN_SHAPES, heldout_errors

# A closed step in which the engine held less than this share of the requests the client meant
# to hold in flight was bounded by the client (Step.held_share). Measured over HTTP against the
# simulated H100 8B at x20 on the 2-core machine: the shapes the engine bounds held 0.76-0.97 at
# their knee and beyond it; 16 x 1 held 0.10, 128 x 1 0.31, 16 x 16 0.41 at C=128 and 0.24 at
# 256, 16 x 128 0.86 at its knee (C=128) and 0.44 at 256, where the engine's batch had room.
CLIENT_BOUND_SHARE = 0.6


def client_bound(result: ShapeResult) -> bool:
    """Whether the client, not the engine, bounded the shape's rate. Pure.

    The engine times its requests from their arrival (vLLM's e2e histogram), so by Little's
    law the engine held sum(latencies) / duration of them; the client meant to hold C. Where
    the knee (the best closed step within the SLO) or a step past it, one the climb doubled to
    and that still met the SLO, shows the engine holding under CLIENT_BOUND_SHARE of C, the
    requests waited in the client or on the wire while the engine had room: what the climb
    reached is the client's ceiling, not the engine's capacity. A step the client's clock timed
    has no share (real vLLM with its default buckets, the in-process virtual clock), so it
    never reads client-bound: nothing changes there. It holds whether or not an open-loop step
    then met the SLO: a client starved of CPU misses it in the open loop too (16 x 1 at x20 on
    the 2-core machine once missed every open step beside the rest of `make test`; with three
    CPU hogs beside it, its closed steps held 0.02-0.34 of C), and the verdict says whose the
    miss was.
    """
    closed = [s for s in result.steps if s.mode == "closed" and s.met_slo]
    if not closed:
        return False
    knee = max(closed, key=lambda s: s.throughput_per_s)
    return any(
        s.held_share is not None and s.held_share < CLIENT_BOUND_SHARE
        for s in closed
        if s is knee or s.concurrency > knee.concurrency
    )


def implausible(results: Sequence[ShapeResult], slack: float = 0.25) -> list[int]:
    """Shapes that sustained a lower rate than a larger shape (as many or more tokens in and
    out) by more than `slack`: more work can never be served faster, so one of the two
    measurements was disturbed, and it is the slow one. Pure.

    Worked numbers: 256 in x 16 out at 1,505 req/min beside 256 x 64 at 2,257 -> re-measure
    256 x 16 (2,257 / 1,505 = 1.5 > 1.25); 16 x 16 at 17,000 beside 64 x 16 at 17,500 is noise.
    """
    out = []
    for i, a in enumerate(results):
        rate = a.sustainable_per_minute
        if (
            rate > 0
            and not a.client_bound
            and any(b.sustainable_per_minute > rate * (1 + slack) for b in _larger(a, results))
        ):
            out.append(i)
    return out


def slow_outliers(results: Sequence[ShapeResult], slack: float = 0.2) -> list[int]:
    """Shapes that cost more than `slack` above what a fit of all the other shapes predicts for
    them, worst first. Pure. The disturbances of a shared machine are one-sided (a stall only
    slows a step), so a shape the others price far cheaper most likely read slow; a shape the
    others price dearer has no such excuse and is left alone. Needs a fit without the shape.

    Worked numbers (real vLLM): 256 x 128 measured 1,524 req/min, 0.0656 MU, where the other 12
    shapes predict 0.0385 MU: -41 % -> measure again; 256 x 64 at -13 % is within the slack.
    """
    return [i for e, i in _heldout_slowest_first(results) if e < -slack]


def slowest_first(results: Sequence[ShapeResult]) -> list[int]:
    """The measured shapes, the one the others' fit prices furthest below its measurement first."""
    return [i for _, i in _heldout_slowest_first(results)]


def _heldout_slowest_first(results: Sequence[ShapeResult]) -> list[tuple[float, int]]:
    """(held-out error, index) of every measured shape, most negative first; errors are 0, in
    the shapes' order, when too few shapes are measured to fit without one."""
    # A client-bound shape is not the engine's capacity: it neither predicts the others nor is
    # looked at again (another look meets the same client).
    measured = [i for i, r in enumerate(results) if r.sustainable_per_minute > 0 and not r.client_bound]
    if len(measured) <= MIN_SHAPES:
        return [(0.0, i) for i in measured]
    errors = heldout_errors([results[i].measurement() for i in measured])
    return sorted(zip(errors, measured, strict=True))


def _larger(a: ShapeResult, results: Sequence[ShapeResult]) -> list[ShapeResult]:
    """The other shapes with as many or more tokens in and out than `a`: at most as fast."""
    return [
        b
        for b in results
        if b.shape != a.shape and b.input_tokens >= a.input_tokens and b.output_tokens >= a.output_tokens
    ]


def at_least_larger(results: Sequence[ShapeResult]) -> tuple[ShapeResult, ...]:
    """Each shape's rate raised to the best rate of any larger shape (as many or more tokens in
    and out), which it sustains too: more work is never served faster, and a closed or open
    step can only be slowed by a disturbance, never sped up. Pure; the steps keep what was
    measured, and the note says what was raised.

    Worked numbers: 128 x 16 measured at 1,633 req/min twice (stalled) beside 256 x 16 at 9,048
    -> 9,048, noted; 16 x 16 at 17,000 beside 64 x 16 at 17,500 -> 17,500.
    """
    out = []
    for a in results:
        best = max(_larger(a, results), key=lambda b: b.sustainable_per_minute, default=None)
        if a.sustainable_per_minute > 0 and best and best.sustainable_per_minute > a.sustainable_per_minute:
            note = (
                f"{a.note} raised from {a.sustainable_per_minute:.0f}: "
                f"{shape_name(*best.shape)} sustained more"
            ).strip()
            a = replace(a, sustainable_per_minute=best.sustainable_per_minute, note=note)
        out.append(a)
    return tuple(out)


def client_bound_verdict(
    shapes: Sequence[ShapeResult], predict: Callable[[int, int], float], mu: float, tolerance: float
) -> tuple[bool, str]:
    """(publish?, why not): a client-bound shape is left out of the fit, but what it measured
    still bounds its price: the engine served it at least that fast, so it costs at most that
    much. A fit that prices one more than `tolerance` above it extrapolates to where it was not
    measured, wrongly. Pure.

    Worked numbers (simulated H100 8B over HTTP at x20, 12 of 17 shapes client-bound): the five
    long-answer shapes left fit gamma 0.027 MU (95 % interval -0.0002 to 0.059), pricing 16 x 1
    at 0.0285 MU where the client already measured it at 0.0093 at most (truly 0.0011).
    """
    for s in shapes:
        if not s.client_bound or s.sustainable_per_minute <= 0:
            continue
        bound = mu / s.sustainable_per_minute
        priced = predict(s.input_tokens, s.output_tokens)
        if priced > bound * (1 + tolerance):
            return False, (
                f"prices client-bound {s.input_tokens} x {s.output_tokens} at {priced:.4g} MU, above the"
                f" {bound:.4g} MU it measured at most: the shapes left do not determine the price of"
                " the ones this machine's client could not drive"
            )
    return True, ""
