"""Whole replicas on real nodes (capacity/packing.py): worked numbers, then generated fleets."""

from __future__ import annotations

from fractions import Fraction

import pytest

from capacity.packing import (
    NodeShape,
    ReplicaDemand,
    check_change,
    pack,
    replicas_needed,
)

EIGHT = NodeShape(gpus=8)


def demand(key: str, gpus: int, count: int = 1, model: str = "m") -> ReplicaDemand:
    return ReplicaDemand(key=key, model=model, gpus=gpus, count=count)


def test_replicas_are_whole_ten_tenants_of_half_a_replica_need_ten():
    # 10 endpoints x 50 MU/min of a 4-GPU, 100-MU/min-per-replica model: 10 replicas, 40 GPUs (not 20).
    counts = [replicas_needed(50, 100, 0) for _ in range(10)]
    assert counts == [1] * 10
    packing = pack(5, EIGHT, [demand(f"t{i}", 4, c) for i, c in enumerate(counts)])
    assert packing.fits and packing.used_gpus == 40 and packing.free_gpus == 0


@pytest.mark.parametrize(
    ("reserved", "per_replica", "minimum", "expected"),
    [
        (50, 100, 0, 1),
        (200, 100, 0, 2),
        (201, 100, 0, 3),
        (0, 100, 0, 0),
        (0, 100, 2, 2),
        (300, 100, 1, 3),
        (Fraction(1, 3), 100, 0, 1),
        (Fraction(100), 100, 0, 1),
    ],
)
def test_replicas_needed_is_the_ceiling_at_least_the_minimum(reserved, per_replica, minimum, expected):
    assert replicas_needed(reserved, per_replica, minimum) == expected


def test_two_nodes_of_eight_hold_two_five_gpu_replicas_not_three():
    assert pack(2, EIGHT, [demand("a", 5, 2)]).fits
    packing = pack(2, EIGHT, [demand("a", 5, 3)])
    assert not packing.fits
    assert packing.unplaced == (demand("a", 5, 1),)
    assert packing.free_per_node == (3, 3)
    assert packing.stranded_gpus([5]) == 6


def test_contract_sale_check_16_gpus_5_gpu_replicas():
    # 200 MU/min at 100 per replica -> 2 replicas fit; 300 -> 3 do not, and 2 of them fit.
    two = check_change(2, EIGHT, [], demand("e", 5, replicas_needed(200, 100, 0)))
    assert two.fits and two.fit_replicas == 2
    three = check_change(2, EIGHT, [], demand("e", 5, replicas_needed(300, 100, 0)))
    assert not three.fits
    assert (three.asked_replicas, three.asked_gpus_per_replica, three.fit_replicas) == (3, 5, 2)
    # Two endpoints of 50 MU/min each: two replicas, 10 GPUs.
    both = pack(
        2, EIGHT, [demand("x", 5, replicas_needed(50, 100, 0)), demand("y", 5, replicas_needed(50, 100, 0))]
    )
    assert both.fits and both.used_gpus == 10
