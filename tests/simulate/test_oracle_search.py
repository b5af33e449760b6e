"""The searched oracle: repair missed minutes, trim slack, report what no schedule met."""

from dataclasses import replace

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
    # Trimmed down to a local optimum: one replica fewer in any minute would miss it.
    assert searched.per_minute == (3, 10, 50, 2)
    assert searched.runs == len(calls) and set(searched.result.violating_minutes) == {2}


def test_unmet_minutes_leave_every_policys_score():
    replay, _ = _replay_against([3, 10, 200, 2])
    result = replay([3, 6, 50, 2])  # minutes 1 and 2 missed
    assert result.slo_attainment == 0.5
    assert attainment_without(result, (2,)) == pytest.approx(2 / 3)


def test_a_trim_that_breaks_the_next_minute_is_given_back_and_the_rest_kept():
    # Minute 1's first requests run on minute 0's replicas: it misses when minute 0 has under 5,
    # however little minute 0's own requests need (3).
    need, carried = [3, 10, 1, 2], 5
    replay, _ = _replay_against(need)

    def coupled(schedule):
        result = replay(schedule)
        if schedule[0] >= carried:
            return result
        minutes = list(result.minutes)
        minutes[1] = replace(minutes[1], p99_slo_ratio=carried / schedule[0])
        violating = tuple(m.minute for m in minutes if m.p99_slo_ratio > 1.0)
        return replace(result, minutes=tuple(minutes), violating_minutes=violating)

    searched = search_schedule([8, 10, 4, 8], coupled, ceiling=50)
    assert searched.unmet == ()
    assert searched.per_minute[:2] == (carried, 10)  # minute 0's trims past 5 given back
    assert searched.per_minute[3] == 2  # trimmed beside it all along
    assert searched.per_minute[2] < 4
