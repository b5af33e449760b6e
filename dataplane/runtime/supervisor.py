"""Runs runtime pods as local processes and restarts the ones that hang or die.

The local stand-in for Kubernetes (the autoscaler's local cluster driver uses it):
``start_pod``, ``stop_pod`` (SIGTERM, then SIGKILL of the pod's process group after a grace
period), ``list_pods`` with readiness. A background thread checks every ``check_interval_s``:
a pod whose process exited, or whose ``/livez`` answers 503, is stopped and started again after
the ``restart_policy`` delay, with a ``restart`` event (and ``crash_loop`` when restarts repeat
within the window). Every wait is bounded; ``close()`` stops all pods.

``start_pod`` takes a process from the ``warm_pool`` (a ``WarmPool``) when it has one for the
launch, and starts the pod cold otherwise; restarts start cold, so that a crash-looping pod
cannot drain the pool meant for scale-up. The pool is refilled on ``start()`` and by every
check pass. Each pod records whether it started warm and how long it took from ``start_pod``
(or its restart) to the first ``/readyz`` 200, polled every ``ready_poll_interval_s`` by a
thread of its own so that the figure does not depend on the check interval.
"""

from __future__ import annotations

import logging
import signal
import subprocess
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field

from dataplane.runtime.events import EventReporter, ReporterConfig
from dataplane.runtime.pod_process import (
    PodLaunch,
    kill_group,
    log_path,
    pod_environment,
    start_in_own_session,
)
from dataplane.runtime.restart_policy import RestartPolicy, decide_restart
from dataplane.runtime.warm_pool import WarmPool, WarmPoolConfig

log = logging.getLogger("dataplane.runtime.supervisor")


@dataclass(frozen=True)
class SupervisorConfig:
    check_interval_s: float = 2.0  # liveness check period, seconds
    probe_timeout_s: float = 2.0  # one /livez or /readyz request, seconds
    stop_grace_s: float = 30.0  # SIGTERM to SIGKILL, seconds
    restart_policy: RestartPolicy = field(default_factory=RestartPolicy)
    log_dir: str | None = None  # pod stdout/stderr go to <log_dir>/<name>.log; None: inherit
    warm_pool: WarmPoolConfig = field(default_factory=WarmPoolConfig)  # default: none, all cold
    ready_poll_interval_s: float = 0.05  # /readyz poll period of a starting pod, seconds
    ready_timeout_s: float = 900.0  # stop timing a start that is not ready after this, seconds

    def __post_init__(self) -> None:
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


@dataclass
class _Pod:
    launch: PodLaunch
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
        self.warm_pool = WarmPool(
            self.config.warm_pool, self.config.restart_policy, self.config.log_dir, clock
        )

    # --- public API ---

    def start(self) -> None:
        """Fill the warm pool and start the background supervision thread."""
        self.warm_pool.refill()
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="pod-supervisor", daemon=True)
            self._thread.start()

    def close(self) -> None:
        """Stop the thread, the warm processes and all pods."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self.config.check_interval_s + 5)
        self.warm_pool.close()
        for name in list(self._pods):
            self.stop_pod(name)

    def start_pod(self, launch: PodLaunch) -> None:
        """Start a pod: from the warm pool when it has a process for the launch, cold otherwise."""
        requested_at = time.monotonic()
        with self._lock:
            if launch.name in self._pods:
                raise ValueError(f"pod {launch.name!r} already exists")
            pod = _Pod(launch)
            self._pods[launch.name] = pod
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
                p.launch.name,
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

    def check_once(self) -> None:
        """One supervision pass over all pods, then the warm pool's refill (the thread calls
        this; tests may too)."""
        with self._lock:
            pods = list(self._pods.values())
        for pod in pods:
            self._check(pod)
        self.warm_pool.refill()

    # --- internals ---

    def _run(self) -> None:
        while not self._stop.wait(self.config.check_interval_s):
            try:
                self.check_once()
            except Exception:  # keep supervising the other pods
                log.exception("supervision pass failed")

    def _spawn(self, pod: _Pod, requested_at: float | None = None, warm_ok: bool = False) -> None:
        """Start the pod's process (under the lock); a warm one when ``warm_ok`` and the pool
        has one that fits."""
        requested_at = time.monotonic() if requested_at is None else requested_at
        launch = pod.launch
        proc = self.warm_pool.take(launch) if warm_ok else None
        pod.warm = proc is not None
        if proc is None:
            proc = start_in_own_session(
                launch.command(),
                pod_environment(launch.env),
                log_path(self.config.log_dir, launch.name),
            )
        pod.proc = proc
        pod.restart_at = None
        pod.last_live, pod.last_ready = None, False
        pod.ready_after_s, pod.requested_at = None, requested_at
        log.info("pod %s started %s, pid %d", launch.name, "warm" if pod.warm else "cold", proc.pid)
        timer = threading.Thread(
            target=self._time_readiness, args=(pod, proc, requested_at), name=f"ready-{launch.name}"
        )
        timer.daemon = True
        timer.start()

    def _time_readiness(self, pod: _Pod, proc: subprocess.Popen[bytes], requested_at: float) -> None:
        """Poll the new process's /readyz until 200; bounded by ``ready_timeout_s``, and over
        when the process exits, is replaced, or the supervisor closes. Real time (not
        ``clock``): it measures the start, it decides nothing."""
        launch, config = pod.launch, self.config
        while (
            not self._stop.is_set()
            and pod.proc is proc
            and proc.poll() is None
            and time.monotonic() - requested_at < config.ready_timeout_s
        ):
            if _get_status(launch.host, launch.probe_port, "/readyz", config.probe_timeout_s) == 200:
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
                log.warning("pod %s ignored SIGTERM for %.1f s; killing", pod.launch.name, grace_s)
        kill_group(proc.pid)  # the engine too, whatever the pod did
        code = proc.wait(timeout=10)
        pod.proc = None
        return code

    def _check(self, pod: _Pod) -> None:
        now = self.clock()
        if pod.proc is None:
            if pod.restart_at is not None and now >= pod.restart_at:
                with self._lock:
                    if pod.launch.name in self._pods:
                        self._spawn(pod)
            return
        code = pod.proc.poll()
        if code is not None:
            self._restart(pod, f"pod process exited with status {code}", {"exit_code": code})
            return
        launch, timeout = pod.launch, self.config.probe_timeout_s
        live_status = _get_status(launch.host, launch.probe_port, "/livez", timeout)
        pod.last_live = None if live_status is None else live_status == 200
        ready = _get_status(launch.host, launch.probe_port, "/readyz", timeout) == 200
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
            "restart",
            "warning",
            f"pod {pod.launch.name} restarted: {why}",
            info,
            pod=pod.launch.name,
            attribution=pod.launch.attribution,
        )
        if (
            decision.crash_loop and decision.recent_restarts == self.config.restart_policy.crash_loop_restarts
        ):  # report entering the loop once
            self.reporter.report(
                "crash_loop",
                "critical",
                f"pod {pod.launch.name} restarted {decision.recent_restarts} "
                f"times in {self.config.restart_policy.window_s:g} s; "
                f"backing off {decision.delay_s:g} s",
                info,
                pod=pod.launch.name,
                attribution=pod.launch.attribution,
            )
        if decision.delay_s == 0:
            with self._lock:
                if pod.launch.name in self._pods:
                    self._spawn(pod)
