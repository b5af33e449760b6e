"""The container's CPU limit, from cgroup files, so thread pools match it (not the host's cores).

A pod limited to 2 CPUs on a 96-core host that starts 96 OpenMP threads is throttled for most
of every scheduling period; size pools from the quota instead. The cgroup root is a parameter
so tests read fixture files.

* cgroup v2: ``<root>/cpu.max`` holds "quota period" ("200000 100000" -> 2.0 CPUs) or
  "max period" (no limit).
* cgroup v1: ``cpu.cfs_quota_us`` / ``cpu.cfs_period_us`` (quota -1 = no limit), in
  ``<root>/cpu``, ``<root>/cpu,cpuacct`` or ``<root>`` itself.
* No limit: the CPUs this process may run on (``os.sched_getaffinity``).
"""

from __future__ import annotations

import math
import os
from pathlib import Path

DEFAULT_ROOT = Path("/sys/fs/cgroup")


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None


def cpu_quota(root: Path = DEFAULT_ROOT) -> float | None:
    """CPUs allowed by the cgroup quota (may be fractional); None when unlimited or unknown."""
    v2 = _read(root / "cpu.max")
    if v2 is not None:
        parts = v2.split()
        if len(parts) == 2 and parts[0] != "max":
            try:
                quota, period = int(parts[0]), int(parts[1])
            except ValueError:
                return None
            return quota / period if quota > 0 and period > 0 else None
        return None
    for directory in (root / "cpu", root / "cpu,cpuacct", root):
        quota_s = _read(directory / "cpu.cfs_quota_us")
        period_s = _read(directory / "cpu.cfs_period_us")
        if quota_s is None or period_s is None:
            continue
        try:
            quota, period = int(quota_s), int(period_s)
        except ValueError:
            return None
        return quota / period if quota > 0 and period > 0 else None
    return None


def affinity_cpus() -> int:
    return len(os.sched_getaffinity(0))


def cpu_threads(root: Path = DEFAULT_ROOT, affinity: int | None = None) -> int:
    """Threads to run compute pools with: floor(quota), at least 1, at most the affinity set.

    Floor, not ceil: 1.5 CPUs with 2 busy threads is throttled 25 % of every period, which
    costs more than leaving half a CPU for the server's own threads.
    """
    allowed = affinity if affinity is not None else affinity_cpus()
    quota = cpu_quota(root)
    if quota is None:
        return max(1, allowed)
    return max(1, min(allowed, math.floor(quota)))


THREAD_ENV_VARS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")


def thread_env(threads: int) -> dict[str, str]:
    """Environment that sizes OpenMP/MKL/BLAS pools; torch takes its intra-op thread count
    from OMP_NUM_THREADS at start-up."""
    return {name: str(threads) for name in THREAD_ENV_VARS}
