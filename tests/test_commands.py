"""Management commands print what the README promises: the new key alone on the last line."""

from io import StringIO

import pytest
from django.core.management import CommandError, call_command
from rest_framework.test import APIClient

from controlplane.capacity.models import GpuPool, Reservation
from controlplane.endpoints.models import Endpoint
from controlplane.oncall.models import Event
from controlplane.tenants.models import ApiKey, Tenant


def run(*args) -> list[str]:
    out = StringIO()
    call_command(*args, stdout=out, stderr=StringIO())
    return out.getvalue().strip().splitlines()


def whoami(secret):
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {secret}")
    return client.get("/api/v1/whoami/").json()


def test_create_tenant_prints_a_working_key_last(db):
    secret = run("create_tenant", "acme")[-1]
    assert secret.startswith("mu_") and " " not in secret
    assert whoami(secret) == {"name": "acme-initial", "operator": False, "tenant": "acme"}


def test_create_tenant_refuses_bad_and_duplicate_names(db):
    with pytest.raises(CommandError, match="lowercase letters"):
        run("create_tenant", "Not OK")
    run("create_tenant", "acme")
    with pytest.raises(CommandError, match="already exists"):
        run("create_tenant", "acme")
    assert Tenant.objects.count() == 1 and ApiKey.objects.count() == 1


def test_create_operator_key_prints_a_working_key_last(db):
    secret = run("create_operator_key", "alice")[-1]
    assert whoami(secret) == {"name": "alice", "operator": True, "tenant": None}


def test_load_demo_is_idempotent(db, tmp_path):
    first = run("load_demo", "--write-keys", str(tmp_path / "keys"))
    assert first[0] == "Demo fleet loaded. API keys (shown once):"
    counts = (Endpoint.objects.count(), GpuPool.objects.count(), Reservation.objects.count())
    assert counts[0] >= 4 and counts[2] >= 1
    assert run("load_demo") == ["Demo fleet already loaded."]
    assert (Endpoint.objects.count(), GpuPool.objects.count(), Reservation.objects.count()) == counts
    operator = first[1].split(": ")[1]
    assert whoami(operator)["operator"] is True
    # ...and the local stack reads them from files only their owner can read
    written = tmp_path / "keys" / "operator.key"
    assert written.read_text().strip() == operator and written.stat().st_mode & 0o777 == 0o600
    assert whoami((tmp_path / "keys" / "acme.key").read_text().strip())["tenant"] == "acme"


def test_the_demo_sales_are_events_like_any_other_sale(db):
    run("load_demo")
    sold = {r.endpoint_id: r.mu_per_minute for r in Reservation.objects.all()}
    events = Event.objects.filter(kind=Event.Kind.RESERVATION)
    assert {e.endpoint_id: e.detail["mu_per_minute"] for e in events} == sold
    assert all(e.reported_by == "demo" and e.message.startswith("demo sold ") for e in events)
