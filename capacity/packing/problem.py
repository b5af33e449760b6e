"""A packing problem counted: the replica kinds of a pool and how many of each (`_Problem`),
the node contents that fit one node, how a placement is ranked, and how a counted placement
becomes a named `Packing`; with the work bounds `EXACT_WORK` and `MAX_FILLS`."""

from __future__ import annotations

import functools
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from capacity.packing.model import (
    Kind,
    Named,
    NodeShape,
    Packing,
    PlacedReplica,
    ReplicaDemand,
    _by_key,
    _check_int,
    _minus,
    _room,
    _with_count,
)

# Work bound of the exact programme (updates: for each node content, the count vectors holding
# it; at most prod(count + 1) x contents). 40,000 is about 20 ms of pure Python on this machine;
# beyond it the heuristics' answer stands.
EXACT_WORK = 40_000

# Node contents enumerated at most (for 8-GPU nodes and sizes 1-8 there are 66).
MAX_FILLS = 5_000

# The node contents enumerated so far, per (node capacity, kinds, caps, most): _Problem._fills.
_FILLS: dict[tuple[Kind, tuple[Kind, ...], tuple[int, ...], int], tuple[tuple[int, ...], ...] | None] = {}
_UNSEEN: Any = object()


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
        (or beyond `most` kinds: each kind is a level of the walk). Enumerated once per process
        for a node's capacity, the kinds and `caps` (_FILLS): a pool's stay as they are across
        the sales that pack it, and the walk was a quarter of a packing."""
        key = (self.capacity, self.kinds, caps, most)
        fills = _FILLS.get(key, _UNSEEN)  # one lookup: another thread may clear it meanwhile
        if fills is _UNSEEN:
            found = self._walk_fills(caps, most)
            fills = None if found is None else tuple(found)
            if most <= MAX_FILLS and len(fills or ()) <= 500:  # the usual few dozen; 256 x 500 at most
                if len(_FILLS) >= 256:
                    _FILLS.clear()
                _FILLS[key] = fills
        return None if fills is None else list(fills)

    def _walk_fills(self, caps: tuple[int, ...], most: int) -> list[tuple[int, ...]] | None:
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
        """Number the nodes (fullest first, then by content) and put names on the replicas
        (when the nodes are first read: Named)."""
        used = {c: self.used(c) for c in states}
        distinct = sorted(
            (c for c, n in states.items() if n),
            key=lambda c: (tuple(-u for u in used[c]), tuple(-x for x in c)),
        )
        comps = [c for c in distinct for _ in range(states[c])]
        taken = [sum(states[c] * c[i] for c in distinct) for i in range(len(self.kinds))]
        placed = Named(functools.partial(self._names, comps), len(comps))
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
            placed=placed,
            unplaced=tuple(unplaced),
            free_per_node=tuple(f[0] for f in free),
            fits=not unplaced,
            method=method,
            free_resources=free,
            free_grains=grains,
        )

    def _names(self, comps: list[tuple[int, ...]]) -> tuple[tuple[PlacedReplica, ...], ...]:
        """The replicas on nodes of these contents, in node order: names in key order onto
        nodes in node order (the tail of the key order is unplaced). One PlacedReplica per
        endpoint, repeated: a replica is its (key, GPUs), nothing more."""
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
        return tuple(placed)
