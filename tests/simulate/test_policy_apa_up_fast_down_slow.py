"""apa is capacity.autoscaler in the loop: 5-second buckets, up on the last 20 s, capped per
tick, down only to the highest need of the last 60 s."""

from dataclasses import replace

from capacity.simulate.policies import Apa, merge
from tests.simulate.support import buckets, state


def test_apa_merges_one_second_buckets_into_five_second_ones():
    merged = merge(buckets(0, 20, in_flight=3.0, mu_per_minute=60.0), 5.0, 20.0, 20.0)
    assert [b.end for b in merged] == [5.0, 10.0, 15.0, 20.0]
    assert all(b.seconds == 5.0 and b.requests == 5 and b.in_flight == 3.0 for b in merged)


def test_apa_merge_keeps_the_latest_router_backlog():
    # The router's backlog is a level: a 5-second bucket ends with its last second's.
    history = buckets(0, 5, mu_per_minute=60.0)
    history[2] = replace(history[2], backlog_mu=9.0)
    history[4] = replace(history[4], backlog_mu=4.0)
    assert [b.backlog_mu for b in merge(history, 5.0, 5.0, 5.0)] == [4.0]


def test_apa_scales_up_fast_and_down_slowly():
    apa = Apa(mu_per_replica_minute=100.0)
    # 2,400 MU/min against 80 % of 100 per replica: need 30; from 2, capped at max(2 x 10, 2 + 4).
    history = buckets(0, 20, mu_per_minute=2400.0)
    assert apa.decide(state(2, target=256), history, 20.0) == 20
    assert apa.decide(state(20, target=256), history + buckets(20, 25, mu_per_minute=2400.0), 25.0) == 30
    history += buckets(20, 25, mu_per_minute=2400.0)
    # The load falls to 80 MU/min (need 1): the window of 2,400 ending at 25 s is remembered 60 s.
    t = 25.0
    while t < 80.0:
        history += buckets(t, t + 5, mu_per_minute=80.0)
        t += 5.0
        assert apa.decide(state(30), history, t) == 30, t
    # Past 60 s + 20 s from the high load, the window's highest need is 1; the load past it
    # still holds 1.75 x that for a recurrence (the burst hold): 2.
    history += buckets(t, 105.0, mu_per_minute=80.0)
    assert apa.decide(state(30), history, 105.0) == 2
