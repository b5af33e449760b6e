"""The pod-event contract: what a pod's reporter posts is what the events API stores and serves."""

import pytest

from controlplane.oncall.models import Event
from dataplane.wire.pod_events import PodEvent


def test_a_pod_event_round_trips_through_json_and_the_events_api(operator_client, owner, make_endpoint):
    chat = make_endpoint(owner, "chat")
    event = PodEvent(
        "restart",
        "warning",
        "chat-0",
        "restarted",
        chat.pk,
        {"restarts": 2},
        "2026-11-29T03:00:00Z",
        1,
        "owner",
    )
    assert PodEvent.from_json(event.to_json()) == event
    # The reader: the events API takes the body as the reporter posts it and serves it back.
    posted = operator_client.post("/api/v1/events/", event.to_json(), format="json")
    assert posted.status_code == 201, posted.content
    served = operator_client.get(f"/api/v1/events/{posted.json()['id']}/").json()
    assert PodEvent.from_json(served) == event
    assert Event.objects.get().endpoint == chat


def test_a_bad_event_is_refused_naming_the_field_and_value():
    body = PodEvent("hang", "critical", "chat-0", "3 probes failed").to_json()
    with pytest.raises(ValueError, match="event endpoint='7' must be an integer or null"):
        PodEvent.from_json({**body, "endpoint": "7"})
    with pytest.raises(ValueError, match="event kind 'boom' not in"):
        PodEvent.from_json({**body, "kind": "boom"})
