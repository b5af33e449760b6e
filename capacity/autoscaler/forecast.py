"""Predictive minimum: raise the floor ahead of a peak that recurs daily or weekly. Pure.

From an endpoint's per-minute load history, look at the same slot (now + lead, for `horizon`)
on each of the previous days and on the same weekday of previous weeks. A peak is *recurring*
when it shows on most previous days (the median of the daily maxima) or on the previous weeks
(the median of those); the floor is the replicas that peak needs. One-off spikes do not move
the median, so they do not raise tomorrow's floor.

Worked numbers: the 09:00-09:05 slot peaked at 700, 650 and 720 MU/min on the three previous
days; the median 700 against 70 % of 100 MU/min per replica is 10 replicas, so at 08:55 the
floor becomes 10 and the pods have five minutes to start before the load arrives.
"""

from __future__ import annotations

import bisect
import math
import statistics
from collections.abc import Sequence

DAY = 86400.0
WEEK = 7 * DAY
DAYS, WEEKS = 7, 4  # how many previous days, and previous weeks, a forecast looks at
PERIODS = ((DAY, DAYS), (WEEK, WEEKS))  # (period, how many back) a forecast compares
HISTORY_S = WEEKS * WEEK + DAY  # the per-minute history a forecast may read, seconds


def slots(
    now: float, lead_s: float = 300.0, horizon_s: float = 300.0, period: float = DAY, count: int = DAYS
) -> list[tuple[float, float]]:
    """[start, end] of the slot now + lead .. + horizon on each of `count` previous periods."""
    return [(now + lead_s - k * period, now + lead_s - k * period + horizon_s) for k in range(1, count + 1)]


def windows(now: float, lead_s: float = 300.0, horizon_s: float = 300.0) -> list[tuple[float, float]]:
    """Every span of history `predicted_peak` reads: what a caller needs to load."""
    return [span for period, count in PERIODS for span in slots(now, lead_s, horizon_s, period, count)]


def predicted_peak(
    history: Sequence[tuple[float, float]],  # (unix seconds, MU/min), ascending time
    now: float,
    lead_s: float = 300.0,
    horizon_s: float = 300.0,
) -> float | None:
    """The recurring peak expected in [now + lead, now + lead + horizon]; None without 2 periods."""
    times = [t for t, _ in history]

    def peak(start: float, end: float) -> float | None:
        lo = bisect.bisect_left(times, start)
        hi = bisect.bisect_right(times, end)
        return max((v for _, v in history[lo:hi]), default=None)

    estimates = []
    for period, count in PERIODS:
        peaks = [p for span in slots(now, lead_s, horizon_s, period, count) if (p := peak(*span)) is not None]
        if len(peaks) >= 2:
            estimates.append(statistics.median(peaks))
    return max(estimates) if estimates else None


def predicted_min_replicas(
    history: Sequence[tuple[float, float]],
    now: float,
    mu_per_replica_minute: float,
    target_utilisation: float,
    lead_s: float = 300.0,
) -> int:
    """Replicas the recurring peak needs (0 when no pattern is known)."""
    peak = predicted_peak(history, now, lead_s=lead_s)
    if peak is None or peak <= 0:
        return 0
    # 1e-9: 6 x 0.8 x 100 / (0.8 x 100) is 6.000000000000001 in floats; 6 replicas carry it.
    return math.ceil(peak / (target_utilisation * mu_per_replica_minute) - 1e-9)
