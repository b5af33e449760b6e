"""Fit a model's price in model units from benchmark measurements. Pure; no numpy needed.

Each measured shape s (input tokens, output tokens) has a sustainable rate R_s requests/min
under the latency SLO. A replica does `mu_per_replica_minute` MU/min (100), so one request of
that shape costs cost_s = 100 / R_s MU, and we fit

    cost_s ~ alpha * input_s + beta * output_s + gamma,      alpha, beta, gamma >= 0

by non-negative least squares on *relative* residuals (each row weighted by 1 / cost_s), so a
0.2-MU chat turn counts as much as a 20-MU long generation. With three unknowns NNLS is exact by
enumeration: the optimum is the least-squares solution on some subset of the coefficients (the
others pinned at 0) that is itself non-negative, so we solve every subset and keep the best.

Worked numbers: shapes (100 in, 10 out) at 1000 req/min and (100 in, 100 out) at 250 req/min
cost 0.1 and 0.4 MU; the 90 extra output tokens cost 0.3 MU, so beta = 0.3 / 90 = 0.00333.

Quality: R^2 on the costs, the mean absolute percentage error of each shape predicted by a fit
of all the *other* shapes (leave-one-shape-out: the held-out MAPE), relative residuals, and a
95 % confidence interval per coefficient. `Fit.verdict(max_mape)` refuses to publish a fit whose
held-out error exceeds the threshold, and says why.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import combinations

from capacity.units import MU_PER_REPLICA_MINUTE, price

NAMES = ("alpha", "beta", "gamma")
MIN_SHAPES = 5  # three coefficients, one left out, and at least one degree of freedom to spare
# Two-sided 97.5 % quantiles of Student's t by degrees of freedom; 1.96 beyond 30.
_T975 = [
    12.706,
    4.303,
    3.182,
    2.776,
    2.571,
    2.447,
    2.365,
    2.306,
    2.262,
    2.228,
    2.201,
    2.179,
    2.160,
    2.145,
    2.131,
    2.120,
    2.110,
    2.101,
    2.093,
    2.086,
    2.080,
    2.074,
    2.069,
    2.064,
    2.060,
    2.056,
    2.052,
    2.048,
    2.045,
    2.042,
]


@dataclass(frozen=True)
class Measurement:
    input_tokens: int  # prompt tokens of the shape; >= 0
    output_tokens: int  # generated tokens of the shape; >= 0
    requests_per_minute: float  # highest rate sustained within the SLO; finite, > 0

    def cost(self, mu_per_replica_minute: float) -> float:
        return mu_per_replica_minute / self.requests_per_minute


@dataclass(frozen=True)
class Fit:
    alpha: float  # MU per input token
    beta: float  # MU per output token
    gamma: float  # MU per request
    intervals: dict[str, tuple[float, float]]  # 95 % confidence interval per coefficient
    r2: float  # on the costs; 1 is perfect
    heldout_mape: float  # leave-one-shape-out mean absolute percentage error, 0.05 = 5 %
    residuals: tuple[float, ...]  # predicted / measured cost - 1, per measurement, in input order
    samples: int  # shapes measured

    def predict(self, input_tokens: int, output_tokens: int) -> float:
        return price(self.alpha, self.beta, self.gamma, input_tokens, output_tokens)

    def verdict(self, max_heldout_mape: float) -> tuple[bool, str]:
        """(publish?, why): a fit is published only if shapes it did not see are priced well."""
        if self.heldout_mape > max_heldout_mape:
            return False, (
                f"held-out MAPE {self.heldout_mape:.1%} exceeds the {max_heldout_mape:.1%} threshold"
                f" ({self.samples} shapes); the cost model does not predict unseen shapes well enough"
            )
        return (
            True,
            f"held-out MAPE {self.heldout_mape:.1%} within {max_heldout_mape:.1%} ({self.samples} shapes)",
        )


def fit(measurements: Sequence[Measurement], mu_per_replica_minute: float = MU_PER_REPLICA_MINUTE) -> Fit:
    """Fit alpha, beta, gamma >= 0; refuses bad measurements naming the shape."""
    for m in measurements:
        _check(m)
    if len({(m.input_tokens, m.output_tokens) for m in measurements}) < MIN_SHAPES:
        raise ValueError(
            f"need at least {MIN_SHAPES} distinct shapes to fit and hold one out, got {len(measurements)}"
        )
    rows, costs = _rows_and_costs(measurements, mu_per_replica_minute)
    coef, active = _nnls(rows, costs)
    predicted = [_dot(coef, x) for x in rows]
    mean = sum(costs) / len(costs)
    total = sum((y - mean) ** 2 for y in costs)
    r2 = 1 - sum((y - p) ** 2 for y, p in zip(costs, predicted, strict=True)) / total if total else 1.0
    heldout = [abs(e) for e in _heldout_errors(rows, costs)]
    return Fit(
        alpha=coef[0],
        beta=coef[1],
        gamma=coef[2],
        intervals=_intervals(rows, costs, coef, active),
        r2=r2,
        heldout_mape=sum(heldout) / len(heldout),
        residuals=tuple(p / y - 1 for y, p in zip(costs, predicted, strict=True)),
        samples=len(measurements),
    )


def heldout_errors(
    measurements: Sequence[Measurement], mu_per_replica_minute: float = MU_PER_REPLICA_MINUTE
) -> list[float]:
    """Per measurement, the cost a fit of all the others predicts for it, relative to what it
    measured, minus 1: -0.3 means the others price it 30 % cheaper than it measured (it read
    slow). The held-out MAPE is the mean of their absolute values."""
    for m in measurements:
        _check(m)
    return _heldout_errors(*_rows_and_costs(measurements, mu_per_replica_minute))


def _rows_and_costs(
    measurements: Sequence[Measurement], mu_per_replica_minute: float
) -> tuple[list[tuple[float, float, float]], list[float]]:
    """The fit's design rows (input, output, 1) and each measurement's cost in MU."""
    rows = [(float(m.input_tokens), float(m.output_tokens), 1.0) for m in measurements]
    return rows, [m.cost(mu_per_replica_minute) for m in measurements]


def _heldout_errors(rows: Sequence[tuple[float, ...]], costs: Sequence[float]) -> list[float]:
    errors = []
    for i in range(len(rows)):
        others = [j for j in range(len(rows)) if j != i]
        loo, _ = _nnls([rows[j] for j in others], [costs[j] for j in others])
        errors.append(_dot(loo, rows[i]) / costs[i] - 1)
    return errors


def _check(m: Measurement) -> None:
    shape = f"shape ({m.input_tokens} in, {m.output_tokens} out)"
    if m.input_tokens < 0 or m.output_tokens < 0:
        raise ValueError(f"{shape}: token counts must be >= 0")
    if not (math.isfinite(m.requests_per_minute) and m.requests_per_minute > 0):
        raise ValueError(
            f"{shape}: requests_per_minute must be finite and > 0, got {m.requests_per_minute!r}"
        )


def _nnls(rows: Sequence[tuple[float, ...]], costs: Sequence[float]) -> tuple[list[float], tuple[int, ...]]:
    """Weighted (1/cost) non-negative least squares by enumerating the coefficient subsets."""
    scaled = [[v / y for v in x] for x, y in zip(rows, costs, strict=True)]
    best: tuple[float, list[float], tuple[int, ...]] = (float(len(costs)), [0.0, 0.0, 0.0], ())
    for size in (1, 2, 3):
        for active in combinations(range(3), size):
            solution = _least_squares([[r[k] for k in active] for r in scaled], [1.0] * len(scaled))
            if solution is None or any(c < 0 for c in solution):
                continue
            coef = [0.0, 0.0, 0.0]
            for k, c in zip(active, solution, strict=True):
                coef[k] = c
            sse = sum((1.0 - _dot(coef, r)) ** 2 for r in scaled)
            if sse < best[0] - 1e-15:
                best = (sse, coef, active)
    return best[1], best[2]


def _least_squares(a: list[list[float]], b: list[float]) -> list[float] | None:
    """Solve the normal equations (A^T A) x = A^T b; None when A's columns are dependent."""
    gram = [[sum(r[i] * r[j] for r in a) for j in range(len(a[0]))] for i in range(len(a[0]))]
    rhs = [sum(r[i] * y for r, y in zip(a, b, strict=True)) for i in range(len(a[0]))]
    return _solve(gram, rhs)


def _solve(m: list[list[float]], v: list[float]) -> list[float] | None:
    """Gaussian elimination with partial pivoting on a small square system."""
    n = len(v)
    aug = [[*row, v[i]] for i, row in enumerate(m)]
    scale = max((abs(x) for row in m for x in row), default=0.0) or 1.0
    for col in range(n):
        pivot = max(range(col, n), key=lambda r: abs(aug[r][col]))
        if abs(aug[pivot][col]) <= 1e-12 * scale:
            return None
        aug[col], aug[pivot] = aug[pivot], aug[col]
        for r in range(n):
            if r != col:
                factor = aug[r][col] / aug[col][col]
                aug[r] = [x - factor * y for x, y in zip(aug[r], aug[col], strict=True)]
    return [aug[i][n] / aug[i][i] for i in range(n)]


def _intervals(
    rows: Sequence[tuple[float, ...]], costs: Sequence[float], coef: list[float], active: tuple[int, ...]
) -> dict[str, tuple[float, float]]:
    """95 % intervals from the weighted fit's covariance on the active coefficients.

    A coefficient pinned at 0 by the constraint gets (0, 0): the data pushed it to the bound.
    """
    out = {name: (0.0, 0.0) for name in NAMES}
    dof = len(rows) - len(active)
    if not active or dof <= 0:
        return out
    scaled = [[x[k] / y for k in active] for x, y in zip(rows, costs, strict=True)]
    sse = sum(
        (1.0 - sum(c * v for c, v in zip([coef[k] for k in active], r, strict=True))) ** 2 for r in scaled
    )
    gram = [[sum(r[i] * r[j] for r in scaled) for j in range(len(active))] for i in range(len(active))]
    inverse = [_solve(gram, [1.0 if i == j else 0.0 for i in range(len(active))]) for j in range(len(active))]
    if any(col is None for col in inverse):
        return out
    t = _T975[dof - 1] if dof <= len(_T975) else 1.96
    for pos, k in enumerate(active):
        column = inverse[pos]
        assert column is not None
        half = t * math.sqrt(max(sse / dof * column[pos], 0.0))
        out[NAMES[k]] = (max(coef[k] - half, 0.0), coef[k] + half)
    return out


def _dot(coef: Sequence[float], x: Sequence[float]) -> float:
    return sum(c * v for c, v in zip(coef, x, strict=True))
