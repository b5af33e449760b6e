"""The capacity ledger of one GPU pool: what we HAVE, what we SOLD, what is USED.

Pure arithmetic, exact (fractions), no Django. A model unit (MU) is 1/100 of what one replica of
a model does per minute on its GPU type (the 100 is `mu_per_replica_minute`), so MU converts to
GPUs through each model's profile:

    gpus = mu_per_minute / mu_per_replica_minute * gpus_per_replica

Worked numbers: a pool of 8 H100s at over-commit 1.0. Endpoint A serves an 8B model (1 GPU per
replica, 100 MU/min per replica) with 200 MU/min sold -> 2 GPUs; endpoint B a 70B model (4 GPUs
per replica, 100 MU/min per replica) with 100 MU/min sold -> 4 GPUs. Sold: 6 of 8 GPUs. Selling
B another 100 MU/min asks 4 GPUs; 6 + 4 > 8, so it is refused; selling A 200 MU/min (2 GPUs) fits.

Pool-level MU figures use the pool's blended MU per GPU (sold MU / sold GPUs: 300 / 6 = 50 above),
so MU utilisation equals GPU utilisation; the per-model view (`ModelCapacity`) says what the free
GPUs would serve of each model placed there (2 free GPUs = 200 MU/min of A or 50 MU/min of B).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from fractions import Fraction


@dataclass(frozen=True)
class Shape:
    """How a model is priced on a GPU type (from its ModelProfile)."""

    mu_per_replica_minute: int  # MU/min one replica serves; > 0 (100 by convention)
    gpus_per_replica: int  # GPUs one replica occupies; >= 1

    @property
    def mu_per_gpu(self) -> Fraction:
        return Fraction(self.mu_per_replica_minute, self.gpus_per_replica)

    def gpus(self, mu_per_minute: Fraction | float | int) -> Fraction:
        """GPUs needed to serve `mu_per_minute`: 250 MU/min at 100 MU/replica, 4 GPUs -> 10."""
        return _exact(mu_per_minute) / self.mu_per_gpu


@dataclass(frozen=True)
class Allocation:
    """What the endpoints of one shape in a pool hold: sold and metered MU/min."""

    shape: Shape
    model: str  # model name, for the per-model view
    sold_mu_per_minute: Fraction  # reservations; >= 0
    used_mu_per_minute: Fraction  # metered by the router; >= 0


@dataclass(frozen=True)
class ModelCapacity:
    """What the pool could serve of one model placed in it."""

    model: str
    shape: Shape
    have_mu_per_minute: Fraction  # the whole pool running only this model
    headroom_mu_per_minute: Fraction  # the free sellable GPUs running only this model


@dataclass(frozen=True)
class PoolLedger:
    have_gpus: int  # GPUs in the pool
    overcommit: Fraction  # sellable = have x overcommit
    sold_gpus: Fraction  # reservations converted to GPUs
    used_gpus: Fraction  # metered MU converted to GPUs
    sold_mu_per_minute: Fraction
    used_mu_per_minute: Fraction
    mu_per_gpu: Fraction  # blended; see the module docstring
    models: tuple[ModelCapacity, ...]

    @property
    def sellable_gpus(self) -> Fraction:
        return self.have_gpus * self.overcommit

    @property
    def headroom_gpus(self) -> Fraction:
        return self.sellable_gpus - self.sold_gpus

    @property
    def have_mu_per_minute(self) -> Fraction:
        return self.have_gpus * self.mu_per_gpu

    @property
    def sellable_mu_per_minute(self) -> Fraction:
        return self.sellable_gpus * self.mu_per_gpu

    @property
    def headroom_mu_per_minute(self) -> Fraction:
        return self.headroom_gpus * self.mu_per_gpu

    @property
    def oversold(self) -> bool:
        return self.sold_gpus > self.sellable_gpus


class Oversold(Exception):
    """A sale (or a change) would put more GPUs under reservation than the pool may sell."""

    def __init__(
        self, pool: str, ledger: PoolLedger, asked_gpus: Fraction, asked_mu: Fraction, replacing_mu: int = 0
    ):
        self.pool = pool
        self.ledger = ledger
        self.asked_gpus = asked_gpus
        self.asked_mu_per_minute = asked_mu
        self.replacing_mu_per_minute = replacing_mu  # the reservation the asked one would replace
        sold_to = " to other endpoints" if replacing_mu else ""
        replacing = f", replacing its {replacing_mu} MU/min" if replacing_mu else ""
        super().__init__(
            f"pool {pool!r} cannot hold this: it has {_fmt(ledger.have_gpus)} GPUs"
            f" ({_fmt(ledger.have_mu_per_minute)} MU/min, sellable"
            f" {_fmt(ledger.sellable_mu_per_minute)} at over-commit {_fmt(ledger.overcommit)}),"
            f" {_fmt(ledger.sold_gpus)} GPUs ({_fmt(ledger.sold_mu_per_minute)} MU/min) are sold{sold_to}"
            + (
                f", and {_fmt(asked_gpus)} GPUs ({_fmt(asked_mu)} MU/min) were asked{replacing}"
                if asked_gpus
                else ""
            )
        )


def pool_ledger(
    have_gpus: int,
    overcommit: Fraction | float,
    allocations: Iterable[Allocation],
    default_shape: Shape,
) -> PoolLedger:
    """Sum a pool's allocations. `default_shape` prices MU when nothing is placed there yet."""
    allocations = list(allocations)
    sold_gpus = sum((a.shape.gpus(a.sold_mu_per_minute) for a in allocations), Fraction(0))
    used_gpus = sum((a.shape.gpus(a.used_mu_per_minute) for a in allocations), Fraction(0))
    sold_mu = sum((a.sold_mu_per_minute for a in allocations), Fraction(0))
    used_mu = sum((a.used_mu_per_minute for a in allocations), Fraction(0))
    shapes = {(a.model, a.shape) for a in allocations}
    if sold_gpus > 0:
        mu_per_gpu = sold_mu / sold_gpus
    elif shapes:
        mu_per_gpu = sum((s.mu_per_gpu for _, s in shapes), Fraction(0)) / len(shapes)
    else:
        mu_per_gpu = default_shape.mu_per_gpu
    overcommit = _exact(overcommit)
    headroom = have_gpus * overcommit - sold_gpus
    models = tuple(
        ModelCapacity(
            model=model,
            shape=shape,
            have_mu_per_minute=have_gpus * shape.mu_per_gpu,
            headroom_mu_per_minute=max(headroom, Fraction(0)) * shape.mu_per_gpu,
        )
        for model, shape in sorted(shapes, key=lambda ms: (ms[0], ms[1].gpus_per_replica))
    )
    return PoolLedger(
        have_gpus=have_gpus,
        overcommit=overcommit,
        sold_gpus=sold_gpus,
        used_gpus=used_gpus,
        sold_mu_per_minute=sold_mu,
        used_mu_per_minute=used_mu,
        mu_per_gpu=mu_per_gpu,
        models=models,
    )


def check_sale(
    pool: str, ledger: PoolLedger, shape: Shape, mu_per_minute: int, replacing_mu: int = 0
) -> None:
    """Raise Oversold unless `ledger` (without this sale) can also hold `mu_per_minute`.

    `replacing_mu` is the reservation being changed, already left out of `ledger`; it only
    makes the refusal read right ("sold to other endpoints ... replacing its 300 MU/min").
    """
    asked_gpus = shape.gpus(mu_per_minute)
    if ledger.sold_gpus + asked_gpus > ledger.sellable_gpus:
        raise Oversold(pool, ledger, asked_gpus, Fraction(mu_per_minute), replacing_mu)


def as_json_number(value: Fraction | float | int) -> float | int:
    """A ledger figure for JSON: an integer when whole (8, not 8.0), else 6 decimals."""
    as_float = float(value)
    return int(as_float) if as_float.is_integer() else round(as_float, 6)


def _exact(value: Fraction | float | int) -> Fraction:
    # Through str so that a float setting such as 1.1 means 11/10, not 1.100000000000000088...
    return value if isinstance(value, Fraction) else Fraction(str(value))


def _fmt(value: Fraction | int) -> str:
    return f"{float(value):g}"
