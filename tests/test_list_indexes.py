"""The lists' queries, as the pages make them, are served by the indexes made for them
(endpoints and oncall migrations "list_indexes"): EXPLAIN names the index. PostgreSQL only, on a
fleet big enough (20,000 endpoints, 80,000 events, 20,000 on-call groups) that the planner
chooses as it would at scale."""

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from controlplane.tenants.models import Tenant
from tests.conftest import client_for
from tests.console.conftest import member_client

pytestmark = pytest.mark.skipif(connection.vendor != "postgresql", reason="PostgreSQL's plans")

API = [  # (who, url, table, index)
    ("tenant", "/api/v1/endpoints/", "endpoints_endpoint", "endpoint_tenant_newest"),
    ("operator", "/api/v1/endpoints/?state=failed", "endpoints_endpoint", "endpoint_state_newest"),
    ("operator", "/api/v1/endpoints/?search=fleet-e1234", "endpoints_endpoint", "endpoint_name_trigram"),
    ("operator", "/api/v1/events/?pod=fleet-pod-77", "oncall_event", "oncall_event_pod_newest"),
    ("operator", "/api/v1/events/?acknowledged=true", "oncall_event", "oncall_event_acknowledged"),
    ("operator", "/api/v1/events/?group=GROUP", "oncall_event", "oncall_event_group_time"),
]
CONSOLE = [
    ("operator", "/console/endpoints/?search=fleet-e1234", "endpoints_endpoint", "endpoint_name_trigram"),
    ("tenant", "/console/endpoints/", "endpoints_endpoint", "endpoint_tenant_newest"),
    ("operator", "/console/oncall/", "oncall_eventgroup", "oncall_group_on_call"),
    ("operator", "/console/oncall/?state=resolved&severity=any", "oncall_eventgroup", "oncall_group_on_call"),
    ("tenant", "/console/oncall/", "oncall_eventgroup", "oncall_group_tenant_on_call"),
    ("operator", "/console/oncall/?view=events&pod=fleet-pod-77", "oncall_event", "oncall_event_pod_newest"),
    ("operator", "/console/oncall/attention/", "oncall_event", "oncall_event_stack_newest"),
]


def plans(client, url: str, table: str) -> str:
    """The plans of every query on `table` that the page at `url` makes."""
    with CaptureQueriesContext(connection) as queries:
        response = client.get(url)
    assert response.status_code == 200, response.content[:300]
    found = []
    with connection.cursor() as cursor:
        for query in queries.captured_queries:
            if query["sql"].startswith("SELECT") and f'FROM "{table}"' in query["sql"]:
                cursor.execute("EXPLAIN " + query["sql"])
                found.append("\n".join(row[0] for row in cursor.fetchall()))
    assert found, f"no query on {table}"
    return "\n\n".join(found)


@pytest.fixture
def fleet(owner, make_endpoint):
    """owner's endpoint, then 20,000 more across 200 tenants, each with events; groups."""
    mine = make_endpoint(owner, "owner-chat")
    Tenant.objects.bulk_create([Tenant(name=f"fleet-t{i}") for i in range(200)])
    with connection.cursor() as cursor:
        cursor.execute(
            """
            INSERT INTO endpoints_endpoint (name, served_model_name, min_provisioned_concurrency,
              max_provisioned_concurrency, scale_to_zero_enabled, target_concurrency_per_replica,
              desired_replicas, ready_replicas, state, used_mu_per_minute, created_at, updated_at,
              pool_id, profile_id, tenant_id, routing_policy, autoscaler, version, region_preference)
            SELECT 'fleet-e' || i, 'fleet-e' || i, 0, 8, false, 8, 1, 1,
              (ARRAY['ready', 'pending', 'scaling'])[1 + i %% 3], 0, now(), now(), %s, %s,
              (SELECT min(id) FROM tenants_tenant WHERE name LIKE 'fleet-%%') + i %% 200,
              'p2c-mu', '{}', 1, ''
            FROM generate_series(0, 19999) i
            """,
            [mine.pool_id, mine.profile_id],
        )
        cursor.execute(
            """
            INSERT INTO oncall_eventgroup (fingerprint, kind, severity, endpoint_name, pod, pattern, message,
              count, first_at, last_at, state, acknowledged_by, resolved_at, resolved_by, silenced_by,
              silence_reason, paged, page_due, page_attempts, page_error, endpoint_id, tenant_id)
            SELECT md5(e.name), 'hang', (ARRAY['info', 'warning', 'critical'])[1 + e.id % 3], e.name,
              '', 'x', 'x', 2, now() - interval '3 days', now() - (e.id % 200) * interval '1 hour',
              CASE WHEN e.id % 10 = 0 THEN 'open' ELSE 'resolved' END, '',
              CASE WHEN e.id % 10 = 0 THEN NULL ELSE now() - (e.id % 200) * interval '1 hour' END,
              '', '', '', '', false, 0, '', e.id, e.tenant_id
            FROM endpoints_endpoint e WHERE e.name LIKE 'fleet-%'
            """
        )
        cursor.execute(
            """
            INSERT INTO oncall_event (kind, severity, endpoint_name, pod, message, detail, time, reported_by,
              endpoint_id, tenant_id, acknowledged_by, recorded_at, group_id)
            SELECT g.kind, g.severity, g.endpoint_name, 'fleet-pod-' || (g.id * 7 + k) % 5000, 'x', '{}',
              now() - k * interval '1 hour', '', g.endpoint_id, g.tenant_id, '',
              now() - interval '1 day', g.id
            FROM oncall_eventgroup g, generate_series(0, 2) k
            """
        )
        # A day of the fleet's pods restarting: what the embedded stack's own deaths hide among.
        cursor.execute(
            """
            INSERT INTO oncall_event (kind, severity, endpoint_name, pod, message, detail, time, reported_by,
              endpoint_id, tenant_id, acknowledged_by, recorded_at)
            SELECT 'restart', 'warning', e.name, 'fleet-pod-' || e.id % 5000, 'x', '{}',
              now() - (e.id % 1400) * interval '1 minute', 'prober', e.id, e.tenant_id, '', now()
            FROM endpoints_endpoint e WHERE e.name LIKE 'fleet-%'
            """
        )
        cursor.execute("ANALYZE")
        cursor.execute("SELECT id FROM oncall_eventgroup ORDER BY id LIMIT 1")
        return cursor.fetchone()[0]


def test_each_list_has_its_index(fleet, owner):
    clients = {
        ("api", "operator"): client_for(None, "ops"),
        ("api", "tenant"): client_for(Tenant.objects.get(name="fleet-t7")),
        ("console", "operator"): member_client("opal", operator=True),
        ("console", "tenant"): member_client("olivia", tenant=Tenant.objects.get(name="fleet-t7")),
    }
    missed = []
    for surface, cases in (("api", API), ("console", CONSOLE)):
        for who, url, table, index in cases:
            plan = plans(clients[(surface, who)], url.replace("GROUP", str(fleet)), table)
            if index not in plan:
                missed.append((who, url, index, plan))
    assert not missed, "\n\n".join(f"{who} {url}: no {index} in\n{plan}" for who, url, index, plan in missed)
