"""The capacity ledger of one GPU pool: what we HAVE, COMMIT, SOLD and USE.

Pure arithmetic, exact (fractions), no Django. A model unit (MU) is 1/100 of what one replica of
a model does per minute on its GPU type (the 100 is `mu_per_replica_minute`), so MU converts to
GPUs through each model's profile:

    gpus = mu_per_minute / mu_per_replica_minute * gpus_per_replica

Figures, each defined once here (the API's /capacity/, the console and every 409 show them):
- HAVE: the pool's GPUs; sellable = have x over-commit.
- SOLD: the reservations, in MU/min exactly as sold, and in GPUs through each model's profile.
- COMMITTED: what the pool must hold for its endpoints. An endpoint commits
  max(its reservation in GPUs, its minimum replicas x gpus_per_replica): both are capacity the
  endpoint may use at any moment, and a reservation served by the minimum replicas needs no
  second set of GPUs, so the two are never counted twice. COMMITTED is a figure beside SOLD, not
  folded into it: SOLD stays what operators sold (what the routers enforce, what tenants pay
  for), and COMMITTED is what every check refuses on: a sale, a raise of an endpoint's minimum,
  a pool shrink or a re-pricing is refused (Oversold) when it would take COMMITTED beyond the
  sellable GPUs.
- USED: metered MU/min (what the routers counted), and the GPUs held by running replicas
  (ready pods x gpus_per_replica), which is what the cluster really occupies.

MU per GPU: each model placed in a pool has its own (mu_per_replica_minute / gpus_per_replica);
the pool's is their mean weighted by the GPUs committed to each, i.e. the pool total is the sum
of the per-model figures at the current placement: committed MU / committed GPUs (a pool with
nothing committed: the plain mean of the models placed there; with no model: the default shape).
Pool-level MU figures are GPUs x that rate, so MU utilisation equals GPU utilisation. A change
is checked against the pool's ledger as it stands (the one /capacity/ shows), with what the
change asks and what it replaces, so the 409 reports the same figures as /capacity/.

Worked numbers: a pool of 8 H100s at over-commit 1.0. Endpoint A serves an 8B model (1 GPU per
replica, 100 MU/min per replica) with 200 MU/min sold and 1 minimum replica -> commits 2 GPUs;
endpoint B a 70B model (4 GPUs per replica) with 100 MU/min sold and min 1 replica -> 4 GPUs.
Committed: 6 of 8 GPUs, 300 MU/min, so 50 MU per GPU and the pool has 400 MU/min. Selling B
another 100 MU/min asks 8 GPUs in place of its 4; 6 - 4 + 8 > 8, so it is refused; selling A 400
MU/min (4 GPUs in place of 2) fits. Raising B's minimum to 2 replicas asks 8 GPUs: refused too.
The per-model view (`ModelCapacity`) says what the free GPUs would serve of each model placed
there (2 free GPUs = 200 MU/min of A or 50 MU/min of B).
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

    def commitment(self, reserved_mu_per_minute: Fraction | int, min_replicas: int) -> Commitment:
        """What an endpoint of this shape commits: the larger of its reservation and its minimum
        replicas (300 MU/min reserved at 1 GPU per replica and 2 minimum replicas -> 3 GPUs)."""
        reserved = _exact(reserved_mu_per_minute)
        floor = Fraction(min_replicas * self.mu_per_replica_minute)
        mu = max(reserved, floor)
        return Commitment(self.gpus(mu), mu)


@dataclass(frozen=True)
class Commitment:
    """GPUs a pool must hold for one endpoint, and the same in that endpoint's model's MU/min."""

    gpus: Fraction
    mu_per_minute: Fraction


NOTHING = Commitment(Fraction(0), Fraction(0))


@dataclass(frozen=True)
class Allocation:
    """What one endpoint holds in its pool."""

    shape: Shape
    model: str  # model name, for the per-model view
    sold_mu_per_minute: Fraction  # its reservation; >= 0
    used_mu_per_minute: Fraction  # metered by the router; >= 0
    min_replicas: int = 0  # its provisioned minimum (capacity.provisioning.replica_bounds)
    running_replicas: int = 0  # ready pods

    @property
    def committed(self) -> Commitment:
        return self.shape.commitment(self.sold_mu_per_minute, self.min_replicas)

    @property
    def held_gpus(self) -> int:
        return self.running_replicas * self.shape.gpus_per_replica


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
    committed_gpus: Fraction  # sum of the endpoints' commitments (the module docstring)
    sold_gpus: Fraction  # reservations converted to GPUs
    used_gpus: Fraction  # held by running replicas: ready pods x gpus_per_replica
    committed_mu_per_minute: Fraction
    sold_mu_per_minute: Fraction
    used_mu_per_minute: Fraction  # metered
    mu_per_gpu: Fraction  # the pool's rate at its current placement; see the module docstring
    models: tuple[ModelCapacity, ...]

    @property
    def sellable_gpus(self) -> Fraction:
        return self.have_gpus * self.overcommit

    @property
    def headroom_gpus(self) -> Fraction:
        return self.sellable_gpus - self.committed_gpus

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
        return self.committed_gpus > self.sellable_gpus


class Oversold(Exception):
    """A sale (or a change) would commit more GPUs than the pool may sell. `ledger` is the pool's
    as it stands (what /capacity/ shows); `asked` what the change commits, `replacing` what it
    commits now (NOTHING for a new endpoint or for a pool or profile change, checked after it)."""

    def __init__(self, pool: str, ledger: PoolLedger, asked: Commitment, replacing: Commitment = NOTHING):
        self.pool = pool
        self.ledger = ledger
        self.asked = asked
        self.replacing = replacing
        asked_text = (
            f"; {_fmt(asked.gpus)} GPUs ({_fmt(asked.mu_per_minute)} MU/min) were asked"
            + (
                f" in place of its {_fmt(replacing.gpus)} GPUs ({_fmt(replacing.mu_per_minute)} MU/min)"
                if replacing.gpus
                else ""
            )
            if asked.gpus or replacing.gpus
            else ""
        )
        super().__init__(
            f"pool {pool!r} cannot hold this: it has {_fmt(ledger.have_gpus)} GPUs"
            f" ({_fmt(ledger.have_mu_per_minute)} MU/min, sellable {_fmt(ledger.sellable_gpus)} GPUs ="
            f" {_fmt(ledger.sellable_mu_per_minute)} MU/min at over-commit {_fmt(ledger.overcommit)}),"
            f" {_fmt(ledger.committed_gpus)} GPUs ({_fmt(ledger.committed_mu_per_minute)} MU/min) are"
            f" committed to reservations and minimum replicas ({_fmt(ledger.sold_gpus)} GPUs ="
            f" {_fmt(ledger.sold_mu_per_minute)} MU/min sold)" + asked_text
        )

    @property
    def asked_gpus(self) -> Fraction:
        return self.asked.gpus

    @property
    def asked_mu_per_minute(self) -> Fraction:
        return self.asked.mu_per_minute


class QuotaExceeded(Exception):
    """A tenant's endpoints would ask more GPUs (at their minimum or maximum replicas) than its quota."""

    def __init__(
        self, tenant: str, quota: int, which: str, asked_gpus: int, others_gpus: int, total_gpus: int
    ):
        self.tenant = tenant
        self.quota = quota
        self.which = which  # "min" or "max": which replica bound is over
        self.asked_gpus = asked_gpus  # this endpoint's GPUs at that bound
        self.others_gpus = others_gpus  # the tenant's other endpoints' GPUs at that bound
        self.total_gpus = total_gpus
        super().__init__(
            f"tenant {tenant!r} has a quota of {quota} GPUs: this endpoint's {which} replicas take"
            f" {asked_gpus} GPUs and its other endpoints' {which} replicas {others_gpus},"
            f" {total_gpus} in all"
        )


def pool_ledger(
    have_gpus: int,
    overcommit: Fraction | float,
    allocations: Iterable[Allocation],
    default_shape: Shape,
) -> PoolLedger:
    """Sum a pool's allocations (one per endpoint). `default_shape` prices MU when nothing is
    placed there yet."""
    allocations = list(allocations)
    commitments = [a.committed for a in allocations]
    committed_gpus = sum((c.gpus for c in commitments), Fraction(0))
    committed_mu = sum((c.mu_per_minute for c in commitments), Fraction(0))
    shapes = {(a.model, a.shape) for a in allocations}
    if committed_gpus > 0:
        mu_per_gpu = committed_mu / committed_gpus
    elif shapes:
        mu_per_gpu = sum((s.mu_per_gpu for _, s in shapes), Fraction(0)) / len(shapes)
    else:
        mu_per_gpu = default_shape.mu_per_gpu
    overcommit = _exact(overcommit)
    headroom = have_gpus * overcommit - committed_gpus
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
        committed_gpus=committed_gpus,
        sold_gpus=sum((a.shape.gpus(a.sold_mu_per_minute) for a in allocations), Fraction(0)),
        used_gpus=Fraction(sum(a.held_gpus for a in allocations)),
        committed_mu_per_minute=committed_mu,
        sold_mu_per_minute=sum((a.sold_mu_per_minute for a in allocations), Fraction(0)),
        used_mu_per_minute=sum((a.used_mu_per_minute for a in allocations), Fraction(0)),
        mu_per_gpu=mu_per_gpu,
        models=models,
    )


def check_change(pool: str, ledger: PoolLedger, asked: Commitment, replacing: Commitment = NOTHING) -> None:
    """Raise Oversold unless the pool, as `ledger` has it, can hold `asked` in place of
    `replacing` (one endpoint's commitment now, NOTHING for a new one). A change that commits no
    more than it replaces always passes, even in a pool that is already over (say after the
    over-commit setting was lowered): it makes nothing worse."""
    if asked.gpus <= replacing.gpus:
        return
    if ledger.committed_gpus - replacing.gpus + asked.gpus > ledger.sellable_gpus:
        raise Oversold(pool, ledger, asked, replacing)


def check_holds(pool: str, ledger: PoolLedger) -> None:
    """Raise Oversold when the pool commits more than it may sell (after a shrink or a re-pricing)."""
    if ledger.oversold:
        raise Oversold(pool, ledger, NOTHING)


def check_quota(
    tenant: str, quota: int, bounds_gpus: tuple[int, int], others_gpus: tuple[int, int],
    replacing_gpus: tuple[int, int] = (0, 0),
) -> None:  # fmt: skip
    """Raise QuotaExceeded unless a tenant's endpoints, with one endpoint at `bounds_gpus` (its
    (min, max) replicas x gpus_per_replica) and the others at `others_gpus` (summed), fit its
    quota at both bounds. As for pools, a change that asks no more than `replacing_gpus` (the
    endpoint's bounds now) passes even when the tenant is over, e.g. after its quota was lowered."""
    for i, which in ((1, "max"), (0, "min")):  # max first: it is never below min
        total = others_gpus[i] + bounds_gpus[i]
        if total > quota and bounds_gpus[i] > replacing_gpus[i]:
            raise QuotaExceeded(tenant, quota, which, bounds_gpus[i], others_gpus[i], total)


def free_replicas(have_gpus: int, others_gpus: Fraction, shape: Shape) -> int:
    """How many replicas of `shape` fit in a pool of `have_gpus` beside `others_gpus` (what the
    other endpoints there commit or hold, whichever is larger): 8 GPUs, 5 elsewhere, 1 GPU per
    replica -> 3; at 4 GPUs per replica -> 0."""
    return max(int((have_gpus - others_gpus) // shape.gpus_per_replica), 0)


def as_json_number(value: Fraction | float | int) -> float | int:
    """A ledger figure for JSON: an integer when whole (8, not 8.0), else 6 decimals."""
    as_float = float(value)
    return int(as_float) if as_float.is_integer() else round(as_float, 6)


def _exact(value: Fraction | float | int) -> Fraction:
    # Through str so that a float setting such as 1.1 means 11/10, not 1.100000000000000088...
    return value if isinstance(value, Fraction) else Fraction(str(value))


def _fmt(value: Fraction | int) -> str:
    # 125000, not 1.25e+05: these figures are read by people
    return str(int(value)) if Fraction(value).denominator == 1 else f"{float(value):.6g}"
