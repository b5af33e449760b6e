"""schemathesis against the live API: a real gunicorn on 127.0.0.1 over the test PostgreSQL, with
production settings (DEBUG unset, SECRET_KEY and ALLOWED_HOSTS set), driven once with a tenant's
key and once with an operator's, each for SCHEMATHESIS_MAX_TIME_S (60 s by default; `make
test-schemathesis` runs longer). It fails on any 5xx, any response that breaks the published schema
(status code, content type, headers, body) and any check below.

Checks: all but two. `positive_data_acceptance` and `negative_data_rejection` ask whether the
schema says exactly what the server accepts, and it cannot: a body the schema allows is refused by
rules no JSON schema states (a model must be profiled on the GPU type, a filter's id must be one
the principal may see), and DRF's fields take more than they publish (a decimal sent as a number).
Left out of the run: revoking keys (DELETE /api-keys/{id}/), which would revoke the key under test
and leave the rest of the run unauthenticated (revocation is tested in test_auth.py).
"""

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from django.db import connection

from controlplane.capacity.models import Reservation
from controlplane.endpoints.models import Pod
from controlplane.oncall.models import Event
from controlplane.tenants.models import ApiKey

ROOT = Path(__file__).resolve().parents[2]
MAX_TIME_S = int(os.environ.get("SCHEMATHESIS_MAX_TIME_S", "60"))
CHECKS = ["all"]
EXCLUDED_CHECKS = ["positive_data_acceptance", "negative_data_rejection"]
EXCLUDED_OPERATIONS = 'method == "DELETE" and path == "/api/v1/api-keys/{id}/"'

pytestmark = [pytest.mark.schemathesis, pytest.mark.timeout(4 * MAX_TIME_S + 120)]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def live_api(transactional_db, tmp_path):
    """gunicorn serving the test database, as production runs it; its log on failure."""
    if connection.vendor != "postgresql":
        pytest.skip("the server is another process: it needs the test database on PostgreSQL")
    db = connection.settings_dict
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k != "DEBUG"}
    env.update(
        DATABASE_URL=f"postgres://{db['USER']}@{db['HOST'] or '127.0.0.1'}:{db['PORT'] or 5432}/{db['NAME']}",
        SECRET_KEY="schemathesis-run-" + "k" * 40,
        ALLOWED_HOSTS="127.0.0.1",
        CLUSTER_DRIVER="none",
        REDIS_URL="",
        PYTHONPATH=str(ROOT),
    )
    if db.get("PASSWORD"):
        env["PGPASSWORD"] = db["PASSWORD"]
    log = (tmp_path / "gunicorn.log").open("w")
    server = subprocess.Popen(
        [sys.executable, "-m", "gunicorn", "controlplane.wsgi", "-b", f"127.0.0.1:{port}", "-w", "3"],
        cwd=ROOT,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                if httpx.get(f"{url}/healthz", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert server.poll() is None and time.monotonic() < deadline, (
                tmp_path / "gunicorn.log"
            ).read_text()
            time.sleep(0.2)
        yield url, tmp_path / "gunicorn.log"
    finally:
        server.terminate()
        server.wait(timeout=30)
        log.close()


@pytest.fixture
def fleet(owner, other, make_endpoint, pool, small_model):
    """Objects of every kind, so that generated ids find some (ids start low on a fresh database)."""
    chat = make_endpoint(owner, "chat", min_provisioned_concurrency=8)
    make_endpoint(owner, "nightly", scale_to_zero_enabled=True)
    theirs = make_endpoint(other, "theirs")
    Reservation.objects.create(endpoint=chat, mu_per_minute=100, sold_by="ops")
    Pod.objects.create(endpoint=chat, name="chat-0", url="http://127.0.0.1:9", ready=True)
    Event.record("hang", "hung", endpoint=chat, severity="critical", reported_by="ops")
    Event.record("scale", "up", endpoint=theirs, detail={"replicas": 2}, reported_by="autoscaler")
    Event.record("benchmark", "fleet-wide")  # no tenant: the field is null
    return {
        "tenant": ApiKey.issue(name="st-tenant", tenant=owner)[1],
        "operator": ApiKey.issue(name="st-ops", tenant=None)[1],
    }


@pytest.mark.parametrize("who", ["tenant", "operator"])
def test_the_live_api_keeps_its_schema_and_never_answers_5xx(live_api, fleet, who):
    url, server_log = live_api
    command = [
        str(Path(sys.executable).parent / "schemathesis"),
        "run",
        f"{url}/api/schema/?format=json",
        "--checks",
        ",".join(CHECKS),
        "--exclude-checks",
        ",".join(EXCLUDED_CHECKS),
        "--exclude-by",
        EXCLUDED_OPERATIONS,
        "-H",
        f"Authorization: Bearer {fleet[who]}",
        "--max-time",
        str(MAX_TIME_S),
        "--workers",
        "2",
        "--request-timeout",
        "10",
        "--no-color",
    ]
    run = subprocess.run(
        command, capture_output=True, text=True, timeout=MAX_TIME_S * 2 + 60, cwd=server_log.parent
    )
    output = run.stdout + run.stderr
    assert run.returncode == 0, output[-6000:] + "\n--- server log ---\n" + server_log.read_text()[-3000:]
    assert "Tested:" in output and "failures" not in output.splitlines()[-1], output[-2000:]
