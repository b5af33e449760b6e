"""The embedded stack's processes, started in order and kept up: what scripts/run-local.sh execs.

Redis first (the Celery broker, the routers' shared limiter and metering, on a unix socket under
var/ that only this user can open), then the Celery worker with beat, the cluster agent, the router
and the control plane. The terminal gets one line per process started. A process that dies is
started again after controlplane.localstack.backoff's wait, its log's end is printed, and an
on-call event (`manage.py record_stack_event`, written straight to the database, so it is
recorded while the control plane itself is down) carries the same lines. Ctrl-C, SIGTERM or
SIGHUP, or the parent (make, a shell) going away, stop every process; a requested stop prints
"Stopped." and exits 0 (make prints no error), with no log shown.

    python -m controlplane.localstack.supervisor --bin .venv/bin --var var --parent PID \\
        --cp-port 8000 --router-port 8080 --agent-port 8700 --warm-pool 2
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any, TextIO

from controlplane.localstack.backoff import Policy, after_death

TAIL_LINES = 15
POLL_S = 0.5
STOP_GRACE_S = 30.0  # the agent stops its pods before it exits
SOCKET_PATH_MAX = 100  # a unix socket's path must fit sockaddr_un (108 bytes with its NUL)


@dataclass
class Process:
    name: str  # as the terminal and the on-call event name it
    log: Path
    argv: list[str]
    url: str = ""
    popen: subprocess.Popen[bytes] | None = None
    started_at: float = 0.0
    quick_deaths: int = 0
    restarts: int = 0
    restart_at: float | None = None  # monotonic; None while it runs
    extra: dict[str, str] = field(default_factory=dict)


def redis_socket(var: Path) -> Path:
    return var / "redis.sock"


def stack(args: argparse.Namespace) -> list[Process]:
    var, py = Path(args.var), str(Path(args.bin) / "python")
    cp = f"http://127.0.0.1:{args.cp_port}"
    redis_url = f"unix://{redis_socket(var)}"
    return [
        # No TCP port: only this user reaches it (the socket is 0600 in a 0700 var/). The broker's
        # messages survive a restart of Redis in its append-only file (fsync once a second).
        Process(
            "redis",
            var / "redis.log",
            [
                args.redis_server,
                "--port",
                "0",
                "--unixsocket",
                str(redis_socket(var)),
                "--unixsocketperm",
                "600",
                "--dir",
                str(var / "redis"),
                "--save",
                "",
                "--appendonly",
                "yes",
                "--appendfsync",
                "everysec",
                "--daemonize",
                "no",
            ],
        ),
        Process(
            "celery",
            var / "celery.log",
            [
                str(Path(args.bin) / "celery"),
                "-A",
                "controlplane",
                "worker",
                "--beat",
                "--pool=threads",
                "--concurrency=4",
                "--loglevel=INFO",
                f"--schedule={var / 'celerybeat-schedule'}",
            ],
        ),
        Process(
            "cluster agent",
            var / "agent.log",
            [
                py,
                "-m",
                "dataplane.cluster.agent",
                "--listen",
                f"127.0.0.1:{args.agent_port}",
                "--log-dir",
                str(var / "pods"),
                "--warm-pool",
                str(args.warm_pool),
                "--control-plane",
                cp,
                "--key-file",
                args.key_file,
                "--token-file",
                args.agent_token_file,
                "--pod-key-file",
                args.pod_key_file,
                *(("--vllm-python", args.vllm_python) if args.vllm_python else ()),
            ],
            url=f"http://127.0.0.1:{args.agent_port}",
        ),
        # Its metered seconds wait in var/router-spool/ until Redis takes them; leases of the
        # shared limiter live in Redis too, as in production.
        Process(
            "router",
            var / "router.log",
            [
                py,
                "-m",
                "dataplane.router",
                "--listen",
                f"127.0.0.1:{args.router_port}",
                "--spool-dir",
                str(var / "router-spool"),
                "--control-plane",
                cp,
                "--key-file",
                args.key_file,
                "--pod-key-file",
                args.pod_key_file,
                "--redis",
                redis_url,
                "--log-level",
                "info",
            ],
            url=f"http://127.0.0.1:{args.router_port}",
        ),
        Process(
            "control plane",
            var / "controlplane.log",
            [py, "manage.py", "runserver", f"127.0.0.1:{args.cp_port}", "--noreload"],
            url=cp,
        ),
    ]


class Supervisor:
    def __init__(self, args: argparse.Namespace, processes: list[Process], policy: Policy) -> None:
        self.args = args
        self.processes = processes
        self.policy = policy
        self.stop_requested = False
        self.env = {
            **os.environ,
            "REDIS_URL": f"unix://{redis_socket(Path(args.var))}",
            "CLUSTER_AGENT_URL": f"http://127.0.0.1:{args.agent_port}",  # the worker's passes reach it
        }
        self.recorders: list[threading.Thread] = []

    def request_stop(self, signum: int, frame: FrameType | None) -> None:
        self.stop_requested = True

    def start(self, p: Process, restarted: bool) -> None:
        with p.log.open("ab" if restarted else "wb") as log:
            if restarted:
                log.write(f"--- started again by the stack's supervisor ({time.ctime()})\n".encode())
            # Its own process group: what it leaves behind when it dies (the worker's beat, the
            # agent's pods) goes with it, and Ctrl-C reaches the supervisor alone, which stops
            # the processes in order.
            p.popen = subprocess.Popen(
                p.argv, stdout=log, stderr=subprocess.STDOUT, env=self.env, process_group=0
            )
        p.started_at, p.restart_at = time.monotonic(), None
        if restarted:
            print(f"  restarted {p.name:<14} pid {p.popen.pid:<7} (restart {p.restarts})", flush=True)
        else:
            url = f"{p.url}  " if p.url else ""
            print(f"  started {p.name:<14} pid {p.popen.pid:<7} {url}log {p.log}", flush=True)

    def died(self, p: Process, code: int, now: float) -> None:
        """A death nobody asked for: its log's end to the terminal and to on-call, a restart due."""
        assert p.popen is not None
        kill_group(p.popen.pid)
        ran_s = now - p.started_at
        decision = after_death(self.policy, p.quick_deaths, ran_s)
        p.quick_deaths, p.restarts = decision.quick_deaths, p.restarts + 1
        p.restart_at = now + decision.delay_s
        tail = log_tail(p.log, TAIL_LINES)
        print(
            f"{p.name} (pid {p.popen.pid}) exited with code {code} after {ran_s:.0f} s; "
            f"starting it again in {decision.delay_s:.0f} s. The end of {p.log}:",
            file=sys.stderr,
        )
        for line in tail:
            print(f"    {line}", file=sys.stderr)
        sys.stderr.flush()
        argv = [
            str(Path(self.args.bin) / "python"), "manage.py", "record_stack_event", p.name,
            "--exit-code", str(code), "--ran-s", f"{ran_s:.1f}", "--restart-in-s", f"{decision.delay_s:.1f}",
            "--restarts", str(p.restarts), "--log", str(p.log),
        ]  # fmt: skip
        if decision.crash_loop:
            argv.append("--crash-loop")
        recorder = threading.Thread(target=self.record, args=(argv, "\n".join(tail)), daemon=True)
        recorder.start()
        self.recorders.append(recorder)

    def record(self, argv: list[str], tail: str) -> None:
        """The on-call event, from its own process: Django and SQLite stay out of this one."""
        try:
            done = subprocess.run(argv, input=tail.encode(), capture_output=True, env=self.env, timeout=120)
            ok = done.returncode == 0
            why = done.stderr.decode(errors="replace").strip().splitlines()[-1:] if not ok else []
        except (OSError, subprocess.TimeoutExpired) as e:
            ok, why = False, [str(e)]
        if not ok:
            print(f"could not record the on-call event ({' '.join(why)})", file=sys.stderr, flush=True)

    def orphaned(self) -> bool:
        # Our parent exited and we were handed to init (or a subreaper): make passes no SIGTERM on.
        return os.getppid() != int(self.args.parent)

    def run(self) -> int:
        for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            signal.signal(signum, self.request_stop)
        redis, *rest = self.processes
        self.start(redis, restarted=False)
        wait_for_socket(redis_socket(Path(self.args.var)), redis, 10.0)
        for p in rest:
            if self.stop_requested:
                break
            self.start(p, restarted=False)
        if not self.stop_requested:
            self.banner()
        while not (self.stop_requested or self.orphaned()):
            now = time.monotonic()
            for p in self.processes:
                if self.stop_requested:
                    break
                if p.restart_at is not None:
                    if now >= p.restart_at:
                        self.start(p, restarted=True)
                elif p.popen is not None and (code := p.popen.poll()) is not None:
                    self.died(p, code, now)
            time.sleep(POLL_S)
        self.stop()
        return 0

    def banner(self) -> None:
        cp = f"http://127.0.0.1:{self.args.cp_port}"
        keys = " ".join(  # the fleet key is no API key
            sorted(k.name for k in (Path(self.args.var) / "keys").glob("*.key") if k.name != "fleet.key")
        )
        print(f"Console:  {cp}/console/   (users: README.md, 'The console')")
        print(f"API:      {cp}/api/v1/    (docs {cp}/api/docs/)")
        print(f"Router:   http://127.0.0.1:{self.args.router_port}/v1/   (OpenAI-compatible)")
        print(f"API keys: {Path(self.args.var) / 'keys'}/   ({keys})")
        print("Drive traffic from another shell: make load. Stop: Ctrl-C.", flush=True)

    def stop(self) -> None:
        for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            signal.signal(signum, signal.SIG_IGN)  # a second Ctrl-C does not cut the agent's drain
        running = [p for p in self.processes if p.popen is not None and p.popen.poll() is None]
        print(f"Stopping the stack ({len(running)} processes; the agent stops its pods)...", flush=True)
        # Redis last: the others flush what they hold (the router its metered seconds) into it.
        for group in (running[1:] if running and running[0].name == "redis" else running, running[:1]):
            for p in group:
                if p.popen is not None and p.popen.poll() is None:
                    p.popen.terminate()
            deadline = time.monotonic() + STOP_GRACE_S
            for p in group:
                if p.popen is None:
                    continue
                try:
                    p.popen.wait(timeout=max(0.1, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    p.popen.kill()
                    p.popen.wait()
                kill_group(p.popen.pid)
        for recorder in self.recorders:
            recorder.join(timeout=5)
        print(f"Stopped. Logs: {self.args.var}/*.log (the previous run's: *.log.1)", flush=True)


def kill_group(pgid: int, bound_s: float = 5.0) -> None:
    """What is left of a process group whose leader has exited: no stray beat or pod stays. Waits
    (up to ``bound_s``) until the group is gone, so that "Stopped." means every port is free."""
    deadline = time.monotonic() + bound_s
    try:
        os.killpg(pgid, signal.SIGKILL)
        while time.monotonic() < deadline:
            time.sleep(0.05)
            os.killpg(pgid, 0)  # ProcessLookupError once the last of them has been reaped
    except (ProcessLookupError, PermissionError):
        pass


def log_tail(path: Path, lines: int) -> list[str]:
    try:
        with path.open("rb") as f:
            f.seek(max(0, f.seek(0, os.SEEK_END) - 64 * 1024))
            return [line.decode(errors="replace").rstrip() for line in deque(f, maxlen=lines)]
    except OSError:
        return []


def wait_for_socket(path: Path, redis: Process, timeout_s: float) -> None:
    """Until Redis answers on its socket (the others connect at start), or it died or is late."""
    import redis as client

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if redis.popen is not None and redis.popen.poll() is not None:
            return  # the loop restarts it; the others retry their connections
        try:
            client.Redis(unix_socket_path=str(path), socket_timeout=1).ping()
            return
        except (client.ConnectionError, client.TimeoutError, OSError):
            time.sleep(0.05)


class Terminal:
    """Our terminal's stream, whose writes are dropped once the terminal is gone (closed: EIO; a
    pipe whose reader left: EPIPE). The stop that follows a closed terminal then stops the stack
    rather than dying of its "Stopping..." line and leaving every process running."""

    def __init__(self, stream: TextIO) -> None:
        self.stream = stream

    def write(self, text: str) -> int:
        try:
            return self.stream.write(text)
        except OSError:
            return len(text)

    def flush(self) -> None:
        try:
            self.stream.flush()
        except OSError:
            pass

    def __getattr__(self, name: str) -> Any:
        return getattr(self.stream, name)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bin", required=True, help="the venv's bin/ (python, celery)")
    ap.add_argument("--var", required=True, help="CONTROLPLANE_VAR_DIR: logs, database, Redis socket")
    ap.add_argument("--parent", type=int, required=True, help="pid of whoever started the stack")
    ap.add_argument("--key-file", required=True, help="the operator key for the agent and router")
    ap.add_argument("--agent-token-file", required=True, help="the token every call to the agent carries")
    ap.add_argument("--pod-key-file", required=True, help="the fleet key pods answer to")
    ap.add_argument("--vllm-python", default=None, help="interpreter of vllm pods (default: the agent's)")
    ap.add_argument("--cp-port", type=int, default=8000, help="the control plane's port")
    ap.add_argument("--router-port", type=int, default=8080, help="the router's port")
    ap.add_argument("--agent-port", type=int, default=8700, help="the cluster agent's port")
    ap.add_argument("--warm-pool", type=int, default=2, help="pre-started pods the agent keeps ready")
    ap.add_argument("--redis-server", default="redis-server", help="Debian's redis-server")
    args = ap.parse_args(argv)
    sys.stdout, sys.stderr = Terminal(sys.stdout), Terminal(sys.stderr)
    sock = redis_socket(Path(args.var))
    if len(str(sock)) > SOCKET_PATH_MAX:
        ap.error(f"--var: {sock} is too long for a unix socket (at most {SOCKET_PATH_MAX} characters)")
    (Path(args.var) / "redis").mkdir(mode=0o700, exist_ok=True)
    return Supervisor(args, stack(args), Policy()).run()


if __name__ == "__main__":
    sys.exit(main())
