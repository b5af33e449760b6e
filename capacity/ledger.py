"""The capacity ledger of one GPU pool: what we HAVE, COMMIT, SOLD and USE, in whole replicas.

Pure, exact (integers and fractions), no Django. A replica takes `gpus_per_replica` GPUs on ONE
node (tensor parallelism cannot span nodes), so capacity is counted in whole replicas placed on
nodes, never in GPUs as one heap: the packing (capacity.packing) decides what fits, and every
check refuses on COMMITTED (per endpoint, max(its sold replicas, its minimum replicas)). Worked
numbers: two nodes of 8 GPUs hold two 5-GPU replicas, not the three 16 GPUs would as a heap. Each
figure is defined once here (the API's /capacity/, the console and every 409 show them):
docs/capacity-ledger.md explains them, docs/capacity-model.md ("The ledger's figures") the rest.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Any, NamedTuple

from capacity.numbers import shown, with_unit
from capacity.packing import NodeShape, Packing, ReplicaDemand, pack, replicas_needed
from capacity.packing import check_change as packing_check_change


@dataclass(frozen=True)
class Shape:
    """How a model is priced on a GPU type (from its ModelProfile)."""

    mu_per_replica_minute: int  # MU/min one replica serves; > 0 (100 by convention)
    gpus_per_replica: int  # GPUs one replica occupies, on one node; >= 1

    @property
    def mu_per_gpu(self) -> Fraction:
        return Fraction(self.mu_per_replica_minute, self.gpus_per_replica)

    def sold_replicas(
        self, reserved_mu_per_minute: Fraction | int, overcommit: Fraction = Fraction(1)
    ) -> int:
        """Whole replicas a reservation needs: 250 MU/min at 100 MU/min per replica -> 3."""
        return replicas_needed(_exact(reserved_mu_per_minute) / overcommit, self.mu_per_replica_minute, 0)

    def commitment(
        self, reserved_mu_per_minute: Fraction | int, min_replicas: int, overcommit: Fraction = Fraction(1)
    ) -> Commitment:
        """What an endpoint of this shape commits: the larger of its sold replicas and its minimum
        (300 MU/min reserved at 100 MU/min per replica and 2 minimum replicas -> 3 replicas)."""
        replicas = replicas_needed(
            _exact(reserved_mu_per_minute) / overcommit, self.mu_per_replica_minute, min_replicas
        )
        return Commitment(replicas, self)


@dataclass(frozen=True)
class Commitment:
    """Whole replicas a pool must place for one endpoint, of its model's shape."""

    replicas: int  # >= 0
    shape: Shape

    @property
    def gpus(self) -> int:
        return self.replicas * self.shape.gpus_per_replica

    @property
    def mu_per_minute(self) -> int:
        return self.replicas * self.shape.mu_per_replica_minute


NOTHING = Commitment(0, Shape(1, 1))


class Allocation(NamedTuple):
    """What one endpoint holds in its pool (a tuple: a ledger read builds one per endpoint), or
    what `endpoints` alike endpoints hold (the same shape, model, sale and minimum: each commits
    as many replicas, and the packing counts replicas per shape, so as one they pack as apart)."""

    key: str  # the endpoint's id: its replicas' name in the packing (a group's: any unique name)
    shape: Shape
    model: str  # model name, for the per-model view
    sold_mu_per_minute: int  # its reservation (each one's, for alike endpoints); >= 0
    used_mu_per_minute: float  # metered by the router (alike endpoints: theirs summed); >= 0
    min_replicas: int = 0  # its provisioned minimum (capacity.provisioning.replica_bounds), each one's
    running_replicas: int = 0  # ready pods (alike endpoints: theirs summed)
    label: str = ""  # how people name it ("tenant/endpoint"), for the node grid
    endpoints: int = 1  # endpoints alike in shape, model, sale and minimum; >= 1
    # A rollout's version (one allocation each, the old one selling nothing): the replicas it
    # commits, whatever its sale and minimum; None outside a rollout.
    replicas: int | None = None

    def committed(self, overcommit: Fraction = Fraction(1)) -> Commitment:
        """One endpoint's commitment (each of alike endpoints commits this)."""
        if self.replicas is not None:
            return Commitment(self.replicas, self.shape)
        return self.shape.commitment(self.sold_mu_per_minute, self.min_replicas, overcommit)

    @property
    def held_gpus(self) -> int:
        return self.running_replicas * self.shape.gpus_per_replica


class ReplicaCounter:
    """Whole replicas per endpoint by packing.replicas_needed at one over-commit, asked once
    per distinct sale: a fleet's reservations take few values, and exact arithmetic per
    endpoint is most of a ledger read."""

    def __init__(self, overcommit: Fraction):
        self.overcommit = overcommit
        self._memo: dict[tuple[Fraction | int, int, int], int] = {}

    def __call__(self, reserved: Fraction | int, mu_per_replica: int, least: int) -> int:
        key = (reserved, mu_per_replica, least)
        if (n := self._memo.get(key)) is None:
            n = self._memo[key] = replicas_needed(Fraction(reserved) / self.overcommit, mu_per_replica, least)
        return n


def committed_demands(allocations: Iterable[Allocation], overcommit: Fraction | float) -> list[ReplicaDemand]:
    """The committed replicas of these allocations, as pool_ledger packs them, without the rest
    of the ledger (a sale check needs no more to say yes)."""
    replicas = ReplicaCounter(_exact(overcommit))
    demands = []
    for a in allocations:
        if committed := _committed(a, replicas):
            demands.append(ReplicaDemand(a.key, a.model, a.shape.gpus_per_replica, committed * a.endpoints))
    return demands


def _committed(a: Allocation, replicas: ReplicaCounter) -> int:
    """One endpoint's committed replicas (each of alike endpoints'): Allocation.committed."""
    if a.replicas is not None:
        return a.replicas
    return replicas(a.sold_mu_per_minute, a.shape.mu_per_replica_minute, a.min_replicas)


@dataclass(frozen=True)
class ModelCapacity:
    """What the pool could still place of one model placed in it."""

    model: str
    shape: Shape
    have_replicas: int  # the whole pool, empty, running only this model
    more_replicas: int  # replicas of it that still fit beside what is committed
    overcommit: Fraction

    @property
    def have_mu_per_minute(self) -> int:
        """What this model alone would fill the empty pool with: its have_replicas' MU/min."""
        return self.have_replicas * self.shape.mu_per_replica_minute

    @property
    def headroom_mu_per_minute(self) -> Fraction:
        """What could still be sold of it: its free replicas' MU, over-committed."""
        return self.more_replicas * self.shape.mu_per_replica_minute * self.overcommit


@dataclass(frozen=True)
class NodeReplica:
    """One replica in a node's row of the node grid (NodeUse): the packing's PlacedReplica with
    its endpoint's label and model, for people to read."""

    key: str  # the endpoint's id
    label: str
    model: str
    gpus: int


@dataclass(frozen=True)
class NodeUse:
    """One node of the packing: which replicas occupy it, and its free GPUs."""

    index: int  # 0-based
    gpus: int  # the node's GPUs
    replicas: tuple[NodeReplica, ...]
    free_gpus: int


@dataclass(frozen=True)
class PoolLedger:
    node_count: int
    node_shape: NodeShape
    overcommit: Fraction  # a replica's MU is sold up to this many times
    committed_replicas: int  # sum of the endpoints' commitments (the module docstring)
    committed_gpus: int
    sold_replicas: int  # reservations in whole replicas
    sold_gpus: int
    used_gpus: int  # held by running replicas: ready pods x gpus_per_replica
    committed_mu_per_minute: int  # the committed replicas' MU/min
    sold_mu_per_minute: int  # as sold
    used_mu_per_minute: float  # metered
    # MU/min per GPU of the default shape: what an empty pool's MU figures are counted at.
    default_mu_per_gpu: Fraction
    free_gpus: int  # GPUs the packing leaves free
    stranded_gpus: int  # free GPUs no replica of a model placed here can use
    unplaced_replicas: int  # committed replicas the packing could not place (> 0: oversold)
    models: tuple[ModelCapacity, ...]
    # Replicas of 1, 2, ... gpus_per_node GPUs that still fit beside what is committed: what
    # `more_replicas` reads (a stored ledger keeps it, not the packing).
    more_fit: tuple[int, ...]
    # The committed replicas, what a change is checked beside, and how they are placed: None in
    # a ledger read from storage (from_figures), which keeps the figures only.
    demands: tuple[ReplicaDemand, ...] | None
    packing: Packing | None
    names: Mapping[str, tuple[str, str]]  # per demand key: (label, model), for the node grid

    @functools.cached_property
    def nodes(self) -> tuple[NodeUse, ...]:
        """The packing node by node, with names (built when asked: a sale check never does)."""
        if self.packing is None:
            raise ValueError("a stored ledger keeps no placement: read the pool live to see its nodes")
        return tuple(
            NodeUse(
                index=i,
                gpus=self.node_shape.gpus,
                replicas=tuple(NodeReplica(r.key, *self.names[r.key], r.gpus) for r in placed),
                free_gpus=free,
            )
            for i, (placed, free) in enumerate(
                zip(self.packing.placed, self.packing.free_per_node, strict=True)
            )
        )

    @property
    def gpus_per_node(self) -> int:
        return self.node_shape.gpus

    @property
    def have_gpus(self) -> int:
        return self.node_count * self.node_shape.gpus

    @property
    def sellable_gpus(self) -> int:
        """GPUs that may be committed: all of them (over-commit sells MU, not GPUs)."""
        return self.have_gpus

    @property
    def headroom_gpus(self) -> int:
        """Free GPUs a replica of a model placed here can still use (free less stranded)."""
        return self.free_gpus - self.stranded_gpus

    @property
    def have_mu_per_minute(self) -> Fraction:
        """The mean of what each model placed here would fill the pool with alone, or with none
        its GPUs at the default shape's rate: it moves with the pool's nodes and models, never
        with a sale (a rate weighted by what is sold did). The pool's have is its GPUs."""
        if not self.models:
            return self.have_gpus * self.default_mu_per_gpu
        return Fraction(sum(m.have_mu_per_minute for m in self.models), len(self.models))

    @property
    def sellable_mu_per_minute(self) -> Fraction:
        return self.have_mu_per_minute * self.overcommit

    @property
    def headroom_mu_per_minute(self) -> Fraction:
        """The mean of the models' headroom, or with none placed the headroom GPUs at the default
        shape's rate: a sale moves it by the room it takes, at no other rate."""
        if not self.models:
            return self.headroom_gpus * self.default_mu_per_gpu * self.overcommit
        return sum((m.headroom_mu_per_minute for m in self.models), Fraction(0)) / len(self.models)

    @property
    def oversold(self) -> bool:
        return self.unplaced_replicas > 0

    def more_replicas(self, gpus_per_replica: int) -> int:
        """Replicas of this many GPUs that still fit (for a model placed here or not)."""
        if gpus_per_replica < 1:
            raise ValueError(f"gpus_per_replica must be at least 1, got {gpus_per_replica}")
        return _fits(self.more_fit, gpus_per_replica)

    def figures(self) -> dict[str, Any]:
        """The ledger's figures as JSON (what a stored ledger keeps; from_figures reads them
        back): exact, fractions as "n/d", no placement and no names."""
        shape = self.node_shape
        return {
            "node_count": self.node_count,
            "node_shape": [shape.gpus, shape.cpu_millicores, shape.memory_mib],
            "overcommit": str(self.overcommit),
            **{name: getattr(self, name) for name in _INTEGER_FIGURES},
            "used_mu_per_minute": self.used_mu_per_minute,
            "default_mu_per_gpu": str(self.default_mu_per_gpu),
            "more_fit": list(self.more_fit),
            "models": [
                [m.model, s.mu_per_replica_minute, s.gpus_per_replica, m.have_replicas, m.more_replicas]
                for m in self.models
                for s in [m.shape]
            ],
        }

    @classmethod
    def from_figures(cls, doc: Mapping[str, Any]) -> PoolLedger:
        """A ledger from its stored figures (figures()): every figure and `more_replicas`, no
        placement (`nodes`, `demands` and a change's check need the pool read live)."""
        overcommit = Fraction(doc["overcommit"])
        return cls(
            node_count=doc["node_count"],
            node_shape=NodeShape(*doc["node_shape"]),
            overcommit=overcommit,
            **{name: doc[name] for name in _INTEGER_FIGURES},
            used_mu_per_minute=doc["used_mu_per_minute"],
            default_mu_per_gpu=Fraction(doc["default_mu_per_gpu"]),
            more_fit=tuple(doc["more_fit"]),
            models=tuple(
                ModelCapacity(model, Shape(mu, gpus), have, more, overcommit)
                for model, mu, gpus, have, more in doc["models"]
            ),
            demands=None,
            packing=None,
            names={},
        )


# The figures a stored ledger keeps as they are (PoolLedger.figures).
_INTEGER_FIGURES = [
    "committed_replicas", "committed_gpus", "sold_replicas", "sold_gpus", "used_gpus",
    "committed_mu_per_minute", "sold_mu_per_minute", "free_gpus", "stranded_gpus", "unplaced_replicas",
]  # fmt: skip


@dataclass(frozen=True)
class RolloutChange:
    """A change to an endpoint whose rollout runs (or starts): it commits two versions
    (Allocation.replicas), so the change is checked for the new version (the endpoint's own
    demand) with the old one, as the change leaves it, placed beside it."""

    new_version: int
    old_version: int
    old_key: str  # the old version's replicas' name in the packing
    old_model: str
    old_asked: Commitment  # what the old version commits after the change
    old_replacing: Commitment = NOTHING  # and now (at a rollout's start: the endpoint's commitment)

    @property
    def old_grows(self) -> bool:
        return _grows(self.old_asked, self.old_replacing)


class Oversold(Exception):
    """A sale (or a change) whose committed replicas do not pack onto the pool's nodes. `ledger`
    is the pool's as it stands (what /capacity/ shows); `asked` what the change commits,
    `replacing` what it commits now (NOTHING for a new endpoint or for a pool or profile change,
    checked after it), `fit_replicas` how many replicas of the asked shape fit in its place.
    For an endpoint in a rollout, `asked` is its new version's and `rollout` says what its old
    version commits beside it.

    The refusal is worded from the pool's point of view, in this order: what the pool has, what
    is committed in it, what the change needs and how many of its replicas fit. Two views: an
    operator's (str()) and a tenant's (`tenant_message`: the same without what is committed, sold
    or free in the pool, which would show other tenants' sales; its pool's GPUs and node shape it
    reads at /api/v1/pools/)."""

    def __init__(
        self,
        pool: str,
        ledger: PoolLedger,
        asked: Commitment,
        replacing: Commitment = NOTHING,
        fit_replicas: int | None = None,
        rollout: RolloutChange | None = None,
    ):
        self.pool = pool
        self.ledger = ledger
        self.asked = asked
        self.replacing = replacing
        self.fit_replicas = fit_replicas
        self.rollout = rollout
        super().__init__(self._message(operator=True))

    def _message(self, operator: bool) -> str:
        ledger = self.ledger
        has = (
            f"It has {with_unit(ledger.have_gpus, 'GPU')} ({with_unit(ledger.node_count, 'node')} x"
            f" {with_unit(ledger.gpus_per_node, 'GPU')})"
        )
        committed = (
            f"; {with_unit(ledger.committed_gpus, 'GPU')} {_are(ledger.committed_gpus)} committed to"
            " reservations and minimum replicas"
            f" ({with_unit(ledger.committed_replicas, 'replica')}, {shown(ledger.committed_mu_per_minute)}"
            f" MU/min; sold: {with_unit(ledger.sold_replicas, 'replica')} ="
            f" {shown(ledger.sold_mu_per_minute)} MU/min at over-commit {_fmt(ledger.overcommit)}),"
            f" {with_unit(ledger.free_gpus, 'GPU')} {_are(ledger.free_gpus)} free,"
            f" {shown(ledger.stranded_gpus)}"
            " of them stranded"
            if operator
            else ""
        )
        if not self.asked.replicas:  # a pool shrink or a re-pricing: operators' writes
            head = f"pool {self.pool!r} cannot hold what is committed in it"
            if not operator:
                return head
            unplaced = ledger.unplaced_replicas
            return (
                f"{head}. {has}{committed}. It cannot place {with_unit(unplaced, 'replica')} of the"
                f" {shown(ledger.committed_replicas)} committed"
            )
        return f"pool {self.pool!r} cannot place this. {has}{committed}. {self._needs()}"

    def _needs(self) -> str:
        """What the change needs, beside what the endpoint commits now, and how much of it fits."""
        asked, replacing, r = self.asked, self.replacing, self.rollout
        return (
            f"This needs {with_unit(asked.replicas, 'replica')} of"
            f" {with_unit(asked.shape.gpus_per_replica, 'GPU')}"
            f" ({with_unit(asked.gpus, 'GPU')}, {shown(asked.mu_per_minute)} MU/min)"
            + (f" for version {r.new_version}" if r else "")
            + (
                f", where the endpoint commits {with_unit(replacing.replicas, 'replica')}"
                f" ({with_unit(replacing.gpus, 'GPU')}) now"
                if replacing.replicas
                else ""
            )
            + (
                f", beside version {r.old_version}'s {with_unit(r.old_asked.replicas, 'replica')} of"
                f" {with_unit(r.old_asked.shape.gpus_per_replica, 'GPU')} (a rollout commits both versions)"
                if r
                else ""
            )
            + f"; at most {shown(self.fit_replicas or 0)} fit"
        )

    def tenant_message(self) -> str:
        """The refusal as a tenant reads it: what its pool has, what it asked and what fits for
        it; no pool totals."""
        return self._message(operator=False)

    @property
    def asked_gpus(self) -> int:
        return self.asked.gpus

    @property
    def asked_mu_per_minute(self) -> int:
        return self.asked.mu_per_minute


class QuotaExceeded(Exception):
    """A tenant's endpoints would ask more GPUs (at their minimum or maximum replicas) than its
    quota. While an endpoint's rollout runs, its bounds are both versions' (`rollout`)."""

    def __init__(
        self,
        tenant: str,
        quota: int,
        which: str,
        asked_gpus: int,
        others_gpus: int,
        total_gpus: int,
        rollout: bool = False,
    ):
        self.tenant = tenant
        self.quota = quota
        self.which = which  # "min" or "max": which replica bound is over
        self.asked_gpus = asked_gpus  # this endpoint's GPUs at that bound
        self.others_gpus = others_gpus  # the tenant's other endpoints' GPUs at that bound
        self.total_gpus = total_gpus
        self.rollout = rollout  # this endpoint's figure is both versions' of its rollout
        both = " (both versions of its rollout, each its share)" if rollout else ""
        super().__init__(
            f"tenant {tenant!r} has a quota of {quota} GPUs: this endpoint's {which} replicas{both} take"
            f" {asked_gpus} GPUs and its other endpoints' {which} replicas {others_gpus},"
            f" {total_gpus} in all"
        )


class AllowanceExceeded(Exception):
    """A tenant's minimum replicas beyond its reservations in one pool would take more GPUs than
    its allowance there (an operator's, or the default: `source`)."""

    def __init__(
        self, tenant: str, pool: str, allowance: int, source: str, asked_gpus: int, others_gpus: int
    ):
        self.tenant, self.pool, self.allowance, self.source = tenant, pool, allowance, source
        self.asked_gpus = asked_gpus  # this endpoint's minimum replicas beyond its reservation, GPUs
        self.others_gpus = others_gpus  # the tenant's other endpoints' in the pool
        self.total_gpus = asked_gpus + others_gpus
        super().__init__(
            f"tenant {tenant!r} has an allowance of {allowance} GPUs ({source}) in pool {pool!r} for"
            f" minimum replicas beyond its reservations: this endpoint's take {asked_gpus} GPUs and its"
            f" other endpoints' there {others_gpus}, {self.total_gpus} in all; a reservation covers"
            " minimum replicas, or an operator raises the allowance"
        )


def pool_ledger(
    node_count: int,
    node_shape: NodeShape,
    overcommit: Fraction | float,
    allocations: Iterable[Allocation],
    default_shape: Shape,
) -> PoolLedger:
    """Pack a pool's allocations (one per endpoint) onto its nodes and sum them.
    `default_shape` prices the pool's MU figures while no model is placed there."""
    overcommit = _exact(overcommit)
    allocations = list(allocations)
    replicas = ReplicaCounter(overcommit)
    demands: list[ReplicaDemand] = []
    committed_replicas = committed_gpus = committed_mu = sold_replicas = sold_gpus = used_gpus = 0
    for a in allocations:
        mu, gpus = a.shape.mu_per_replica_minute, a.shape.gpus_per_replica
        committed = _committed(a, replicas) * a.endpoints
        sold = replicas(a.sold_mu_per_minute, mu, 0) * a.endpoints
        if committed:
            demands.append(ReplicaDemand(a.key, a.model, gpus, committed))
        committed_replicas += committed
        committed_gpus += committed * gpus
        committed_mu += committed * mu
        sold_replicas += sold
        sold_gpus += sold * gpus
        used_gpus += a.running_replicas * gpus
    packing = pack(node_count, node_shape, demands)
    shapes = sorted({(a.model, a.shape) for a in allocations}, key=lambda ms: (ms[0], ms[1].gpus_per_replica))
    sizes = sorted({s.gpus_per_replica for _, s in shapes})
    more_fit = tuple(packing.more_fit(size) for size in range(1, node_shape.gpus + 1))
    models = tuple(
        ModelCapacity(
            model=model,
            shape=shape,
            have_replicas=node_count * (node_shape.gpus // shape.gpus_per_replica),
            more_replicas=_fits(more_fit, shape.gpus_per_replica),
            overcommit=overcommit,
        )
        for model, shape in shapes
    )
    return PoolLedger(
        node_count=node_count,
        node_shape=node_shape,
        overcommit=overcommit,
        committed_replicas=committed_replicas,
        committed_gpus=committed_gpus,
        sold_replicas=sold_replicas,
        sold_gpus=sold_gpus,
        used_gpus=used_gpus,
        committed_mu_per_minute=committed_mu,
        sold_mu_per_minute=sum(a.sold_mu_per_minute * a.endpoints for a in allocations),
        used_mu_per_minute=sum(a.used_mu_per_minute for a in allocations),
        default_mu_per_gpu=default_shape.mu_per_gpu,
        free_gpus=sum(packing.free_per_node),
        stranded_gpus=packing.stranded_gpus(sizes) if sizes else 0,
        unplaced_replicas=packing.unplaced_replicas,
        models=models,
        more_fit=more_fit,
        demands=tuple(demands),
        packing=packing,
        names={a.key: (a.label, a.model) for a in allocations},
    )


def check_change(
    pool: str, ledger: PoolLedger, key: str, model: str, asked: Commitment, replacing: Commitment = NOTHING
) -> None:
    """Raise Oversold unless the pool, as `ledger` has it, can place `asked` (endpoint `key`'s
    replicas of `model`) in place of `replacing` (its commitment there now, NOTHING for a new
    one). A change that asks no more replicas of no larger a shape always passes, even in a
    pool that is already over (say after a shrink): it makes nothing worse."""
    if ledger.demands is None:
        raise ValueError("a stored ledger keeps no placement: check a change against the pool read live")
    check_demands_change(
        pool, ledger.node_count, ledger.node_shape, ledger.demands, key, model, asked, replacing,
        lambda: ledger,
    )  # fmt: skip


def check_demands_change(
    pool: str,
    node_count: int,
    node_shape: NodeShape,
    demands: Sequence[ReplicaDemand],
    key: str,
    model: str,
    asked: Commitment,
    replacing: Commitment,
    read_ledger: Callable[[], PoolLedger],
    rollout: RolloutChange | None = None,
) -> None:
    """check_change from the pool's committed replicas alone (committed_demands): the whole
    ledger, which a refusal carries, is read (`read_ledger`) only when the change is refused.
    With a `rollout`, its old version is placed as the change leaves it, and the change passes
    unchecked only when neither version asks more."""
    if not _grows(asked, replacing) and not (rollout and rollout.old_grows):
        return
    placed = list(demands)
    if rollout is not None:
        old = rollout.old_asked
        placed = [d for d in placed if d.key != rollout.old_key]
        if old.replicas:
            placed.append(
                ReplicaDemand(rollout.old_key, rollout.old_model, old.shape.gpus_per_replica, old.replicas)
            )
    change = ReplicaDemand(key, model, asked.shape.gpus_per_replica, asked.replicas)
    verdict = packing_check_change(node_count, node_shape, placed, change)
    if not verdict.fits:
        raise Oversold(pool, read_ledger(), asked, replacing, verdict.fit_replicas, rollout)


def _grows(asked: Commitment, replacing: Commitment) -> bool:
    """Whether `asked` takes more replicas, or larger ones, than `replacing`."""
    return (
        asked.replicas > replacing.replicas or asked.shape.gpus_per_replica > replacing.shape.gpus_per_replica
    )


def more_replicas_after(
    ledger: PoolLedger, key: str, model: str, asked: Commitment, gpus_per_replica: int
) -> int:
    """Replicas of `gpus_per_replica` GPUs that would still fit in the pool once endpoint `key`
    holds `asked` in place of what it commits there now (a what-if, as a sale would leave it)."""
    if ledger.demands is None:
        raise ValueError("a stored ledger keeps no placement: ask what fits of the pool read live")
    others = [d for d in ledger.demands if d.key != key]
    if asked.replicas:
        others.append(ReplicaDemand(key, model, asked.shape.gpus_per_replica, asked.replicas))
    return _more_fit(ledger.node_count, ledger.node_shape, others, gpus_per_replica)


def check_holds(pool: str, ledger: PoolLedger) -> None:
    """Raise Oversold when the committed replicas do not pack (after a shrink or a re-pricing)."""
    if ledger.oversold:
        raise Oversold(pool, ledger, NOTHING)


def fit_replicas(
    node_count: int, node_shape: NodeShape, claims: Sequence[ReplicaDemand], key: str, gpus: int
) -> int:
    """How many replicas endpoint `key` may have beside the others' `claims` (its own claim, if
    there, is replaced): 2 nodes x 8 GPUs, another endpoint's one 5-GPU replica, 5 GPUs per
    replica -> 1; at 1 GPU per replica -> 11 (8 + 3)."""
    others = [d for d in claims if d.key != key]
    return _more_fit(node_count, node_shape, others, gpus)


def check_quota(
    tenant: str, quota: int, bounds_gpus: tuple[int, int], others_gpus: tuple[int, int],
    replacing_gpus: tuple[int, int] = (0, 0), rollout: bool = False,
) -> None:  # fmt: skip
    """Raise QuotaExceeded unless a tenant's endpoints, with one endpoint at `bounds_gpus` (its
    (min, max) replicas x gpus_per_replica; both versions' while its rollout runs: `rollout`)
    and the others at `others_gpus` (summed), fit its quota at both bounds. As for pools, a
    change that asks no more than `replacing_gpus` (the endpoint's bounds now) passes even when
    the tenant is over, e.g. after its quota was lowered."""
    for i, which in ((1, "max"), (0, "min")):  # max first: it is never below min
        total = others_gpus[i] + bounds_gpus[i]
        if total > quota and bounds_gpus[i] > replacing_gpus[i]:
            raise QuotaExceeded(tenant, quota, which, bounds_gpus[i], others_gpus[i], total, rollout)


def check_allowance(
    tenant: str, pool: str, allowance: int, source: str, asked_gpus: int, others_gpus: int,
    replacing_gpus: int = 0,
) -> None:  # fmt: skip
    """Raise AllowanceExceeded unless a tenant's minimum replicas beyond its reservations in a
    pool (GPUs: this endpoint's `asked_gpus`, its others' there `others_gpus`) fit its
    allowance there. As for quotas, asking no more than `replacing_gpus` passes even when over."""
    if asked_gpus + others_gpus > allowance and asked_gpus > replacing_gpus:
        raise AllowanceExceeded(tenant, pool, allowance, source, asked_gpus, others_gpus)


def unreserved_gpus(commitment: Commitment, sold_replicas: int) -> int:
    """GPUs an endpoint commits beyond what it bought: its minimum replicas past its sold ones
    (4 committed of which 1 sold, 2 GPUs each -> 6)."""
    return max(0, commitment.replicas - sold_replicas) * commitment.shape.gpus_per_replica


def as_json_number(value: Fraction | float | int) -> float | int:
    """A ledger figure for JSON: an integer when whole (8, not 8.0), else 6 decimals."""
    as_float = float(value)
    return int(as_float) if as_float.is_integer() else round(as_float, 6)


def _fits(more_fit: tuple[int, ...], gpus_per_replica: int) -> int:
    """Replicas of `gpus_per_replica` GPUs that fit, from the counts per size 1..node's GPUs
    (PoolLedger.more_fit): none wider than a node."""
    return more_fit[gpus_per_replica - 1] if gpus_per_replica <= len(more_fit) else 0


def _more_fit(node_count: int, node_shape: NodeShape, demands: Iterable[ReplicaDemand], gpus: int) -> int:
    return pack(node_count, node_shape, list(demands)).more_fit(gpus)


def _exact(value: Fraction | float | int) -> Fraction:
    # Through str so that a float setting such as 1.1 means 11/10, not 1.100000000000000088...
    return value if isinstance(value, Fraction) else Fraction(str(value))


def _fmt(value: Fraction | int) -> str:
    # 125000, not 1.25e+05: these figures are read by people
    return str(int(value)) if Fraction(value).denominator == 1 else f"{float(value):.6g}"


def _are(value: int) -> str:
    return "is" if value == 1 else "are"
