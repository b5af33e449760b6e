"""Plausibility checks of a sweep's rates, pure: which shapes the sweep measures again
(`implausible`, `slow_outliers`), in which order it gives them second looks (`slowest_first`),
and the rate each shape sustains at least, since more work is never served faster
(`at_least_larger`)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from capacity.benchmark.results import ShapeResult
from capacity.fitting import MIN_SHAPES, heldout_errors


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
        if rate > 0 and any(b.sustainable_per_minute > rate * (1 + slack) for b in _larger(a, results)):
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
    measured = [i for i, r in enumerate(results) if r.sustainable_per_minute > 0]
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
                f"{best.input_tokens}x{best.output_tokens} sustained more"
            ).strip()
            a = replace(a, sustainable_per_minute=best.sustainable_per_minute, note=note)
        out.append(a)
    return tuple(out)
