"""Whole replicas on real nodes: pack a pool's replicas onto its nodes and say what still fits.

Pure, exact integer arithmetic (an LP's floats only guide a rounding checked in integers), no
Django, no I/O. A pool is `nodes` identical nodes of a `NodeShape` (GPUs per node, optionally CPU
and memory per node); an endpoint needs a whole number of replicas (`replicas_needed`), and a
tensor-parallel replica needs all its GPUs on one node. So a pool of 2 nodes x 8 GPUs holds two
5-GPU replicas, not three (16 GPUs, but 3 GPUs stranded on each node), and ten endpoints of 50
MU/min each of a 4-GPU, 100-MU/min-per-replica model need ten replicas, 40 GPUs, not 20.

How `pack` places (deterministic: the same demands in any order give the same placement):
- Replicas of the same resources (GPUs, and CPU/memory where the shape limits them) are
  interchangeable, so the packer counts: a node's content is the multiset of replica kinds on
  it, and the pool is "how many nodes hold each content" (for 8-GPU nodes at most 66 non-empty
  contents whatever the fleet size). Names go onto the counted placement afterwards, in key
  order, on nodes numbered fullest first.
- Best-fit decreasing (BFD) by GPUs: each kind, largest first, goes onto the fullest nodes it
  fits; n identical replicas fill a node to the brim before the next, so a kind is one pass over
  the contents. When every size divides the next larger one and the node (TP 1, 2, 4, 8 on 8-GPU
  nodes) a replica is left out only when every node is full, so BFD is optimal there (divisible
  sizes: Coffman, Garey and Johnson, 1987); in general it needs at most 11/9 OPT + 6/9 nodes for
  what it places (Dosa, 2007, for FFD and BFD alike).
- Fullest node first (minimum bin slack, Gupta and Ho, 1999), counted: node after node, the
  fullest content the replicas left allow. The better of the two is kept: more GPUs placed, then
  the free GPUs gathered on fewer nodes (`_rank`).
- When both leave replicas out: the configuration LP (how many nodes hold each content, at most
  the nodes, at most the replicas of each kind, most GPUs), rounded down, its rest packed by the
  heuristics. Its optimum uses at most kinds + 1 contents, so rounding gives up at most that
  many nodes; and its value bounds what any packing places.
- Exact, when replicas are still left out below that bound and the pool is small (the exact
  programme's work, at most prod over kinds of (count + 1) x contents, within `EXACT_WORK`): a DP
  over count vectors, as coin change with node contents as the coins, finds the fewest nodes for
  every sub-multiset of the replicas and keeps the one of most GPUs that fits the nodes. So a
  refusal on a small pool is never a heuristic's. Measured against CP-SAT on random pools
  (bench/packing.py): 100 % of the optimal GPUs placed on every pool tried.

What is left (`Packing.more_fit`, `Packing.stranded_gpus`) is read from the packing as placed;
`defrag_plan` says which few moves would make room when the free GPUs are there but scattered.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from fractions import Fraction
from typing import NamedTuple

# Work bound of the exact programme (updates: for each node content, the count vectors holding
# it; at most prod(count + 1) x contents). 40,000 is about 20 ms of pure Python on this machine;
# beyond it the heuristics' answer stands.
EXACT_WORK = 40_000

# CPU and memory are packed in 1/GRAINS of a node, rounded up: replicas whose needs differ by a
# little share a kind (the counting stays fast), and a packing in grains is valid in MiB; at
# worst a replica is charged 1/64 of a node more than it needs.
GRAINS = 64

# Work bound of the configuration LP's simplex (tableau cells updated, over all pivots): about
# 40 ms of pure Python; beyond it the LP gives up (no rounding, no bound) and the heuristics stand.
LP_WORK = 400_000

# Node contents enumerated at most (for 8-GPU nodes and sizes 1-8 there are 66).
MAX_FILLS = 5_000

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


@dataclass(frozen=True)
class Move:
    """Move one replica of endpoint `key` from node `from_node` to node `to_node` (node indexes
    of the `Packing` that `defrag_plan` started from)."""

    key: str
    gpus: int
    from_node: int
    to_node: int


@dataclass(frozen=True)
class Packing:
    """Replicas placed on a pool's nodes, and what is left."""

    shape: NodeShape
    placed: tuple[tuple[PlacedReplica, ...], ...]  # per node (index = node), largest replicas first
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


@dataclass(frozen=True)
class Verdict:
    """Whether one endpoint's changed demand packs with the rest of the pool (for the 409)."""

    fits: bool
    key: str
    asked_replicas: int  # the replicas the change asks for that endpoint
    asked_gpus_per_replica: int
    fit_replicas: int  # how many of the asked would fit with the rest as they are (= asked if fits)
    # Packs the pool with the change as asked, as `pack` does (only when `packing` is read: a
    # sale check needs the answer, not the names).
    pack_as_asked: Callable[[], Packing] = field(repr=False, compare=False)

    @functools.cached_property
    def packing(self) -> Packing:
        """The pool packed with the change as asked (what `pack` returns for it)."""
        return self.pack_as_asked()

    def message(self, pool: str) -> str:
        """The 409's sentence: pool 'h100': 3 replicas of 5 GPUs asked, 2 fit."""
        return (
            f"pool {pool!r}: {self.asked_replicas} replicas of {self.asked_gpus_per_replica} GPUs asked "
            f"for {self.key!r}, {self.fit_replicas} fit"
        )


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


def pack(nodes: int, shape: NodeShape, demands: Sequence[ReplicaDemand]) -> Packing:
    """Place every demand's replicas on `nodes` nodes of `shape` (see the module docstring)."""
    return _pack_problem(_Problem.build(nodes, shape, demands))


def _pack_problem(problem: _Problem) -> Packing:
    states, _, method = _solve(problem)
    return problem.materialise(states, method)


def pack_heuristic(nodes: int, shape: NodeShape, demands: Sequence[ReplicaDemand]) -> Packing:
    """`pack` with best-fit decreasing only (for the tests and the benchmark)."""
    problem = _Problem.build(nodes, shape, demands)
    states, _ = _best_fit_decreasing(problem)
    return problem.materialise(states, "best-fit-decreasing")


def pack_exact(nodes: int, shape: NodeShape, demands: Sequence[ReplicaDemand]) -> Packing:
    """`pack` with the exact programme only, whatever the size (small instances only: its work is
    `exact_work`, the product over kinds of (count + 1) times the node fills)."""
    problem = _Problem.build(nodes, shape, demands)
    fills = problem._fills(problem._caps(), most=10**9)
    assert fills is not None
    states, _ = _exact(problem, fills)
    return problem.materialise(states, "exact")


def exact_work(nodes: int, shape: NodeShape, demands: Sequence[ReplicaDemand]) -> int:
    """The exact programme's work on this instance (it runs in `pack` when <= EXACT_WORK)."""
    return _Problem.build(nodes, shape, demands).exact_work()


def gpus_bound(nodes: int, shape: NodeShape, demands: Sequence[ReplicaDemand]) -> int | None:
    """An upper bound on the GPUs any packing of `demands` places: the configuration LP's value,
    rounded down (None when the node contents are too many to enumerate). A packing that places
    this many is optimal; 2 nodes x 8 GPUs and three 5-GPU replicas: 10."""
    problem = _Problem.build(nodes, shape, demands)
    fills = problem._fills(problem._caps())
    if fills is None:
        return None
    if not fills:
        return 0
    rounded = _rounded_lp(problem, fills)
    return None if rounded is None else rounded[2]


def check_change(
    nodes: int, shape: NodeShape, demands: Sequence[ReplicaDemand], change: ReplicaDemand
) -> Verdict:
    """Whether the pool packs with endpoint `change.key`'s demand replaced by `change` (added
    when the pool has no demand of that key). 16 GPUs at 8 per node with 5-GPU replicas: 2
    asked -> fits; 3 asked -> does not, 2 fit.

    `fit_replicas` is the most replicas of the change that pack with the rest (binary search on
    the count, each step a `pack` without the configuration LP; 0 when the rest alone does not
    pack)."""
    others = [d for d in demands if d.key != change.key]
    problem = _Problem.build(nodes, shape, [*others, change])
    _, left, _ = _solve(problem, any_fit=True)
    fits = not any(left)
    fit = change.count
    if not fits and change.count:
        # Only the counts change between the steps: solve them, name nothing.
        i = problem.kinds.index(shape.grains(change.gpus, change.cpu_millicores, change.memory_mib))
        base = problem.counts[i] - change.count

        def solve_with(k: int) -> tuple[dict[tuple[int, ...], int], list[int], str]:
            counts = (*problem.counts[:i], base + k, *problem.counts[i + 1 :])
            # Without the LP: one simplex per step made a refused check on 16-GPU nodes with
            # 16 sizes take seconds while it holds the pool's locks. The steps' answer is then
            # the heuristics' (the exact programme's on a small pool): a lower bound.
            return _solve(dataclasses.replace(problem, counts=counts), any_fit=True, lp=False, within=problem)

        states, left, _ = solve_with(0)
        if any(left):
            fit = 0  # the rest alone does not pack
        else:
            # At least what fits in the free space as the rest is packed; at most what the
            # free GPUs hold; less than asked.
            kind = problem.kinds[i]
            lo = sum(n * _room(_minus(problem.capacity, problem.used(c)), kind) for c, n in states.items())
            free_gpus = problem.nodes * problem.capacity[0] - sum(
                g[0] * c for g, c in zip(problem.kinds, problem.counts, strict=True)
            )
            hi = min(change.count - 1, (free_gpus + change.count * change.gpus) // change.gpus)
            lo = min(lo, hi)
            while lo < hi:
                mid = (lo + hi + 1) // 2
                if any(solve_with(mid)[1]):
                    hi = mid - 1
                else:
                    lo = mid
            fit = lo
    return Verdict(
        fits=fits,
        key=change.key,
        asked_replicas=change.count,
        asked_gpus_per_replica=change.gpus,
        fit_replicas=fit,
        pack_as_asked=functools.partial(_pack_problem, problem),
    )


def defrag_plan(
    nodes: int,
    shape: NodeShape,
    demands: Sequence[ReplicaDemand],
    wanted: ReplicaDemand,
    max_moves: int = 16,
    placed: Sequence[Sequence[str]] | None = None,
) -> list[Move] | None:
    """Moves that make room for `wanted.count` more replicas of `wanted`'s size: [] when they fit
    as placed; None when no plan exists (the pool with them does not pack at all) or none of at
    most `max_moves` moves was found. As placed: `placed` (per node, the endpoint keys of the
    replicas running there, e.g. the cluster's pods), else as `pack` places `demands`.

    Search (greedy, one wanted replica at a time): a replica that fits in free space as it stands
    takes it; otherwise, over every node (one per distinct node content) and every sub-multiset of
    its movable replicas that frees enough room, the one whose replicas all fit directly into the
    other nodes' free space (best fit, largest first) with the fewest moves, then the fewest GPUs
    moved, then the lowest node. Moved replicas are never moved again, and the room made is
    held for the wanted replica. E.g. 2 nodes x 8 GPUs with a 4-GPU replica on each: an 8-GPU
    replica is wanted -> move one 4 onto the other node.
    """
    _check_int("max_moves", max_moves, 0)
    need = shape.kind(wanted.gpus, wanted.cpu_millicores, wanted.memory_mib)
    remaining = wanted.count
    # Node contents: (key, kind, movable); free space per node.
    kinds_by_key = {d.key: shape.kind(d.gpus, d.cpu_millicores, d.memory_mib) for d in demands}
    if placed is None:
        placed = [[r.key for r in node] for node in pack(nodes, shape, demands).placed]
    if len(placed) != nodes:
        raise ValueError(f"placed names {len(placed)} nodes, the pool has {nodes}")
    content: list[list[tuple[str, Kind, bool]]] = []
    free: list[list[int]] = []
    for n, keys in enumerate(placed):
        unknown = [key for key in keys if key not in kinds_by_key]
        if unknown:
            raise ValueError(f"placed: node {n} runs {unknown[0]!r}, which has no demand")
        content.append([(key, kinds_by_key[key], True) for key in keys])
        free.append([c - sum(k[d] for _, k, _ in content[-1]) for d, c in enumerate(shape.capacity)])
        if min(free[-1]) < 0:
            raise ValueError(f"placed: node {n} holds more than a node of {shape} has")

    def hold(n: int) -> None:
        nonlocal remaining
        content[n].append((wanted.key, need, False))
        free[n] = [f - w for f, w in zip(free[n], need, strict=True)]
        remaining -= 1

    for n in range(nodes):
        while remaining and _room(tuple(free[n]), need):
            hold(n)
    if not remaining:
        return []
    if any(sum(f[d] for f in free) < need[d] * remaining for d in range(len(need))):
        return None  # not enough free in all, however it is moved
    combined = [d for d in demands if d.key != wanted.key]
    own = sum(d.count for d in demands if d.key == wanted.key)
    if not pack(nodes, shape, [*combined, dataclasses.replace(wanted, count=own + wanted.count)]).fits:
        return None
    moves: list[Move] = []
    cache: dict[int, tuple[tuple[tuple[Kind, int], ...], list[Kind], dict[Kind, list[int]]]] = {}
    while remaining:
        best = _cheapest_eviction(content, free, need, cache)
        if best is None or len(moves) + len(best) > max_moves:
            return None
        for item_index, source, target in best:
            key, kind, _ = content[source][item_index]
            moves.append(Move(key=key, gpus=kind[0], from_node=source, to_node=target))
        # Apply: remove from the source (highest index first), add to the targets, pinned.
        for item_index, source, target in sorted(best, reverse=True):
            key, kind, _ = content[source].pop(item_index)
            free[source] = [f + k for f, k in zip(free[source], kind, strict=True)]
            content[target].append((key, kind, False))
            free[target] = [f - k for f, k in zip(free[target], kind, strict=True)]
            cache.pop(source, None)
            cache.pop(target, None)
        source = best[0][1]
        while remaining and _room(tuple(free[source]), need):
            hold(source)
    return moves


# -- internals ------------------------------------------------------------------------------------


def _solve(
    p: _Problem, any_fit: bool = False, lp: bool = True, within: _Problem | None = None
) -> tuple[dict[tuple[int, ...], int], list[int], str]:
    """The better of best-fit decreasing and fullest-node-first (more GPUs placed; when both
    place everything, the free space gathered on fewer nodes); when both leave replicas out, the
    rounded configuration LP, and the exact programme on a small pool unless the LP's bound shows
    the best so far is optimal already. `any_fit`: return the first that places everything
    (a yes/no question: which placement does not matter). `lp=False`: without the LP (the
    steps of `check_change`'s search, where the LP is most of the work). `within`: a problem with
    at least these counts, whose node contents are filtered rather than enumerated again (when
    it has too many, so does this one, as far as the work goes)."""
    best = (*_best_fit_decreasing(p), "best-fit-decreasing")
    if any_fit and not any(best[1]):
        return best
    caps = p._caps()
    fills = p.fills if within is None else within.fills
    if fills is not None and within is not None:
        # The contents within the smaller caps, in the same order (fullest first).
        tighter = [(j, c) for j, (c, w) in enumerate(zip(caps, within._caps(), strict=True)) if c < w]
        fills = [f for f in fills if all(f[j] <= c for j, c in tighter)]
    if fills is None:
        return best
    other = (*_fullest_node_first(p, fills), "fullest-node-first")
    if p._rank(other[0]) > p._rank(best[0]):
        best = other
    if not any(best[1]):
        return best
    rounded = _rounded_lp(p, fills) if lp else None
    bound = None
    if rounded is not None:
        states, left, bound = rounded
        if p._rank(states) > p._rank(best[0]):
            best = (states, left, "lp-rounding")
    if (bound is None or p._rank(best[0])[0] < bound) and p.exact_work(fills) <= EXACT_WORK:
        return (*_exact(p, fills), "exact")
    return best


@dataclass(frozen=True)
class _Problem:
    shape: NodeShape
    nodes: int
    capacity: Kind
    kinds: tuple[Kind, ...]  # distinct replica kinds, largest first
    counts: tuple[int, ...]  # replicas of each kind
    # Per kind, its demands in key order (the order names go onto placed replicas).
    demands: tuple[tuple[ReplicaDemand, ...], ...]

    @classmethod
    def build(cls, nodes: int, shape: NodeShape, demands: Sequence[ReplicaDemand]) -> _Problem:
        _check_int("nodes", nodes, 0)
        if len({d.key for d in demands}) < len(demands):
            twice = sorted(k for k, n in Counter(d.key for d in demands).items() if n > 1)
            raise ValueError(f"two demands for endpoint {twice[0]!r}: one per endpoint and pool")
        by_kind: dict[Kind, list[ReplicaDemand]] = {}
        for d in demands:
            if d.count:
                kind = shape.grains(d.gpus, d.cpu_millicores, d.memory_mib)
                group = by_kind.get(kind)
                if group is None:
                    by_kind[kind] = [d]
                else:
                    group.append(d)
        kinds = tuple(sorted(by_kind, reverse=True))
        # Keys are unique, so the key order is total: the input order never shows.
        groups = tuple(tuple(sorted(by_kind[k], key=_by_key)) for k in kinds)
        return cls(
            shape=shape,
            nodes=nodes,
            capacity=shape.grain_capacity,
            kinds=kinds,
            counts=tuple(sum(d.count for d in g) for g in groups),
            demands=groups,
        )

    def used(self, comp: tuple[int, ...]) -> Kind:
        dims = len(self.capacity)
        return tuple(sum(c * k[d] for c, k in zip(comp, self.kinds, strict=True)) for d in range(dims))

    def exact_work(self, fills: list[tuple[int, ...]] | None = None) -> int:
        """Updates the exact programme makes: for each node content, the count vectors that
        contain it (so at most prod(count + 1) x contents)."""
        caps = self._caps()
        states = 1
        for c in caps:
            states *= c + 1
            if states > EXACT_WORK:
                return states
        fills = self._fills(caps) if fills is None else fills
        if fills is None:
            return EXACT_WORK + 1
        work = 0
        for fill in fills:
            box = 1
            for a, c in zip(fill, caps, strict=True):
                box *= c - a + 1
            work += box
        return work

    @functools.cached_property
    def fills(self) -> list[tuple[int, ...]] | None:
        """`_fills` within `_caps`, enumerated once per problem."""
        return self._fills(self._caps())

    def _caps(self) -> tuple[int, ...]:
        """Replicas per kind that could be placed at all (no more than the nodes hold)."""
        return tuple(
            min(c, self.nodes * _room(self.capacity, k)) for k, c in zip(self.kinds, self.counts, strict=True)
        )

    def _fills(self, caps: tuple[int, ...], most: int = MAX_FILLS) -> list[tuple[int, ...]] | None:
        """Every non-empty node content (count per kind, within `caps`) that fits one node, the
        fullest first (GPUs, then CPU, memory), then the larger replicas; None beyond `most`
        (or beyond `most` kinds: each kind is a level of the walk)."""
        if len(self.kinds) > min(most, 200):
            return None
        out: list[tuple[int, ...]] = []

        def walk(i: int, comp: list[int], free: Kind) -> bool:
            if i == len(self.kinds):
                if any(comp):
                    out.append(tuple(comp))
                return len(out) <= most
            kind = self.kinds[i]
            for c in range(min(caps[i], _room(free, kind)) + 1):
                comp.append(c)
                ok = walk(i + 1, comp, tuple(f - c * k for f, k in zip(free, kind, strict=True)))
                comp.pop()
                if not ok:
                    return False
            return True

        if not walk(0, [], self.capacity):
            return None
        out.sort(key=lambda c: (tuple(-u for u in self.used(c)), tuple(-x for x in c)))
        return out

    def _rank(self, states: dict[tuple[int, ...], int]) -> tuple[int, tuple[int, ...]]:
        """Which of two packings is better: more GPUs placed, then the free GPUs gathered: the
        nodes with all GPUs free, then with all but one, ... (an empty node beats two halves)."""
        placed = 0
        nodes_by_free = [0] * (self.capacity[0] + 1)
        for comp, n in states.items():
            gpus = sum(c * k[0] for c, k in zip(comp, self.kinds, strict=True))
            placed += n * gpus
            nodes_by_free[self.capacity[0] - gpus] += n
        return placed, tuple(reversed(nodes_by_free))

    def materialise(self, states: dict[tuple[int, ...], int], method: str) -> Packing:
        """Number the nodes (fullest first, then by content) and put names on the replicas."""
        used = {c: self.used(c) for c in states}
        distinct = sorted(
            (c for c, n in states.items() if n),
            key=lambda c: (tuple(-u for u in used[c]), tuple(-x for x in c)),
        )
        comps = [c for c in distinct for _ in range(states[c])]
        # Names in key order onto nodes in node order; the tail of the key order is unplaced.
        # One PlacedReplica per endpoint, repeated: a replica is its (key, GPUs), nothing more.
        replicas = [
            [r for d in group for r in [PlacedReplica(d.key, kind[0])] * d.count]
            for group, kind in zip(self.demands, self.kinds, strict=True)
        ]
        taken = [0] * len(self.kinds)
        placed: list[tuple[PlacedReplica, ...]] = []
        for comp in comps:
            node: list[PlacedReplica] = []
            for i, c in enumerate(comp):
                if c:
                    node += replicas[i][taken[i] : taken[i] + c]
                    taken[i] += c
            placed.append(tuple(node))
        unplaced: list[ReplicaDemand] = []
        for i, group in enumerate(self.demands):
            at = 0  # replicas of this kind before `d`
            for d in group:
                short = min(d.count, at + d.count - taken[i])
                if short > 0:
                    unplaced.append(_with_count(d, short))
                at += d.count
        free_of = {c: _minus(self.capacity, used[c]) for c in distinct}
        grains = tuple(free_of[c] for c in comps)
        free: tuple[Kind, ...] = grains
        if len(self.capacity) > 1:
            # What is free in real units (the grains rounded the needs up).
            real = {
                d.key: self.shape.kind(d.gpus, d.cpu_millicores, d.memory_mib)
                for g in self.demands
                for d in g
            }
            cap = self.shape.capacity
            free = tuple(
                tuple(c - sum(real[r.key][i] for r in node) for i, c in enumerate(cap)) for node in placed
            )
        unplaced.sort(key=lambda d: d.key)
        return Packing(
            shape=self.shape,
            placed=tuple(placed),
            unplaced=tuple(unplaced),
            free_per_node=tuple(f[0] for f in free),
            fits=not unplaced,
            method=method,
            free_resources=free,
            free_grains=grains,
        )


def _best_fit_decreasing(p: _Problem) -> tuple[dict[tuple[int, ...], int], list[int]]:
    """Counted BFD: how many nodes hold each content, and the replicas left per kind."""
    empty = (0,) * len(p.kinds)
    states: dict[tuple[int, ...], int] = {empty: p.nodes} if p.nodes else {}
    used: dict[tuple[int, ...], Kind] = {empty: (0,) * len(p.capacity)}
    left: list[int] = []
    for i, kind in enumerate(p.kinds):
        k = p.counts[i]
        # Fullest first (GPUs, then CPU, memory), ties by content: deterministic.
        for comp in sorted(states, key=lambda c: (tuple(-u for u in used[c]), c)):
            if not k:
                break
            m = _room(tuple(c - u for c, u in zip(p.capacity, used[comp], strict=True)), kind)
            if not m:
                continue
            n = states[comp]
            full = min(n, k // m)
            batch = [(full, m)] if full == n or k == full * m else [(full, m), (1, k - full * m)]
            for nodes, each in batch:
                if not nodes:
                    continue
                states[comp] -= nodes
                new = (*comp[:i], comp[i] + each, *comp[i + 1 :])
                states[new] = states.get(new, 0) + nodes
                if new not in used:
                    used[new] = tuple(u + each * x for u, x in zip(used[comp], kind, strict=True))
                k -= nodes * each
            if not states[comp]:
                del states[comp]
        left.append(k)
    return states, left


def _fullest_node_first(
    p: _Problem, fills: list[tuple[int, ...]]
) -> tuple[dict[tuple[int, ...], int], list[int]]:
    """Node by node, the fullest content the replicas left allow (minimum bin slack, Gupta and
    Ho 1999), counted: a content is repeated on as many nodes as the replicas left allow, and a
    content that no longer fits never fits again, so one pass over `fills` (fullest first)."""
    left = list(p.counts)
    nodes = p.nodes
    states: dict[tuple[int, ...], int] = {}
    for fill in fills:
        if not nodes:
            break
        times = min([nodes, *(x // a for a, x in zip(fill, left, strict=True) if a)])
        if times:
            states[fill] = times
            nodes -= times
            left = [x - times * a for a, x in zip(fill, left, strict=True)]
    if nodes:
        empty = (0,) * len(p.kinds)
        states[empty] = states.get(empty, 0) + nodes
    return states, left


def _rounded_lp(
    p: _Problem, fills: list[tuple[int, ...]]
) -> tuple[dict[tuple[int, ...], int], list[int], int] | None:
    """The configuration LP (how many nodes hold each content: at most `p.nodes` nodes, at most
    the replicas of each kind, most GPUs), rounded down, and the nodes and replicas that leaves
    packed by the heuristics. An optimal vertex has at most kinds + 1 contents in use, so the
    rounding gives up at most that many nodes, which the heuristics then fill: on a large pool
    the result is within a few nodes of the optimum. Also returns the LP's bound on the GPUs any
    packing places (rounded down; None when the simplex does not finish)."""
    gain = [float(p.used(f)[0]) for f in fills]
    rows = [[1.0] * len(fills), *([float(f[i]) for f in fills] for i in range(len(p.kinds)))]
    bounds = [float(p.nodes), *(float(c) for c in p.counts)]
    y = _simplex_max(gain, rows, bounds)
    if y is None:
        return None
    times = [int(v + 1e-9) for v in y]
    bound = int(sum(g * v for g, v in zip(gain, y, strict=True)) + 1e-6)
    # Exact check of the rounded vertex (floats above): trim a content until it fits.
    left = list(p.counts)
    nodes = p.nodes
    states: dict[tuple[int, ...], int] = {}
    for fill, t in zip(fills, times, strict=True):
        t = min([t, nodes, *(x // a for a, x in zip(fill, left, strict=True) if a)])
        if t > 0:
            states[fill] = t
            nodes -= t
            left = [x - t * a for a, x in zip(fill, left, strict=True)]
    rest = dataclasses.replace(p, nodes=nodes, counts=tuple(left))
    best = _best_fit_decreasing(rest)
    for candidate in (_fullest_node_first(rest, fills),):
        if rest._rank(candidate[0]) > rest._rank(best[0]):
            best = candidate
    for comp, n in best[0].items():
        states[comp] = states.get(comp, 0) + n
    return states, best[1], bound


def _simplex_max(gain: list[float], rows: list[list[float]], bounds: list[float]) -> list[float] | None:
    """max gain . y subject to rows . y <= bounds, y >= 0 (bounds >= 0): the tableau simplex
    in floats: callers check the rounded answer exactly."""
    m, n = len(rows), len(gain)
    eps = 1e-9
    table = [
        [*row, *(1.0 if j == i else 0.0 for j in range(m)), b]
        for i, (row, b) in enumerate(zip(rows, bounds, strict=True))
    ]
    cost = [*(-g for g in gain), *([0.0] * m), 0.0]
    basis = list(range(n, n + m))
    # Dantzig's rule (most negative reduced cost: far fewer pivots than Bland's on these
    # tableaux); a degenerate pivot may cycle, so the pivots are capped, and so is the work (a
    # sale check holds row locks): past LP_WORK cell updates the caller keeps its heuristics.
    for _ in range(min(50 * (n + m), LP_WORK // (m * (n + m + 1)) + 1)):
        entering = min(range(n + m), key=cost.__getitem__)
        if cost[entering] >= -eps:
            y = [0.0] * n
            for i, b in enumerate(basis):
                if b < n:
                    y[b] = table[i][-1]
            return y
        leaving = None
        ratio = 0.0
        for i in range(m):
            a = table[i][entering]
            if a > eps:
                r = table[i][-1] / a
                if (
                    leaving is None
                    or r < ratio - eps
                    or (abs(r - ratio) <= eps and basis[i] < basis[leaving])
                ):
                    leaving, ratio = i, r
        if leaving is None:
            return None  # unbounded: not with these rows (every content uses a node)
        pivot = table[leaving]
        scale = pivot[entering]
        pivot[:] = [v / scale for v in pivot]
        for i in range(m):
            if i != leaving and table[i][entering]:
                factor = table[i][entering]
                table[i] = [v - factor * w for v, w in zip(table[i], pivot, strict=True)]
        factor = cost[entering]
        cost = [v - factor * w for v, w in zip(cost, pivot, strict=True)]
        basis[leaving] = entering
    return None


def _exact(p: _Problem, fills: list[tuple[int, ...]]) -> tuple[dict[tuple[int, ...], int], list[int]]:
    """Fewest nodes for every sub-multiset of the replicas (a DP over count vectors, as coin
    change: node contents are the coins), then the sub-multiset of most GPUs (ties: the larger
    replicas) that fits `p.nodes` nodes; the nodes are rebuilt fullest content first."""
    caps = p._caps()
    radix = [c + 1 for c in caps]
    strides = [1] * len(caps)
    for i in range(len(caps) - 2, -1, -1):
        strides[i] = strides[i + 1] * radix[i + 1]
    size = strides[0] * radix[0] if caps else 1
    inf = p.nodes + 1
    best = [inf] * size
    best[0] = 0
    offsets = []
    for fill in fills:
        off = sum(a * s for a, s in zip(fill, strides, strict=True))
        offsets.append(off)
        # Every count vector that contains `fill`, in increasing index order.
        index = [0]
        for a, c, s in zip(fill, caps, strides, strict=True):
            index = [x + d * s for x in index for d in range(a, c + 1)]
        for v in index:
            b = best[v - off] + 1
            if b < best[v]:
                best[v] = b
    vectors = list(itertools.product(*(range(r) for r in radix)))
    gpus = [k[0] for k in p.kinds]
    chosen = max(
        (i for i in range(size) if best[i] <= p.nodes),
        key=lambda i: (sum(g * x for g, x in zip(gpus, vectors[i], strict=True)), vectors[i]),
    )
    comps: list[tuple[int, ...]] = []
    v = chosen
    while v:
        for fill, off in zip(fills, offsets, strict=True):
            if all(a <= x for a, x in zip(fill, vectors[v], strict=True)) and best[v - off] == best[v] - 1:
                comps.append(fill)
                v -= off
                break
    comps += [(0,) * len(p.kinds)] * (p.nodes - len(comps))
    left = [c - x for c, x in zip(p.counts, vectors[chosen], strict=True)]
    return dict(Counter(comps)), left


def _cheapest_eviction(
    content: list[list[tuple[str, Kind, bool]]],
    free: list[list[int]],
    need: Kind,
    cache: dict[int, tuple[tuple[tuple[Kind, int], ...], list[Kind], dict[Kind, list[int]]]],
) -> list[tuple[int, int, int]] | None:
    """(item index on the source, source node, target node) moves that make room for `need` on
    one node, the fewest first; None when no single-node eviction into free space does it.
    Replicas of a kind are alike, so a node's evictions are the sub-multisets of its kinds (the
    first of each kind in key order moves), and alike nodes are tried once. `cache` keeps each
    node's movable replicas by kind; the caller drops the nodes it changes."""
    by_free: dict[Kind, list[int]] = {}
    for n, f in enumerate(free):
        by_free.setdefault(tuple(f), []).append(n)
    best: tuple[tuple[int, int, int], list[tuple[int, int, int]]] | None = None
    seen: set[tuple[tuple[tuple[Kind, int], ...], Kind]] = set()
    for source, items in enumerate(content):
        if source not in cache:
            of_kind: dict[Kind, list[int]] = {}
            for i, (_, kind, movable) in sorted(enumerate(items), key=lambda item: item[1][0]):
                if movable:
                    of_kind.setdefault(kind, []).append(i)
            kinds = sorted(of_kind, reverse=True)
            cache[source] = (tuple((k, len(of_kind[k])) for k in kinds), kinds, of_kind)
        held, kinds, of_kind = cache[source]
        signature = (held, tuple(free[source]))
        if signature in seen or not kinds:
            continue
        seen.add(signature)
        for take in itertools.product(*(range(len(of_kind[k]) + 1) for k in kinds)):
            moved = sum(take)
            if not moved or (best is not None and moved > best[0][0]):
                continue
            freed = tuple(
                f + sum(t * k[d] for t, k in zip(take, kinds, strict=True))
                for d, f in enumerate(free[source])
            )
            if not _room(freed, need):
                continue
            evicted = [(k, i) for t, k in zip(take, kinds, strict=True) for i in of_kind[k][:t]]
            cost = (moved, sum(k[0] for k, _ in evicted), source)
            if best is not None and cost >= best[0]:
                continue
            targets = _relocate([k for k, _ in evicted], by_free, source)
            if targets is not None:
                best = (cost, [(i, source, t) for (_, i), t in zip(evicted, targets, strict=True)])
    return None if best is None else best[1]


def _relocate(kinds: list[Kind], by_free: dict[Kind, list[int]], source: int) -> list[int] | None:
    """Target node per replica (best fit, largest first) in the other nodes' free space: the
    node of least room that takes it, the lowest-numbered of those."""
    changed: dict[int, Kind] = {source: ()}  # nodes this relocation filled (and the source: out)
    out: dict[int, int] = {}
    for j in sorted(range(len(kinds)), key=lambda j: kinds[j], reverse=True):
        kind = kinds[j]
        choice: tuple[Kind, int] | None = None
        for f, nodes in by_free.items():
            if (choice is None or f < choice[0]) and _room(f, kind):
                first = next((n for n in nodes if n not in changed), None)
                if first is not None:
                    choice = (f, first)
        for n, f in changed.items():
            if n != source and _room(f, kind) and (choice is None or (f, n) < choice):
                choice = (f, n)
        if choice is None:
            return None
        f, target = choice
        changed[target] = _minus(f, kind)
        out[j] = target
    return [out[j] for j in range(len(kinds))]


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
