"""How `pack` places, counted and deterministic: best-fit decreasing by GPUs and fullest node
first, the better kept (`_rank`); when both leave replicas out, the configuration LP rounded down
and its rest packed by the heuristics (its value bounds any packing: `gpus_bound`); and, while
replicas are still left out below that bound on a small pool (within `EXACT_WORK`), the exact
programme, a DP over count vectors. The public entry points `pack`, `pack_heuristic`,
`pack_exact`, `exact_work` and `gpus_bound` live here; docs/capacity-ledger.md has the details."""

from __future__ import annotations

import dataclasses
import itertools
from collections import Counter
from collections.abc import Sequence

from capacity.packing.model import Kind, NodeShape, Packing, ReplicaDemand, _room
from capacity.packing.problem import EXACT_WORK, _Problem
from capacity.packing.simplex import _simplex_max


def pack(nodes: int, shape: NodeShape, demands: Sequence[ReplicaDemand]) -> Packing:
    """Place every demand's replicas on `nodes` nodes of `shape` (see this module's docstring)."""
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
