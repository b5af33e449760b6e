"""A rename with real parts: the local cluster agent runs simulated-engine pods, the router (a
process) routes by the control plane's table, and the tenant renames its endpoint through the
API while it sends requests under the new name. They answer 200 from the router's next table on
(the router's own 404 before it, which reaches no pod and costs nothing); no pod restarts; every
answer and stream chunk names the model asked for; the usage the tenant is billed counts the
answered requests and nothing else; the old name is gone, until a second endpoint takes it."""

import json
import os
import time
from collections.abc import Callable

import httpx
import openai
import pytest
from django.utils import timezone
from rest_framework.test import APIClient

from controlplane import drivers, pods, scaling
from controlplane.capacity.models import ModelProfile
from controlplane.endpoints.models import Endpoint, Pod
from controlplane.selling import sell
from controlplane.tenants.models import ApiKey
from tests.runtime.support import agent_token_file, answers, free_ports, wait_until
from tests.test_autoscaling_stack import spawn, stop

pytestmark = pytest.mark.stack  # a live_server, an agent, routers and pods as subprocesses

RENAMED_WITHIN_S = 20.0  # the Contract's bound; the router's poll (1 s) is what it takes


def ask(router: str, key: str, model: str, stream: bool) -> tuple[int, httpx.Headers, list[str]]:
    """One completion; (status, headers, the model named by the answer or each of its chunks)."""
    body = {"model": model, "prompt": "hi", "max_tokens": 4, "stream": stream}
    answer = httpx.post(
        f"{router}/v1/completions", json=body, headers={"authorization": f"Bearer {key}"}, timeout=10
    )
    if answer.status_code != 200:
        return answer.status_code, answer.headers, [json.loads(answer.content)["error"]["code"]]
    if not stream:
        return 200, answer.headers, [answer.json()["model"]]
    events = [e[6:] for e in answer.text.split("\n\n") if e.startswith("data: {")]
    return 200, answer.headers, [json.loads(e)["model"] for e in events]


@pytest.mark.django_db(transaction=True)
def test_a_rename_fails_no_request_restarts_no_pod_and_bills_no_failure(
    live_server, settings, owner, make_endpoint, h100, tmp_path
):
    cheap = ModelProfile.objects.create(model="sim-cheap", gpu_type=h100, alpha=0, beta=0.0005, gamma=0.005)
    chat = make_endpoint(owner, "chat", profile=cheap, min_provisioned_concurrency=8)  # 1 replica
    sell(chat, mu_per_minute=400, best_effort_allowed=True, sold_by="test")
    _, operator = ApiKey.issue(name="router", tenant=None)
    _, key = ApiKey.issue(name="app", tenant=owner)
    agent_port, router_port = free_ports(2)
    settings.CLUSTER_DRIVER, settings.CLUSTER_AGENT_URL = "local", f"http://127.0.0.1:{agent_port}"
    settings.CLUSTER_AGENT_TOKEN_FILE = token_file = agent_token_file(tmp_path)
    settings.REDIS_URL = ""  # the router polls the table and posts its seconds to the control plane
    cluster = drivers.driver()
    env = {**os.environ, "ROUTER_KEY": operator}
    log = open(tmp_path / "stack.log", "wb")
    procs = [
        spawn(["-m", "dataplane.cluster.agent", "--listen", f"127.0.0.1:{agent_port}", "--drain-delay", "1",
               "--token-file", token_file,
               "--grace", "10", "--log-level", "warning"], env, log),
        spawn(["-m", "dataplane.router", "--listen", f"127.0.0.1:{router_port}", "--control-plane",
               live_server.url, "--poll-interval-s", "1"], env, log),
    ]  # fmt: skip
    router = f"http://127.0.0.1:{router_port}"
    api = APIClient()
    api.credentials(HTTP_AUTHORIZATION=f"Bearer {key}")

    def control_until(done: Callable[[], bool], timeout: float) -> None:
        """What beat does, on a clock of real seconds: mirror pods, run the passes."""
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

    def billed(endpoint: Endpoint) -> tuple[int, int, float]:
        """(requests, errors, MU) of the endpoint in the tenant's usage."""
        rows = api.get(f"/api/v1/usage/?endpoint={endpoint.pk}").json()["results"]
        return sum(r["requests"] for r in rows), sum(r["errors"] for r in rows), sum(r["mu"] for r in rows)

    try:
        wait_until(lambda: answers(f"http://127.0.0.1:{agent_port}/healthz"), timeout=30, interval=0.1)
        control_until(lambda: Pod.objects.filter(endpoint=chat, ready=True).count() == 1, timeout=60)
        control_until(lambda: ask(router, key, "chat", False)[0] == 200, timeout=20)
        pods_before = [p.to_json() for p in cluster.list_pods()]
        ok = 1
        # What the warm-up cost: 503s (and their errors) while the router had no ready pod yet.
        control_until(lambda: billed(chat)[0] >= ok, timeout=30)
        errors_before = billed(chat)[1]

        renamed = api.patch(f"/api/v1/endpoints/{chat.pk}/", {"name": "assistant"}, format="json")
        assert renamed.status_code == 200 and renamed.json()["served_model_name"] == "chat"
        renamed_at = time.monotonic()
        answered: list[tuple[float, int, httpx.Headers, list[str]]] = []
        while len([a for a in answered if a[1] == 200]) < 20:  # until 20 answers under the new name
            assert time.monotonic() - renamed_at < RENAMED_WITHIN_S, answered
            status, headers, named = ask(router, key, "assistant", stream=len(answered) % 2 == 1)
            answered.append((time.monotonic() - renamed_at, status, headers, named))
        first_ok = next(i for i, a in enumerate(answered) if a[1] == 200)
        # Before the router's next table: its own 404, priced at nothing (no pod saw it); after
        # it, every request answered, each answer and chunk under the name asked for.
        assert all(a[1] == 404 and a[3] == ["model_not_found"] for a in answered[:first_ok]), answered
        assert all("x-mu-cost" not in a[2] for a in answered[:first_ok])
        assert all(a[1] == 200 and set(a[3]) == {"assistant"} for a in answered[first_ok:]), answered
        assert answered[first_ok][0] < 5.0, answered  # a poll or two, well within the bound
        assert all(float(a[2]["x-mu-cost"]) > 0 for a in answered[first_ok:] if "x-mu-cost" in a[2])
        ok += len(answered) - first_ok
        # The SDK reads it as any model: the router's list names the endpoint's current name.
        with openai.OpenAI(base_url=f"{router}/v1", api_key=key, max_retries=0) as sdk:
            assert [m.id for m in sdk.models.list().data] == ["assistant"]
            stream = sdk.chat.completions.create(
                model="assistant", messages=[{"role": "user", "content": "hi"}], max_tokens=3, stream=True
            )
            assert {c.model for c in stream} == {"assistant"}
            ok += 1

        # No pod restarted or was replaced: they still serve "chat", and the router maps onto it.
        control_until(lambda: True, timeout=5)  # passes after the rename declare the same deployment
        pods_after = [p.to_json() for p in cluster.list_pods()]
        assert [(p["name"], p["restarts"]) for p in pods_after] == [(p["name"], 0) for p in pods_before]
        # The old name is no endpoint now: the router's 404, nothing billed.
        status, headers, named = ask(router, key, "chat", False)
        assert (status, named) == (404, ["model_not_found"]) and "x-mu-cost" not in headers

        # The bill: the answered requests, no new error, no 404 (the router's seconds, collected).
        control_until(lambda: billed(chat)[0] >= ok, timeout=30)
        requests, errors, mu = billed(chat)
        assert (requests, errors) == (ok, errors_before) and mu > 0

        # A second endpoint takes the old name: "chat" is that one, on pods of its own.
        second = make_endpoint(owner, "chat", profile=cheap, min_provisioned_concurrency=8)
        control_until(lambda: Pod.objects.filter(endpoint=second, ready=True).count() == 1, timeout=60)
        control_until(lambda: ask(router, key, "chat", False)[0] == 200, timeout=20)
        status, headers, named = ask(router, key, "chat", True)
        assert status == 200 and set(named) == {"chat"}
        assert headers["x-pod"].startswith(f"ep-{second.pk}-v1-")
        status, headers, named = ask(router, key, "assistant", False)
        assert status == 200 and named == ["assistant"] and headers["x-pod"].startswith(f"ep-{chat.pk}-v1-")
    finally:
        for p in reversed(procs):
            stop(p)
        log.close()
