"""What-if checks on a pool: whether one endpoint's changed demand still packs with the rest
(`check_change`, its `Verdict` for the 409), and which few moves would make room for more
replicas when the free GPUs are there but scattered (`defrag_plan`, its `Move`s)."""

from __future__ import annotations

import dataclasses
import functools
import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from capacity.packing.model import Kind, NodeShape, Packing, ReplicaDemand, _check_int, _minus, _room
from capacity.packing.problem import _Problem
from capacity.packing.solver import _pack_problem, _solve, pack


@dataclass(frozen=True)
class Move:
    """Move one replica of endpoint `key` from node `from_node` to node `to_node` (node indexes
    of the `Packing` that `defrag_plan` started from)."""

    key: str
    gpus: int
    from_node: int
    to_node: int


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
