"""The API's answers read fast (FastAnswer) are DRF's own: every read of a varied fleet gives the
same bytes with DRF's per-field machinery, and each kind of field, on each kind of value, reads
as DRF reads it."""

import datetime as dt
import inspect
import json
from fractions import Fraction
from types import SimpleNamespace
from typing import Any

import pytest
from django.utils import timezone
from rest_framework import serializers as drf
from rest_framework.test import APIClient

from controlplane.api.serializers.base import ExactNumberField, FastAnswer, StrictInput
from controlplane.api.urls import router
from controlplane.capacity.models import GpuPool, ProfileFit, ProvisionedAllowance
from controlplane.endpoints.models import Pod, UsageHour
from controlplane.oncall.models import Event
from controlplane.selling import sell
from controlplane.tenants.models import ApiKey


def drf_own(self: Any, instance: Any) -> Any:
    return drf.Serializer.to_representation(self, instance)


def test_every_read_of_a_varied_fleet_is_the_same_bytes_as_drf_makes_them(
    monkeypatch, operator_client, owner_client, other_client, owner, other, make_endpoint, small_model, l40s
):
    GpuPool.objects.create(name="empty-l40s", gpu_type=l40s, region="eu-west-1", gpu_count=8)
    plain = make_endpoint(owner, "plain", used_mu_per_minute=12.5)
    reserved = make_endpoint(owner, "reserved")
    sell(reserved, mu_per_minute=30, best_effort_allowed=True, sold_by="t")
    theirs = make_endpoint(other, "theirs")
    Pod.objects.create(endpoint=plain, name="plain-0", url="http://10.1.2.3:8000", ready=True, version=1)
    Pod.objects.create(endpoint=theirs, name="theirs-0", url="http://10.9.9.9:8000")
    Event.record(
        "hang",
        "pod plain-0 at 10.1.2.3:8000 hung",
        endpoint=plain,
        pod="plain-0",
        detail={"addresses": ["10.1.2.3:8000"], "seconds": 31.5, "nested": {"ok": True}},
    )
    Event.record("restart", "the fleet restarted", severity="critical")
    Event.record("hang", "theirs hung", endpoint=theirs).acknowledge("ops", timezone.now())
    ProvisionedAllowance.objects.create(tenant=owner, pool=plain.pool, gpus=8, set_by="ops")
    now = timezone.now()
    ProfileFit.objects.create(
        profile=small_model, status="published", alpha=0.001, beta=0.01, gamma=0.02, r2=0.99,
        samples=40, intervals={"alpha": [0.0009, 0.0011]}, started_at=now, finished_at=now,
    )  # fmt: skip
    ApiKey.issue(name="revoked", tenant=owner)[0].revoke()
    hour = int(now.timestamp()) // 3600 * 3600
    for start, mu in [(hour, 12.345678), (hour - 3600, 7.0)]:
        UsageHour.objects.create(
            endpoint_id=plain.pk, endpoint_name=plain.name, tenant=owner, start=start, mu=mu, requests=3
        )

    lists = [f"/api/v1/{prefix}/" for prefix, _, _ in router.registry]
    asked = [
        "/api/v1/capacity/?nodes=true",
        "/api/v1/events/?page_size=2",
        "/api/v1/pods/?page=1",
        f"/api/v1/model-profiles/{small_model.pk}/fits/",
        "/api/v1/usage/",
        "/api/v1/usage/?granularity=day",
    ]
    answered = 0
    for client in (operator_client, owner_client, other_client):
        client.get("/api/v1/whoami/")  # the key's last use, written once, then as it stays
        paths = lists + asked
        for path in paths:  # each listed row's own answer joins them
            fast = client.get(path)
            with monkeypatch.context() as m:
                m.setattr(FastAnswer, "to_representation", drf_own)
                slow = client.get(path)
            assert (fast.status_code, fast.content) == (slow.status_code, slow.content), path
            answered += fast.status_code == 200
            if path in lists and fast.status_code == 200:
                body = fast.json()
                paths += [f"{path}{row['id']}/" for row in (body["results"] if "results" in body else body)]
    assert answered > 60, answered  # the lists and their rows, for each of the three principals
    events = owner_client.get("/api/v1/events/").json()["results"]
    assert "10.1.2.3" not in json.dumps(events) and events[0]["detail"]["seconds"] == 31.5
    assert [u["mu"] for u in owner_client.get("/api/v1/usage/").json()["results"]] == [7, 12.345678]


class Child(FastAnswer, drf.Serializer[Any]):
    n = drf.IntegerField(read_only=True)
    name = drf.CharField(read_only=True)


class OwnRead(drf.CharField):
    """A field that reads its value its own way (as DRF's ModelField does)."""

    def get_attribute(self, instance: Any) -> Any:
        return instance

    def to_representation(self, value: Any) -> str:
        return f"read {type(value).__name__}"


class Kinds(FastAnswer, drf.Serializer[Any]):
    """A field of each kind FastAnswer reads itself, and of some it leaves to DRF."""

    number = drf.IntegerField(source="a.b", read_only=True)
    text = drf.CharField(read_only=True)
    ratio = drf.FloatField(read_only=True)
    exact = ExactNumberField(read_only=True)
    flag = drf.BooleanField(read_only=True)
    at = drf.DateTimeField(read_only=True)
    day = drf.DateTimeField(read_only=True, format="%Y-%m-%d")
    nullable = drf.CharField(source="gone", allow_null=True, read_only=True)
    computed = drf.IntegerField(source="compute", read_only=True)
    method = drf.SerializerMethodField()
    children = Child(many=True, read_only=True)
    choice = drf.ChoiceField(choices=[("a", "A"), (1, "one")], read_only=True)
    own = OwnRead(source="text", read_only=True)

    def get_method(self, instance: Any) -> Any:
        return [self.context.get("asked"), getattr(instance, "text", None)]


UTC = dt.UTC
VALUES: dict[str, list[Any]] = {
    "a": [SimpleNamespace(b=3), SimpleNamespace(b="4"), SimpleNamespace(b=None), None, SimpleNamespace()],
    "text": ["x", 5, None, Fraction(1, 3)],
    "ratio": [1, 2.5, "3.5", None],
    "exact": [Fraction(7, 3), Fraction(6, 3), 2.0, None],
    "flag": [True, False, "yes", "false", 0, 1, None, "other"],
    "at": [
        dt.datetime(2026, 12, 7, 1, 2, 3, 456, tzinfo=UTC),
        dt.datetime(2026, 12, 7, 1, 2, 3, tzinfo=UTC),
        dt.datetime(2026, 12, 7, 3, 2, 3, tzinfo=dt.timezone(dt.timedelta(hours=2))),
        dt.datetime(2026, 12, 7, 1, 2, 3),
        "2026-12-07",
        None,
    ],
    "children": [[SimpleNamespace(n=1, name="a"), {"n": "2", "name": 3}], []],
    "choice": ["a", 1, "1", "z", ""],
}


def instances() -> list[Any]:
    """Objects across VALUES (each value of each field at least once, on an object and in a
    mapping), some missing attributes, some with the callable `compute`."""
    out: list[Any] = []
    longest = max(len(v) for v in VALUES.values())
    for i in range(longest):
        fields = {name: values[i % len(values)] for name, values in VALUES.items()}
        fields["day"] = fields["at"]
        if i % 3 == 0:
            fields["compute"] = lambda i=i: i * 10
        elif i % 3 == 1:
            fields["gone"] = "here"
        if i % 4 == 3:
            fields.pop("text")  # read-only and missing: DRF leaves it out
        out += [SimpleNamespace(**fields), fields]  # attributes, and a mapping's keys
    return out


def test_each_kind_of_field_on_each_kind_of_value_reads_as_drf_reads_it():
    """In UTC and in another time zone, by a new serializer and by one that answered in the
    other zone before (a list's serializer answers every row)."""
    reused = Kinds(context={"asked": "me"})
    for zone in ["UTC", "Europe/Paris", "UTC"]:
        with timezone.override(zone):
            for instance in instances():
                drf_answer = drf.Serializer.to_representation(Kinds(context={"asked": "me"}), instance)
                new = Kinds(instance, context={"asked": "me"}).data
                for fast in (new, reused.to_representation(instance)):
                    assert json.dumps(fast, default=str) == json.dumps(drf_answer, default=str), instance
                    assert [type(v) for v in fast.values()] == [type(v) for v in drf_answer.values()]


def test_the_schema_describes_no_serializer_by_fast_answer(db):
    """drf-spectacular publishes a serializer's first docstring in its class tree as its
    description: FastAnswer, first among every serializer's bases, must add none."""
    schemas = APIClient().get("/api/schema/", HTTP_ACCEPT="application/vnd.oai.openapi+json").json()
    described = {name: body.get("description") for name, body in schemas["components"]["schemas"].items()}
    assert described["ProfileFit"] is None and described["Usage"] is None, described
    assert described["Tenant"] == described["Pod"] == inspect.cleandoc(StrictInput.__doc__ or "")


@pytest.mark.django_db
def test_related_fields_read_their_key_and_slug_as_drf_does(owner, make_endpoint):
    from controlplane.api.serializers import EventSerializer, PodSerializer, ReservationSerializer

    endpoint = make_endpoint(owner, "e")
    sold = sell(endpoint, mu_per_minute=30, best_effort_allowed=False, sold_by="t")
    pod = Pod.objects.create(endpoint=endpoint, name="e-0", url="http://10.0.0.1:80")
    fleetwide = Event.record("restart", "no tenant")  # a null tenant: the slug is null
    cases = [
        (PodSerializer, pod),
        (PodSerializer, Pod.objects.get(pk=pod.pk)),  # the endpoint not loaded: its key's column
        (ReservationSerializer, sold),
        (EventSerializer, fleetwide),
        (EventSerializer, Event.objects.select_related("tenant").get(endpoint=endpoint)),
    ]
    principal = SimpleNamespace(is_operator=True)
    for serializer, instance in cases:
        fast = serializer(instance, context={"principal": principal}).data
        slow = drf.Serializer.to_representation(serializer(context={"principal": principal}), instance)
        assert json.dumps(fast) == json.dumps(slow), serializer.__name__
