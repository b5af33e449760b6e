"""Fit a model's price in model units from benchmark measurements. Pure; no numpy needed.

A shape measured at R_s requests/min under the latency SLO costs 100 / R_s MU (a replica does
`mu_per_replica_minute`, 100 MU/min): (100 in, 10 out) at 1,000 req/min and (100 in, 100 out) at
250 cost 0.1 and 0.4 MU, so beta = 0.3 / 90. The fit is non-negative least squares of
capacity.units' price rule on relative residuals, exact by enumerating the coefficients' subsets.
Before changing it: gamma is fitted on the decoded tokens (out - 1) and published as
gamma = gamma_d - beta, so it may be below 0 (down to -beta); and the fit is one-sided, a shape
priced more than `max_underprice` under its measurement is reweighted, and `Fit.verdict` refuses
an under-pricing or inaccurate fit. Why each, with figures: docs/capacity-model.md, "Fitting a
price".
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import combinations

from capacity.units import MU_PER_REPLICA_MINUTE, kv_token_steps, prefill_stall, price

NAMES = ("alpha", "beta", "gamma", "rho", "kappa")
MIN_SHAPES = 5  # enough to fit the headline three with one left out and a degree of freedom to spare
DEFAULT_MAX_UNDERPRICE = 0.05  # a shape priced more than 5 % below its measurement is reweighted
UNDERPRICE_ROUNDS = 12  # reweighting rounds at most: 3**12 weighs a stubborn shape 531,441x
# rho and kappa are fitted only from this many shapes on (the default grid has 17): with fewer,
# five coefficients from a handful of shapes fit the noise (7 shapes: each held-out fit has one
# degree of freedom left), and the headline three are fitted alone.
LONG_TERMS_MIN_SHAPES = 12
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
    rho: float = 0.0  # MU per input token x log2(output tokens); >= 0
    kappa: float = 0.0  # MU per KV token-step, out x (in + out / 2); >= 0
    shapes: tuple[tuple[int, int], ...] = ()  # the measured shapes, in the residuals' order

    def predict(self, input_tokens: int, output_tokens: int) -> float:
        return price(self.alpha, self.beta, self.gamma, input_tokens, output_tokens, self.rho, self.kappa)

    @property
    def worst_underprice(self) -> tuple[float, tuple[int, int] | None]:
        """(residual, shape) of the shape priced furthest below its measurement; (0, None) if none is."""
        worst = min(range(len(self.residuals)), key=lambda k: self.residuals[k], default=None)
        if worst is None or self.residuals[worst] >= 0:
            return 0.0, None
        return self.residuals[worst], self.shapes[worst] if self.shapes else None

    def verdict(
        self, max_heldout_mape: float, max_underprice: float = DEFAULT_MAX_UNDERPRICE
    ) -> tuple[bool, str]:
        """(publish?, why): a fit is published only if shapes it did not see are priced well and
        no shape it saw is priced more than `max_underprice` below its measurement."""
        if self.heldout_mape > max_heldout_mape:
            return False, (
                f"held-out MAPE {self.heldout_mape:.1%} exceeds the {max_heldout_mape:.1%} threshold"
                f" ({self.samples} shapes); the cost model does not predict unseen shapes well enough"
            )
        residual, shape = self.worst_underprice
        if -residual > max_underprice:
            where = f"{shape[0]} x {shape[1]}" if shape else "a shape"
            return False, (
                f"prices {where} {-residual:.1%} below its measurement, beyond the {max_underprice:.1%}"
                " under-pricing threshold: it would oversell those requests"
            )
        return (
            True,
            f"held-out MAPE {self.heldout_mape:.1%} within {max_heldout_mape:.1%} ({self.samples} shapes),"
            f" no shape under-priced by more than {max_underprice:.1%}",
        )


def fit(
    measurements: Sequence[Measurement],
    mu_per_replica_minute: float = MU_PER_REPLICA_MINUTE,
    max_underprice: float = DEFAULT_MAX_UNDERPRICE,
) -> Fit:
    """Fit alpha, beta, rho, kappa >= 0 and gamma >= -beta; refuses bad measurements naming the shape."""
    for m in measurements:
        _check(m)
    if len({(m.input_tokens, m.output_tokens) for m in measurements}) < MIN_SHAPES:
        raise ValueError(
            f"need at least {MIN_SHAPES} distinct shapes to fit and hold one out, got {len(measurements)}"
        )
    rows, costs = _rows_and_costs(measurements, mu_per_replica_minute)
    coef, active, weights = _one_sided(rows, costs, max_underprice)
    predicted = [_dot(coef, x) for x in rows]
    mean = sum(costs) / len(costs)
    total = sum((y - mean) ** 2 for y in costs)
    r2 = 1 - sum((y - p) ** 2 for y, p in zip(costs, predicted, strict=True)) / total if total else 1.0
    heldout = [abs(e) for e in _heldout_errors(rows, costs, max_underprice)]
    intervals = _intervals(rows, costs, coef, active, weights)
    coef += [0.0] * (len(NAMES) - len(coef))  # the long-request terms a small sweep leaves out
    return Fit(
        alpha=coef[0],
        beta=coef[1],
        gamma=coef[2] - coef[1],  # gamma_d - beta: the headline on all output tokens
        rho=coef[3],
        kappa=coef[4],
        intervals=intervals,
        r2=r2,
        heldout_mape=sum(heldout) / len(heldout),
        residuals=tuple(p / y - 1 for y, p in zip(costs, predicted, strict=True)),
        samples=len(measurements),
        shapes=tuple((m.input_tokens, m.output_tokens) for m in measurements),
    )


def heldout_errors(
    measurements: Sequence[Measurement], mu_per_replica_minute: float = MU_PER_REPLICA_MINUTE
) -> list[float]:
    """Per measurement, the cost a fit of all the others predicts for it, relative to what it
    measured, minus 1: -0.3 means the others price it 30 % cheaper than it measured (it read
    slow). The held-out MAPE is the mean of their absolute values."""
    for m in measurements:
        _check(m)
    # The plain least-squares fit of the others: the question is whether the shape read slow.
    return _heldout_errors(*_rows_and_costs(measurements, mu_per_replica_minute), math.inf)


def design_row(input_tokens: float, output_tokens: float) -> tuple[float, ...]:
    """What each coefficient multiplies, in NAMES order, with beta on the decoded tokens (out - 1)
    and gamma as gamma_d = gamma + beta: the price rule's own line, its coefficients >= 0."""
    return (
        float(input_tokens),
        float(output_tokens) - 1.0,
        1.0,
        prefill_stall(input_tokens, output_tokens),
        kv_token_steps(input_tokens, output_tokens),
    )


def _rows_and_costs(
    measurements: Sequence[Measurement], mu_per_replica_minute: float
) -> tuple[list[tuple[float, ...]], list[float]]:
    """The fit's design rows (the headline three alone below LONG_TERMS_MIN_SHAPES) and each
    measurement's cost in MU."""
    terms = len(NAMES) if len(measurements) >= LONG_TERMS_MIN_SHAPES else 3
    rows = [design_row(m.input_tokens, m.output_tokens)[:terms] for m in measurements]
    return rows, [m.cost(mu_per_replica_minute) for m in measurements]


def _heldout_errors(
    rows: Sequence[tuple[float, ...]], costs: Sequence[float], max_underprice: float
) -> list[float]:
    errors = []
    for i in range(len(rows)):
        others = [j for j in range(len(rows)) if j != i]
        loo, _, _ = _one_sided([rows[j] for j in others], [costs[j] for j in others], max_underprice)
        errors.append(_dot(loo, rows[i]) / costs[i] - 1)
    return errors


def _one_sided(
    rows: Sequence[tuple[float, ...]], costs: Sequence[float], max_underprice: float
) -> tuple[list[float], tuple[int, ...], list[float]]:
    """NNLS, then while some shape is priced more than `max_underprice` below its cost, triple
    its weight and fit again: (coefficients, active set, final weights)."""
    weights = [1.0] * len(rows)
    coef, active = nnls(rows, costs, weights)
    for _ in range(UNDERPRICE_ROUNDS):
        under = [_dot(coef, x) / y - 1 < -max_underprice for x, y in zip(rows, costs, strict=True)]
        if not any(under):
            break
        weights = [w * 3.0 if u else w for w, u in zip(weights, under, strict=True)]
        coef, active = nnls(rows, costs, weights)
    return coef, active, weights


def _check(m: Measurement) -> None:
    shape = f"shape ({m.input_tokens} in, {m.output_tokens} out)"
    if m.input_tokens < 0 or m.output_tokens < 0:
        raise ValueError(f"{shape}: token counts must be >= 0")
    if not (math.isfinite(m.requests_per_minute) and m.requests_per_minute > 0):
        raise ValueError(
            f"{shape}: requests_per_minute must be finite and > 0, got {m.requests_per_minute!r}"
        )


def nnls(
    rows: Sequence[tuple[float, ...]], costs: Sequence[float], weights: Sequence[float] | None = None
) -> tuple[list[float], tuple[int, ...]]:
    """Weighted (weight/cost) non-negative least squares by enumerating the coefficient subsets.

    Columns are scaled to unit size first: a KV token-step column runs to 10**6 where the
    constant is 1, and the normal equations would lose the small ones to rounding.
    """
    n = len(rows[0])
    w = list(weights) if weights is not None else [1.0] * len(rows)
    scaled = [[v * wi / y for v in x] for x, y, wi in zip(rows, costs, w, strict=True)]
    norms = [max(abs(r[k]) for r in scaled) or 1.0 for k in range(n)]
    scaled = [[v / norms[k] for k, v in enumerate(r)] for r in scaled]
    best: tuple[float, list[float], tuple[int, ...]] = (float("inf"), [0.0] * n, ())
    for size in range(1, n + 1):
        for active in combinations(range(n), size):
            solution = _least_squares([[r[k] for k in active] for r in scaled], w)
            if solution is None or any(c < 0 for c in solution):
                continue
            coef = [0.0] * n
            for k, c in zip(active, solution, strict=True):
                coef[k] = c
            sse = sum((wi - _dot(coef, r)) ** 2 for r, wi in zip(scaled, w, strict=True))
            if sse < best[0] - 1e-15:
                best = (sse, coef, active)
    return [c / norms[k] for k, c in enumerate(best[1])], best[2]


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
    rows: Sequence[tuple[float, ...]],
    costs: Sequence[float],
    coef: list[float],
    active: tuple[int, ...],
    weights: Sequence[float],
) -> dict[str, tuple[float, float]]:
    """95 % intervals from the weighted fit's covariance on the active coefficients.

    A coefficient pinned at 0 by the constraint gets (0, 0): the data pushed it to the bound.
    gamma's is that of gamma_d - beta, no lower than -beta.
    """
    out = {name: (0.0, 0.0) for name in NAMES}
    dof = len(rows) - len(active)
    if not active or dof <= 0:
        return out
    scaled = [[x[k] * w / y for k in active] for x, y, w in zip(rows, costs, weights, strict=True)]
    sse = sum(
        (w - sum(c * v for c, v in zip([coef[k] for k in active], r, strict=True))) ** 2
        for r, w in zip(scaled, weights, strict=True)
    )
    # Unit-size columns (as in nnls) keep the inverse exact; a column's variance scales back by
    # its norm squared, its interval's half-width by its norm.
    norms = [max(abs(r[pos]) for r in scaled) or 1.0 for pos in range(len(active))]
    scaled = [[v / norms[pos] for pos, v in enumerate(r)] for r in scaled]
    gram = [[sum(r[i] * r[j] for r in scaled) for j in range(len(active))] for i in range(len(active))]
    inverse = [_solve(gram, [1.0 if i == j else 0.0 for i in range(len(active))]) for j in range(len(active))]
    if any(col is None for col in inverse):
        return out
    t = _T975[dof - 1] if dof <= len(_T975) else 1.96

    def covariance(a: int, b: int) -> float:
        """Of active coefficients a and b (NAMES indices), in their own units; 0 if pinned."""
        if a not in active or b not in active:
            return 0.0
        pa, pb = active.index(a), active.index(b)
        column = inverse[pb]
        assert column is not None
        return sse / dof * column[pa] / (norms[pa] * norms[pb])

    for k in active:
        half = t * math.sqrt(max(covariance(k, k), 0.0))
        out[NAMES[k]] = (max(coef[k] - half, 0.0), coef[k] + half)
    # The published gamma is gamma_d - beta: its variance var(gamma_d) + var(beta) - 2 cov.
    gamma = coef[2] - coef[1]
    spread = covariance(2, 2) + covariance(1, 1) - 2 * covariance(1, 2)
    half = t * math.sqrt(max(spread, 0.0))
    upper_beta = out["beta"][1] if 1 in active else 0.0
    out["gamma"] = (max(gamma - half, -upper_beta), gamma + half)
    return out


def _dot(coef: Sequence[float], x: Sequence[float]) -> float:
    return sum(c * v for c, v in zip(coef, x, strict=True))
