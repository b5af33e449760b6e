"""`make run`'s script (scripts/run-local.sh) as a new user meets it: a quiet terminal that says
where everything is, and SIGTERM to whatever started it (make does not pass the signal on)
stops every process of the stack and frees its ports, within a bound.

The stack runs on its own ports and var/ folder (CONTROLPLANE_VAR_DIR), in a process group this
test owns; nothing else on the machine is looked at."""

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterable
from pathlib import Path

import pytest

from tests.runtime.support import free_port

pytestmark = pytest.mark.stack  # the embedded stack (make run)

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


def started_pids(out: Path) -> dict[str, int]:
    """The stack's processes as its terminal named them (each leads a process group of its own)."""
    return {name: int(pid) for name, pid in re.findall(r"started (.+?)\s+pid (\d+)", out.read_text())}


def kill_groups(pids: Iterable[int]) -> None:
    for pid in pids:
        try:
            os.killpg(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


def stack_env(tmp_path: Path) -> tuple[dict[str, int], dict[str, str]]:
    """Free ports of its own and the environment of an embedded stack under tmp_path/var (no
    PostgreSQL or Redis of the suite's: the embedded default)."""
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
    return ports, env


@pytest.fixture
def stack(tmp_path):
    ports, env = stack_env(tmp_path)
    out = tmp_path / "terminal.txt"
    # The parent stands for make: a shell that runs the script and waits for it.
    with out.open("w") as terminal:
        parent = subprocess.Popen(
            ["bash", "-c", "bash scripts/run-local.sh; echo script exit $?; echo parent-finished"],
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
        kill_groups(started_pids(out).values())  # restarted ones too: every "started" line


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
    assert sum(line.startswith("  started ") for line in terminal) == 5, terminal
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
    assert not [pid for pid in started_pids(out).values() if group_alive(pid)], out.read_text()
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


FATAL = re.compile(r"Unrecoverable error|JSONDecodeError")
# The contract is 90 s of streamed load; the suite runs a shorter stretch of it (STACK_LOAD_S=90
# runs the contract's own).
LOAD_S = int(os.environ.get("STACK_LOAD_S", "30"))


def wait_until_up(parent: subprocess.Popen[bytes], out: Path) -> dict[str, int]:
    deadline = time.monotonic() + START_BOUND_S
    while "Stop: Ctrl-C" not in out.read_text():
        assert parent.poll() is None, out.read_text()
        assert time.monotonic() < deadline, f"not up in {START_BOUND_S} s:\n{out.read_text()}"
        time.sleep(0.5)
    return started_pids(out)


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_streamed_load_at_16_clients_leaves_every_process_alive_and_no_fatal_broker_error(stack):
    parent, ports, out, var = stack
    pids = wait_until_up(parent, out)
    assert list(pids) == ["redis", "celery", "cluster agent", "router", "control plane"], pids
    router = f"http://127.0.0.1:{ports['ROUTER_PORT']}"
    deadline = time.monotonic() + 60  # the router answers once it has its first routing table
    while not listening(ports["ROUTER_PORT"]):
        assert time.monotonic() < deadline, out.read_text()
        time.sleep(0.5)
    load = subprocess.run(
        [sys.executable, "-m", "dataplane.loadgen", "--url", router,
         "--key-file", str(var / "keys" / "acme.key"), "--model", "summarize", "--stream",
         "--stages", f"{LOAD_S}x16"],
        cwd=ROOT, capture_output=True, text=True, timeout=LOAD_S + 120,
    )  # fmt: skip
    assert load.returncode == 0, load.stdout + load.stderr
    print(load.stdout.strip().splitlines()[-1])  # the load's total line: what the run carried
    terminal = out.read_text()
    assert " exited with code " not in terminal, terminal
    assert {name: alive(pid) for name, pid in pids.items()} == dict.fromkeys(pids, True), terminal
    fatal = [f"{log.name}: {line}" for log in var.glob("*.log") for line in log.read_text().splitlines()
             if FATAL.search(line)]  # fmt: skip
    assert not fatal


def test_a_killed_process_is_started_again_and_on_call_gets_its_log_then_ctrl_c_stops_cleanly(stack):
    parent, ports, out, var = stack
    pids = wait_until_up(parent, out)
    deadline = time.monotonic() + 60
    while "ready." not in (var / "celery.log").read_text():  # a log with lines to show
        assert time.monotonic() < deadline, (var / "celery.log").read_text()
        time.sleep(0.2)
    os.kill(pids["celery"], signal.SIGKILL)
    deadline = time.monotonic() + 30
    while "restarted celery" not in out.read_text():
        assert time.monotonic() < deadline, out.read_text()
        time.sleep(0.2)
    terminal = out.read_text()
    assert f"celery (pid {pids['celery']}) exited with code -9" in terminal
    assert "The end of" in terminal and "celery.log" in terminal
    restarted = started_pids(out)["celery"]
    assert restarted != pids["celery"] and alive(restarted)
    # On-call sees it, through the API as the console's page reads it: the process and its log.
    key = (var / "keys" / "operator.key").read_text().strip()
    deadline = time.monotonic() + 60
    events: list[dict[str, object]] = []
    while not events:
        assert time.monotonic() < deadline, out.read_text()
        request = urllib.request.Request(
            f"http://127.0.0.1:{ports['CP_PORT']}/api/v1/events/?kind=restart",
            headers={"Authorization": f"Bearer {key}"},
        )
        try:
            with urllib.request.urlopen(request, timeout=10) as resp:
                events = json.load(resp)["results"]
        except urllib.error.URLError:
            pass  # the control plane is still starting: it listens after the terminal's last line
        time.sleep(0.5)
    (event,) = events
    assert event["pod"] == "stack-celery" and event["severity"] == "warning", event
    assert "killed by signal 9" in str(event["message"])
    detail = event["detail"]
    assert isinstance(detail, dict) and detail["log_tail"] and "celery" in detail["log"], detail

    # Ctrl-C: SIGINT to the terminal's process group (make's, here the parent's).
    stop_from = len(out.read_text())
    os.killpg(parent.pid, signal.SIGINT)
    parent.wait(timeout=STOP_BOUND_S)
    after = out.read_text()[stop_from:]
    assert "Stopped." in after and "script exit 0" in after, after
    assert " exited with code " not in after and "The end of" not in after, after
    assert not [pid for pid in started_pids(out).values() if group_alive(pid)]


def test_a_stop_once_the_terminal_is_gone_still_stops_every_process(tmp_path):
    """The terminal closed (its window, an ssh session), then the stop that follows (the shell's
    SIGHUP, here SIGTERM): writing "Stopping..." fails (EIO), and the stop goes on: no process of
    the stack is left running, holding its ports."""
    import pty

    ports, env = stack_env(tmp_path)
    master, slave = pty.openpty()
    script = subprocess.Popen(
        ["bash", "scripts/run-local.sh"],
        cwd=ROOT,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=slave,
        stderr=slave,
        start_new_session=True,
    )
    os.close(slave)
    seen = b""
    try:
        deadline = time.monotonic() + START_BOUND_S
        while b"Stop: Ctrl-C." not in seen:
            assert time.monotonic() < deadline and script.poll() is None, seen.decode(errors="replace")
            seen += os.read(master, 65536)
        os.close(master)  # the terminal is gone
        master = -1
        script.send_signal(signal.SIGTERM)
        script.wait(timeout=STOP_BOUND_S)
        started = [int(pid) for pid in re.findall(rb"started .+?\s+pid (\d+)", seen)]
        deadline = time.monotonic() + STOP_BOUND_S
        while [pid for pid in started if group_alive(pid)]:
            assert time.monotonic() < deadline, [pid for pid in started if group_alive(pid)]
            time.sleep(0.2)
        assert not [p for p in ports.values() if listening(p)]
    finally:
        if master >= 0:
            os.close(master)
        if script.poll() is None:
            os.killpg(script.pid, signal.SIGKILL)
            script.wait(timeout=10)
        kill_groups(int(pid) for pid in re.findall(rb"started .+?\s+pid (\d+)", seen))
