"""The configuration LP's solver: a hand-written tableau simplex in floats (`_simplex_max`),
capped in work (`LP_WORK`); its answer only guides a rounding that the caller checks exactly."""

from __future__ import annotations

# Work bound of the configuration LP's simplex (tableau cells updated, over all pivots): about
# 40 ms of pure Python; beyond it the LP gives up (no rounding, no bound) and the heuristics stand.
LP_WORK = 400_000


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
