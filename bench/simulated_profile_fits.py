"""Fit every simulated profile on the virtual clock and print its figures (SIMULATED).

    PYTHONPATH=. python bench/simulated_profile_fits.py [--seeds 0,1,2] [--smoke] [PROFILE ...]

Per profile and seed (the open loop's Poisson arrivals): held-out MAPE, R^2, the worst
under-pricing and the shape, the coefficients, and whether the fit publishes at the default
thresholds (10 % held out, 5 % under-priced). Then a held-out *family*: shapes the sweep never
measured for the fit, halfway (geometrically) between the grid's inputs and between its outputs
(2,048/512-token grid: 45, 256 and 1,024 in x 4, 45 and 256 out), swept the same way and priced
by the grid's fit: its MAPE and its worst under-pricing. The virtual clock makes the figures the
same on a busy machine as on a quiet one. --smoke: tiny-test, seed 0, in a second or two.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import math

from capacity.benchmark.config import SweepConfig, grid_for_context, on_virtual_clock
from capacity.benchmark.drivers import SimulatedDriver
from capacity.benchmark.results import SweepResult
from capacity.benchmark.sweep import sweep
from capacity.units import MU_PER_REPLICA_MINUTE
from engine_model.profiles import PROFILES


def family(grid: tuple[tuple[int, int], ...], max_model_len: int) -> tuple[tuple[int, int], ...]:
    """The shapes halfway between the grid's neighbouring inputs and outputs, within the context."""
    inputs = sorted({i for i, _ in grid})
    outputs = sorted({o for _, o in grid})

    def mids(values: list[int]) -> list[int]:
        return [round(math.sqrt(a * b)) for a, b in itertools.pairwise(values)]

    return tuple((i, o) for i in mids(inputs) for o in mids(outputs) if i + o <= max_model_len)


def measured(name: str, seed: int, shapes: tuple[tuple[int, int], ...] | None = None) -> SweepResult:
    driver = SimulatedDriver(PROFILES[name], seed=seed)
    config = on_virtual_clock(
        SweepConfig(seed=seed, **({"shapes": shapes} if shapes else {}))
    )  # as run_benchmark's
    return asyncio.run(sweep(driver, config, clock=lambda d=driver: d.elapsed_s))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("profiles", nargs="*")
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--smoke", action="store_true", help="tiny sizes, seconds: tiny-test, seed 0")
    args = parser.parse_args()
    if args.smoke:  # again, with these as the defaults (an explicit argument still wins)
        parser.set_defaults(profiles=["tiny-test"], seeds="0")
        args = parser.parse_args()
    for name in args.profiles or sorted(PROFILES):
        profile = PROFILES[name]
        unseen = family(grid_for_context(profile.max_model_len), profile.max_model_len)
        for seed in (int(s) for s in args.seeds.split(",")):
            fitted = measured(name, seed).fit()
            ok, why = fitted.verdict(0.10, 0.05)
            worst, shape = fitted.worst_underprice
            errors = {
                s.shape: fitted.predict(*s.shape) / s.measurement().cost(MU_PER_REPLICA_MINUTE) - 1
                for s in measured(name, seed, unseen).shapes
                if s.sustainable_per_minute > 0
            }
            family_worst = min(errors, key=lambda s: errors[s])
            print(
                f"{name:18} seed {seed}  held-out {fitted.heldout_mape:5.1%}  R^2 {fitted.r2:.4f}"
                f"  worst {worst:+.1%} at {shape}"
                f"  | family of {len(errors)}: MAPE {sum(map(abs, errors.values())) / len(errors):5.1%}"
                f" worst {errors[family_worst]:+.1%} at {family_worst}"
                f"  | alpha {fitted.alpha:.3g} beta {fitted.beta:.3g} gamma {fitted.gamma:.3g}"
                f" rho {fitted.rho:.3g} kappa {fitted.kappa:.3g}  {'published' if ok else 'REFUSED: ' + why}"
            )


if __name__ == "__main__":
    main()
