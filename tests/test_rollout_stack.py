"""A canary rollout under load with real parts and zero failed requests: the local cluster agent
runs real simulated-engine pods, the real router routes by the control plane's table and traffic
split, the load generator keeps clients busy, and the autoscaler's passes (run here, as beat
would) move the endpoint from v1 to v2: the canary's pods start, it takes half the traffic (each
version at its share of the replicas, both committed in /api/v1/capacity/), and once promoted
the rest of v2 starts, traffic moves when they are ready, the old pods drain and go."""

import os
import re
import time

import pytest
from django.utils import timezone
from rest_framework.test import APIClient

from controlplane import drivers, pods, scaling
from controlplane.capacity.models import ModelProfile
from controlplane.endpoints.models import Endpoint, Pod, Rollout
from controlplane.oncall.models import Event
from controlplane.selling import sell
from controlplane.tenants.models import ApiKey
from tests.runtime.support import agent_token_file, answers, free_ports, wait_until
from tests.test_autoscaling_stack import spawn, stop
from tests.test_stack import post

pytestmark = pytest.mark.stack  # a live_server, an agent, routers and pods as subprocesses


@pytest.mark.django_db(transaction=True)
def test_a_canary_rollout_under_load_fails_no_request_and_stays_in_the_ledger(
    live_server, settings, owner, make_endpoint, h100, tmp_path
):
    chat = make_endpoint(owner, "chat", min_provisioned_concurrency=16)  # 2 replicas of 8
    ModelProfile.objects.filter(pk=chat.profile_id).update(alpha=0, beta=0.0005, gamma=0.005)
    ModelProfile.objects.create(model="llama-8b-v2", gpu_type=h100, alpha=0, beta=0.0005, gamma=0.005)
    sell(chat, mu_per_minute=400, best_effort_allowed=True, sold_by="test")
    _, operator = ApiKey.issue(name="router", tenant=None)
    _, tenant_key = ApiKey.issue(name="app", tenant=owner)
    agent_port, router_port = free_ports(2)
    settings.CLUSTER_DRIVER, settings.CLUSTER_AGENT_URL = "local", f"http://127.0.0.1:{agent_port}"
    settings.CLUSTER_AGENT_TOKEN_FILE = token_file = agent_token_file(tmp_path)
    settings.ROLLOUT_DRAIN_S = 3.0
    settings.REDIS_URL = ""  # the router posts its samples to the control plane
    cluster = drivers.driver()
    env = {**os.environ, "ROUTER_KEY": operator}
    log = open(tmp_path / "stack.log", "wb")
    procs = [
        spawn(["-m", "dataplane.cluster.agent", "--listen", f"127.0.0.1:{agent_port}", "--drain-delay", "1",
               "--token-file", token_file,
               "--grace", "10", "--log-level", "warning"], env, log),
        spawn(["-m", "dataplane.router", "--listen", f"127.0.0.1:{router_port}", "--control-plane",
               live_server.url, "--poll-interval-s", "0.3"], env, log),
    ]  # fmt: skip
    router = f"http://127.0.0.1:{router_port}"

    def control_until(done, timeout):
        """What beat does, on a fast clock of real seconds: mirror pods, run the passes."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for p in procs:
                assert p.poll() is None, (tmp_path / "stack.log").read_text()[-3000:]
            pods.sync_pods(cluster)
            scaling.horizontal_pass(cluster, timezone.now())
            if done():
                return
            time.sleep(0.3)  # waiting on other processes
        raise AssertionError(f"not done in {timeout} s: " + (tmp_path / "stack.log").read_text()[-3000:])

    try:
        wait_until(lambda: answers(f"http://127.0.0.1:{agent_port}/healthz"), timeout=30, interval=0.1)
        ready_v1 = Pod.objects.filter(endpoint=chat, version=1, ready=True)
        control_until(lambda: ready_v1.count() == 2, timeout=60)
        hello = {"model": "chat", "prompt": "hi", "max_tokens": 4}
        control_until(lambda: post(f"{router}/v1/completions", hello, tenant_key)[0] == 200, timeout=20)

        load = spawn(["-m", "dataplane.loadgen", "--url", router, "--model", "chat", "--stages", "30x8",
                      "--max-tokens", "100"], {**env, "MU_API_KEY": tenant_key}, log)  # fmt: skip
        try:
            time.sleep(3)  # the load runs on v1 first
            api = APIClient()  # the tenant changes the model through the API
            api.credentials(HTTP_AUTHORIZATION=f"Bearer {tenant_key}")
            body = {"model": "llama-8b-v2", "canary_percent": 50}
            changed = api.patch(f"/api/v1/endpoints/{chat.pk}/", body, format="json")
            assert changed.status_code == 200 and changed.json()["version"] == 2
            rollout = Rollout.objects.get(endpoint=chat)
            control_until(lambda: Rollout.objects.get(pk=rollout.pk).phase == "canary", timeout=60)
            # The Contract: while the canary runs, /capacity/ counts both versions' replicas as
            # committed, at least the pods each runs (its share of the endpoint's replicas).
            ops = APIClient()
            ops.credentials(HTTP_AUTHORIZATION=f"Bearer {operator}")
            (row,) = ops.get("/api/v1/capacity/", {"nodes": "true"}).json()
            placed = [r["endpoint"] for node in row["nodes"] for r in node["replicas"]]
            running = {v: Pod.objects.filter(endpoint=chat, version=v, ready=True).count() for v in (1, 2)}
            assert placed.count("owner/chat v1") >= running[1] >= 1, (placed, running)
            assert placed.count("owner/chat v2") >= running[2] >= 1, (placed, running)
            assert row["committed_replicas"] == len(placed) >= 2
            promoted = api.post(f"/api/v1/endpoints/{chat.pk}/rollout/", {"action": "promote"}, format="json")
            assert promoted.status_code == 202, promoted.content
            control_until(lambda: Rollout.objects.get(pk=rollout.pk).phase == "done", timeout=60)
            # The old pods leave the cluster, and the endpoint serves on v2 alone.
            control_until(lambda: not Pod.objects.filter(endpoint=chat, version=1).exists(), timeout=30)
            assert Pod.objects.filter(endpoint=chat, version=2, ready=True).count() == 2
        finally:
            assert load.wait(timeout=90) == 0
        total = next(
            line for line in (tmp_path / "stack.log").read_text().splitlines() if line.startswith("total ")
        )
        sent, ok = (int(n) for n in re.findall(r"(?:sent|ok)\s+(\d+)", total))
        assert "errors -" in total and sent == ok and ok > 50, total
        phases = list(Event.objects.filter(kind="rollout").order_by("id").values_list("message", flat=True))
        assert "canary at 50% until promoted" in phases[0] and phases[-1].endswith("rollout done")
        assert Endpoint.objects.get(pk=chat.pk).profile.model == "llama-8b-v2"
    finally:
        for p in reversed(procs):
            stop(p)
        log.close()
