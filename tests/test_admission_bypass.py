"""A tenant cannot raise what it is admitted: the router (`python -m dataplane.router`, real Redis)
in front of the real simulated engine over HTTP, in static mode (`--rate-limit-mu-per-min`) and in
control-plane mode (a live control plane, a sold reservation).

100 MU/min and a 10 s burst tolerance hold 16.7 MU; a `max_tokens` 3000 completion is priced at
0.02 x 3000 + 0.1 + input = 60.1 MU (static and the 70B profile price alike), so one request in
an empty bucket conforms and the next 19 are 429; then, the bucket still full (it drains 1.7 MU
a second), none of 20 with the header `x-probe: 1` nor with `"priority": -1000` (measured before
this: 20 of 20 with either). The prober's credential, and only it, still makes a probe. (The
bucket is the router's own, at the share of the reservation it leases from Redis.)"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from controlplane.endpoints.models import Pod
from controlplane.selling import sell
from controlplane.tenants.models import ApiKey
from tests.runtime.support import router_process as router
from tests.runtime.support import sim_engine

pytestmark = pytest.mark.stack  # a simulated engine and routers as subprocesses

REDIS_URL = os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/15")
PROBE_KEY = "prober-credential-3f9c"
BIG = {"prompt": "hello there", "max_tokens": 3000}
# h100-llama-8b: max_model_len 8192; 3000 tokens of 6 ms steps in 18 ms at 1000x
ENGINE = ("--profile", "h100-llama-8b", "--time-scale", "1000", "--served-model-name", "chat")


@pytest.fixture
def redis_db() -> Iterator[object]:
    """The test Redis; the lease keys (``mu:lease:*``) removed before and after."""
    import redis

    client = redis.Redis.from_url(REDIS_URL)
    try:
        client.ping()
    except redis.RedisError as exc:  # pragma: no cover - CI starts Redis (.ci/run)
        pytest.skip(f"no Redis at {REDIS_URL}: {exc}")
    for key in client.scan_iter("mu:lease:*"):
        client.delete(key)
    yield client
    for key in client.scan_iter("mu:lease:*"):
        client.delete(key)
    client.close()


def admitted(
    client: httpx.Client, count: int = 20, headers: dict[str, str] | None = None, **extra: object
) -> int:
    """How many of ``count`` max_tokens-3000 completions answer 200 (the others must be 429)."""
    statuses = [
        client.post("/v1/completions", json={"model": "chat", **BIG, **extra}, headers=headers).status_code
        for _ in range(count)
    ]
    assert set(statuses) <= {200, 429}, statuses
    return statuses.count(200)


def test_static_mode_reservation_holds_whatever_the_client_claims(redis_db, tmp_path):
    key_file = tmp_path / "probe-key"
    key_file.write_text(PROBE_KEY + "\n")
    static = ("--rate-limit-mu-per-min", "100", "--redis", REDIS_URL, "--probe-key-file", str(key_file))
    with (
        sim_engine(*ENGINE) as engine,
        router("--backends", engine.url, *static) as base,
        httpx.Client(base_url=base, timeout=30) as c,
    ):
        for claim, conforming in (({}, 1), ({"headers": {"x-probe": "1"}}, 0), ({"priority": -1000}, 0)):
            assert admitted(c, **claim) == conforming, claim
        assert admitted(c, 5, headers={"x-probe": PROBE_KEY}) == 5  # the prober's credential
        # the contract: an absurd budget is a 400 that names it, and nothing is metered
        r = c.post("/v1/completions", json={"model": "chat", "prompt": "hi", "max_tokens": 10**26})
        assert r.status_code == 400 and r.json()["error"]["param"] == "max_tokens"
        assert "max_tokens" in r.json()["error"]["message"]
        families = {f.name: f for f in text_string_to_metric_families(c.get("/metrics").text)}
        finished = sum(
            s.value for s in families["router_requests"].samples if s.name == "router_requests_total"
        )
        assert finished == 1 + 5  # the one admitted and the probes; the 400 was not metered


@pytest.mark.django_db(transaction=True)
def test_control_plane_mode_reservation_holds_whatever_the_tenant_claims(
    live_server, owner, make_endpoint, big_model, redis_db
):
    big_model.max_model_len = 4096  # the engine serves 8192: what the router refuses is the table's
    big_model.save()
    chat = make_endpoint(owner, "chat", profile=big_model)
    sell(chat, mu_per_minute=100, best_effort_allowed=False, sold_by="test")
    _, operator = ApiKey.issue(name="router", tenant=None)
    _, tenant_key = ApiKey.issue(name="app", tenant=owner)
    with sim_engine(*ENGINE) as engine:
        Pod.objects.create(endpoint=chat, name="chat-0", url=engine.url, ready=True)
        cp_mode = ("--control-plane", live_server.url, "--poll-interval-s", "0.2", "--redis", REDIS_URL)
        env = {"ROUTER_KEY": operator, "ROUTER_PROBE_KEY": PROBE_KEY}
        with (
            router(*cp_mode, env=env) as base,
            httpx.Client(base_url=base, timeout=30, headers={"authorization": f"Bearer {tenant_key}"}) as c,
        ):
            deadline = time.monotonic() + 30
            while "chat" not in [m["id"] for m in c.get("/v1/models").json().get("data", [])]:
                assert time.monotonic() < deadline, "the router never loaded the endpoint"
                time.sleep(0.2)
            for claim, conforming in (({}, 1), ({"headers": {"x-probe": "1"}}, 0), ({"priority": -1000}, 0)):
                assert admitted(c, **claim) == conforming, claim
            assert admitted(c, 3, headers={"x-probe": PROBE_KEY}) == 3
            r = c.post("/v1/completions", json={"model": "chat", "prompt": "hi", "max_tokens": 5000})
            assert r.status_code == 400 and r.json()["error"]["param"] == "max_tokens"
            assert "4096" in r.json()["error"]["message"]  # the profile's, not the engine's 8192
