"""The contract a control-plane outage keeps, on the embedded stack's shape (no Redis): the
production web server (the image's command, against the test PostgreSQL), a router posting its
seconds to it, a simulated engine. The web server is stopped for OUTAGE_S while the router
serves from the routing table it has; every request answered meanwhile is in /api/v1/usage/
within DEADLINE_S of the web server's return, none twice. The collector runs in the test, as
Celery beat runs it, every BEAT_S."""

from __future__ import annotations

import os
import signal
import subprocess
import tempfile
import threading
import time

import pytest
from django.utils import timezone

from controlplane.endpoints import collector
from controlplane.endpoints.models import Lease, Pod
from controlplane.tenants.models import ApiKey
from tests.production_server import ROOT, database_url, image_command, rebound
from tests.runtime.support import answers, free_port, sim_engine, wait_until
from tests.test_metering_delivery import metric, router
from tests.test_usage_end_to_end import call, profile, selling, totals, usage_rows  # noqa: F401 (a fixture)

pytestmark = pytest.mark.stack  # a control plane, a router and an engine as subprocesses

OUTAGE_S = 30.0
DEADLINE_S = 90.0
BEAT_S = 5.0


class WebServer:
    """The control plane's web server on a fixed port, stopped and started again at will."""

    def __init__(self) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = tempfile.TemporaryFile()
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        env = {k: v for k, v in os.environ.items() if k not in ("DEBUG", "DJANGO_SETTINGS_MODULE")}
        env.update(
            DATABASE_URL=database_url(),
            REDIS_URL="",  # embedded: seconds are posted to the control plane
            SECRET_KEY="test-outage-" + "k" * 40,
            ALLOWED_HOSTS="127.0.0.1",
            PYTHONPATH=str(ROOT),
            WEB_CONCURRENCY="2",
        )
        command = rebound(image_command(), self.port)
        self.proc = subprocess.Popen(
            command, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=self.log, start_new_session=True
        )
        wait_until(lambda: answers(self.url + "/healthz"), timeout=30)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            self.proc.wait(timeout=30)
        self.proc = None


@pytest.mark.django_db(transaction=True)
def test_requests_answered_while_the_control_plane_is_down_are_billed_once_it_is_back(
    settings, profile, owner, make_endpoint  # noqa: F811 (the fixture)
):  # fmt: skip
    settings.REDIS_URL = ""  # the collector, here, reads the posted seconds
    chat = make_endpoint(owner, "chat", profile=profile)
    selling(chat)
    _, operator = ApiKey.issue(name="router", tenant=None)
    _, tenant = ApiKey.issue(name="app", tenant=owner)
    web = WebServer()
    answered: list[float] = []
    refused: list[int] = []
    stop = threading.Event()
    body = {"model": "chat", "prompt": "hi", "max_tokens": 2}
    with sim_engine("--profile", "tiny-test", "--time-scale", "20", "--served-model-name", "chat") as engine:
        Pod.objects.create(endpoint=chat, name="chat-0", url=engine.url, ready=True)
        web.start()
        try:
            with router(web.url, operator) as (url, _):

                def traffic() -> None:  # a client's steady trickle, outage or not
                    while not stop.wait(0.1):
                        status, _ = call(url + "/v1/completions", tenant, body)
                        if status == 200:
                            answered.append(time.monotonic())
                        else:
                            refused.append(status)

                client = threading.Thread(target=traffic)
                client.start()
                try:
                    wait_until(lambda: len(answered) >= 10, timeout=20)
                    web.stop()
                    down = time.monotonic()
                    wait_until(lambda: time.monotonic() - down >= OUTAGE_S, timeout=OUTAGE_S + 5, interval=1)
                    held = metric(url, "router_metering_seconds_held")
                    during = sum(t > down for t in answered)
                    web.start()
                    back = time.monotonic()
                finally:
                    stop.set()
                    client.join(timeout=30)
                total = len(answered)

                def billed() -> int:
                    """Usage after the beat's next collect pass."""
                    Lease.objects.filter(name=collector.COLLECTOR).update(last_run_at=None)
                    collector.collect_pass(timezone.now())
                    return int(totals(usage_rows(web.url, operator))["requests"])

                waited = wait_until(lambda: billed() >= total, timeout=DEADLINE_S, interval=BEAT_S)
                assert time.monotonic() - back <= DEADLINE_S
                assert billed() == billed() == total  # later passes add nothing: none twice
        finally:
            web.stop()
            web.log.close()
    assert refused == [] and during >= OUTAGE_S, (refused, during)  # served all along
    assert held >= OUTAGE_S - 2  # the router held the outage's seconds
    print(
        f"outage {OUTAGE_S:.0f} s: {during} answered during it, {total} in all, billed {waited:.1f} s after"
    )
