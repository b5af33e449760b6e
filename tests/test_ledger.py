"""The pool ledger in whole replicas on nodes, with worked numbers (pure; no database)."""

from fractions import Fraction

import pytest

from capacity.ledger import (
    NOTHING,
    Allocation,
    Commitment,
    Oversold,
    QuotaExceeded,
    Shape,
    check_change,
    check_holds,
    check_quota,
    fit_replicas,
    pool_ledger,
)
from capacity.packing import NodeShape, ReplicaDemand

SMALL = Shape(mu_per_replica_minute=100, gpus_per_replica=1)
BIG = Shape(mu_per_replica_minute=100, gpus_per_replica=4)
FIVE = Shape(mu_per_replica_minute=100, gpus_per_replica=5)
EIGHT = NodeShape(8)


def alloc(key, shape, sold, used=0, model="m", min_replicas=0, running=0):
    return Allocation(
        str(key), shape, model, Fraction(sold), Fraction(used), min_replicas, running, f"t/{key}"
    )


def asked(shape, sold, min_replicas=0, overcommit=Fraction(1)):
    return shape.commitment(sold, min_replicas, overcommit)


def test_replicas_are_whole_per_endpoint():
    # The first example: ten endpoints of 50 MU/min of a 70B model (100 MU/min, 4 GPUs
    # per replica) need ten replicas, 40 GPUs, not 20.
    ledger = pool_ledger(8, EIGHT, 1.0, [alloc(i, BIG, 50, model="70b") for i in range(10)], SMALL)
    assert (ledger.sold_replicas, ledger.sold_gpus) == (10, 40)
    assert (ledger.committed_replicas, ledger.committed_gpus) == (10, 40)
    assert ledger.sold_mu_per_minute == 500  # as sold
    assert ledger.committed_mu_per_minute == 1000  # what the ten replicas serve


def test_an_endpoint_commits_the_larger_of_its_sold_replicas_and_its_minimum():
    # 300 MU/min = 3 replicas; 2 minimum replicas: 3, not 5. 250 MU/min is 3 replicas too.
    assert SMALL.commitment(300, 2) == Commitment(3, SMALL)
    assert SMALL.commitment(250, 0).replicas == 3
    # No reservation, 3 minimum replicas of the 4-GPU model: 12 GPUs, 300 MU/min.
    assert (BIG.commitment(0, 3).gpus, BIG.commitment(0, 3).mu_per_minute) == (12, 300)
    assert SMALL.commitment(0, 0).replicas == NOTHING.replicas == 0


def test_two_five_gpu_replicas_fit_two_eight_gpu_nodes_and_three_do_not():
    # The second example and the Contract: 16 GPUs at 8 per node, 5 GPUs per replica.
    empty = pool_ledger(2, EIGHT, 1.0, [], SMALL)
    check_change("p", empty, "1", "m5", asked(FIVE, 200))  # 2 replicas, one per node
    with pytest.raises(Oversold) as refused:
        check_change("p", empty, "1", "m5", asked(FIVE, 300))  # 15 GPUs < 16, but 3 nodes' worth
    assert (refused.value.asked.replicas, refused.value.fit_replicas) == (3, 2)
    # Worded from the pool's point of view: what it has, what this needs, how many fit.
    assert str(refused.value).startswith("pool 'p' cannot place this. It has 16 GPUs (2 nodes x 8 GPUs);")
    assert str(refused.value).endswith("This needs 3 replicas of 5 GPUs (15 GPUs, 300 MU/min); at most 2 fit")
    # With two placed: 3 GPUs free on each node, all stranded for a 5-GPU model.
    two = pool_ledger(2, EIGHT, 1.0, [alloc(1, FIVE, 200, model="m5")], SMALL)
    assert (two.free_gpus, two.stranded_gpus, two.headroom_gpus) == (6, 6, 0)
    assert [m.more_replicas for m in two.models] == [0]
    assert [len(n.replicas) for n in two.nodes] == [1, 1]


def test_committed_sold_and_used_sum_with_what_still_fits_per_model():
    # One 8-GPU node. Small model: 200 MU/min sold (2 replicas), 1 minimum, 150 metered, 3 running.
    # Big model: 100 MU/min sold (1 replica of 4), 50 metered, 1 running.
    ledger = pool_ledger(
        1,
        EIGHT,
        1.0,
        [
            alloc(1, SMALL, 200, 150, "s", min_replicas=1, running=3),
            alloc(2, BIG, 100, 50, "b", 1, running=1),
        ],
        SMALL,
    )
    assert (ledger.committed_replicas, ledger.committed_gpus, ledger.sold_gpus) == (3, 6, 6)
    assert ledger.committed_mu_per_minute == 300 and ledger.sold_mu_per_minute == 300
    assert ledger.used_mu_per_minute == 200  # metered
    assert ledger.used_gpus == 3 * 1 + 1 * 4  # held by running replicas
    # Alone, the 1-GPU model fills the pool with 800 MU/min, the 4-GPU one with 200: the pool's
    # MU/min is their mean, whatever was sold of each; 2 GPUs are free.
    assert (ledger.have_mu_per_minute, ledger.headroom_mu_per_minute) == (500, 100)
    assert (ledger.free_gpus, ledger.stranded_gpus, ledger.headroom_gpus) == (2, 0, 2)
    by_model = {m.model: m for m in ledger.models}
    assert (by_model["s"].more_replicas, by_model["b"].more_replicas) == (2, 0)
    assert (by_model["s"].headroom_mu_per_minute, by_model["b"].headroom_mu_per_minute) == (200, 0)
    assert (by_model["s"].have_replicas, by_model["b"].have_replicas) == (8, 2)
    assert not ledger.oversold


def test_minimum_replicas_are_committed_without_a_reservation():
    # 4 nodes x 8 GPUs; an unreserved 4-GPU endpoint with 6 minimum replicas commits 24 GPUs.
    ledger = pool_ledger(4, EIGHT, 1.0, [alloc(1, BIG, 0, min_replicas=6)], SMALL)
    assert (ledger.committed_gpus, ledger.sold_gpus, ledger.free_gpus) == (24, 0, 8)
    # Raising its minimum to 9 asks 9 replicas in place of 6; 8 fit.
    with pytest.raises(Oversold) as refused:
        check_change("p", ledger, "1", "m", asked(BIG, 0, 9), asked(BIG, 0, 6))
    assert (refused.value.asked.replicas, refused.value.replacing.replicas, refused.value.fit_replicas) == (
        9,
        6,
        8,
    )
    assert (
        "This needs 9 replicas of 4 GPUs (36 GPUs, 900 MU/min), where the endpoint commits 6 replicas"
        in str(refused.value)
    )
    check_change("p", ledger, "1", "m", asked(BIG, 0, 8), asked(BIG, 0, 6))  # 32 of 32


def test_a_reservation_within_the_minimum_asks_nothing_more():
    ledger = pool_ledger(1, EIGHT, 1.0, [alloc(1, SMALL, 0, min_replicas=8)], SMALL)  # full
    check_change("p", ledger, "1", "m", asked(SMALL, 800, 8), asked(SMALL, 0, 8))  # 8 replicas: same
    with pytest.raises(Oversold):
        check_change("p", ledger, "1", "m", asked(SMALL, 801, 8), asked(SMALL, 0, 8))  # 9


def test_an_empty_pool_is_priced_at_the_default_shape():
    ledger = pool_ledger(2, EIGHT, 1.0, [], SMALL)
    assert ledger.have_gpus == 16 and ledger.have_mu_per_minute == 1600
    assert ledger.committed_gpus == 0 and ledger.sold_gpus == 0 and ledger.stranded_gpus == 0
    assert ledger.models == () and [n.free_gpus for n in ledger.nodes] == [8, 8]


def test_a_change_that_asks_no_more_passes_even_in_a_pool_that_is_over():
    ledger = pool_ledger(1, NodeShape(4), 1.0, [alloc(1, SMALL, 600)], SMALL)  # 6 of 4: shrunk
    assert ledger.oversold and ledger.unplaced_replicas == 2
    check_change("p", ledger, "1", "m", asked(SMALL, 600), asked(SMALL, 600))  # a rename, say
    check_change("p", ledger, "1", "m", asked(SMALL, 500), asked(SMALL, 600))  # a cut
    with pytest.raises(Oversold):
        check_change("p", ledger, "1", "m", asked(SMALL, 601), asked(SMALL, 600))
    with pytest.raises(
        Oversold, match=r"It has 4 GPUs \(1 node x 4 GPUs\);.* It cannot place 2 replicas of the 6 committed"
    ):
        check_holds("p", ledger)


def test_overcommit_sells_a_replica_more_than_once():
    # One 8-GPU node at over-commit 1.25: a replica sells 125 MU/min, so 1000 MU/min is 8 replicas.
    oc = Fraction(5, 4)
    ledger = pool_ledger(1, EIGHT, oc, [], SMALL)
    assert ledger.sellable_mu_per_minute == 1000
    check_change("p", ledger, "1", "m", asked(SMALL, 1000, overcommit=oc))
    with pytest.raises(Oversold):
        check_change("p", ledger, "1", "m", asked(SMALL, 1001, overcommit=oc))  # 9 replicas


def test_float_overcommit_is_read_exactly():
    # 1.1 is 11/10, not 1.10000000000000008882: 1100 MU/min at 110 per replica is 10 replicas.
    ledger = pool_ledger(10, NodeShape(1), 1.1, [alloc(1, SMALL, 1100)], SMALL)
    assert ledger.committed_replicas == 10 and not ledger.oversold


def test_fit_replicas_beside_the_others_claims():
    claims = [ReplicaDemand("a", "m5", 5, 1), ReplicaDemand("b", "m1", 1, 2)]
    # 2 nodes x 8: a's 5-GPU replica and b's two 1-GPU ones: b may grow to 2 + 1 + 8 = 11.
    assert fit_replicas(2, EIGHT, claims, "b", 1) == 11
    assert fit_replicas(2, EIGHT, claims, "a", 5) == 2  # its own claim is replaced
    assert fit_replicas(2, EIGHT, claims, "new", 5) == 1  # a and b share a node (7 GPUs): one more
    assert fit_replicas(1, EIGHT, claims, "new", 8) == 0  # never negative


def test_the_quota_bounds_the_minimum_and_the_maximum_summed():
    # Quota 64: other endpoints take 8 GPUs at min and 40 at max.
    check_quota("acme", 64, (8, 24), (8, 40))  # 16 and 64: fits exactly
    with pytest.raises(QuotaExceeded) as refused:
        check_quota("acme", 64, (8, 25), (8, 40))
    assert (refused.value.which, refused.value.total_gpus, refused.value.asked_gpus) == ("max", 65, 25)
    assert "acme" in str(refused.value) and "64 GPUs" in str(refused.value)
    with pytest.raises(QuotaExceeded) as refused:
        check_quota("acme", 10, (8, 8), (4, 0))
    assert refused.value.which == "min"


def test_a_tenant_over_a_lowered_quota_may_still_shrink():
    check_quota("acme", 10, (2, 20), (0, 0), replacing_gpus=(2, 30))
    with pytest.raises(QuotaExceeded):
        check_quota("acme", 10, (2, 31), (0, 0), replacing_gpus=(2, 30))
