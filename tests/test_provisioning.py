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


def test_bounds_are_refused_naming_both_values():
    from capacity.provisioning import bounds_error

    assert bounds_error(8, 8) is None and bounds_error(0, 1) is None
    assert bounds_error(10, 8) == (
        "min_provisioned_concurrency (10) must not exceed max_provisioned_concurrency (8)"
    )
