"""The frontier bench's goal, as written and restated (the minutes of the bursts' first 60 s
apart), judged on points made by hand: what it reports is what the docs' tables say."""

import importlib
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parent.parent / "bench"


@pytest.fixture
def frontier(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.syspath_prepend(str(BENCH))  # the bench and the policies bench it reads
    return importlib.import_module("autoscaler_frontier")


def test_a_family_missed_only_at_its_bursts_starts_holds_restated(frontier):
    point = frontier.Point
    points = [
        point("oracle", 0.0, 1.0, 1.0, 1.0),
        point("apa", 0.8, 1.2, 0.80, 0.95),
        point("hpa", 70.0, 2.0, 0.60, 0.70),
        point("hpa", 10.0, 5.0, 0.85, 0.99),  # more minutes, at more cost: not below its frontier
        point("kpa", 70.0, 1.1, 0.20, 0.20),
    ]
    assert frontier.goal(points) == ["attainment 0.800 < 0.9"]
    assert frontier.goal(points, restated=True) == []
    # A baseline that meets more of the minutes apart at no more cost: restated, apa is below it.
    cheaper = [*points, point("kpa", 10.0, 1.15, 0.50, 0.97)]
    assert frontier.goal(cheaper, restated=True) == ["below kpa's frontier (0.970 at no more cost)"]
    # The cost clause is the same either way.
    dear = [p if p.policy != "apa" else point("apa", 0.8, 1.3, 0.95, 0.99) for p in points]
    assert frontier.goal(dear, restated=True) == ["1.30x the oracle > 1.25x"]
