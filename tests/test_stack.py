"""The pieces together on loopback: the control plane's routing table feeds a real router, which
authenticates a tenant's key, routes to a simulated engine pod the control plane knows of (with
the fleet key in place of the tenant's: the pod answers nothing else), and meters the request
into Redis for the autoscaler."""

import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request

import pytest
import redis
from django.utils import timezone

from controlplane import scaling
from controlplane.endpoints.models import Pod
from controlplane.selling import sell
from controlplane.tenants.models import ApiKey
from dataplane.wire.load_samples import EndpointSecond, load_key
from tests.runtime.support import free_port, sim_engine

pytestmark = pytest.mark.stack  # a live_server, an engine and a router as subprocesses


def post(url, body, key, timeout=10.0):
    request = urllib.request.Request(
        url,
        data=json.dumps(body).encode(),
        method="POST",
        headers={"content-type": "application/json", "authorization": f"Bearer {key}"},
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        with error:
            return error.code, json.loads(error.read())


@pytest.mark.django_db(transaction=True)
def test_a_tenant_request_flows_through_the_router_to_its_pod(
    live_server, owner, other, make_endpoint, tmp_path
):
    chat = make_endpoint(owner, "chat")
    sell(chat, mu_per_minute=100, best_effort_allowed=True, sold_by="test")
    _, operator = ApiKey.issue(name="router", tenant=None)
    _, owner_key = ApiKey.issue(name="app", tenant=owner)
    _, other_key = ApiKey.issue(name="app", tenant=other)
    broker = os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/15")
    metrics = redis.Redis.from_url(broker)
    metrics.delete(*metrics.keys(load_key(chat.pk, "*")) or ["none"])
    port = free_port()
    # Pods serve under their endpoint's name (the cluster driver passes --served-model-name), so
    # the router passes a tenant's body through untouched: `model` names the endpoint.
    fleet_key = tmp_path / "fleet.key"
    fleet_key.write_text("the-fleet-key\n")
    fleet_key.chmod(0o600)
    with sim_engine(
        "--profile",
        "tiny-test",
        "--time-scale",
        "20",
        "--served-model-name",
        "chat",
        "--api-key",
        "the-fleet-key",
    ) as engine:
        Pod.objects.create(endpoint=chat, name="chat-0", url=engine.url, ready=True)
        router = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "dataplane.router",
                "--listen",
                f"127.0.0.1:{port}",
                "--control-plane",
                live_server.url,
                "--redis",
                broker,
                "--poll-interval-s",
                "0.2",
                "--pod-key-file",
                str(fleet_key),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            env={**os.environ, "ROUTER_KEY": operator},
        )
        try:
            url = f"http://127.0.0.1:{port}/v1/completions"
            body = {"model": "chat", "prompt": "hello there", "max_tokens": 4}
            deadline = time.monotonic() + 30
            status, answer = None, None
            while time.monotonic() < deadline and status != 200:
                try:
                    status, answer = post(url, body, owner_key)
                except OSError:
                    pass  # the router is still starting
                if status != 200:
                    time.sleep(0.2)  # waiting for another process to load its routing table
            assert status == 200, answer
            assert answer["usage"]["completion_tokens"] == 4
            # Another tenant has no endpoint named "chat": not found, not someone else's pod.
            assert post(url, body, other_key)[0] == 404
            assert post(url, body, "mu_not-a-key")[0] == 401
            # the pod itself, with the tenant's key: refused (only the router's fleet key serves)
            assert post(f"{engine.url}/v1/completions", body, owner_key)[0] == 401
            deadline = time.monotonic() + 5
            while time.monotonic() < deadline and not metrics.keys(load_key(chat.pk, "*")):
                time.sleep(0.1)  # the router flushes its meter once a second
            rows = [
                EndpointSecond.from_redis_slots(metrics.get(k)) for k in metrics.keys(load_key(chat.pk, "*"))
            ]
            assert sum(r.requests for r in rows) >= 1
            assert sum(r.mu for r in rows) > 0
            # ...and the control plane turns it into the endpoint's used MU/min (the ledger's USED).
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline and not chat.used_mu_per_minute:
                time.sleep(0.5)  # the request's second must fall in a finished 5-second slot
                scaling.horizontal_pass(None, timezone.now())
                chat.refresh_from_db()
            assert chat.used_mu_per_minute > 0
        finally:
            router.terminate()
            router.wait(timeout=30)
