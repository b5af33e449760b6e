"""The production web server, started from the image's own command line: slow clients cannot
starve it.

The Dockerfile's last CMD (a JSON array) is run as it is but for its bind, moved to a free port
on 127.0.0.1, against the test PostgreSQL, with DEBUG unset. 200 clients each send a request
line and then one header line a second, never finishing, and 50 more send a body a byte a
second; /healthz must answer 200 within 1 s to every probe for 12 s, and the header deadline
must then have disconnected the slow header senders, each with a 408.
"""

import json
import os
import selectors
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from django.db import connection

from tests.router.conftest import free_port

ROOT = Path(__file__).resolve().parents[1]
DOCKERFILE = ROOT / "docker" / "controlplane.Dockerfile"
SLOW_CLIENTS = 200
SLOW_BODIES = 50  # more than controlplane/gunicorn.conf.py lets into Django at once (2 x 16)
PROBE_FOR_S = 12.0  # past the 10 s header deadline of controlplane/gunicorn.conf.py
PROBE_LIMIT_S = 1.0


def image_command() -> list[str]:
    """The last CMD of the Dockerfile, which must be a JSON array."""
    cmds = [line for line in DOCKERFILE.read_text().splitlines() if line.startswith("CMD ")]
    assert cmds, "the Dockerfile has no CMD"
    command = json.loads(cmds[-1].removeprefix("CMD "))
    assert isinstance(command, list) and all(isinstance(arg, str) for arg in command)
    return command


def test_the_image_command_is_a_json_array_binding_all_interfaces_on_8000():
    command = image_command()
    assert command[0] == "gunicorn"
    assert command[command.index("--bind") + 1] == "0.0.0.0:8000"


def rebound(command: list[str], port: int) -> list[str]:
    at = command.index("--bind") + 1
    program = shutil.which(command[0], path=str(Path(sys.executable).parent)) or command[0]
    return [program, *command[1:at], f"127.0.0.1:{port}", *command[at + 1 :]]


def database_url() -> str:
    db = connection.settings_dict
    assert db["ENGINE"] == "django.db.backends.postgresql", "runs against the test PostgreSQL"
    auth = db["USER"] + (f":{db['PASSWORD']}" if db["PASSWORD"] else "")
    return f"postgres://{auth}@{db['HOST']}:{db['PORT'] or 5432}/{db['NAME']}"


def get(port: int, path: str, timeout: float) -> tuple[int, float]:
    """(status, seconds) of one request on a new connection; status 0 when none came in time."""
    started = time.monotonic()
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
            s.settimeout(timeout)
            s.sendall(f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n".encode())
            head = s.recv(64)
    except OSError:
        return 0, time.monotonic() - started
    status = int(head.split()[1]) if head.startswith(b"HTTP/1.1 ") else 0
    return status, time.monotonic() - started


@pytest.fixture(scope="module")
def server(django_db_setup):
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k not in ("DEBUG", "DJANGO_SETTINGS_MODULE")}
    env.update(
        DATABASE_URL=database_url(),
        SECRET_KEY="test-web-server-" + "k" * 40,
        ALLOWED_HOSTS="127.0.0.1",
        PYTHONPATH=str(ROOT),
        WEB_CONCURRENCY="2",
    )
    proc = subprocess.Popen(
        rebound(image_command(), port),
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 30
        while get(port, "/healthz", 1.0)[0] != 200:
            assert proc.poll() is None, proc.stderr.read().decode() if proc.stderr else ""
            assert time.monotonic() < deadline, "the web server did not answer /healthz within 30 s"
            time.sleep(0.2)
        yield port
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        if proc.stderr:
            proc.stderr.close()


def test_it_serves_the_console_api_and_static_files(server):
    base = f"http://127.0.0.1:{server}"
    with httpx.Client(base_url=base, timeout=5) as client:
        login = client.get("/accounts/login/")
        assert login.status_code == 200 and "Sign in" in login.text
        assert "script-src 'self'" in login.headers["content-security-policy"]
        assert "httponly" in login.headers["set-cookie"].lower()
        token = login.text.split('name="csrfmiddlewaretoken" value="')[1].split('"')[0]
        wrong = client.post(
            "/accounts/login/",
            data={"csrfmiddlewaretoken": token, "username": "nobody", "password": "wrong"},
            headers={"Referer": f"{base}/accounts/login/"},
        )
        assert wrong.status_code == 200 and "Wrong username or password" in wrong.text
        assert client.get("/api/v1/whoami/").status_code == 401
        assert client.get("/static/console/console.css").status_code == 200


def test_many_clients_at_once_hold_a_bounded_number_of_database_connections(server):
    """80 clients at once, 320 requests: all answered, and the server's PostgreSQL connections
    stay within its workers x app_concurrency (2 x 16; a persistent connection per request's
    thread reached 81 and PostgreSQL refused more)."""
    import concurrent.futures
    import threading

    import psycopg

    most = 0
    done = threading.Event()

    def sample() -> None:
        nonlocal most
        with psycopg.connect(database_url(), autocommit=True) as db:
            while not done.is_set():
                row = db.execute(
                    "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                    "AND pid <> pg_backend_pid()"
                ).fetchone()
                most = max(most, row[0] if row else 0)
                time.sleep(0.05)

    sampler = threading.Thread(target=sample)
    sampler.start()
    try:
        with concurrent.futures.ThreadPoolExecutor(80) as pool:
            statuses = list(pool.map(lambda _: get(server, "/healthz", 10.0)[0], range(320)))
    finally:
        done.set()
        sampler.join()
    assert statuses == [200] * 320
    assert most <= 2 * 16 + 2, most  # + the test's own connections


def test_two_hundred_slow_clients_do_not_starve_healthz(server):
    """And 50 clients that send a body a byte a second, past what Django may run at once."""
    port = server
    slow, slow_bodies = [], []
    for _ in range(SLOW_CLIENTS):
        s = socket.create_connection(("127.0.0.1", port), timeout=2)
        s.sendall(b"GET /console/ HTTP/1.1\r\nHost: 127.0.0.1\r\n")
        s.setblocking(False)
        slow.append(s)
    for _ in range(SLOW_BODIES):
        s = socket.create_connection(("127.0.0.1", port), timeout=2)
        s.sendall(
            b"POST /accounts/login/ HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            b"Content-Type: application/x-www-form-urlencoded\r\nContent-Length: 1000\r\n\r\n"
        )
        s.setblocking(False)
        slow_bodies.append(s)
    selector = selectors.DefaultSelector()
    for s in slow:
        selector.register(s, selectors.EVENT_READ)
    answered: dict[socket.socket, bytes] = {}
    probes: list[tuple[int, float]] = []
    line = 0
    started = next_line = time.monotonic()
    try:
        while time.monotonic() - started < PROBE_FOR_S:
            if time.monotonic() >= next_line:  # one more header line from each slow client
                for s in slow:
                    if s not in answered:
                        try:
                            s.sendall(b"X-Slow-%d: 1\r\n" % line)
                        except OSError:
                            answered.setdefault(s, b"")
                for s in slow_bodies:
                    try:
                        s.sendall(b"u")
                    except OSError:
                        pass
                line += 1
                next_line += 1.0
            probes.append(get(port, "/healthz", 5.0))
            for key, _ in selector.select(timeout=0.2):
                s = key.fileobj
                assert isinstance(s, socket.socket)
                try:
                    answered[s] = s.recv(256)
                except OSError:
                    answered[s] = b""
                selector.unregister(s)
    finally:
        selector.close()
        for s in slow + slow_bodies:
            s.close()
    assert len(probes) >= 20
    assert all(status == 200 for status, _ in probes), probes
    slowest = max(seconds for _, seconds in probes)
    assert slowest < PROBE_LIMIT_S, f"/healthz took {slowest:.2f} s under {SLOW_CLIENTS} slow clients"
    # The header deadline (10 s) disconnected them, each told why; none got a page.
    timed_out = [r for r in answered.values() if r.startswith(b"HTTP/1.1 408")]
    assert len(timed_out) >= SLOW_CLIENTS * 0.9, (len(answered), len(timed_out))
