"""Leased shares of a reservation: the arithmetic (pure: no I/O, time passed in).

Every router worker process is a holder: it admits locally, with the in-process GCRA, at the rate
of its lease, a share of the endpoint's reservation R (MU/s) sized to its recent demand, granted
by the shared store (``lease_limiter``) and valid until ``ttl_s`` after the grant. The invariant a
change must keep: the live leases never sum above R (``grant`` gives at most R less the others'
grants), so the burst on top is at most burst_s x R, what one shared GCRA allows. Oversubscribed,
R is split max-min fair: demands 140, 40, 10, 10 of R = 100 get 40, 40, 10, 10. The grant's
steps, renewals and fallback, with worked numbers: docs/router.md, "Leased shares of a
reservation".
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class LeaseTerms:
    renew_s: float = 0.25  # a holder renews each active endpoint's lease this often, s
    ttl_s: float = 3.0  # a grant is valid this long, s (12 renewals: a lost reply or two is nothing)
    # ask = demand x (1 + margin): room to grow between renewals, and for the noise of a demand
    # counted in few requests a renewal. Free when oversubscribed (R is split on demand).
    margin: float = 0.25
    demand_tau_s: float = 1.0  # time constant of the demand EWMA, s
    seen_s: float = 30.0  # a holder counts as "seen recently" this long after its last renewal, s
    # An uncontended lease (the asks fit in R) is renewed only this often, s, unless its ask
    # grows: Redis commands per request fall with load.
    steady_renew_s: float = 1.0
    steady_change: float = 0.1  # ... or whose ask grew by less than this share
    idle_s: float = 5.0  # no request for this long: the holder asks 0 (returns its lease), s
    spare_share: float = 0.5  # of what fitting asks leave of R, this much is granted (n + 1 ways)
    # Holders a fresh one assumes before the store has told it how many there are (its first
    # renewal, one Redis round trip after its first request): it admits R / this meanwhile, so
    # that a fleet restarting at once admits about burst_s x R together, not a burst each.
    provisional_holders: int = 8

    def __post_init__(self) -> None:
        if self.provisional_holders < 1:
            raise ValueError(f"LeaseTerms.provisional_holders must be >= 1, got {self.provisional_holders!r}")
        for name in ("renew_s", "ttl_s", "demand_tau_s", "seen_s", "idle_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"LeaseTerms.{name} must be > 0, got {getattr(self, name)!r}")
        if self.margin < 0:
            raise ValueError(f"LeaseTerms.margin must be >= 0, got {self.margin!r}")
        if not 0 <= self.spare_share < 1:
            raise ValueError(f"LeaseTerms.spare_share must be in [0, 1), got {self.spare_share!r}")
        if not self.renew_s <= self.steady_renew_s < self.ttl_s:
            raise ValueError(
                f"LeaseTerms needs renew_s ({self.renew_s}) <= steady_renew_s ({self.steady_renew_s}) "
                f"< ttl_s ({self.ttl_s})"
            )


@dataclass(frozen=True)
class Lease:
    demand: float  # MU/s the holder was asked for recently (EWMA)
    ask: float  # MU/s it asked for: demand plus margin
    granted: float  # MU/s it may admit, <= ask
    expires_at: float  # the store's clock, s
    admitted: float  # MU/s the holder reported admitting (best-effort headroom), MU/s


@dataclass(frozen=True)
class Grant:
    rate: float  # MU/s granted to the asking holder
    holders_seen: int  # holders that renewed within seen_s, the asking one included
    others_admitted: float  # MU/s the other live holders admit, for headroom
    contended: bool  # the live asks exceed R, or a holder got less than it asked: renew often


def fair_level(capacity: float, asks: list[float]) -> float:
    """Max-min fair level: sum(min(a, L)) = capacity; inf when the asks fit.
    capacity 100, asks [140, 40, 10, 10] -> 40; asks [30, 20] -> inf."""
    left = capacity
    ordered = sorted(asks)
    for i, a in enumerate(ordered):
        share = left / (len(ordered) - i)
        if a > share:
            return share
        left -= a
    return math.inf


def target_rate(
    demand: float, ask: float, demands: list[float], asks: list[float], reservation: float, spare_share: float
) -> float:
    """What one holder should hold, all holders' demands and asks (its own included) given.
    R 100, spare_share 0.5: asks [31.5, 21] fit -> its ask + 47.5 x 0.5 / 3; demands [60, 38]
    (asks 102.9) -> 60 + 3 x 2 / 4.9 = 61.22; demands [140, 40, 10, 10] -> min(its demand, 40)."""
    total_ask, total_demand = sum(asks), sum(demands)
    if total_ask <= reservation:
        return ask + (reservation - total_ask) * spare_share / (len(asks) + 1)
    if total_demand <= reservation:
        return demand + (ask - demand) * (reservation - total_demand) / (total_ask - total_demand)
    return min(demand, fair_level(reservation, demands))


def grant(
    holder: str,
    demand: float,
    admitted: float,
    reservation: float,
    leases: dict[str, Lease],
    seen: dict[str, float],
    now: float,
    terms: LeaseTerms,
) -> tuple[Grant, dict[str, Lease], dict[str, float]]:
    """One renewal: (the grant, the leases and last-seen times to store). ``demand`` and
    ``reservation`` in MU/s; a reservation of 0 grants nothing but still shares what holders
    admit; a demand of 0 returns the holder's lease."""
    ask = ask_for(demand, terms)
    live = {h: le for h, le in leases.items() if h != holder and le.expires_at > now}
    taken = sum(le.granted for le in live.values())
    target = target_rate(
        demand,
        ask,
        [le.demand for le in live.values()] + [demand],
        [le.ask for le in live.values()] + [ask],
        reservation,
        terms.spare_share,
    )
    rate = max(0.0, min(target, reservation - taken)) if ask > 0 else 0.0  # 0: returned
    if ask > 0 or admitted > 0:
        live[holder] = Lease(demand, ask, rate, now + terms.ttl_s, admitted)
    recent = {h: t for h, t in seen.items() if t > now - terms.seen_s}
    recent[holder] = now
    others = sum(le.admitted for h, le in live.items() if h != holder)
    contended = sum(le.ask for le in live.values()) > reservation or any(
        le.granted < le.ask - 1e-9 for le in live.values()
    )
    return Grant(rate, len(recent), others, contended), live, recent


def renewal_due(
    now: float, renewed_at: float, last_ask: float, ask: float, contended: bool, terms: LeaseTerms
) -> bool:
    """Renew now? Each renew_s while contended, or when the ask grew by steady_change or more,
    or fell to 0 (idle: return the lease); else each steady_renew_s (a smaller ask leaves
    slack, which only a contended endpoint needs back). Last ask 100, renewed 0.3 s ago,
    uncontended: ask 105 or 50 -> no, 111 -> yes."""
    age = now - renewed_at
    if age >= terms.steady_renew_s:
        return True
    if age < terms.renew_s - 1e-9:
        return False
    return contended or ask >= last_ask * (1 + terms.steady_change) or (ask == 0 < last_ask)


def ewma(previous: float, sample: float, dt_s: float, tau_s: float) -> float:
    """Exponentially weighted mean: previous 0, sample 100, dt 0.25 s, tau 1 s -> 22.1."""
    return previous + (1.0 - math.exp(-dt_s / tau_s)) * (sample - previous)


def ask_for(demand_mu_per_s: float, terms: LeaseTerms) -> float:
    """The lease to ask for: demand 100 MU/s, margin 0.05 -> 105 MU/s; idle (< 1e-6) -> 0."""
    return demand_mu_per_s * (1.0 + terms.margin) if demand_mu_per_s > 1e-6 else 0.0


def fallback_rate(reservation: float, holders_seen: int) -> float:
    """The share without a lease: R / holders seen recently. 100 MU/s, 4 holders -> 25."""
    return reservation / max(1, holders_seen)


def rescale_tat(tat: float, now: float, old_rate: float, new_rate: float) -> float:
    """A GCRA's theoretical arrival time when its rate changes, keeping the MU owed: TAT 2 s
    ahead at 10 MU/s (20 MU) -> 1 s ahead at 20 MU/s. An empty bucket stays empty."""
    if tat <= now or old_rate <= 0 or new_rate <= 0:
        return tat
    return now + (tat - now) * old_rate / new_rate
