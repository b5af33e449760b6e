"""The whole loop on one machine, real parts only: Celery beat + worker on the real Redis decide
from the real router's samples, the local cluster agent starts and stops real simulated-engine
pods, the pod mirror feeds the routing table back to the router. Under load an endpoint scales
up, and back down after its (shortened) scale-down window; an endpoint at zero is woken by a
request, which completes once the new pod is ready.

Waits are on events, not on the machine's speed: the load runs until the scale-up is seen (then
Ctrl-C ends it), and the waking request waits for the router's own answer. The bounds only catch
a stack that hangs; on a busy 2-core machine every step may take several times longer."""

import os
import re
import signal
import subprocess
import sys
import time

import pytest
import redis
from django.conf import settings as django_settings

from controlplane.capacity.models import ModelProfile
from controlplane.endpoints.models import Endpoint
from controlplane.oncall.models import Event
from controlplane.selling import sell
from controlplane.tenants.models import ApiKey
from dataplane.cluster.local import LocalDriver
from dataplane.router.config import RouterConfig
from tests.runtime.support import agent_token_file, free_ports, http, wait_until
from tests.test_stack import post

# Longest the load may run while the test waits for the scale-up: a bound on a hang only, as the
# test ends the load (Ctrl-C) once chat has its 4 replicas.
LOAD_BOUND_S = 180
# `python -m dataplane.loadgen` with Ctrl-C's handler set, lest the shell that started the tests
# left SIGINT ignored for its children.
LOADGEN = (
    "-c",
    "import signal, sys; signal.signal(signal.SIGINT, signal.default_int_handler);"
    " from dataplane.loadgen.__main__ import main; sys.exit(main())",
)
TOTAL = re.compile(r"^total \d+s\s+sent\s+\d+\s+ok\s+(?P<ok>\d+)", re.MULTILINE)


def spawn(args, env, log):
    return subprocess.Popen(
        [sys.executable, *args], env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
    )


def stop(proc):
    if proc.poll() is None:
        os.killpg(proc.pid, 15)
        try:
            proc.wait(timeout=40)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, 9)
            proc.wait(timeout=10)


@pytest.mark.stack
@pytest.mark.celery
@pytest.mark.django_db(transaction=True)
@pytest.mark.timeout(LOAD_BOUND_S + 300)  # the load's bound and the steps around it
def test_beat_scales_local_pods_up_under_load_and_down_after_the_window(
    live_server, settings, owner, make_endpoint, tmp_path
):
    # target 8 per replica, 1..6 replicas; scale down after 20 s instead of 5 min.
    chat = make_endpoint(owner, "chat", max_provisioned_concurrency=48)
    Endpoint.objects.filter(pk=chat.pk).update(autoscaler={"scale_down_window_s": 20.0})
    nightly = make_endpoint(owner, "nightly", scale_to_zero_enabled=True, max_provisioned_concurrency=8)
    # Priced so that concurrency, not MU, drives this test: 300 tokens out cost 0.155 MU.
    ModelProfile.objects.filter(pk=chat.profile_id).update(alpha=0, beta=0.0005, gamma=0.005)
    sell(chat, mu_per_minute=400, best_effort_allowed=True, sold_by="test")
    _, operator = ApiKey.issue(name="router", tenant=None)
    _, tenant_key = ApiKey.issue(name="app", tenant=owner)
    broker = os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/15")
    redis.Redis.from_url(broker).flushdb()  # no stale tasks or samples from an earlier run
    db = django_settings.DATABASES["default"]
    agent_port, router_port = free_ports(2)
    settings.CLUSTER_DRIVER, settings.CLUSTER_AGENT_URL = "local", f"http://127.0.0.1:{agent_port}"  # wake
    settings.CLUSTER_AGENT_TOKEN_FILE = token_file = agent_token_file(tmp_path)
    env = {
        **os.environ,
        "DATABASE_URL": f"postgres://{db['USER']}@{db['HOST']}:{db['PORT']}/{db['NAME']}",
        "REDIS_URL": broker,
        "CELERY_BROKER_URL": broker,
        "CLUSTER_DRIVER": "local",
        "CLUSTER_AGENT_URL": f"http://127.0.0.1:{agent_port}",
        "CLUSTER_AGENT_TOKEN_FILE": token_file,
        "BENCHMARK_CHECK_INTERVAL_S": "3600",
        "CAPACITY_SNAPSHOT_INTERVAL_S": "3600",
        "ROUTER_KEY": operator,
    }
    log = open(tmp_path / "stack.log", "wb")
    procs = [
        spawn(["-m", "dataplane.cluster.agent", "--listen", f"127.0.0.1:{agent_port}", "--drain-delay", "1",
               "--token-file", token_file,
               "--grace", "5", "--log-level", "warning"], env, log),
        spawn(["-m", "dataplane.router", "--listen", f"127.0.0.1:{router_port}", "--control-plane",
               live_server.url, "--redis", broker, "--poll-interval-s", "0.5"], env, log),
        spawn(["-m", "celery", "-A", "controlplane", "worker", "--beat", "--pool=solo", "--loglevel=INFO",
               f"--schedule={tmp_path / 'beat'}"], env, log),
    ]  # fmt: skip
    router = f"http://127.0.0.1:{router_port}"

    def replicas(endpoint):
        endpoint.refresh_from_db()
        for p in procs:
            assert p.poll() is None, (tmp_path / "stack.log").read_text()[-4000:]
        return endpoint.desired_replicas, endpoint.ready_replicas

    try:
        # The first pass declares both deployments; chat's minimum replica starts and is mirrored.
        wait_until(lambda: replicas(chat) == (1, 1), timeout=60, interval=0.5)

        # Wake from zero: the router holds the request, asks the control plane, which starts a
        # pod at once; the request completes when the pod is ready.
        assert replicas(nightly) == (0, 0)
        started = time.monotonic()
        hello = {"model": "nightly", "prompt": "hi", "max_tokens": 4}
        # The router holds the request until the pod is ready or its wake deadline passes (then
        # 503): the client waits longer than that, for the router's answer.
        status, answer = post(
            f"{router}/v1/completions", hello, tenant_key, timeout=RouterConfig.wake_deadline_s + 30
        )
        woke_in = time.monotonic() - started
        assert status == 200 and answer["usage"]["completion_tokens"] == 4, answer
        assert replicas(nightly)[0] == 1
        assert Event.objects.filter(endpoint=nightly, kind="scale", message__contains="0 -> 1").exists()

        # 24 clients with 300-token answers keep 24 requests in the system (at pods or waiting at
        # the router): 8 at the pod and 16 waiting -> (8 + 16) / (0.8 x 8) = 3.75 replicas -> 4
        # once the 20-s window is full of it. The first passes see the window partly loaded and
        # ask for 2, then 3; their pods drain the queue, which then no longer counts, and the
        # requests in flight fill the window alone: 4 about 40 s into the load on a quiet
        # machine, later on a busy one, so the load goes on until the 4 pods are ready and then
        # ends as a newcomer ends it, with Ctrl-C. The load generator is the one a newcomer runs
        # (README).
        load_log = tmp_path / "load.log"
        with load_log.open("wb") as load_out:
            load = spawn([*LOADGEN, "--url", router, "--model", "chat", "--stages", f"{LOAD_BOUND_S}x24",
                          "--max-tokens", "300"], {**env, "MU_API_KEY": tenant_key}, load_out)  # fmt: skip
        loaded = time.monotonic()
        try:
            wait_until(lambda: replicas(chat)[0] >= 4, timeout=LOAD_BOUND_S, interval=0.5)
            up_in = time.monotonic() - loaded
            wait_until(lambda: replicas(chat)[1] >= 4, timeout=60, interval=0.5)
            peak = replicas(chat)[0]
        finally:
            load.send_signal(signal.SIGINT)
            load.wait(timeout=60)
        total = TOTAL.search(load_log.read_text())
        assert load.returncode == 130 and total and int(total["ok"]) > 0, load_log.read_text()[-3000:]
        up = Event.objects.filter(endpoint=chat, kind="scale").order_by("id").first()
        assert up is not None and "in flight" in up.message and up.detail["to"] > up.detail["from"]

        # Load gone: after the 20 s window the highest need is ~0 -> back to the minimum, 1.
        wait_until(lambda: replicas(chat) == (1, 1), timeout=60, interval=0.5)
        down = Event.objects.filter(endpoint=chat, kind="scale").order_by("-id").first()
        assert down.detail["to"] == 1 and "replicas needed over the last 20 s" in down.message
        assert http("GET", f"http://127.0.0.1:{agent_port}/pods")[0] == 401  # the agent's token only
        assert LocalDriver(f"http://127.0.0.1:{agent_port}", token_file).list_pods()
        print(
            f"woke from zero in {woke_in:.1f} s; chat asked for 4 replicas {up_in:.1f} s into the load"
            f" and peaked at {peak}"
        )
    finally:
        for p in reversed(procs):
            stop(p)
        log.close()
