"""Every pod event names its tenant, endpoint and version, whichever writer reports it (the pod's
prober, the agent's supervisor, the Kubernetes pod watcher); the control plane trusts the
endpoint over the tenant; tenants read their own pods' restarts and hangs, nothing of another's,
and no address of the fleet."""

import io
from dataclasses import replace

from controlplane import pods
from controlplane.endpoints.models import Pod
from controlplane.oncall.models import Event
from dataplane.cluster.agent import Agent, control_plane_args
from dataplane.cluster.driver import Deployment
from dataplane.cluster.k8s_objects import pod_events
from dataplane.runtime.pod import parse_args
from dataplane.wire.pod_events import PodEvent, attribution
from tests.cluster.kube_standin import pod as k8s_pod

RESTART = PodEvent(
    "restart", "warning", "ep-1-v2-1", "pod ep-1-v2-1 restarted: liveness failed (/livez 503)", None,
    {"livez": 503, "probe": "http://10.0.3.7:8001/livez"}, "2026-11-29T03:00:00Z",
)  # fmt: skip


def test_the_deployment_labels_name_endpoint_version_and_tenant():
    assert attribution({"endpoint": "7", "version": "2", "tenant": "acme"}) == (7, 2, "acme")
    assert attribution({"benchmark": "3"}) == (None, None, "")
    assert attribution({"endpoint": "x7", "version": "-1"}) == (None, None, "")


class RecordingSupervisor:
    """What the agent asks its supervisor to start (no process is started)."""

    def __init__(self):
        self.launched = []

    def start_pod(self, launch):
        self.launched.append(launch)

    def list_pods(self):
        return []


def test_the_agent_hands_each_pod_its_attribution_and_arguments():
    supervisor = RecordingSupervisor()
    args = control_plane_args("http://127.0.0.1:8000")
    agent = Agent(supervisor, pod_args=args, clock=lambda: 0.0)  # type: ignore[arg-type]
    labels = {"endpoint": "7", "version": "2", "tenant": "acme"}
    agent.apply([Deployment("ep-7-v2", 1, "sim", (), 8, labels, "mupod_7_x"), Deployment("bench-3", 1)])
    agent.reconcile_once()
    launch, bench = sorted(supervisor.launched, key=lambda launch: launch.name, reverse=True)
    assert launch.attribution == (7, 2, "acme")  # on the supervisor's restart and crash-loop events
    parsed, _ = parse_args(launch.pod_args())  # and on the pod's own (its prober's hangs)
    assert (parsed.endpoint_id, parsed.endpoint_version, parsed.tenant) == (7, 2, "acme")
    # ... posted with its endpoint's events credential, in its environment; a pod without one
    # (a benchmark's) posts none.
    assert launch.env == (("MU_POD_EVENTS_KEY", "mupod_7_x"),)
    assert "--control-plane-url" not in bench.pod_args() and bench.env == ()


def test_the_kubernetes_watcher_reads_them_from_the_pods_labels():
    old, new = k8s_pod("ep-7-v2-x", endpoint="7", restarts=0), k8s_pod("ep-7-v2-x", endpoint="7", restarts=1)
    new["metadata"]["labels"].update({"mu/version": "2", "mu/tenant": "acme"})
    (event,) = pod_events(old, new)
    assert (event.endpoint, event.version, event.tenant) == (7, 2, "acme")


def test_the_watchers_event_is_recorded_on_the_endpoint_and_its_tenant(owner, make_endpoint):
    chat = make_endpoint(owner, "chat")
    event = pods.record_pod_event(replace(RESTART, endpoint=chat.pk, version=1, tenant="owner"))
    assert (event.tenant, event.endpoint, event.version) == (owner, chat, 1)
    # a pod with no endpoint label, registered with the control plane: attributed through it
    Pod.objects.create(endpoint=chat, name="ep-x-9", url="http://10.0.3.9:8000", version=1)
    event = pods.record_pod_event(replace(RESTART, pod="ep-x-9"))
    assert (event.tenant, event.endpoint, event.version) == (owner, chat, 1)


def test_the_api_derives_the_tenant_from_the_endpoint_and_refuses_a_mismatch(
    operator_client, owner, other, make_endpoint
):
    chat = make_endpoint(owner, "chat")
    posted = operator_client.post(
        "/api/v1/events/", replace(RESTART, endpoint=chat.pk).to_json(), format="json"
    )
    assert posted.status_code == 201 and posted.json()["tenant"] == "owner"
    lying = replace(RESTART, endpoint=chat.pk, tenant="other").to_json()
    refused = operator_client.post("/api/v1/events/", lying, format="json")
    assert refused.status_code == 400 and "tenant" in refused.json()["fields"], refused.content
    unknown = operator_client.post(
        "/api/v1/events/", replace(RESTART, tenant="nobody").to_json(), format="json"
    )
    assert unknown.status_code == 400 and "tenant" in unknown.json()["fields"]
    assert Event.objects.count() == 1


def test_an_event_naming_only_a_registered_pod_is_attributed_through_it(
    operator_client, owner, make_endpoint
):
    chat = make_endpoint(owner, "chat")
    Pod.objects.create(endpoint=chat, name="ep-1-v2-1", url="http://10.0.3.7:8000", version=2)
    body = operator_client.post("/api/v1/events/", RESTART.to_json(), format="json").json()
    assert (body["tenant"], body["endpoint"], body["version"], body["endpoint_name"]) == (
        "owner",
        chat.pk,
        2,
        "chat",
    )


def test_a_hostile_tenant_sees_its_own_pods_events_and_nothing_else(
    operator_client, owner_client, other_client, owner, other, make_endpoint
):
    mine, theirs = make_endpoint(owner, "chat"), make_endpoint(other, "their-chat")
    for endpoint, pod in ((mine, "ep-mine-1"), (theirs, "ep-theirs-1")):
        posted = operator_client.post(
            "/api/v1/events/", replace(RESTART, endpoint=endpoint.pk, pod=pod).to_json(), format="json"
        )
        assert posted.status_code == 201
    their_event = Event.objects.get(pod="ep-theirs-1")
    (own,) = owner_client.get("/api/v1/events/").json()["results"]
    assert own["pod"] == "ep-mine-1" and own["tenant"] == "owner" and own["kind"] == "restart"
    assert "10.0.3.7" not in str(own) and own["detail"]["probe"] == "<internal address>"
    assert "10.0.3.7" in str(operator_client.get(f"/api/v1/events/{own['id']}/").json())  # operators see all
    # every way of asking for the other tenant's event
    assert owner_client.get(f"/api/v1/events/{their_event.pk}/").status_code == 404
    assert owner_client.get("/api/v1/events/?pod=ep-theirs-1").json()["results"] == []
    assert owner_client.get(f"/api/v1/events/?group={their_event.group_id}").json()["results"] == []
    assert owner_client.get("/api/v1/events/?tenant=other").json()["results"] == []
    by_id = owner_client.get(f"/api/v1/events/?endpoint={theirs.pk}")
    missing = owner_client.get(f"/api/v1/events/?endpoint={theirs.pk + 1000}")
    assert by_id.status_code == missing.status_code == 400  # refused alike: existence does not leak
    assert "endpoint" in by_id.json()["fields"] and "endpoint" in missing.json()["fields"]
    assert owner_client.post(f"/api/v1/events/{their_event.pk}/acknowledge/").status_code == 403
    assert (
        owner_client.post(
            "/api/v1/events/", replace(RESTART, endpoint=mine.pk).to_json(), format="json"
        ).status_code
        == 403
    )


def test_the_demo_names_no_pod_that_does_not_exist(db):
    from django.core.management import call_command

    call_command("load_demo", stdout=io.StringIO())
    named = set(Event.objects.exclude(pod="").values_list("pod", flat=True))
    assert named <= set(Pod.objects.values_list("name", flat=True)), named
