"""Reporting pod events (hang, restart, crash_loop) to the control plane's event API.

``POST {url}/api/v1/events/`` with ``Authorization: Bearer <key>`` and a JSON body; the API
answers 201. ``report()`` never blocks: it appends to a bounded queue that a daemon thread
drains in order, retrying with exponential backoff (0.5 s, 1 s, 2 s ... capped at 30 s) while
the control plane is down or answers 5xx/429/408. When the queue is full the OLDEST event is
dropped and counted (a pod that has been cut off for hours keeps its latest news). A 4xx other
than 408/429 will not get better by retrying: the event is logged and dropped. With no URL
configured, events are only logged.
"""

from __future__ import annotations

import json
import logging
import threading
import time
import urllib.error
import urllib.request
from collections import deque
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from dataplane.wire.pod_events import PodEvent

log = logging.getLogger("dataplane.runtime.events")

RETRYABLE_STATUSES = (408, 429)


@dataclass(frozen=True)
class ReporterConfig:
    url: str | None = None  # control plane base URL; None: log only
    key: str = ""  # bearer key for the event API
    endpoint: int | None = None  # endpoint id stamped on events
    pod: str = "pod"  # pod name stamped on events
    version: int | None = None  # endpoint version stamped on events
    tenant: str = ""  # the endpoint's tenant stamped on events
    max_queued: int = 1000  # events buffered while the control plane is down
    request_timeout_s: float = 5.0  # one POST, seconds
    backoff_base_s: float = 0.5  # first retry delay, seconds
    backoff_cap_s: float = 30.0  # longest retry delay, seconds


def backoff_delay(attempt: int, base_s: float, cap_s: float) -> float:
    """Delay before retry ``attempt`` (1-based): base x 2^(attempt-1), capped. 0.5 -> 1 -> 2."""
    return float(min(cap_s, base_s * 2 ** max(0, attempt - 1)))


def utc_now_iso() -> str:
    return datetime.now(UTC).isoformat().replace("+00:00", "Z")


class EventReporter:
    def __init__(self, config: ReporterConfig):
        self.config = config
        self._queue: deque[PodEvent] = deque()
        self._cond = threading.Condition()
        self._stopping = False
        self.sent = 0  # delivered events
        self.attempts = 0  # POSTs tried
        self.dropped = 0  # events lost to a full queue or a permanent 4xx
        self._thread: threading.Thread | None = None
        if config.url:
            self._thread = threading.Thread(target=self._run, name="event-reporter", daemon=True)
            self._thread.start()

    def report(
        self,
        kind: str,
        severity: str,
        message: str,
        detail: dict[str, Any] | None = None,
        pod: str | None = None,
        attribution: tuple[int | None, int | None, str] | None = None,
    ) -> PodEvent:
        """Queue an event about this pod, or, with `pod` and `attribution` (endpoint, version,
        tenant), about a pod the caller runs for an endpoint (the agent's supervisor)."""
        endpoint, version, tenant = attribution or (
            self.config.endpoint,
            self.config.version,
            self.config.tenant,
        )
        event = PodEvent(
            kind,
            severity,
            pod or self.config.pod,
            message,
            endpoint,
            detail or {},
            utc_now_iso(),
            version,
            tenant,
        )
        log.warning("event %s/%s pod=%s: %s %s", kind, severity, event.pod, message, json.dumps(event.detail))
        if not self.config.url:
            return event
        with self._cond:
            if len(self._queue) >= self.config.max_queued:
                self._queue.popleft()
                self.dropped += 1
            self._queue.append(event)
            self._cond.notify()
        return event

    def pending(self) -> int:
        with self._cond:
            return len(self._queue)

    def close(self, flush_timeout_s: float = 2.0) -> None:
        """Try to deliver what is queued for up to ``flush_timeout_s``, then stop."""
        deadline = time.monotonic() + flush_timeout_s
        while self.pending() and time.monotonic() < deadline:
            time.sleep(0.02)
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join(timeout=self.config.request_timeout_s + 1.0)
        if self.pending():
            log.error("event reporter stopped with %d undelivered events", self.pending())

    def _run(self) -> None:
        attempt = 0
        while True:
            with self._cond:
                while not self._queue and not self._stopping:
                    self._cond.wait()
                if self._stopping:
                    return
                event = self._queue[0]
            outcome = self._post(event)
            if outcome == "retry":
                attempt += 1
                delay = backoff_delay(attempt, self.config.backoff_base_s, self.config.backoff_cap_s)
                with self._cond:
                    self._cond.wait_for(lambda: self._stopping, timeout=delay)
                continue
            attempt = 0
            with self._cond:
                if self._queue and self._queue[0] is event:
                    self._queue.popleft()
                if outcome == "sent":
                    self.sent += 1
                else:
                    self.dropped += 1

    def _post(self, event: PodEvent) -> str:
        assert self.config.url is not None
        self.attempts += 1
        request = urllib.request.Request(
            self.config.url.rstrip("/") + "/api/v1/events/",
            data=json.dumps(event.to_json()).encode(),
            method="POST",
            headers={"Content-Type": "application/json", "Authorization": f"Bearer {self.config.key}"},
        )
        try:
            with urllib.request.urlopen(request, timeout=self.config.request_timeout_s) as resp:
                resp.read()
                return "sent"
        except urllib.error.HTTPError as err:
            err.close()
            if err.code >= 500 or err.code in RETRYABLE_STATUSES:
                log.info("event API answered %d; will retry", err.code)
                return "retry"
            log.error("event API refused event %s with %d; dropped", event.kind, err.code)
            return "drop"
        except (OSError, TimeoutError) as err:
            log.info("event API unreachable (%s); will retry", err)
            return "retry"
