"""Over real HTTP: a pod whose engine is saturated for minutes of simulated time stays live,
and the same pod is declared hung within its deadline once the engine stops progressing."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest

from tests.runtime.support import free_ports, http, metric_value, start_pod, stop_group, wait_until

pytestmark = pytest.mark.stack  # a pod as a subprocess

IDLE_S, DEADLINE_S, SCRAPE_S = 0.3, 1.0, 0.1


@pytest.fixture
def pod() -> Iterator[tuple[str, str]]:
    port, probe_port = free_ports(2)
    proc = start_pod(
        "--engine",
        "sim",
        "--port",
        str(port),
        "--probe-port",
        str(probe_port),
        "--name",
        "busy",
        "--enable-fault-injection",
        "--profile",
        "tiny-test",
        "--time-scale",
        "100",
        "--idle-interval",
        str(IDLE_S),
        "--completion-deadline",
        str(DEADLINE_S),
        "--scrape-interval",
        str(SCRAPE_S),
        "--grace",
        "2",
    )
    engine, probe = f"http://127.0.0.1:{port}", f"http://127.0.0.1:{probe_port}"
    try:

        def ready() -> bool:
            try:
                return http("GET", probe + "/readyz", timeout=1)[0] == 200
            except OSError:
                return False

        wait_until(ready, timeout=15)
        yield engine, probe
    finally:
        stop_group(proc)


def test_saturated_engine_stays_live_then_hang_is_found_within_the_deadline(pod: tuple[str, str]) -> None:
    engine, probe = pod
    stop = threading.Event()

    def client() -> None:  # closed loop: always one long request in flight per client
        for _ in range(1000):
            if stop.is_set():
                return
            try:
                http(
                    "POST",
                    engine + "/v1/completions",
                    {"prompt": "busy " * 50, "max_tokens": 400},
                    timeout=30,
                )
            except OSError:
                return

    # 8 clients on tiny-test's 4 slots: the batch stays full and 4 requests wait. Each
    # request runs ~400 steps x 14 ms = 5.6 s simulated; 3 s of real time at 100x is 5
    # simulated minutes at 100 % load. Liveness must stay 200 all along.
    clients = [threading.Thread(target=client) for _ in range(8)]
    for c in clients:
        c.start()
    try:
        wait_until(lambda: metric_value(engine, "vllm:num_requests_waiting") >= 4, timeout=5)
        end = time.monotonic() + 3.0
        while time.monotonic() < end:
            assert http("GET", probe + "/livez", timeout=2)[0] == 200
            time.sleep(0.05)
        # Still busy (a slot can be empty for a step while its client sends the next one).
        assert metric_value(engine, "vllm:num_requests_running") >= 3
        assert metric_value(engine, "vllm:request_success_total") >= 20

        # Now the engine hangs with the batch full. Worst case to 503: the idle interval
        # before the probe, the completion deadline, one scrape interval, plus slack for
        # process scheduling on a busy 2-core machine.
        http("POST", engine + "/_sim/fault", {"mode": "hang"})
        hung_at = time.monotonic()
        waited = wait_until(
            lambda: http("GET", probe + "/livez", timeout=2)[0] == 503, timeout=10, interval=0.02
        )
        assert waited <= IDLE_S + DEADLINE_S + SCRAPE_S + 0.5
        assert waited >= DEADLINE_S  # not before a probe has waited the whole deadline
        assert time.monotonic() - hung_at < 10
    finally:
        stop.set()
        http("POST", engine + "/_sim/fault", {"mode": "none"})  # release the clients
        for c in clients:
            c.join(timeout=30)
