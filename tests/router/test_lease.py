"""The lease arithmetic with worked numbers on a fake clock (``dataplane.router.lease``)."""

import math

import pytest

from dataplane.router.lease import (
    Lease,
    LeaseTerms,
    ask_for,
    ewma,
    fair_level,
    fallback_rate,
    grant,
    renewal_due,
    rescale_tat,
)

TERMS = LeaseTerms(margin=0.05)  # the worked numbers: renew 0.25 s, ttl 3 s, margin 5 %, seen 30 s
R = 100.0  # MU/s: 6,000 MU/min


class Store:
    """What the Lua script keeps in Redis, kept here: leases and last-seen times."""

    def __init__(self) -> None:
        self.leases: dict[str, Lease] = {}
        self.seen: dict[str, float] = {}

    def renew(self, holder: str, demand: float, now: float, admitted: float = 0.0, reservation: float = R):
        g, self.leases, self.seen = grant(
            holder, demand, admitted, reservation, self.leases, self.seen, now, TERMS
        )
        live = sum(le.granted for le in self.leases.values() if le.expires_at > now)
        assert live <= reservation + 1e-9  # the invariant, after every renewal
        return g


def test_fair_level_is_the_max_min_split():
    assert fair_level(100, [140, 40, 10, 10]) == 40  # 10 + 10 + 40 + 40 = 100
    assert fair_level(100, [60, 60]) == 50
    assert fair_level(100, [30, 20]) == math.inf  # the asks fit
    assert fair_level(0, [5]) == 0


def test_oversubscribed_routers_converge_to_the_fair_split_within_a_round():
    s = Store()
    # A alone, demand 140 MU/s: all of R
    assert s.renew("a", 140, 0.0).rate == 100
    # B, demand 40: fair level 60, but A holds all of R until it renews: nothing yet
    assert s.renew("b", 40, 0.05).rate == 0
    # A renews: level 60 (40 + 60 = 100), B holds 0 -> A 60; B renews -> 40
    assert s.renew("a", 140, 0.25).rate == 60
    assert s.renew("b", 40, 0.30).rate == 40
    # two small routers arrive (10 each): they get their demand as soon as there is room
    assert s.renew("c", 10, 0.35).rate == 0
    assert s.renew("d", 10, 0.40).rate == 0
    assert s.renew("a", 140, 0.50).rate == 40  # level 40 = (100 - 10 - 10) / 2
    assert s.renew("b", 40, 0.55).rate == 40
    assert s.renew("c", 10, 0.60).rate == 10
    assert s.renew("d", 10, 0.65).rate == 10  # a small router is never starved past a round
    # steady state: 40, 40, 10, 10 = R, no margin left idle
    steady = {"a": 140, "b": 40, "c": 10, "d": 10}
    rounds = [s.renew(h, d, 0.75 + i / 100).rate for i, (h, d) in enumerate(steady.items())]
    assert rounds == [40, 40, 10, 10]


def test_fitting_asks_get_half_the_spare_and_fitting_demands_share_the_margin():
    s = Store()
    g = s.renew("a", 30, 0.0)  # ask 31.5 + 68.5 x 0.5 / 2
    assert (g.rate, g.contended) == (pytest.approx(48.625), False)
    g = s.renew("b", 60, 0.1)  # ask 63, target 63 + 5.5 x 0.5 / 3; a holds 48.625: room 51.375
    assert (g.rate, g.contended) == (pytest.approx(51.375), True)
    assert s.renew("a", 30, 0.2).rate == pytest.approx(31.5 + 5.5 / 6)
    g = s.renew("b", 60, 0.3)
    assert (g.rate, g.contended) == (pytest.approx(63 + 5.5 / 6), False)  # room now
    # a grows to 38: asks 39.9 + 63 = 102.9 > 100, demands 98 fit -> the 2 left in margin ratio
    assert s.renew("a", 38, 0.4).rate == pytest.approx(100 - 63 - 5.5 / 6)  # until b renews
    assert s.renew("b", 60, 0.5).rate == pytest.approx(60 + 3 * 2 / 4.9)  # 61.22
    assert s.renew("a", 38, 0.6).rate == pytest.approx(38 + 1.9 * 2 / 4.9)  # 38.78: sum 100


def test_a_dead_holder_s_lease_expires_after_ttl():
    s = Store()
    assert s.renew("a", 60, 0.0).rate == pytest.approx(72.25)  # 63 + 37 x 0.5 / 2
    assert s.renew("b", 80, 0.1).rate == pytest.approx(27.75)  # fair 50, but a holds 72.25
    # a dies: its lease holds until 0 + ttl 3 s
    assert s.renew("b", 80, 2.9).rate == pytest.approx(27.75)
    assert s.renew("b", 80, 3.0).rate == pytest.approx(88)  # alone: 84 + 16 x 0.5 / 2
    assert "a" not in s.leases


def test_an_idle_holder_returns_its_lease_and_the_seen_count_decays():
    s = Store()
    s.renew("a", 50, 0.0)
    g = s.renew("b", 50, 0.1)
    assert (g.rate, g.holders_seen) == (pytest.approx(35.625), 2)  # a holds 52.5 + 47.5 / 4
    assert s.renew("a", 0, 0.2).rate == 0  # idle: returned
    assert "a" not in s.leases and s.renew("b", 100, 0.3).rate == 100
    assert s.renew("b", 100, 30.1).holders_seen == 2  # a seen at 0.2 s, within 30 s
    assert s.renew("b", 100, 30.3).holders_seen == 1


def test_a_newcomer_as_large_as_the_holder_finds_room():
    s = Store()
    assert s.renew("a", 40, 0.0).rate == pytest.approx(56.5)  # 42 + 58 x 0.5 / 2
    g = s.renew("b", 40, 0.1)  # target 42 + 16 x 0.5 / 3 = 44.67, room 43.5: more than it asks
    assert (g.rate, g.contended) == (pytest.approx(43.5), False)


def test_the_others_admitted_rate_is_shared_for_headroom():
    s = Store()
    s.renew("a", 0, 0.0, admitted=30, reservation=0)  # no reservation: nothing granted
    g = s.renew("b", 0, 0.1, admitted=20, reservation=0)
    assert (g.rate, g.others_admitted) == (0, 30)
    assert s.renew("a", 0, 0.2, admitted=30, reservation=0).others_admitted == 20
    assert s.renew("a", 0, 3.2, admitted=30, reservation=0).others_admitted == 0  # b's expired


def test_demand_ask_fallback_and_rescale_worked_numbers():
    assert ewma(0, 100, 0.25, 1.0) == pytest.approx(22.12, abs=0.01)
    assert ewma(100, 100, 0.25, 1.0) == 100
    assert ask_for(100, TERMS) == pytest.approx(105)
    assert ask_for(0, TERMS) == 0
    assert fallback_rate(100, 4) == 25 and fallback_rate(100, 0) == 100
    assert rescale_tat(12.0, 10.0, 10, 20) == 11.0  # 20 MU owed: 2 s at 10 MU/s, 1 s at 20
    assert rescale_tat(9.0, 10.0, 10, 20) == 9.0  # an empty bucket stays empty


def test_renewals_are_due_each_renew_s_when_contended_or_moving_else_each_steady_renew_s():
    assert not renewal_due(10.3, 10.0, 100, 105, False, TERMS)  # 0.3 s, grew 5 %, uncontended
    assert not renewal_due(10.3, 10.0, 100, 50, False, TERMS)  # shrank: the slack can wait
    assert renewal_due(10.3, 10.0, 100, 111, False, TERMS)  # grew 11 %
    assert renewal_due(10.3, 10.0, 100, 100, True, TERMS)  # contended
    assert not renewal_due(10.2, 10.0, 100, 200, True, TERMS)  # not before renew_s
    assert renewal_due(11.0, 10.0, 100, 100, False, TERMS)  # steady: once a second
    assert renewal_due(10.3, 10.0, 100, 0, False, TERMS)  # idle: return the lease


def test_lease_terms_are_validated():
    with pytest.raises(ValueError, match="ttl_s"):
        LeaseTerms(renew_s=1, ttl_s=1)
    with pytest.raises(ValueError, match="margin"):
        LeaseTerms(margin=-0.1)
    with pytest.raises(ValueError, match="spare_share"):
        LeaseTerms(spare_share=1)
