"""Fit every simulated profile on the virtual clock and print its figures (SIMULATED).

    PYTHONPATH=. python bench/simulated_profile_fits.py [--seeds 0,1,2] [PROFILE ...]

Per profile and seed (the open loop's Poisson arrivals): held-out MAPE, R^2, the worst
under-pricing and the shape, the coefficients, and whether the fit publishes at the default
thresholds (10 % held out, 5 % under-priced). The virtual clock makes the figures the same on a
busy machine as on a quiet one.
"""

from __future__ import annotations

import argparse
import asyncio

from capacity.benchmark.config import SweepConfig, on_virtual_clock
from capacity.benchmark.drivers import SimulatedDriver
from capacity.benchmark.sweep import sweep
from dataplane.runtime.profiles import PROFILES


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("profiles", nargs="*")
    parser.add_argument("--seeds", default="0,1,2")
    args = parser.parse_args()
    for name in args.profiles or sorted(PROFILES):
        for seed in (int(s) for s in args.seeds.split(",")):
            driver = SimulatedDriver(PROFILES[name], seed=seed)
            config = on_virtual_clock(SweepConfig(seed=seed))  # as run_benchmark's
            result = asyncio.run(sweep(driver, config, clock=lambda d=driver: d.elapsed_s))
            fitted = result.fit()
            ok, why = fitted.verdict(0.10, 0.05)
            worst, shape = fitted.worst_underprice
            print(
                f"{name:18} seed {seed}  held-out {fitted.heldout_mape:6.1%}  R^2 {fitted.r2:.4f}"
                f"  worst {worst:+.1%} at {shape}"
                f"  alpha {fitted.alpha:.3g} beta {fitted.beta:.3g} gamma {fitted.gamma:.3g}"
                f" rho {fitted.rho:.3g} kappa {fitted.kappa:.3g}  {'published' if ok else 'REFUSED: ' + why}"
            )


if __name__ == "__main__":
    main()
