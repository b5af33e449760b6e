"""A pod's events credential (controlplane.endpoints.pod_keys), over real sockets: it posts its own
endpoint's pod events and nothing else; every other call is refused. The control plane puts it
in the deployments it declares; it verifies under SECRET_KEY_FALLBACKS too, so the key rotates."""

import json
import os
import subprocess
import sys
import urllib.error
import urllib.request
from dataclasses import replace

import pytest

from controlplane.endpoints import pod_keys
from controlplane.endpoints.deployments import deployment
from controlplane.oncall.models import Event
from dataplane.cluster.local import LocalDriver
from dataplane.wire.pod_events import PodEvent
from tests.runtime.support import agent_token_file, answers, free_port, wait_until

pytestmark = pytest.mark.stack  # a live_server and a cluster agent as a subprocess

HANG = PodEvent(
    "hang", "critical", "ep-1-v1-1", "3 probes failed", None, {"failed_probes": 3}, "2026-11-29T03:00:00Z"
)


def call(url, method="GET", body=None, key=""):
    headers = {"content-type": "application/json", "authorization": f"Bearer {key}"}
    data = None if body is None else json.dumps(body).encode()
    try:
        with urllib.request.urlopen(
            urllib.request.Request(url, data, headers, method=method), timeout=10
        ) as r:
            return r.status, json.loads(r.read() or b"null")
    except urllib.error.HTTPError as err:
        with err:
            return err.code, json.loads(err.read() or b"null")


@pytest.fixture
def endpoints(live_server, owner, other, make_endpoint):
    return make_endpoint(owner, "chat"), make_endpoint(other, "search")


def test_it_posts_its_own_endpoints_events(live_server, endpoints):
    chat, _ = endpoints
    key = pod_keys.events_key(chat.pk)
    assert key.startswith(f"mupod_{chat.pk}_")
    status, body = call(
        f"{live_server.url}/api/v1/events/", "POST", replace(HANG, endpoint=chat.pk).to_json(), key
    )
    assert status == 201, body
    event = Event.objects.get(pk=body["id"])
    assert (event.endpoint, event.tenant, event.reported_by) == (
        chat,
        chat.tenant,
        f"pods of endpoint {chat.pk}",
    )


def test_it_is_refused_for_another_endpoints_event_and_every_other_call(live_server, endpoints):
    chat, search = endpoints
    key = pod_keys.events_key(chat.pk)
    url = f"{live_server.url}/api/v1"
    mine = replace(HANG, endpoint=chat.pk).to_json()
    for body in [
        replace(HANG, endpoint=search.pk).to_json(),  # another tenant's endpoint
        replace(HANG, endpoint=None).to_json(),  # left to the pod's registration to say
        {**mine, "endpoint": str(chat.pk)},  # spelled otherwise
        {**mine, "kind": "rollout"},  # not a kind pods report
        [mine],
    ]:
        assert call(f"{url}/events/", "POST", body, key)[0] == 403, body
    for path in [
        "/events/",
        "/endpoints/",
        f"/endpoints/{chat.pk}/",
        "/pods/",
        "/api-keys/",
        "/whoami/",
        "/routing-table/",
        "/usage/",
        "/metrics/",
        "/capacity/",
        "/tenants/",
    ]:
        assert call(url + path, key=key)[0] == 403, path
    assert call(f"{url}/api-keys/", "POST", {"name": "mine"}, key)[0] == 403
    assert call(f"{url}/endpoints/{chat.pk}/", "PATCH", {"min_provisioned_concurrency": 8}, key)[0] == 403
    event = Event.record(Event.Kind.RESTART, "restarted", endpoint=chat, pod="ep-1-v1-1")
    assert call(f"{url}/events/{event.pk}/acknowledge/", "POST", {}, key)[0] == 403
    assert Event.objects.count() == 1 and Event.objects.get().acknowledged_at is None


def test_a_forged_or_rotated_out_credential_is_refused(live_server, endpoints, settings):
    chat, search = endpoints
    url = f"{live_server.url}/api/v1/events/"
    body = replace(HANG, endpoint=search.pk).to_json()
    forged = pod_keys.events_key(chat.pk).replace(f"mupod_{chat.pk}_", f"mupod_{search.pk}_")
    for key in [
        forged,
        f"mupod_{search.pk}_",
        "mupod_",
        f"mupod_{search.pk}",
        "mupod_x_y",
        "mupod_" + "9" * 40 + "_0",
    ]:
        assert call(url, "POST", body, key)[0] == 401, key
    old = pod_keys.events_key(search.pk)
    settings.SECRET_KEY, settings.SECRET_KEY_FALLBACKS = "a-new-secret-key-" + "x" * 40, [settings.SECRET_KEY]
    assert pod_keys.events_key(search.pk) != old
    assert call(url, "POST", body, old)[0] == 201  # rotating: the old one still verifies
    settings.SECRET_KEY_FALLBACKS = []
    assert call(url, "POST", body, old)[0] == 401  # rotated out
    assert call(url, "POST", body, pod_keys.events_key(search.pk))[0] == 201


def test_the_control_plane_declares_each_endpoints_credential(endpoints):
    chat, search = endpoints
    d = deployment(chat)
    assert pod_keys.endpoint_of(d.events_key) == chat.pk and d.events_key != deployment(search).events_key
    assert d.events_key not in repr(d) and d.events_key not in json.dumps(d.to_json())


@pytest.mark.django_db(transaction=True)
def test_a_pod_of_the_agent_posts_its_hang_with_the_credential_the_control_plane_declared(
    live_server, owner, make_endpoint, tmp_path
):
    """Real parts: the agent (a subprocess, with no operator key of its own) runs the pod the
    control plane declared through the local driver; the pod's engine hangs, and its prober's
    hang event reaches the events API with the endpoint's credential, as the endpoint's."""
    chat = make_endpoint(owner, "chat")
    token_file = agent_token_file(tmp_path)
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k not in ("MU_CONTROL_PLANE_KEY", "ROUTER_KEY")}
    agent = subprocess.Popen(
        [sys.executable, "-m", "dataplane.cluster.agent", "--listen", f"127.0.0.1:{port}",
         "--token-file", token_file, "--control-plane", live_server.url, "--grace", "2"],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        wait_until(lambda: answers(f"http://127.0.0.1:{port}/healthz"), timeout=30)
        declared = deployment(chat)
        hangs = ("--fault", "hang", "--fault-after", "2", "--idle-interval", "0.2")
        hangs += ("--completion-deadline", "1", "--failure-threshold", "1")
        LocalDriver(f"http://127.0.0.1:{port}", token_file).apply(
            [replace(declared, replicas=1, args=(*declared.args, *hangs))]
        )
        wait_until(lambda: Event.objects.filter(endpoint=chat, kind="hang").exists(), timeout=60)
        hang = Event.objects.filter(endpoint=chat, kind="hang").first()
        assert hang is not None and hang.reported_by == f"pods of endpoint {chat.pk}"
        assert (hang.tenant, hang.version) == (owner, chat.version)
    finally:
        agent.terminate()
        agent.wait(timeout=30)
