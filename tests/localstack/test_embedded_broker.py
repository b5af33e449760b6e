"""The embedded stack's broker under stress: thousands of messages from several processes, one
publisher SIGKILLed mid-stream, every confirmed message consumed once, and no consumer error (a
Celery worker dies of one: "Unrecoverable error").

The broker is the embedded default as a fresh process of the control plane reads it (no
REDIS_URL, no DATABASE_URL), started the way `make run` starts it (the supervisor's own argv)."""

import json
import os
import signal
import subprocess
import sys
import time
from argparse import Namespace
from pathlib import Path

import pytest

from bench.embedded_broker import CTX, Broker, collect, publisher, run_consumers
from controlplane.localstack.supervisor import stack

pytestmark = pytest.mark.stack  # redis-server and publishers and consumers as subprocesses

ROOT = Path(__file__).resolve().parents[2]
PUBLISHERS, MESSAGES = 3, 1000
BOUND_S = 60


def embedded_default(var: Path) -> tuple[str, dict[str, object]]:
    env = {k: v for k, v in os.environ.items() if k not in ("REDIS_URL", "DATABASE_URL", "CELERY_BROKER_URL")}
    env.update(CONTROLPLANE_VAR_DIR=str(var), DJANGO_SETTINGS_MODULE="controlplane.settings")
    code = (
        "from django.conf import settings; import json; print(json.dumps([settings.CELERY_BROKER_URL, "
        "getattr(settings, 'CELERY_BROKER_TRANSPORT_OPTIONS', {})]))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    url, options = json.loads(done.stdout)
    return url, options


def test_several_processes_publish_and_consume_thousands_with_a_publisher_killed_mid_stream(tmp_path):
    var = tmp_path / "var"
    (var / "redis").mkdir(parents=True)
    url, options = embedded_default(var)
    args = Namespace(var=str(var), bin=str(Path(sys.executable).parent), cp_port=1, router_port=2,
                     agent_port=3, warm_pool=0, key_file="-", agent_token_file="-", pod_key_file="-",
                     vllm_python=None, redis_server="redis-server")  # fmt: skip
    redis_argv = stack(args)[0].argv
    server = subprocess.Popen(redis_argv, stdout=subprocess.DEVNULL) if url.startswith("redis") else None
    try:
        if server is not None:
            deadline = time.monotonic() + 10
            while not (var / "redis.sock").exists():
                assert time.monotonic() < deadline, "redis did not start"
                time.sleep(0.05)
        broker = Broker(url, options, server.pid if server else None)
        started = time.monotonic()
        stop, counter, results, consumers = run_consumers(broker, 2)
        confirmed = tmp_path / "confirmed"
        killed = CTX.Process(target=publisher, args=(broker, range(100_000, 200_000), str(confirmed)))
        killed.start()
        publishers = [
            CTX.Process(target=publisher, args=(broker, range(k * MESSAGES, (k + 1) * MESSAGES), None))
            for k in range(PUBLISHERS)
        ]
        for p in publishers:
            p.start()
        deadline = started + BOUND_S
        while not (confirmed.exists() and len(confirmed.read_text().split()) > 200):
            assert time.monotonic() < deadline, "the publisher to kill confirmed nothing"
            time.sleep(0.01)
        os.kill(killed.pid or 0, signal.SIGKILL)  # mid-stream: it publishes 100,000
        killed.join()
        for p in publishers:
            p.join(timeout=BOUND_S)
            assert p.exitcode == 0
        sent = set(range(PUBLISHERS * MESSAGES)) | {int(x) for x in confirmed.read_text().split()}
        while counter.value < len(sent) and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.5)  # a message the killed publisher sent but had not confirmed may follow
        ids, _, errors = collect(stop, results, consumers)
    finally:
        if server is not None:
            server.terminate()
            server.wait(timeout=10)
    assert not errors
    assert not sent - set(ids), f"{len(sent - set(ids))} of {len(sent)} confirmed messages lost"
    assert len(ids) == len(set(ids)), "a message consumed twice"
    assert time.monotonic() - started < BOUND_S
