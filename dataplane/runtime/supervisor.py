"""Runs runtime pods as local processes and restarts the ones that hang or die.

The local stand-in for Kubernetes (the autoscaler's local cluster driver uses it):
``start_pod``, ``stop_pod`` (SIGTERM, then SIGKILL of the pod's process group after a grace
period), ``list_pods`` with readiness. A background thread checks every ``check_interval_s``:
a pod whose process exited, or whose ``/livez`` answers 503, is stopped and started again after
the ``restart_policy`` delay, with a ``restart`` event (and ``crash_loop`` when restarts repeat
within the window). Every wait is bounded; ``close()`` stops all pods.
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
        return [
            sys.executable,
            "-m",
            "dataplane.runtime.pod",
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


@dataclass(frozen=True)
class PodStatus:
    name: str
    pid: int | None  # None while waiting to restart
    running: bool  # process alive
    live: bool | None  # /livez 200; None when it did not answer
    ready: bool  # /readyz 200
    restarts: int  # restarts so far


@dataclass
class _Pod:
    spec: PodSpec
    proc: subprocess.Popen[bytes] | None = None
    restart_times: list[float] = field(default_factory=list)  # monotonic seconds
    restart_at: float | None = None  # pending restart time, monotonic seconds
    last_live: bool | None = None
    last_ready: bool = False


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

    # --- public API ---

    def start(self) -> None:
        """Start the background supervision thread."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="pod-supervisor", daemon=True)
            self._thread.start()

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self.config.check_interval_s + 5)
        for name in list(self._pods):
            self.stop_pod(name)

    def start_pod(self, spec: PodSpec) -> None:
        with self._lock:
            if spec.name in self._pods:
                raise ValueError(f"pod {spec.name!r} already exists")
            pod = _Pod(spec)
            self._pods[spec.name] = pod
            self._spawn(pod)

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
            )
            for p in pods
        ]

    def check_once(self) -> None:
        """One supervision pass over all pods (the thread calls this; tests may too)."""
        with self._lock:
            pods = list(self._pods.values())
        for pod in pods:
            self._check(pod)

    # --- internals ---

    def _run(self) -> None:
        while not self._stop.wait(self.config.check_interval_s):
            try:
                self.check_once()
            except Exception:  # keep supervising the other pods
                log.exception("supervision pass failed")

    def _spawn(self, pod: _Pod) -> None:
        spec = pod.spec
        env = {**os.environ, **dict(spec.env)}
        out = None
        if self.config.log_dir:
            os.makedirs(self.config.log_dir, exist_ok=True)
            out = open(os.path.join(self.config.log_dir, f"{spec.name}.log"), "ab")
        try:
            # A new session makes the pod the leader of a process group that holds its
            # engine too, so a SIGKILL of the group leaves no orphaned engine behind.
            pod.proc = subprocess.Popen(
                spec.command(),
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT if out else None,
                start_new_session=True,
            )
        finally:
            if out is not None:
                out.close()
        pod.restart_at = None
        pod.last_live, pod.last_ready = None, False
        log.info("pod %s started, pid %d", spec.name, pod.proc.pid)

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
        pod.last_ready = _get_status(spec.host, spec.probe_port, "/readyz", timeout) == 200
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
