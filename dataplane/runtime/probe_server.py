"""The prober's I/O: scrape the engine, send probes, serve /livez, /readyz and /metrics (the
prober's own counters: probes, failures, hangs), report hangs.

Runs in the pod beside the engine. Every ``scrape_interval_s`` it reads the engine's /metrics
progress counter and feeds the pure ``Prober``; when the prober asks for a probe it sends
``POST /v1/completions`` with max_tokens 1 at the top priority, as its own task, bounded by the
completion deadline, so the scrape loop and the HTTP endpoints never wait on the engine.
Its calls to the engine bear the fleet credential (``api_key``, the pod's ``$VLLM_API_KEY``),
as the router's do: a keyed engine answers 401 to the rest (``engine_auth``).
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Callable

from dataplane.runtime import engine_auth, http_client, metrics
from dataplane.runtime.events import EventReporter
from dataplane.runtime.http_server import HttpServer, Request, Response, json_response
from dataplane.runtime.prober import Prober, ProberConfig, ProberCounts, Status, metrics_text
from dataplane.wire.prometheus_text import CONTENT_TYPE

log = logging.getLogger("dataplane.runtime.probe")


class ProbeLoop:
    def __init__(
        self,
        config: ProberConfig,
        engine_host: str,
        engine_port: int,
        reporter: EventReporter,
        model: str | None = None,
        clock: Callable[[], float] = time.monotonic,
        api_key: str = "",
    ):
        self.config = config
        self.engine_host = engine_host
        self.engine_port = engine_port
        self.reporter = reporter
        self.model = model  # learnt from /v1/models when None
        self.clock = clock
        self.auth = engine_auth.bearer(api_key)  # the fleet credential's header; {} without one
        self.prober = Prober(config, clock())
        self.http = HttpServer(self.handle)
        self._probe_task: asyncio.Task[None] | None = None
        self._was_live = True
        self.probes_sent = 0
        self.probe_failures = 0
        self.hangs = 0

    def status(self) -> Status:
        return self.prober.status(self.clock())

    async def handle(self, request: Request) -> Response:
        status = self.status()
        body = {
            "live": status.live,
            "ready": status.ready,
            "reason": status.reason,
            "consecutive_failures": status.consecutive_failures,
            "seconds_since_progress": status.seconds_since_progress,
        }
        if request.path == "/livez":
            return json_response(200 if status.live else 503, body)
        if request.path == "/readyz":
            return json_response(200 if status.ready else 503, body)
        if request.path == "/status":
            return json_response(200, body)
        if request.path == "/metrics":
            counts = ProberCounts(self.probes_sent, self.probe_failures, self.hangs)
            return Response(200, metrics_text(status, counts).encode(), CONTENT_TYPE)
        return json_response(404, {"error": "not found"})

    async def run(self, stop: asyncio.Event) -> None:
        try:
            while not stop.is_set():
                await self.tick()
                try:
                    await asyncio.wait_for(stop.wait(), self.config.scrape_interval_s)
                except TimeoutError:
                    pass
        finally:
            if self._probe_task is not None:
                self._probe_task.cancel()

    async def tick(self) -> None:
        total = await self._scrape()
        now = self.clock()
        self.prober.observe(now, total)
        if total is not None and self.model is None:
            self.model = await self._discover_model()
        if self.prober.should_probe(now) and self.model is not None:
            self.prober.probe_sent(now)
            self.probes_sent += 1
            self._probe_task = asyncio.create_task(self._probe(now))
        self._report_transitions()

    def _report_transitions(self) -> None:
        status = self.status()
        if self._was_live and not status.live:
            self.hangs += 1
            self.reporter.report(
                "hang",
                "critical",
                f"engine hung: {status.reason}",
                {
                    "consecutive_failures": status.consecutive_failures,
                    "seconds_since_progress": status.seconds_since_progress,
                    "probes_sent": self.probes_sent,
                },
            )
        elif not self._was_live and status.live:
            log.warning("engine recovered: %s", status.reason)
        self._was_live = status.live

    async def _scrape(self) -> float | None:
        try:
            resp = await http_client.request(
                "GET",
                self.engine_host,
                self.engine_port,
                "/metrics",
                timeout_s=min(5.0, self.config.completion_deadline_s),
            )
        except (OSError, TimeoutError):
            return None
        if resp.status != 200:
            return None
        return metrics.progress_total(resp.body.decode("utf-8", "replace"))

    async def _discover_model(self) -> str | None:
        try:
            resp = await http_client.request(
                "GET", self.engine_host, self.engine_port, "/v1/models", headers=self.auth, timeout_s=5.0
            )
            return str(resp.json()["data"][0]["id"]) if resp.status == 200 else None
        except (OSError, TimeoutError, ValueError, KeyError, IndexError):
            return None

    async def _probe(self, sent_at: float) -> None:
        body = json.dumps(
            {
                "model": self.model,
                "prompt": "ping",
                "max_tokens": self.config.probe_max_tokens,
                "temperature": 0,
                "priority": self.config.probe_priority,
            }
        ).encode()
        ok, detail = False, ""
        try:
            resp = await http_client.request(
                "POST",
                self.engine_host,
                self.engine_port,
                "/v1/completions",
                body=body,
                headers={"content-type": "application/json", **self.auth},
                timeout_s=self.config.completion_deadline_s,
            )
            ok = resp.status == 200
            detail = f"status {resp.status}"
        except TimeoutError:
            detail = "timed out"
        except OSError as err:
            detail = f"connection failed: {err}"
        now = self.clock()
        if not ok or now - sent_at > self.config.completion_deadline_s:  # what the prober counts as failed
            self.probe_failures += 1
        if not ok:
            log.info("probe failed after %.2f s: %s", now - sent_at, detail)
        self.prober.probe_result(now, ok, now - sent_at)
        self._report_transitions()
