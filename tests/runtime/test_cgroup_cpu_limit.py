"""Thread counts come from the container's CPU limit (cgroup fixtures), not the host's cores."""

from __future__ import annotations

from pathlib import Path

import pytest

from dataplane.runtime import cgroup
from dataplane.runtime.launcher import engine_env


def v2(tmp_path: Path, cpu_max: str) -> Path:
    (tmp_path / "cpu.max").write_text(cpu_max + "\n")
    return tmp_path


def v1(tmp_path: Path, quota: str, period: str = "100000") -> Path:
    (tmp_path / "cpu").mkdir()
    (tmp_path / "cpu" / "cpu.cfs_quota_us").write_text(quota + "\n")
    (tmp_path / "cpu" / "cpu.cfs_period_us").write_text(period + "\n")
    return tmp_path


def test_cgroup_v2_quota_gives_the_thread_count(tmp_path: Path) -> None:
    root = v2(tmp_path, "200000 100000")  # 2 CPUs on a host that has 64
    assert cgroup.cpu_quota(root) == 2.0
    assert cgroup.cpu_threads(root, affinity=64) == 2
    env = engine_env({"PATH": "/bin", "OMP_NUM_THREADS": "64"}, root, affinity=64, reserved_cpus=0)
    assert env["OMP_NUM_THREADS"] == env["MKL_NUM_THREADS"] == "2"  # host value overridden
    assert env["PATH"] == "/bin"


def test_engine_env_leaves_a_cpu_for_the_server_by_default(tmp_path: Path) -> None:
    # 2 CPUs: 1 OpenMP thread, 1 CPU for vLLM's API server and engine core; never below 1.
    assert engine_env({}, v2(tmp_path, "200000 100000"), affinity=64)["OMP_NUM_THREADS"] == "1"
    assert engine_env({}, tmp_path, affinity=1)["OMP_NUM_THREADS"] == "1"


def test_cgroup_v2_unlimited_falls_back_to_affinity(tmp_path: Path) -> None:
    root = v2(tmp_path, "max 100000")
    assert cgroup.cpu_quota(root) is None
    assert cgroup.cpu_threads(root, affinity=6) == 6
    assert cgroup.cpu_threads(root) == cgroup.affinity_cpus()  # the real sched_getaffinity


@pytest.mark.parametrize(
    ("cpu_max", "threads"),
    [
        ("150000 100000", 1),  # 1.5 CPUs -> floor 1: two busy threads would be throttled 25 %
        ("50000 100000", 1),  # half a CPU -> still one thread
        ("800000 100000", 4),  # 8 CPUs of quota but only 4 CPUs in the affinity set
    ],
)
def test_fractional_and_capped_quotas(tmp_path: Path, cpu_max: str, threads: int) -> None:
    assert cgroup.cpu_threads(v2(tmp_path, cpu_max), affinity=4) == threads


def test_cgroup_v1_files(tmp_path: Path) -> None:
    assert cgroup.cpu_threads(v1(tmp_path, "300000"), affinity=32) == 3


def test_cgroup_v1_unlimited(tmp_path: Path) -> None:
    assert cgroup.cpu_quota(v1(tmp_path, "-1")) is None
    assert cgroup.cpu_threads(tmp_path, affinity=5) == 5


def test_no_cgroup_files_falls_back_to_affinity(tmp_path: Path) -> None:
    assert cgroup.cpu_quota(tmp_path) is None
    assert cgroup.cpu_threads(tmp_path, affinity=3) == 3
