"""The pool ledger's arithmetic, with worked numbers (pure; no database)."""

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
    free_replicas,
    pool_ledger,
)

SMALL = Shape(mu_per_replica_minute=100, gpus_per_replica=1)
BIG = Shape(mu_per_replica_minute=100, gpus_per_replica=4)


def alloc(shape, sold, used=0, model="m", min_replicas=0, running=0):
    return Allocation(shape, model, Fraction(sold), Fraction(used), min_replicas, running)


def asked(shape, sold, min_replicas=0):
    return shape.commitment(sold, min_replicas)


def test_mu_converts_to_gpus_through_the_profile():
    # 250 MU/min at 100 MU per replica-minute and 4 GPUs per replica: 2.5 replicas, 10 GPUs.
    assert BIG.gpus(250) == 10
    assert SMALL.gpus(250) == Fraction(5, 2)


def test_an_endpoint_commits_the_larger_of_its_reservation_and_its_minimum():
    # 300 MU/min reserved = 3 GPUs; 2 minimum replicas = 2 GPUs: 3 GPUs, not 5.
    assert SMALL.commitment(300, 2) == Commitment(Fraction(3), Fraction(300))
    # No reservation, 3 minimum replicas of the 4-GPU model: 12 GPUs, 300 MU/min of it.
    assert BIG.commitment(0, 3) == Commitment(Fraction(12), Fraction(300))
    assert SMALL.commitment(0, 0) == NOTHING


def test_committed_sold_and_used_sum_in_gpus_and_mu():
    # 8 GPUs. Small model: 200 MU/min sold (2 GPUs), 1 minimum replica, 150 metered, 3 running.
    # Big model: 100 MU/min sold (4 GPUs), 1 minimum replica (4 GPUs), 50 metered, 1 running.
    ledger = pool_ledger(
        8,
        1.0,
        [alloc(SMALL, 200, 150, "s", min_replicas=1, running=3), alloc(BIG, 100, 50, "b", 1, running=1)],
        SMALL,
    )
    assert ledger.committed_gpus == 6 and ledger.sold_gpus == 6
    assert ledger.committed_mu_per_minute == 300 and ledger.sold_mu_per_minute == 300
    assert ledger.used_mu_per_minute == 200  # metered
    assert ledger.used_gpus == 3 * 1 + 1 * 4  # held by running replicas
    # At this placement: 300 MU over 6 GPUs = 50 MU per GPU, so the pool has 400 MU/min, 100 free.
    assert ledger.mu_per_gpu == 50
    assert ledger.have_mu_per_minute == 400
    assert ledger.headroom_gpus == 2
    assert ledger.headroom_mu_per_minute == 100
    # Per model: the 2 free GPUs are 200 MU/min of the small model or 50 of the big one.
    by_model = {m.model: m for m in ledger.models}
    assert by_model["s"].headroom_mu_per_minute == 200
    assert by_model["b"].headroom_mu_per_minute == 50
    assert by_model["s"].have_mu_per_minute == 800
    assert by_model["b"].have_mu_per_minute == 200


def test_minimum_replicas_are_committed_without_a_reservation():
    # 32 GPUs; an unreserved 70B endpoint with 6 minimum replicas commits 24 GPUs, sells nothing.
    ledger = pool_ledger(32, 1.0, [alloc(BIG, 0, min_replicas=6)], SMALL)
    assert (ledger.committed_gpus, ledger.sold_gpus, ledger.headroom_gpus) == (24, 0, 8)
    assert ledger.committed_mu_per_minute == 600
    # Raising its minimum to 9 replicas asks 36 GPUs in place of 24: 44 > 32.
    with pytest.raises(Oversold) as refused:
        check_change("p", ledger, asked(BIG, 0, 9), asked(BIG, 0, 6))
    assert (refused.value.asked.gpus, refused.value.replacing.gpus) == (36, 24)
    assert "in place of its 24 GPUs" in str(refused.value)
    check_change("p", ledger, asked(BIG, 0, 8), asked(BIG, 0, 6))  # 32 of 32


def test_the_pool_rate_is_the_same_whichever_endpoint_is_being_changed():
    # The figures a refusal reports are the pool's as it stands, never a ledger without one endpoint.
    ledger = pool_ledger(8, 1.0, [alloc(SMALL, 200, model="s"), alloc(BIG, 100, model="b")], SMALL)
    with pytest.raises(Oversold) as refused:
        check_change("p", ledger, asked(BIG, 200), asked(BIG, 100))
    assert refused.value.ledger == ledger
    assert refused.value.ledger.have_mu_per_minute == 400


def test_a_reservation_within_the_minimum_asks_nothing_more():
    ledger = pool_ledger(8, 1.0, [alloc(SMALL, 0, min_replicas=8)], SMALL)  # full
    check_change("p", ledger, asked(SMALL, 800, 8), asked(SMALL, 0, 8))  # 800 MU/min = 8 GPUs: same
    with pytest.raises(Oversold):
        check_change("p", ledger, asked(SMALL, 801, 8), asked(SMALL, 0, 8))


def test_an_empty_pool_is_priced_at_the_default_shape():
    ledger = pool_ledger(16, 1.0, [], SMALL)
    assert ledger.have_mu_per_minute == 1600
    assert ledger.committed_gpus == 0 and ledger.sold_gpus == 0
    assert ledger.models == ()


def test_a_sale_that_fits_exactly_is_accepted():
    ledger = pool_ledger(8, 1.0, [alloc(BIG, 100)], SMALL)  # 4 GPUs committed
    check_change("p", ledger, asked(BIG, 100))  # 4 more: 8 of 8


def test_a_sale_beyond_the_pool_is_refused_with_the_numbers():
    ledger = pool_ledger(8, 1.0, [alloc(BIG, 100), alloc(SMALL, 200)], SMALL)  # 6 GPUs committed
    with pytest.raises(Oversold) as refused:
        check_change("use1", ledger, asked(BIG, 100))  # 4 more GPUs: 10 > 8
    assert refused.value.asked_gpus == 4
    assert refused.value.asked_mu_per_minute == 100
    message = str(refused.value)
    assert "use1" in message and "8 GPUs" in message and "6 GPUs" in message and "asked" in message


def test_a_change_that_asks_no_more_passes_even_in_a_pool_that_is_over():
    ledger = pool_ledger(4, 1.0, [alloc(SMALL, 600)], SMALL)  # 6 of 4: the pool was shrunk
    check_change("p", ledger, asked(SMALL, 600), asked(SMALL, 600))  # a rename, say
    check_change("p", ledger, asked(SMALL, 500), asked(SMALL, 600))  # a cut
    with pytest.raises(Oversold):
        check_change("p", ledger, asked(SMALL, 601), asked(SMALL, 600))


def test_overcommit_raises_what_may_be_sold():
    # 8 GPUs at over-commit 1.25 may hold 10 GPUs of commitments.
    ledger = pool_ledger(8, 1.25, [alloc(SMALL, 600)], SMALL)
    assert ledger.sellable_gpus == 10
    check_change("p", ledger, asked(SMALL, 400))
    with pytest.raises(Oversold):
        check_change("p", ledger, asked(SMALL, 401))


def test_float_overcommit_is_read_exactly():
    # 1.1 is 11/10, not 1.10000000000000008882: 10 GPUs x 1.1 = 11 GPUs, and 11 fit.
    ledger = pool_ledger(10, 1.1, [], SMALL)
    assert ledger.sellable_gpus == 11
    check_change("p", ledger, asked(SMALL, 1100))


def test_a_shrunk_pool_reports_oversold():
    ledger = pool_ledger(4, 1.0, [alloc(SMALL, 600)], SMALL)
    assert ledger.oversold
    assert ledger.headroom_gpus == -2
    with pytest.raises(Oversold, match="6 GPUs"):
        check_holds("p", ledger)


def test_big_figures_read_as_numbers():
    ledger = pool_ledger(32, 1.0, [], SMALL)
    with pytest.raises(Oversold) as refused:
        check_change("p", ledger, asked(BIG, 0, 125_000))
    assert "500000 GPUs (12500000 MU/min) were asked" in str(refused.value)


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


def test_free_replicas_beside_what_others_commit_or_hold():
    assert free_replicas(8, Fraction(5), SMALL) == 3
    assert free_replicas(8, Fraction(5), BIG) == 0
    assert free_replicas(8, Fraction(9), SMALL) == 0  # never negative
    assert free_replicas(32, Fraction(5, 2), BIG) == 7  # 29.5 GPUs: 7 replicas of 4
