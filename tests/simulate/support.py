"""Helpers for the simulator's tests: synthetic router buckets and fleet states."""

from capacity.autoscaler import Bucket
from capacity.simulate.policies import FleetState


def buckets(start: float, end: float, in_flight: float = 0.0, mu_per_minute: float = 0.0) -> list[Bucket]:
    """1-second buckets ending at start+1 .. end, all with the same load."""
    return [
        Bucket(end=float(t), seconds=1.0, in_flight=in_flight, mu_per_minute=mu_per_minute, requests=1)
        for t in range(int(start) + 1, int(end) + 1)
    ]


def state(
    desired: int, ready: int | None = None, target: int = 256, lo: int = 1, hi: int = 1000
) -> FleetState:
    return FleetState(desired, desired if ready is None else ready, target, lo, hi)
