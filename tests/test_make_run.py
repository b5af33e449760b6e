"""`make run`'s script (scripts/run-local.sh) as a new user meets it: a quiet terminal that says
where everything is, and SIGTERM to whatever started it (make does not pass the signal on)
stops every process of the stack and frees its ports, within a bound.

The stack runs on its own ports and var/ folder (CONTROLPLANE_VAR_DIR), in a process group this
test owns; nothing else on the machine is looked at."""

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.runtime.support import free_port

ROOT = Path(__file__).resolve().parents[1]
START_BOUND_S = 150  # migrations and the demo fleet on SQLite, on a busy 2-core machine
STOP_BOUND_S = 40  # the agent drains its pods; the script waits for every child


def listening(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.fixture
def stack(tmp_path):
    ports = {"CP_PORT": free_port(), "ROUTER_PORT": free_port(), "AGENT_PORT": free_port()}
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("DATABASE_URL", "REDIS_URL", "DJANGO_SETTINGS_MODULE")
    }
    env.update(
        {k: str(v) for k, v in ports.items()},
        CONTROLPLANE_VAR_DIR=str(tmp_path / "var"),
        WARM_POOL="0",
        BIN=str(Path(sys.executable).parent),
    )
    out = tmp_path / "terminal.txt"
    # The parent stands for make: a shell that runs the script and waits for it.
    with out.open("w") as terminal:
        parent = subprocess.Popen(
            ["bash", "-c", "bash scripts/run-local.sh; echo parent-finished"],
            cwd=ROOT,
            env=env,
            stdout=terminal,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own process group: the test's to signal and to check
        )
    try:
        yield parent, ports, out, tmp_path / "var"
    finally:
        if group_alive(parent.pid):
            os.killpg(parent.pid, signal.SIGKILL)
        parent.wait(timeout=10)


def test_sigterm_to_the_parent_stops_the_whole_stack_and_frees_its_ports(stack):
    parent, ports, out, var = stack
    deadline = time.monotonic() + START_BOUND_S
    while not all(listening(p) for p in ports.values()):
        assert parent.poll() is None, out.read_text()
        assert time.monotonic() < deadline, f"not up in {START_BOUND_S} s:\n{out.read_text()}"
        time.sleep(0.5)
    while "Drive traffic" not in out.read_text():
        assert time.monotonic() < deadline, out.read_text()
        time.sleep(0.2)
    terminal = out.read_text().splitlines()
    # One line per process, the URLs and the keys; no access line (they go to the log).
    assert sum(line.startswith("  started ") for line in terminal) == 4, terminal
    assert f"API keys: {var}/keys/" in "\n".join(terminal)
    assert f"http://127.0.0.1:{ports['CP_PORT']}/console/" in "\n".join(terminal)
    assert not [line for line in terminal if '"GET ' in line or '"POST ' in line], terminal
    assert (var / "keys" / "operator.key").stat().st_mode & 0o077 == 0

    parent.send_signal(signal.SIGTERM)  # to make alone, as `kill <make's pid>` does
    deadline = time.monotonic() + STOP_BOUND_S
    while parent.poll() is None or group_alive(parent.pid):  # poll() reaps the parent itself
        assert time.monotonic() < deadline, subprocess.run(
            ["ps", "-o", "pid,cmd", "-g", str(parent.pid)], capture_output=True, text=True
        ).stdout
        time.sleep(0.2)
    assert not [p for p in ports.values() if listening(p)]
    assert "Stopped." in out.read_text()


def test_a_run_keeps_the_last_runs_logs(tmp_path):
    for run in range(1, 8):
        (tmp_path / "pods").mkdir(exist_ok=True)
        (tmp_path / "pods" / "ep-1-v1-a.log").write_text(f"pod of run {run}")
        (tmp_path / "router.log").write_text(f"run {run}")
        subprocess.run(["bash", "scripts/rotate-logs.sh", str(tmp_path)], cwd=ROOT, check=True, timeout=10)
    # Seven runs rotated: the last five kept, newest first; the pods' folder the same way.
    assert [(tmp_path / f"router.log.{i}").read_text() for i in range(1, 6)] == [
        f"run {r}" for r in (7, 6, 5, 4, 3)
    ]
    assert not (tmp_path / "router.log").exists() and not (tmp_path / "router.log.6").exists()
    assert (tmp_path / "pods.1" / "ep-1-v1-a.log").read_text() == "pod of run 7"
    assert not (tmp_path / "pods.6").exists()
