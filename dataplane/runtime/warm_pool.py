"""The supervisor's warm pool: processes started and imported ahead of need, each handed a pod.

``warm`` is what runs inside a warm process; this is the side that keeps them. With
``WarmPoolConfig.size`` N > 0 the pool keeps N warm processes of the ``engine`` kind, refilled
by ``refill()`` (the supervisor calls it on ``start()`` and in every check pass). ``take(launch)``
hands a launch of that kind to one (preferring those that have finished importing), so that
neither the pod's nor the engine's interpreter has to start and import: only the model load is
left. A launch of another kind, or one whose environment a warm interpreter cannot honour, and
an empty pool get None: the supervisor starts those cold. ``close()`` ends every waiting one.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from dataplane.runtime.pod_process import (
    PodLaunch,
    kill_group,
    log_path,
    pod_environment,
    start_in_own_session,
)
from dataplane.runtime.restart_policy import RestartPolicy, decide_restart
from dataplane.runtime.warm import ENGINE_KINDS, Assignment, env_fits

# The supervisor's logger: starting, losing and handing out warm processes is what it does, and
# one logger tells the whole story of a local pod.
log = logging.getLogger("dataplane.runtime.supervisor")


@dataclass(frozen=True)
class WarmPoolConfig:
    size: int = 0  # warm processes kept ready for start_pod, >= 0; 0: every start is cold
    engine: str = "sim"  # engine kind of the warm processes: "sim" or "vllm"
    engine_python: str | None = None  # their engine interpreter (vllm's); None: this one
    stop_grace_s: float = 2.0  # close(): warm processes' time to exit before SIGKILL, seconds

    def __post_init__(self) -> None:
        if self.size < 0:
            raise ValueError(f"WarmPoolConfig.size must be >= 0, got {self.size}")
        if self.engine not in ENGINE_KINDS:
            raise ValueError(
                f"WarmPoolConfig.engine must be one of {', '.join(ENGINE_KINDS)}, got {self.engine!r}"
            )
        if self.stop_grace_s < 0:
            raise ValueError(f"WarmPoolConfig.stop_grace_s must be >= 0, got {self.stop_grace_s}")


@dataclass(frozen=True)
class WarmStatus:
    pid: int
    engine: str  # "sim" or "vllm"
    ready: bool  # pod and engine interpreters have imported


@dataclass
class _WarmProcess:
    proc: subprocess.Popen[bytes]  # stdin is a pipe: the assignment goes there
    env: dict[str, str]  # the environment it started with
    ready_r: int | None  # non-blocking read end of its ready pipe; None once read or closed
    ready: bool = False  # it wrote its byte: imported, its engine interpreter too

    def poll_ready(self) -> bool:
        if self.ready_r is not None:
            try:
                got = os.read(self.ready_r, 1)
            except BlockingIOError:
                return False
            self.ready = got == b"1"  # b"": it exited before it was ready
            self.close_ready()
        return self.ready

    def close_ready(self) -> None:
        if self.ready_r is not None:
            os.close(self.ready_r)
            self.ready_r = None

    def ask_to_exit(self) -> None:
        """Close its stdin: it tells its engine interpreter to leave, waits for it and exits."""
        self.close_ready()
        if self.proc.stdin is not None:
            try:
                self.proc.stdin.close()
            except OSError:
                pass

    def discard(self, grace_s: float = 0.0) -> None:
        """Ask it to exit, give it ``grace_s``, then SIGKILL its group: an unassigned warm
        process holds no work. Within the grace both interpreters have gone when this returns
        (the warm process reaps its engine's); after it, the engine's SIGKILL is on its way."""
        self.ask_to_exit()
        if grace_s > 0:
            try:
                self.proc.wait(timeout=grace_s)
            except subprocess.TimeoutExpired:
                pass
        kill_group(self.proc.pid)
        self.proc.wait(timeout=10)


class WarmPool:
    """The warm processes waiting for a pod; safe to call from several threads."""

    def __init__(
        self,
        config: WarmPoolConfig,
        restart_policy: RestartPolicy,  # how deaths of waiting processes back off
        log_dir: str | None,  # warm.log and, once assigned, the pod's own log go here
        clock: Callable[[], float],
    ):
        self.config = config
        self.restart_policy = restart_policy
        self.log_dir = log_dir
        self.clock = clock
        self._lock = threading.Lock()
        self._waiting: list[_WarmProcess] = []
        self._deaths: list[float] = []  # when waiting processes died, clock seconds
        self._refill_at: float | None = None  # no new warm process before this, clock seconds
        self._closed = False  # no more warm processes once close() has begun

    def refill(self) -> None:
        """Replace warm processes that died and start new ones up to ``size``. Deaths back off
        like a pod's restarts (``restart_policy``), so that a pool that cannot start (say an
        ``engine_python`` that is not there) does not respawn on every pass."""
        with self._lock:
            if self._closed:
                return
            now = self.clock()
            for process in list(self._waiting):
                if process.proc.poll() is None:
                    process.poll_ready()
                    continue
                self._waiting.remove(process)
                process.discard()
                decision = decide_restart(self.restart_policy, tuple(self._deaths), now)
                self._deaths = [t for t in self._deaths if now - t <= self.restart_policy.window_s] + [now]
                self._refill_at = now + decision.delay_s
                log.warning(
                    "warm process %d exited with %s; next in %g s",
                    process.proc.pid,
                    process.proc.returncode,
                    decision.delay_s,
                )
            if self._refill_at is not None and now < self._refill_at:
                return
            while len(self._waiting) < self.config.size:
                self._waiting.append(self._spawn())

    def take(self, launch: PodLaunch) -> subprocess.Popen[bytes] | None:
        """Hand ``launch`` to a fitting warm process and return it, now the pod's process; None
        when there is none (or it had died)."""
        if launch.engine != self.config.engine:
            return None
        with self._lock:
            fitting = [
                w
                for w in self._waiting
                if w.proc.poll() is None and env_fits("pod", w.env, {**w.env, **dict(launch.env)})
            ]
            if not fitting:
                return None
            process = next((w for w in fitting if w.poll_ready()), fitting[0])  # else the oldest
            self._waiting.remove(process)
        # Off the list the process is this call's alone: the rest needs no lock.
        process.close_ready()
        assert process.proc.stdin is not None
        assignment = Assignment(
            tuple(launch.pod_args()), dict(launch.env), log_path(self.log_dir, launch.name)
        )
        try:
            process.proc.stdin.write(assignment.encode())
            process.proc.stdin.close()
        except OSError:  # it died since the poll
            log.warning("warm process %d is gone; starting pod %s cold", process.proc.pid, launch.name)
            process.discard()
            return None
        return process.proc

    def waiting(self) -> list[WarmStatus]:
        """The warm processes waiting for a pod (not those already given one)."""
        with self._lock:
            return [
                WarmStatus(w.proc.pid, self.config.engine, w.poll_ready())
                for w in self._waiting
                if w.proc.poll() is None
            ]

    def close(self) -> None:
        """End every waiting process, and start none after."""
        with self._lock:
            self._closed = True
            waiting, self._waiting = self._waiting, []
        for process in waiting:  # all at once: they exit in parallel
            process.ask_to_exit()
        deadline = time.monotonic() + self.config.stop_grace_s
        for process in waiting:
            process.discard(max(0.0, deadline - time.monotonic()))

    def _spawn(self) -> _WarmProcess:
        ready_r, ready_w = os.pipe()
        os.set_blocking(ready_r, False)  # polled by poll_ready, never waited on
        env = pod_environment()  # it becomes a pod: none of our keys
        cmd = [sys.executable, "-m", "dataplane.runtime.warm", "--engine", self.config.engine]
        if self.config.engine_python:
            cmd += ["--engine-python", self.config.engine_python]
        try:
            proc = start_in_own_session(
                [*cmd, "--ready-fd", str(ready_w)],
                env,
                log_path(self.log_dir, "warm"),
                stdin=subprocess.PIPE,
                pass_fds=(ready_w,),
            )
        except BaseException:
            os.close(ready_r)
            raise
        finally:
            os.close(ready_w)
        log.info("warm %s process started, pid %d", self.config.engine, proc.pid)
        return _WarmProcess(proc, env, ready_r)
