"""A warm process on its own: it tells when it has imported, leaves quietly (with its engine
interpreter) when stdin closes unassigned, and tolerates a missing vllm. Plus the pure rules
that decide what a warm interpreter may run."""

from __future__ import annotations

import os
import select
import subprocess
import sys

import pytest

from dataplane.runtime.warm import Assignment, engine_call, env_fits
from tests.runtime.support import child_pids, pid_alive, wait_until


def start_warm(engine: str) -> tuple[subprocess.Popen[bytes], int]:
    """A warm process and the read end of its ready pipe."""
    ready_r, ready_w = os.pipe()
    proc = subprocess.Popen(
        [sys.executable, "-m", "dataplane.runtime.warm", "--engine", engine, "--ready-fd", str(ready_w)],
        stdin=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        pass_fds=(ready_w,),
        start_new_session=True,
    )
    os.close(ready_w)
    return proc, ready_r


def read_ready(ready_r: int, timeout: float) -> bytes:
    readable, _, _ = select.select([ready_r], [], [], timeout)
    assert readable, f"not ready within {timeout} s"
    return os.read(ready_r, 1)


@pytest.mark.stack
@pytest.mark.parametrize("engine", ["sim", "vllm"])  # vllm is not installed here: tolerated
def test_warm_process_whose_stdin_closes_exits_quietly(engine: str) -> None:
    proc, ready_r = start_warm(engine)
    try:
        assert read_ready(ready_r, timeout=20) == b"1"
        [engine_pid] = child_pids(proc.pid)
        assert proc.stdin is not None
        proc.stdin.close()
        assert proc.wait(timeout=10) == 0
        wait_until(lambda: not pid_alive(engine_pid), timeout=10)
    finally:
        os.close(ready_r)
        if proc.poll() is None:
            os.killpg(proc.pid, 9)
            proc.wait(timeout=10)


def test_assignment_round_trips_and_rejects_bad_fields() -> None:
    assignment = Assignment(("--engine", "sim"), {"POD_NAME": "a"}, "/tmp/a.log", None)
    assert Assignment.decode(assignment.encode()) == assignment
    with pytest.raises(ValueError, match="argv"):
        Assignment.decode(b'{"argv": "--engine sim"}')
    with pytest.raises(ValueError, match="env"):
        Assignment.decode(b'{"argv": [], "env": {"A": 1}}')


def test_engine_call_takes_only_python_dash_m_of_the_same_interpreter() -> None:
    py = "/venv/bin/python"
    assert engine_call([py, "-m", "dataplane.runtime.sim", "--port", "1"], py) == (
        "dataplane.runtime.sim",
        ("--port", "1"),
    )
    assert engine_call(["/other-venv/bin/python", "-m", "vllm.x"], py) is None  # another venv
    assert engine_call([py, "script.py"], py) is None


def test_env_fits_what_each_interpreter_read_when_it_started() -> None:
    started = {"PATH": "/bin", "PYTHONHASHSEED": "0", "OMP_NUM_THREADS": "2"}
    # Pod and sim read the environment when they run: only PYTHON*/LD_* must match.
    assert env_fits("sim", started, {**started, "POD_NAME": "a", "OMP_NUM_THREADS": "1"})
    assert not env_fits("pod", started, {**started, "PYTHONHASHSEED": "1"})
    assert not env_fits("sim", started, {**started, "LD_PRELOAD": "x.so"})
    # vLLM's imports read it (torch's thread pool from OMP_NUM_THREADS): all of it must match.
    assert env_fits("vllm", started, dict(started))
    assert not env_fits("vllm", started, {**started, "OMP_NUM_THREADS": "1"})
