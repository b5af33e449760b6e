"""apa carries a series of bursts from decision to decision, as the control plane's pass keeps it
on the endpoint's row (capacity.autoscaler.series)."""

import pytest

from capacity.autoscaler import series
from capacity.simulate.policies import Apa
from tests.simulate.support import buckets, state

STARTS = range(300, 601, 50)  # seven 20-s bursts, 50 s apart: a series for 320 s


def history_to(end: float) -> list:
    """400 MU/min with the bursts at 2,800, in 1-second buckets up to `end`."""
    out = []
    for t in range(0, int(end)):
        burst = any(s <= t < s + 20 for s in STARTS)
        out += buckets(t, t + 1, mu_per_minute=2800.0 if burst else 400.0)
    return out


def replicas_by_time(apa: Apa, until: float) -> dict[float, int]:
    whole, desired, seen = history_to(until), 5, {}
    t = 5.0
    while t <= until:
        desired = apa.decide(state(desired), [b for b in whole if b.end <= t], t)
        seen[t] = desired
        t += 5.0
    return seen


def test_apa_holds_a_carried_series_until_a_memory_passes_without_a_burst(monkeypatch):
    # Each burst needs 933 MU x 60 / 25 = 2,240 MU/min: 22.4 replicas of 100. 260 s after the
    # last burst (ending at 620 s) the memory holds none of the series' recurrence: the hold
    # alone is capped at 1.75 x 400 / 80 = 8.75 -> 9. Carried, the series holds 23 until 920 s.
    apa = Apa(mu_per_replica_minute=100.0)
    seen = replicas_by_time(apa, 960.0)
    assert all(seen[t] >= 23 for t in range(880, 916, 5)), seen
    assert seen[960.0] < 23 and apa.series is None  # over, a memory after its last burst
    held = Apa(mu_per_replica_minute=100.0)
    replicas_by_time(held, 880.0)
    assert [(r.start, r.end) for r in held.series.runs] == [(s, s + 20) for s in STARTS]
    assert held.series.level(880.0, held.config) == pytest.approx(2240.0)
    # Never carried (no series is one level), the fleet falls to the capped hold.
    monkeypatch.setattr(series, "ONE_LEVEL", 0.0)
    plain = replicas_by_time(Apa(mu_per_replica_minute=100.0), 900.0)
    assert plain[900.0] == 9
