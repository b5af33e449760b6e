"""A real router (a subprocess, control-plane mode without Redis) in front of a simulated engine,
posting its seconds to a real control plane whose /api/v1/load-samples/ refuses them for a while:
every answered request is billed once it accepts them again, including the seconds it stored
but answered too late for the router (retried, taken as duplicates), the seconds a router
stopped with (kept in its spool, sent by the next router on it), and, SIGKILLed, all but the
second it was metering."""

from __future__ import annotations

import contextlib
import os
import signal
import stat
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest
from django.utils import timezone
from rest_framework import status
from rest_framework.response import Response

from controlplane.api.views import LoadSamplesView
from controlplane.endpoints import collector
from controlplane.endpoints.models import Lease, Pod
from controlplane.tenants.models import ApiKey
from dataplane.runtime.metrics import sample_sum
from tests.runtime.support import free_port, sim_engine, wait_until
from tests.test_usage_end_to_end import call, profile, selling, totals, usage_rows  # noqa: F401 (a fixture)

pytestmark = pytest.mark.stack  # a live_server, an engine and routers as subprocesses

TIMEOUT_S = 1.0  # the router's wait for a post's answer


class Gate:
    """The control plane's door for load samples: closed, it answers 503; open, it is the view
    as it is, but for the next `late` seconds it stores, which it answers after the router has
    given up on them."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.open = False
        self.late = 0
        self.answers: list[int] = []
        real = LoadSamplesView.post

        def post(view: Any, request: Any) -> Response:
            if not self.open:
                answer = Response({"error": "unavailable"}, status=status.HTTP_503_SERVICE_UNAVAILABLE)
            else:
                answer = real(view, request)
                if answer.status_code == 201 and self.late > 0:
                    self.late -= 1
                    time.sleep(TIMEOUT_S * 1.5)  # a server slower than the router's patience
            self.answers.append(answer.status_code)
            return answer

        monkeypatch.setattr(LoadSamplesView, "post", post)


@contextlib.contextmanager
def router(control_plane: str, key: str, *extra: str) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    """A router posting its seconds to `control_plane`; its log printed when the test fails."""
    port = free_port()
    with tempfile.TemporaryFile() as log:
        args = ["--listen", f"127.0.0.1:{port}", "--control-plane", control_plane, "--poll-interval-s", "0.2"]
        args += ["--control-plane-timeout-s", str(TIMEOUT_S), "--log-level", "info", *extra]
        proc = subprocess.Popen(
            [sys.executable, "-m", "dataplane.router", *args],
            stdout=log,
            stderr=subprocess.STDOUT,
            env={**os.environ, "ROUTER_KEY": key},
        )
        url = f"http://127.0.0.1:{port}"
        try:
            wait_until(lambda: up(url), timeout=30)
            yield url, proc
        except BaseException:
            log.seek(0)
            sys.stderr.write(f"--- the router's log:\n{log.read().decode(errors='replace')[-6000:]}\n")
            raise
        finally:
            if proc.poll() is None:
                proc.terminate()
                proc.wait(timeout=30)


def up(url: str) -> bool:
    try:
        with urllib.request.urlopen(url + "/health", timeout=1) as r:
            return bool(r.status == 200)
    except OSError:
        return False


def metric(url: str, name: str) -> float:
    """A figure from the router's /metrics (to loopback)."""
    with urllib.request.urlopen(url + "/metrics", timeout=5) as r:
        return sample_sum(r.read().decode(), name) or 0.0


def complete(url: str, key: str) -> int:
    status_code, answer = call(
        url + "/v1/completions", key, {"model": "chat", "prompt": "hi", "max_tokens": 2}
    )
    assert status_code == 200, answer
    return status_code


def billed_requests(base: str, key: str) -> int:
    """The requests in usage after a collect pass (as the next beat tick runs it)."""
    Lease.objects.filter(name=collector.COLLECTOR).update(last_run_at=None)
    assert collector.collect_pass(timezone.now()) is not None
    return int(totals(usage_rows(base, key))["requests"])


@pytest.fixture
def stack(live_server, settings, profile, owner, make_endpoint, monkeypatch):  # noqa: F811 (the fixture)
    """The control plane (no Redis), one endpoint on a simulated engine, the keys, the gate."""
    settings.REDIS_URL = ""
    chat = make_endpoint(owner, "chat", profile=profile)
    selling(chat)
    _, operator = ApiKey.issue(name="router", tenant=None)
    _, tenant = ApiKey.issue(name="app", tenant=owner)
    gate = Gate(monkeypatch)
    with sim_engine("--profile", "tiny-test", "--time-scale", "20", "--served-model-name", "chat") as engine:
        Pod.objects.create(endpoint=chat, name="chat-0", url=engine.url, ready=True)
        yield live_server.url, operator, tenant, gate


@pytest.mark.django_db(transaction=True)
def test_posts_refused_then_answered_too_late_bill_every_request_once(stack):
    base, operator, tenant, gate = stack
    with router(base, operator) as (url, _):
        served = sum(complete(url, tenant) == 200 for _ in range(20))
        wait_until(lambda: metric(url, "router_metering_seconds_held") >= 3, timeout=10)
        assert metric(url, "router_metering_seconds_delivered_total") == 0
        assert billed_requests(base, operator) == 0
        # The control plane stores the seconds but answers after the router gave up: it sends
        # them again, and they are taken as the duplicates they are.
        gate.late, gate.open = 2, True
        wait_until(lambda: metric(url, "router_metering_seconds_held") == 0, timeout=20)
        assert gate.answers.count(200) >= 2, gate.answers  # the retries of the seconds stored late
        served += sum(complete(url, tenant) == 200 for _ in range(5))
        wait_until(lambda: metric(url, "router_metering_seconds_held") == 0, timeout=10)
    assert billed_requests(base, operator) == served == 25


@pytest.mark.django_db(transaction=True)
def test_a_router_restarted_on_its_spool_sends_what_it_held(stack, tmp_path):
    base, operator, tenant, gate = stack
    spool = tmp_path / "spool"
    with router(base, operator, "--spool-dir", str(spool)) as (url, proc):
        served = sum(complete(url, tenant) == 200 for _ in range(12))
        wait_until(lambda: metric(url, "router_metering_seconds_held") >= 2, timeout=10)
        proc.send_signal(signal.SIGTERM)  # its last try at delivering fails too
        assert proc.wait(timeout=30) == 0
    files = [p for p in (spool / "worker-0").iterdir() if p.name != "lock"]
    assert files and all(stat.S_IMODE(p.stat().st_mode) == 0o600 for p in files)
    assert stat.S_IMODE((spool / "worker-0").stat().st_mode) == 0o700
    assert billed_requests(base, operator) == 0
    gate.open = True
    with router(base, operator, "--spool-dir", str(spool)) as (url, _):
        wait_until(lambda: metric(url, "router_metering_seconds_delivered_total") >= len(files), timeout=20)
        assert billed_requests(base, operator) == served


@pytest.mark.django_db(transaction=True)
def test_a_sigkilled_router_loses_at_most_the_second_it_was_metering(stack, tmp_path):
    base, operator, tenant, gate = stack
    spool = str(tmp_path / "spool")
    answered: list[float] = []  # monotonic s each answer arrived
    stop = threading.Event()
    with router(base, operator, "--spool-dir", spool) as (url, proc):

        def drive() -> None:
            body = {"model": "chat", "prompt": "hi", "max_tokens": 2}
            while not stop.is_set():
                with contextlib.suppress(OSError):  # the router gone
                    if call(url + "/v1/completions", tenant, body)[0] == 200:
                        answered.append(time.monotonic())

        client = threading.Thread(target=drive)
        client.start()
        try:
            wait_until(
                lambda: len(answered) >= 30 and metric(url, "router_metering_seconds_held") >= 3, timeout=30
            )
            proc.send_signal(signal.SIGKILL)
            killed = time.monotonic()
            proc.wait(timeout=10)
        finally:
            stop.set()
            client.join(timeout=30)
    gate.open = True
    with router(base, operator, "--spool-dir", spool) as (url, _):
        wait_until(lambda: metric(url, "router_metering_seconds_held") == 0, timeout=20)
        billed = billed_requests(base, operator)
    # Lost: what finished since the last roll, about a second before the kill (1.5 s: a busy
    # machine's tick comes late). Everything answered before that is billed, nothing twice.
    last_second = sum(t > killed - 1.5 for t in answered)
    assert len(answered) - last_second <= billed <= len(answered), (len(answered), last_second, billed)
