import pytest

from capacity.provisioning import replica_bounds


@pytest.mark.parametrize(
    ("low", "high", "target", "to_zero", "expected"),
    [
        (20, 100, 8, False, (3, 13)),  # ceil(20/8)=3, ceil(100/8)=13
        (0, 8, 8, True, (0, 1)),  # may scale to zero
        (0, 8, 8, False, (1, 1)),  # may not: keeps one replica
        (16, 16, 8, False, (2, 2)),
        (1, 1, 64, False, (1, 1)),
    ],
)
def test_replica_bounds_follow_provisioned_concurrency(low, high, target, to_zero, expected):
    assert replica_bounds(low, high, target, to_zero) == expected


def test_a_zero_target_is_refused_naming_the_value():
    with pytest.raises(ValueError, match="target_concurrency_per_replica must be at least 1, got 0"):
        replica_bounds(1, 2, 0, False)
