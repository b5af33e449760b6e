"""Provisioned concurrency -> replica bounds. Pure.

min_replicas = ceil(min_provisioned_concurrency / target_concurrency_per_replica): 20 concurrent
requests at 8 per replica need 3 replicas. An endpoint that may not scale to zero keeps at least
one replica even when its provisioned minimum is 0.
"""

from math import ceil


def bounds_error(min_provisioned_concurrency: int, max_provisioned_concurrency: int) -> str | None:
    """What is wrong with these provisioned-concurrency bounds, or None when nothing is."""
    if min_provisioned_concurrency > max_provisioned_concurrency:
        return (
            f"min_provisioned_concurrency ({min_provisioned_concurrency}) must not exceed"
            f" max_provisioned_concurrency ({max_provisioned_concurrency})"
        )
    return None


def replica_bounds(
    min_provisioned_concurrency: int,
    max_provisioned_concurrency: int,
    target_concurrency_per_replica: int,
    scale_to_zero_enabled: bool,
) -> tuple[int, int]:
    """(min_replicas, max_replicas); e.g. (20, 100, 8, False) -> (3, 13), (0, 8, 8, True) -> (0, 1)."""
    low = min_replicas(min_provisioned_concurrency, target_concurrency_per_replica, scale_to_zero_enabled)
    high = max(low, ceil(max_provisioned_concurrency / target_concurrency_per_replica))
    return low, high


def min_replicas(
    min_provisioned_concurrency: int, target_concurrency_per_replica: int, scale_to_zero_enabled: bool
) -> int:
    """The lower of replica_bounds, which the maximum does not move (what a pool commits)."""
    if target_concurrency_per_replica < 1:
        raise ValueError(
            f"target_concurrency_per_replica must be at least 1, got {target_concurrency_per_replica}"
        )
    floor = 0 if scale_to_zero_enabled else 1
    return max(floor, ceil(min_provisioned_concurrency / target_concurrency_per_replica))
