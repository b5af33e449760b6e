"""The packing's data: a pool's node shape (`NodeShape`), an endpoint's whole replicas
(`ReplicaDemand`, `replicas_needed`), a packing as placed (`Packing`: what is left, `more_fit`,
`stranded_gpus`) and the small integer helpers the other modules share. Pure, no Django."""

from __future__ import annotations

import functools
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from fractions import Fraction
from typing import Any, NamedTuple

# CPU and memory are packed in 1/GRAINS of a node, rounded up: replicas whose needs differ by a
# little share a kind (the counting stays fast), and a packing in grains is valid in MiB; at
# worst a replica is charged 1/64 of a node more than it needs.
GRAINS = 64

# A replica kind: its resources in the shape's dimensions (GPUs, then CPU and memory where the
# shape limits them). Larger kinds sort first.
Kind = tuple[int, ...]


@dataclass(frozen=True)
class NodeShape:
    """One node of a pool: what a single replica's GPUs (and CPU/memory) must fit on."""

    gpus: int  # GPUs per node; >= 1
    cpu_millicores: int | None = None  # CPU per node; None: not a limit
    memory_mib: int | None = None  # memory per node; None: not a limit

    def __post_init__(self) -> None:
        _check_int("gpus", self.gpus, 1)
        if self.cpu_millicores is not None:
            _check_int("cpu_millicores", self.cpu_millicores, 0)
        if self.memory_mib is not None:
            _check_int("memory_mib", self.memory_mib, 0)

    @property
    def capacity(self) -> Kind:
        return tuple(v for v in (self.gpus, self.cpu_millicores, self.memory_mib) if v is not None)

    @property
    def grain_capacity(self) -> Kind:
        """The capacity the packer counts in: GPUs, and GRAINS per other limited dimension."""
        return (self.gpus, *(GRAINS for v in (self.cpu_millicores, self.memory_mib) if v is not None))

    def grains(self, gpus: int, cpu_millicores: int | None = None, memory_mib: int | None = None) -> Kind:
        """A replica in the packer's units: its GPUs, and its CPU and memory in 1/GRAINS of a
        node, rounded up (so what fits in grains fits in MiB: 100 GiB of a 640 GiB node is 10,
        101 GiB is 11); more than a node, or any of a dimension the node has none of, never fits."""
        if self.cpu_millicores is None and self.memory_mib is None:
            return (gpus,)
        out = [gpus]
        for need, have in ((cpu_millicores, self.cpu_millicores), (memory_mib, self.memory_mib)):
            if have is not None:
                need = need or 0
                out.append(0 if not need else GRAINS + 1 if not have else -(-need * GRAINS // have))
        return tuple(out)

    def kind(self, gpus: int, cpu_millicores: int | None = None, memory_mib: int | None = None) -> Kind:
        """A replica's resources in this shape's dimensions (a dimension the shape does not limit
        is dropped; one the replica does not state counts 0)."""
        out = [gpus]
        if self.cpu_millicores is not None:
            out.append(cpu_millicores or 0)
        if self.memory_mib is not None:
            out.append(memory_mib or 0)
        return tuple(out)


@dataclass(frozen=True)
class ReplicaDemand:
    """Whole replicas one endpoint needs in a pool (`replicas_needed` says how many)."""

    key: str  # the endpoint (its id or name); unique within a pool
    model: str  # the model it serves (for the console and the 409)
    gpus: int  # GPUs per replica, all on one node; >= 1
    count: int  # replicas; >= 0
    cpu_millicores: int | None = None  # per replica; None: 0
    memory_mib: int | None = None  # per replica; None: 0

    def __post_init__(self) -> None:
        _check_int("gpus", self.gpus, 1)
        _check_int("count", self.count, 0)
        if self.cpu_millicores is not None:
            _check_int("cpu_millicores", self.cpu_millicores, 0)
        if self.memory_mib is not None:
            _check_int("memory_mib", self.memory_mib, 0)


class PlacedReplica(NamedTuple):
    """One replica on a node: (endpoint key, GPUs)."""

    key: str
    gpus: int


class Named(Sequence[tuple[PlacedReplica, ...]]):
    """A packing's nodes, each its replicas by name, named when first read: what a pool's
    figures need (what is free, what fits, what is left out) is counted without names, and
    naming every replica of a large pool was most of its packing's cost. Compares, hashes and
    prints as the tuple of nodes."""

    __slots__ = ("_count", "_name", "_nodes")

    def __init__(self, name: Callable[[], tuple[tuple[PlacedReplica, ...], ...]], count: int):
        self._name = name
        self._nodes: tuple[tuple[PlacedReplica, ...], ...] | None = None
        self._count = count  # nodes

    def nodes(self) -> tuple[tuple[PlacedReplica, ...], ...]:
        nodes = self._nodes
        if nodes is None:  # two threads at once both name them, alike
            nodes = self._nodes = self._name()
        return nodes

    @property
    def named(self) -> bool:
        """Whether the names have been put on yet."""
        return self._nodes is not None

    def __len__(self) -> int:
        return self._count

    def __getitem__(self, index: Any) -> Any:
        return self.nodes()[index]

    def __iter__(self) -> Iterator[tuple[PlacedReplica, ...]]:
        return iter(self.nodes())

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Named):
            return self.nodes() == other.nodes()
        return self.nodes() == other if isinstance(other, tuple) else NotImplemented

    def __hash__(self) -> int:
        return hash(self.nodes())

    def __repr__(self) -> str:
        return repr(self.nodes())


@dataclass(frozen=True)
class Packing:
    """Replicas placed on a pool's nodes, and what is left."""

    shape: NodeShape
    placed: Named  # per node (index = node), largest replicas first
    unplaced: tuple[ReplicaDemand, ...]  # per endpoint, the replicas that did not fit (count > 0)
    free_per_node: tuple[int, ...]  # GPUs free on each node
    fits: bool  # every replica placed
    method: str  # which placement won: "best-fit-decreasing", "fullest-node-first", "lp-rounding", "exact"
    free_resources: tuple[Kind, ...]  # per node, free GPUs (and CPU/memory where limited), real units
    # Per node, what is free as the packer counts it (CPU/memory in grains, rounded up): what
    # `more_fit` reads, so that it never promises what a `check_change` would refuse.
    free_grains: tuple[Kind, ...] = field(repr=False, compare=False, default=())

    @property
    def nodes(self) -> int:
        return len(self.placed)

    @property
    def used_gpus(self) -> int:
        return sum(r.gpus for node in self.placed for r in node)

    @property
    def free_gpus(self) -> int:
        return sum(self.free_per_node)

    @property
    def unplaced_replicas(self) -> int:
        return sum(d.count for d in self.unplaced)

    def replicas_of(self, key: str) -> int:
        """Replicas of endpoint `key` placed."""
        return sum(1 for node in self.placed for r in node if r.key == key)

    def more_fit(
        self, gpus_per_replica: int, cpu_millicores: int | None = None, memory_mib: int | None = None
    ) -> int:
        """How many more replicas of that size fit in the free space as packed (no moves): 2
        nodes x 8 GPUs holding one 5-GPU replica take one more 5-GPU replica, and 3 + 8 = 11
        free GPUs take two 4-GPU replicas (none on the 3)."""
        _check_int("gpus_per_replica", gpus_per_replica, 1)
        need = self.shape.grains(gpus_per_replica, cpu_millicores, memory_mib)
        return sum(n * _room(free, need) for free, n in self._free_counted.items())

    @functools.cached_property
    def _free_counted(self) -> Counter[Kind]:
        # Nodes by what is free on them: a fleet's nodes leave few distinct free spaces.
        return Counter(self.free_grains or self.free_resources)

    def stranded_gpus(self, sizes: Iterable[int]) -> int:
        """Free GPUs that no combination of replicas of the given sizes can use, node by node:
        with sizes {4, 8}, a node with 6 free GPUs strands 2; with size 1 nothing is stranded;
        with no sizes every free GPU is. GPUs only (CPU and memory are not looked at)."""
        usable = _subset_sums(sorted({s for s in sizes if s >= 1}), self.shape.gpus)
        return sum(free - usable[free] for free in self.free_per_node)


def replicas_needed(
    reserved_mu_per_minute: Fraction | Decimal | int,
    mu_per_replica_minute: Fraction | Decimal | int,
    min_replicas: int,
) -> int:
    """Whole replicas an endpoint commits: ceil(reserved / per replica), at least its minimum.

    50 MU/min reserved at 100 MU/min per replica, min 0 -> 1; 200 -> 2; 201 -> 3; 0 reserved and
    min 0 -> 0; 0 reserved and min 2 -> 2. Exact (a float is refused: 0.1 is not a tenth).
    """
    if isinstance(reserved_mu_per_minute, float) or isinstance(mu_per_replica_minute, float):
        raise TypeError("replicas_needed takes exact numbers (int, Fraction, Decimal), not float")
    reserved = Fraction(reserved_mu_per_minute)
    per_replica = Fraction(mu_per_replica_minute)
    if reserved < 0:
        raise ValueError(f"reserved_mu_per_minute must be >= 0, not {reserved}")
    if per_replica <= 0:
        raise ValueError(f"mu_per_replica_minute must be > 0, not {per_replica}")
    _check_int("min_replicas", min_replicas, 0)
    q = reserved / per_replica
    return max(-(-q.numerator // q.denominator), min_replicas)


def _room(free: Kind, need: Kind) -> int:
    """How many replicas of `need` fit in `free` (a zero need does not bound)."""
    most = -1
    for f, n in zip(free, need, strict=True):
        if n:
            m = f // n if f >= 0 else 0
            most = m if most < 0 or m < most else most
    return max(most, 0) if most >= 0 else 0


def _subset_sums(sizes: list[int], most: int) -> list[int]:
    """usable[f] = the most GPUs of at most f that replicas of `sizes` (any number) fill."""
    reach = [False] * (most + 1)
    reach[0] = True
    for f in range(1, most + 1):
        reach[f] = any(s <= f and reach[f - s] for s in sizes)
    usable = [0] * (most + 1)
    for f in range(1, most + 1):
        usable[f] = f if reach[f] else usable[f - 1]
    return usable


def _minus(a: Kind, b: Kind) -> Kind:
    return tuple(x - y for x, y in zip(a, b, strict=True))


def _with_count(d: ReplicaDemand, count: int) -> ReplicaDemand:
    # `d` with another count, 0 < count <= d.count: valid, so not validated again (a fleet that
    # does not fit can leave thousands out, and __post_init__ is most of a copy's cost).
    out = object.__new__(ReplicaDemand)
    out.__dict__.update(d.__dict__, count=count)
    return out


def _by_key(d: ReplicaDemand) -> str:
    return d.key


def _check_int(name: str, value: object, least: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < least:
        raise ValueError(f"{name} must be an integer >= {least}, not {value!r}")
