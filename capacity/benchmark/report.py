"""A benchmark sweep as text: the table the bench and the command print. Pure."""

from __future__ import annotations

import math

from capacity.benchmark.results import SweepResult
from capacity.fitting import Fit
from capacity.units import MU_PER_REPLICA_MINUTE


def table(
    result: SweepResult, fitted: Fit | None = None, mu_per_replica_minute: float = MU_PER_REPLICA_MINUTE
) -> str:
    """The sweep as a text table: shape, solo latency, sustained rate, measured vs fitted cost."""
    lines = [f"{'in':>6} {'out':>5} {'solo s':>8} {'req/min':>10} {'cost MU':>9} {'fit MU':>9}  note"]
    for s in result.shapes:
        cost = mu_per_replica_minute / s.sustainable_per_minute if s.sustainable_per_minute else math.nan
        predicted = fitted.predict(s.input_tokens, s.output_tokens) if fitted else math.nan
        lines.append(
            f"{s.input_tokens:>6} {s.output_tokens:>5} {s.solo_latency_s:>8.3f}"
            f" {s.sustainable_per_minute:>10.1f} {cost:>9.4f} {predicted:>9.4f}  {s.note}"
        )
    return "\n".join(lines)
