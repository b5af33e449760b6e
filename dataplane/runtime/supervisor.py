"""Runs runtime pods as local processes and restarts the ones that hang or die.

The local stand-in for Kubernetes (the autoscaler's local cluster driver uses it):
``start_pod``, ``stop_pod`` (SIGTERM, then SIGKILL of the pod's process group after a grace
period), ``list_pods`` with readiness. A background thread checks every ``check_interval_s``:
a pod whose process exited, or whose ``/livez`` answers 503, is stopped and started again after
the ``restart_policy`` delay, with a ``restart`` event (and ``crash_loop`` when restarts repeat
within the window). Every wait is bounded; ``close()`` stops all pods.

Warm pool: with ``warm_pool`` N > 0 the supervisor keeps N warm processes (``warm``) of the
``warm_engine`` kind, refilled on ``start()`` and by every check pass. ``start_pod`` for a spec of
that kind hands it to one (preferring those that have finished importing), so that neither the
pod's nor the engine's interpreter has to start and import: only the model load is left. Other
specs, an empty pool and restarts start cold; restarts so that a crash-looping pod cannot drain
the pool meant for scale-up. Each pod records whether it started warm and how long it took from
``start_pod`` (or its restart) to the first ``/readyz`` 200, polled every
``ready_poll_interval_s`` by a thread of its own so that the figure does not depend on the
check interval.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field

from dataplane.runtime.events import EventReporter, ReporterConfig
from dataplane.runtime.restart_policy import RestartPolicy, decide_restart
from dataplane.runtime.warm import ENGINE_KINDS, Assignment, env_fits

log = logging.getLogger("dataplane.runtime.supervisor")


@dataclass(frozen=True)
class PodSpec:
    name: str  # unique pod name
    engine: str  # "sim" or "vllm"
    port: int  # engine port
    probe_port: int  # prober's /livez, /readyz port
    args: tuple[str, ...] = ()  # further `python -m dataplane.runtime.pod` arguments
    env: tuple[tuple[str, str], ...] = ()  # extra environment variables
    host: str = "127.0.0.1"  # listen address

    def command(self) -> list[str]:
        return [sys.executable, "-m", "dataplane.runtime.pod", *self.pod_args()]

    def pod_args(self) -> list[str]:
        """The arguments after ``python -m dataplane.runtime.pod``."""
        return [
            "--engine",
            self.engine,
            "--port",
            str(self.port),
            "--probe-port",
            str(self.probe_port),
            "--host",
            self.host,
            "--name",
            self.name,
            *self.args,
        ]


@dataclass(frozen=True)
class SupervisorConfig:
    check_interval_s: float = 2.0  # liveness check period, seconds
    probe_timeout_s: float = 2.0  # one /livez or /readyz request, seconds
    stop_grace_s: float = 30.0  # SIGTERM to SIGKILL, seconds
    restart_policy: RestartPolicy = field(default_factory=RestartPolicy)
    log_dir: str | None = None  # pod stdout/stderr go to <log_dir>/<name>.log; None: inherit
    warm_pool: int = 0  # warm processes kept ready for start_pod, >= 0; 0: every start is cold
    warm_engine: str = "sim"  # engine kind of the warm processes: "sim" or "vllm"
    warm_engine_python: str | None = None  # their engine interpreter (vllm's); None: this one
    ready_poll_interval_s: float = 0.05  # /readyz poll period of a starting pod, seconds
    ready_timeout_s: float = 900.0  # stop timing a start that is not ready after this, seconds
    warm_stop_grace_s: float = 2.0  # close(): warm processes' time to exit before SIGKILL, seconds

    def __post_init__(self) -> None:
        if self.warm_pool < 0:
            raise ValueError(f"SupervisorConfig.warm_pool must be >= 0, got {self.warm_pool}")
        if self.warm_engine not in ENGINE_KINDS:
            raise ValueError(
                f"SupervisorConfig.warm_engine must be one of {', '.join(ENGINE_KINDS)}, "
                f"got {self.warm_engine!r}"
            )
        if self.warm_stop_grace_s < 0:
            raise ValueError(f"SupervisorConfig.warm_stop_grace_s must be >= 0, got {self.warm_stop_grace_s}")
        for name in ("ready_poll_interval_s", "ready_timeout_s"):
            if getattr(self, name) <= 0:
                raise ValueError(f"SupervisorConfig.{name} must be > 0, got {getattr(self, name)}")


@dataclass(frozen=True)
class PodStatus:
    name: str
    pid: int | None  # None while waiting to restart
    running: bool  # process alive
    live: bool | None  # /livez 200; None when it did not answer
    ready: bool  # /readyz 200
    restarts: int  # restarts so far
    warm: bool = False  # the current process came from the warm pool
    ready_after_s: float | None = None  # start_pod (or restart) to first /readyz 200, s; None: not yet


@dataclass(frozen=True)
class WarmStatus:
    pid: int
    engine: str  # "sim" or "vllm"
    ready: bool  # pod and engine interpreters have imported


@dataclass
class _Pod:
    spec: PodSpec
    proc: subprocess.Popen[bytes] | None = None
    restart_times: list[float] = field(default_factory=list)  # monotonic seconds
    restart_at: float | None = None  # pending restart time, monotonic seconds
    last_live: bool | None = None
    last_ready: bool = False
    warm: bool = False  # proc came from the warm pool
    ready_after_s: float | None = None  # real seconds from the start request to /readyz 200
    requested_at: float = 0.0  # real monotonic seconds of the start request

    def mark_ready(self, ready: bool) -> None:
        """Record a /readyz answer; the first 200 also records the start-to-ready time, so a
        pod reported ready always has one, whichever thread saw it first."""
        if ready and self.ready_after_s is None:
            self.ready_after_s = time.monotonic() - self.requested_at
        self.last_ready = ready


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
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        self.proc.wait(timeout=10)


def _get_status(host: str, port: int, path: str, timeout_s: float) -> int | None:
    try:
        with urllib.request.urlopen(f"http://{host}:{port}{path}", timeout=timeout_s) as resp:
            resp.read()
            return int(resp.status)
    except urllib.error.HTTPError as err:
        err.close()
        return int(err.code)
    except (OSError, TimeoutError):
        return None


class Supervisor:
    def __init__(
        self,
        config: SupervisorConfig | None = None,
        reporter: EventReporter | None = None,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.config = config or SupervisorConfig()
        self.reporter = reporter or EventReporter(ReporterConfig())
        self.clock = clock
        self._pods: dict[str, _Pod] = {}
        self._lock = threading.RLock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._warm: list[_WarmProcess] = []
        self._warm_deaths: list[float] = []  # when unassigned warm processes died, clock seconds
        self._warm_refill_at: float | None = None  # no new warm process before this, clock seconds
        self._closed = False  # no more warm processes once close() has begun

    # --- public API ---

    def start(self) -> None:
        """Fill the warm pool and start the background supervision thread."""
        self.refill_warm_pool()
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="pod-supervisor", daemon=True)
            self._thread.start()

    def close(self) -> None:
        """Stop the thread, the warm processes and all pods."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self.config.check_interval_s + 5)
        with self._lock:
            self._closed = True
            warm, self._warm = self._warm, []
        for process in warm:  # all at once: they exit in parallel
            process.ask_to_exit()
        deadline = time.monotonic() + self.config.warm_stop_grace_s
        for process in warm:
            process.discard(max(0.0, deadline - time.monotonic()))
        for name in list(self._pods):
            self.stop_pod(name)

    def start_pod(self, spec: PodSpec) -> None:
        """Start a pod: from the warm pool when it has a process for the spec, cold otherwise."""
        requested_at = time.monotonic()
        with self._lock:
            if spec.name in self._pods:
                raise ValueError(f"pod {spec.name!r} already exists")
            pod = _Pod(spec)
            self._pods[spec.name] = pod
            self._spawn(pod, requested_at, warm_ok=True)

    def stop_pod(self, name: str, grace_s: float | None = None) -> int | None:
        """Stop and forget a pod; returns its exit status (None if it was not running)."""
        with self._lock:
            pod = self._pods.pop(name, None)
        if pod is None or pod.proc is None:
            return None
        return self._terminate(pod, self.config.stop_grace_s if grace_s is None else grace_s)

    def list_pods(self) -> list[PodStatus]:
        with self._lock:
            pods = list(self._pods.values())
        return [
            PodStatus(
                p.spec.name,
                p.proc.pid if p.proc else None,
                p.proc is not None and p.proc.poll() is None,
                p.last_live,
                p.last_ready,
                len(p.restart_times),
                p.warm,
                p.ready_after_s,
            )
            for p in pods
        ]

    def list_warm(self) -> list[WarmStatus]:
        """The warm processes waiting for a pod (not those already given one)."""
        with self._lock:
            return [
                WarmStatus(w.proc.pid, self.config.warm_engine, w.poll_ready())
                for w in self._warm
                if w.proc.poll() is None
            ]

    def check_once(self) -> None:
        """One supervision pass over all pods, then the warm pool's refill (the thread calls
        this; tests may too)."""
        with self._lock:
            pods = list(self._pods.values())
        for pod in pods:
            self._check(pod)
        self.refill_warm_pool()

    def refill_warm_pool(self) -> None:
        """Replace warm processes that died and start new ones up to ``warm_pool``. Deaths
        back off like a pod's restarts (``restart_policy``), so that a pool that cannot start
        (say a ``warm_engine_python`` that is not there) does not respawn on every pass."""
        with self._lock:
            if self._closed:
                return
            now = self.clock()
            for process in list(self._warm):
                if process.proc.poll() is None:
                    process.poll_ready()
                    continue
                self._warm.remove(process)
                process.discard()
                policy = self.config.restart_policy
                decision = decide_restart(policy, tuple(self._warm_deaths), now)
                self._warm_deaths = [t for t in self._warm_deaths if now - t <= policy.window_s] + [now]
                self._warm_refill_at = now + decision.delay_s
                log.warning(
                    "warm process %d exited with %s; next in %g s",
                    process.proc.pid,
                    process.proc.returncode,
                    decision.delay_s,
                )
            if self._warm_refill_at is not None and now < self._warm_refill_at:
                return
            while len(self._warm) < self.config.warm_pool:
                self._warm.append(self._spawn_warm())

    # --- internals ---

    def _run(self) -> None:
        while not self._stop.wait(self.config.check_interval_s):
            try:
                self.check_once()
            except Exception:  # keep supervising the other pods
                log.exception("supervision pass failed")

    def _log_path(self, name: str) -> str | None:
        if not self.config.log_dir:
            return None
        os.makedirs(self.config.log_dir, exist_ok=True)
        return os.path.join(self.config.log_dir, f"{name}.log")

    def _spawn(self, pod: _Pod, requested_at: float | None = None, warm_ok: bool = False) -> None:
        """Start the pod's process (under the lock); a warm one when ``warm_ok`` and the pool
        has one that fits."""
        requested_at = time.monotonic() if requested_at is None else requested_at
        spec = pod.spec
        proc = self._assign_warm(spec) if warm_ok else None
        pod.warm = proc is not None
        if proc is None:
            proc = self._popen(spec.command(), {**os.environ, **dict(spec.env)}, self._log_path(spec.name))
        pod.proc = proc
        pod.restart_at = None
        pod.last_live, pod.last_ready = None, False
        pod.ready_after_s, pod.requested_at = None, requested_at
        log.info("pod %s started %s, pid %d", spec.name, "warm" if pod.warm else "cold", proc.pid)
        timer = threading.Thread(
            target=self._time_readiness, args=(pod, proc, requested_at), name=f"ready-{spec.name}"
        )
        timer.daemon = True
        timer.start()

    def _popen(
        self,
        cmd: list[str],
        env: dict[str, str],
        log_path: str | None,
        stdin: int | None = None,
        pass_fds: tuple[int, ...] = (),
    ) -> subprocess.Popen[bytes]:
        out = open(log_path, "ab") if log_path else None
        try:
            # A new session makes the pod the leader of a process group that holds its
            # engine too, so a SIGKILL of the group leaves no orphaned engine behind.
            return subprocess.Popen(
                cmd,
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT if out else None,
                start_new_session=True,
                stdin=stdin,
                pass_fds=pass_fds,
            )
        finally:
            if out is not None:
                out.close()

    def _spawn_warm(self) -> _WarmProcess:
        ready_r, ready_w = os.pipe()
        os.set_blocking(ready_r, False)  # polled by poll_ready, never waited on
        env = dict(os.environ)
        cmd = [sys.executable, "-m", "dataplane.runtime.warm", "--engine", self.config.warm_engine]
        if self.config.warm_engine_python:
            cmd += ["--engine-python", self.config.warm_engine_python]
        try:
            proc = self._popen(
                [*cmd, "--ready-fd", str(ready_w)],
                env,
                self._log_path("warm"),
                stdin=subprocess.PIPE,
                pass_fds=(ready_w,),
            )
        except BaseException:
            os.close(ready_r)
            raise
        finally:
            os.close(ready_w)
        log.info("warm %s process started, pid %d", self.config.warm_engine, proc.pid)
        return _WarmProcess(proc, env, ready_r)

    def _assign_warm(self, spec: PodSpec) -> subprocess.Popen[bytes] | None:
        """Hand ``spec`` to a fitting warm process; None when there is none (or it had died)."""
        if spec.engine != self.config.warm_engine:
            return None
        fitting = [
            w
            for w in self._warm
            if w.proc.poll() is None and env_fits("pod", w.env, {**w.env, **dict(spec.env)})
        ]
        if not fitting:
            return None
        process = next((w for w in fitting if w.poll_ready()), fitting[0])  # else the oldest
        self._warm.remove(process)
        process.close_ready()
        assert process.proc.stdin is not None
        assignment = Assignment(tuple(spec.pod_args()), dict(spec.env), self._log_path(spec.name))
        try:
            process.proc.stdin.write(assignment.encode())
            process.proc.stdin.close()
        except OSError:  # it died since the poll
            log.warning("warm process %d is gone; starting pod %s cold", process.proc.pid, spec.name)
            process.discard()
            return None
        return process.proc

    def _time_readiness(self, pod: _Pod, proc: subprocess.Popen[bytes], requested_at: float) -> None:
        """Poll the new process's /readyz until 200; bounded by ``ready_timeout_s``, and over
        when the process exits, is replaced, or the supervisor closes. Real time (not
        ``clock``): it measures the start, it decides nothing."""
        spec, config = pod.spec, self.config
        while (
            not self._stop.is_set()
            and pod.proc is proc
            and proc.poll() is None
            and time.monotonic() - requested_at < config.ready_timeout_s
        ):
            if _get_status(spec.host, spec.probe_port, "/readyz", config.probe_timeout_s) == 200:
                with self._lock:
                    if pod.proc is proc:
                        pod.mark_ready(True)
                return
            self._stop.wait(config.ready_poll_interval_s)

    def _terminate(self, pod: _Pod, grace_s: float) -> int | None:
        proc = pod.proc
        if proc is None:
            return None
        if proc.poll() is None:
            try:
                proc.send_signal(signal.SIGTERM)
                proc.wait(timeout=grace_s)
            except subprocess.TimeoutExpired:
                log.warning("pod %s ignored SIGTERM for %.1f s; killing", pod.spec.name, grace_s)
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # the engine too, whatever the pod did
        except (ProcessLookupError, PermissionError):
            pass
        code = proc.wait(timeout=10)
        pod.proc = None
        return code

    def _check(self, pod: _Pod) -> None:
        now = self.clock()
        if pod.proc is None:
            if pod.restart_at is not None and now >= pod.restart_at:
                with self._lock:
                    if pod.spec.name in self._pods:
                        self._spawn(pod)
            return
        code = pod.proc.poll()
        if code is not None:
            self._restart(pod, f"pod process exited with status {code}", {"exit_code": code})
            return
        spec, timeout = pod.spec, self.config.probe_timeout_s
        live_status = _get_status(spec.host, spec.probe_port, "/livez", timeout)
        pod.last_live = None if live_status is None else live_status == 200
        ready = _get_status(spec.host, spec.probe_port, "/readyz", timeout) == 200
        with self._lock:
            if pod.proc is not None:
                pod.mark_ready(ready)
        if live_status == 503:
            self._restart(pod, "liveness failed (/livez 503)", {"livez": 503})

    def _restart(self, pod: _Pod, why: str, detail: dict[str, object]) -> None:
        now = self.clock()
        decision = decide_restart(self.config.restart_policy, tuple(pod.restart_times), now)
        exit_code = self._terminate(pod, min(self.config.stop_grace_s, 5.0))
        pod.restart_times = [
            t for t in pod.restart_times if now - t <= self.config.restart_policy.window_s
        ] + [now]
        pod.restart_at = now + decision.delay_s
        info = {
            **detail,
            "restarts_in_window": decision.recent_restarts,
            "delay_s": decision.delay_s,
            "exit_code": exit_code,
        }
        self.reporter.report(
            "restart", "warning", f"pod {pod.spec.name} restarted: {why}", info, pod=pod.spec.name
        )
        if (
            decision.crash_loop and decision.recent_restarts == self.config.restart_policy.crash_loop_restarts
        ):  # report entering the loop once
            self.reporter.report(
                "crash_loop",
                "critical",
                f"pod {pod.spec.name} restarted {decision.recent_restarts} "
                f"times in {self.config.restart_policy.window_s:g} s; "
                f"backing off {decision.delay_s:g} s",
                info,
                pod=pod.spec.name,
            )
        if decision.delay_s == 0:
            with self._lock:
                if pod.spec.name in self._pods:
                    self._spawn(pod)
