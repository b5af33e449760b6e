"""The searched oracle: repair missed minutes, trim slack, report what no schedule met."""

import pytest

from capacity.simulate.fleet import MinuteStats, Result
from capacity.simulate.scenario import attainment_without, search_schedule


def _replay_against(need, gpu_per_replica_minute=1.0):
    """A stand-in for the fleet: minute m meets its SLO iff it has >= need[m] replicas, with a
    p99 ratio of need / replicas (the slack a trim reads)."""
    calls = []

    def replay(schedule):
        calls.append(list(schedule))
        minutes = tuple(
            MinuteStats(m, 100, need[m] / n if n else float("inf"), float(n)) for m, n in enumerate(schedule)
        )
        violating = tuple(m.minute for m in minutes if m.p99_slo_ratio > 1.0)
        return Result(
            "oracle",
            100 * len(need),
            60.0 * len(need),
            sum(schedule) * gpu_per_replica_minute / 60,
            0.0,
            1 - len(violating) / len(need),
            0.0,
            0.0,
            0.0,
            0,
            0.0,
            max(schedule),
            violating,
            minutes,
        )

    return replay, calls


def test_repairs_missed_minutes_trims_slack_and_reports_the_unmeetable():
    # Minute 1 needs 10 (the start gives 6), minute 2 needs 200 (over the ceiling of 50),
    # minute 3 needs 2 and was given 8 (p99 at 0.25 of its deadline: slack).
    need = [3, 10, 200, 2]
    replay, calls = _replay_against(need)
    searched = search_schedule([3, 6, 40, 8], replay, ceiling=50)
    assert searched.unmet == (2,)
    assert searched.per_minute[1] >= 10 and searched.per_minute[2] == 50
    assert searched.per_minute[3] < 8  # trimmed, still meeting its minute
    assert searched.per_minute[3] >= 2 and searched.per_minute[0] >= 3
    assert searched.runs == len(calls) and set(searched.result.violating_minutes) == {2}


def test_unmet_minutes_leave_every_policys_score():
    replay, _ = _replay_against([3, 10, 200, 2])
    result = replay([3, 6, 50, 2])  # minutes 1 and 2 missed
    assert result.slo_attainment == 0.5
    assert attainment_without(result, (2,)) == pytest.approx(2 / 3)
