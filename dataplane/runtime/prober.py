"""The prober's decisions: is the engine live, is it ready, should we probe now. Pure.

Time is passed in; the I/O around it (``probe_server``) scrapes the engine's progress counter
(finished requests + generated tokens from /metrics), sends probes and serves /livez, /readyz.

Rules, with the defaults of ``ProberConfig``:
* Progress is any change of the engine's progress counter, or a successful probe. Progress
  clears every failure: a busy pod whose counter advances is never hung, however slow or
  queued our probe is.
* Probe when nothing has progressed for ``idle_interval_s`` (5 s) and no probe is in flight.
* Hung when, with no progress since, ``failure_threshold`` (3) probes in a row failed (error
  status, refused connection, or slower than the deadline), or the probe in flight has waited
  ``completion_deadline_s`` (20 s). Hung is latched until progress is seen again, so a probe
  that times out (and so is no longer "in flight") does not flap the verdict.
  Worked example: engine hangs at t=0 right after a completion; probe at t=5 s, still waiting
  at t=25 s -> hung at t=25 s (idle interval + completion deadline).
* Before the engine first answers: live (starting up) until ``startup_timeout_s`` (600 s: a
  large model loads for minutes), not ready. Ready = answered once and not hung.
"""

from __future__ import annotations

from dataclasses import dataclass

from dataplane.wire.prometheus_text import family_header


@dataclass(frozen=True)
class ProberConfig:
    idle_interval_s: float = 5.0  # probe after this long without progress, seconds
    completion_deadline_s: float = 20.0  # a probe waiting this long means hung, seconds
    failure_threshold: int = 3  # consecutive failed probes that mean hung, >= 1
    startup_timeout_s: float = 600.0  # engine must answer within this after start, seconds
    scrape_interval_s: float = 1.0  # how often the I/O loop reads /metrics, seconds
    probe_priority: int = -1_000_000  # vLLM priority of probes; lower runs earlier
    probe_max_tokens: int = 1  # output tokens per probe

    def __post_init__(self) -> None:
        for name in ("idle_interval_s", "completion_deadline_s", "startup_timeout_s", "scrape_interval_s"):
            if getattr(self, name) <= 0:
                raise ValueError(f"ProberConfig.{name} must be > 0, got {getattr(self, name)}")
        if self.failure_threshold < 1:
            raise ValueError(f"ProberConfig.failure_threshold must be >= 1, got {self.failure_threshold}")


@dataclass(frozen=True)
class Status:
    live: bool  # /livez: False only when hung or never started
    ready: bool  # /readyz: engine answered and not hung
    reason: str  # human-readable why, for logs and the hang event
    consecutive_failures: int
    seconds_since_progress: float | None  # None before the engine first answered


class Prober:
    def __init__(self, config: ProberConfig, started_at: float):
        self.config = config
        self.started_at = started_at
        self.answered = False  # the engine answered a scrape or a probe at least once
        self.last_total: float | None = None  # last progress counter seen
        self.last_progress: float = started_at  # time of the last progress
        self.consecutive_failures = 0
        self.probe_started: float | None = None  # time the probe in flight was sent
        self.hung_reason: str | None = None  # latched verdict; None while not hung

    # --- inputs ---

    def observe(self, now: float, completed_total: float | None) -> None:
        """A scrape of the progress counter; None when the scrape failed."""
        self._latch(now)
        if completed_total is None:
            return
        if not self.answered:
            self.answered = True
            self._progress(now)
        elif completed_total != self.last_total:  # a drop is an engine restart: it runs
            self._progress(now)
        self.last_total = completed_total

    def probe_sent(self, now: float) -> None:
        self._latch(now)
        self.probe_started = now

    def probe_result(self, now: float, ok: bool, latency: float) -> None:
        """The probe answered (ok) or failed; ``latency`` seconds after it was sent."""
        self._latch(now)
        self.probe_started = None
        if ok and latency <= self.config.completion_deadline_s:
            self.answered = True
            self._progress(now)
        else:
            self.consecutive_failures += 1
            self._latch(now)

    # --- outputs ---

    def should_probe(self, now: float) -> bool:
        return (
            self.answered
            and self.probe_started is None
            and now - self.last_progress >= self.config.idle_interval_s
        )

    def status(self, now: float) -> Status:
        reason = self.hung_reason or self._hung_condition(now)
        since = now - self.last_progress if self.answered else None
        if reason is not None:
            return Status(False, False, reason, self.consecutive_failures, since)
        if not self.answered:
            if now - self.started_at >= self.config.startup_timeout_s:
                return Status(
                    False,
                    False,
                    f"engine did not answer within {self.config.startup_timeout_s:g} s of start",
                    0,
                    None,
                )
            return Status(True, False, "starting: engine has not answered yet", 0, None)
        return Status(True, True, "ok", self.consecutive_failures, since)

    # --- internals ---

    def _progress(self, now: float) -> None:
        self.last_progress = now
        self.consecutive_failures = 0
        self.hung_reason = None

    def _hung_condition(self, now: float) -> str | None:
        cfg = self.config
        if self.consecutive_failures >= cfg.failure_threshold:
            return (
                f"{self.consecutive_failures} probes failed in a row with no progress "
                f"for {now - self.last_progress:.1f} s"
            )
        if self.probe_started is not None:
            waited = now - max(self.probe_started, self.last_progress)
            if waited >= cfg.completion_deadline_s:
                return (
                    f"probe unanswered for {waited:.1f} s (deadline "
                    f"{cfg.completion_deadline_s:g} s) with no progress"
                )
        return None

    def _latch(self, now: float) -> None:
        if self.hung_reason is None:
            self.hung_reason = self._hung_condition(now)


@dataclass(frozen=True)
class ProberCounts:
    """What the prober has seen since its process started (Prometheus counters reset with it)."""

    probes: int  # probes sent
    probe_failures: int  # probes that failed or missed the deadline
    hangs: int  # times the engine was declared hung (live -> not live)


def metrics_text(status: Status, counts: ProberCounts) -> str:
    """The prober's /metrics (Prometheus text 0.0.4). No labels: the scrape's target labels
    (pod, and the pod's mu/endpoint, mu/version, mu/tenant labels) say whose they are."""
    since = status.seconds_since_progress
    lines = [
        *family_header("mu_prober_probes_total", "counter", "Probes sent to the engine."),
        f"mu_prober_probes_total {counts.probes}",
        *family_header(
            "mu_prober_probe_failures_total", "counter", "Probes that failed or missed the deadline."
        ),
        f"mu_prober_probe_failures_total {counts.probe_failures}",
        *family_header("mu_prober_hangs_total", "counter", "Times the engine was declared hung."),
        f"mu_prober_hangs_total {counts.hangs}",
        *family_header("mu_prober_live", "gauge", "1 while /livez answers 200."),
        f"mu_prober_live {int(status.live)}",
        *family_header("mu_prober_ready", "gauge", "1 while /readyz answers 200."),
        f"mu_prober_ready {int(status.ready)}",
        *family_header(
            "mu_prober_seconds_since_progress", "gauge", "Seconds since the engine last made progress."
        ),
        f"mu_prober_seconds_since_progress {since if since is not None else 'NaN'}",
    ]
    return "\n".join(lines) + "\n"
