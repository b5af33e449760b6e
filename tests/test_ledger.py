"""The pool ledger's arithmetic, with worked numbers (pure; no database)."""

from fractions import Fraction

import pytest

from capacity.ledger import Allocation, Oversold, Shape, check_sale, pool_ledger

SMALL = Shape(mu_per_replica_minute=100, gpus_per_replica=1)
BIG = Shape(mu_per_replica_minute=100, gpus_per_replica=4)


def alloc(shape, sold, used=0, model="m"):
    return Allocation(shape, model, Fraction(sold), Fraction(used))


def test_mu_converts_to_gpus_through_the_profile():
    # 250 MU/min at 100 MU per replica-minute and 4 GPUs per replica: 2.5 replicas, 10 GPUs.
    assert BIG.gpus(250) == 10
    assert SMALL.gpus(250) == Fraction(5, 2)


def test_sold_and_used_sum_in_gpus_and_mu():
    # 8 GPUs. Small model: 200 MU/min sold (2 GPUs), 150 used (1.5 GPUs).
    # Big model: 100 MU/min sold (4 GPUs), 50 used (2 GPUs).
    ledger = pool_ledger(8, 1.0, [alloc(SMALL, 200, 150, "s"), alloc(BIG, 100, 50, "b")], SMALL)
    assert ledger.sold_gpus == 6
    assert ledger.used_gpus == Fraction(7, 2)
    assert ledger.sold_mu_per_minute == 300
    assert ledger.used_mu_per_minute == 200
    # Blended: 300 MU over 6 GPUs = 50 MU per GPU, so the pool "has" 400 MU/min, 100 of it free.
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


def test_an_empty_pool_is_priced_at_the_default_shape():
    ledger = pool_ledger(16, 1.0, [], SMALL)
    assert ledger.have_mu_per_minute == 1600
    assert ledger.sold_gpus == 0
    assert ledger.models == ()


def test_a_sale_that_fits_exactly_is_accepted():
    ledger = pool_ledger(8, 1.0, [alloc(BIG, 100)], SMALL)  # 4 GPUs sold
    check_sale("p", ledger, BIG, 100)  # 4 more: 8 of 8


def test_a_sale_beyond_the_pool_is_refused_with_the_numbers():
    ledger = pool_ledger(8, 1.0, [alloc(BIG, 100), alloc(SMALL, 200)], SMALL)  # 6 GPUs sold
    with pytest.raises(Oversold) as refused:
        check_sale("use1", ledger, BIG, 100)  # 4 more GPUs: 10 > 8
    assert refused.value.asked_gpus == 4
    assert refused.value.asked_mu_per_minute == 100
    message = str(refused.value)
    assert "use1" in message and "8 GPUs" in message and "6 GPUs" in message and "asked" in message


def test_overcommit_raises_what_may_be_sold():
    # 8 GPUs at over-commit 1.25 may hold 10 GPUs of reservations.
    ledger = pool_ledger(8, 1.25, [alloc(SMALL, 600)], SMALL)
    assert ledger.sellable_gpus == 10
    check_sale("p", ledger, SMALL, 400)
    with pytest.raises(Oversold):
        check_sale("p", ledger, SMALL, 401)


def test_float_overcommit_is_read_exactly():
    # 1.1 is 11/10, not 1.10000000000000008882: 10 GPUs x 1.1 = 11 GPUs, and 11 fit.
    ledger = pool_ledger(10, 1.1, [], SMALL)
    assert ledger.sellable_gpus == 11
    check_sale("p", ledger, SMALL, 1100)


def test_a_shrunk_pool_reports_oversold():
    ledger = pool_ledger(4, 1.0, [alloc(SMALL, 600)], SMALL)
    assert ledger.oversold
    assert ledger.headroom_gpus == -2
