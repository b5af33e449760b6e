"""The production web server, started from the image's own command line: slow clients cannot
starve it.

The Dockerfile's last CMD (a JSON array) is run as it is but for its bind, moved to a free port
on 127.0.0.1, against the test PostgreSQL, with DEBUG unset. 200 clients each send a request
line and then one header line a second, never finishing, and 50 more send a body a byte a
second; /healthz must answer 200 within 1 s to every probe for 12 s, and the header deadline
must then have disconnected the slow header senders, each with a 408.
"""

import contextlib
import http.client
import json
import os
import re
import select
import selectors
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import IO

import httpx
import pytest

from controlplane.webserver import DEADLINES
from tests.production_server import ROOT, database_url, image_command, rebound
from tests.router.conftest import free_port

pytestmark = pytest.mark.stack  # the production web server as a subprocess

SLOW_CLIENTS = 200
SLOW_BODIES = 50  # more than controlplane/gunicorn.conf.py lets into Django at once (2 x 4)
PROBE_FOR_S = 12.0  # past the 10 s header deadline of controlplane/gunicorn.conf.py
PROBE_LIMIT_S = 1.0


def test_the_image_command_is_a_json_array_binding_all_interfaces_on_8000():
    command = image_command()
    assert command[0] == "gunicorn"
    assert command[command.index("--bind") + 1] == "0.0.0.0:8000"


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


WORKERS, APP_CONCURRENCY = 2, 4  # the image's defaults, set: the bounds below are theirs


@contextlib.contextmanager
def running_server(db_url: str, ready: Callable[[int], bool]) -> Iterator[int]:
    """The production web server on a free port against `db_url`, once `ready(port)`; stopped
    after."""
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k not in ("DEBUG", "DJANGO_SETTINGS_MODULE")}
    env.update(
        DATABASE_URL=db_url,
        SECRET_KEY="test-web-server-" + "k" * 40,
        ALLOWED_HOSTS="127.0.0.1",
        PYTHONPATH=str(ROOT),
        WEB_CONCURRENCY=str(WORKERS),
        WEB_APP_CONCURRENCY=str(APP_CONCURRENCY),
    )
    # The log goes to a file: a pipe nobody reads fills, and the workers block writing to it.
    log = SERVER_LOG[port] = tempfile.TemporaryFile()
    proc = SERVER_PROCESS[port] = subprocess.Popen(
        rebound(image_command(), port),
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=log,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 30
        while not ready(port):
            assert proc.poll() is None, log_tail(log)
            assert time.monotonic() < deadline, "not ready within 30 s:\n" + log_tail(log)
            time.sleep(0.2)
        yield port
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        del SERVER_LOG[port], SERVER_PROCESS[port]
        log.close()


@pytest.fixture(scope="module")
def server(django_db_setup):
    with running_server(database_url(), lambda port: get(port, "/healthz", 1.0)[0] == 200) as port:
        yield port


SERVER_LOG: dict[int, IO[bytes]] = {}  # the running server's log, by its port
SERVER_PROCESS: dict[int, subprocess.Popen[bytes]] = {}  # its gunicorn master, by its port


@pytest.fixture(autouse=True)
def the_servers_log_when_a_test_fails(request):
    """A failed test prints the end of the server's log with its report (its workers' tracebacks)."""
    yield
    report = getattr(request.node, "rep_call", None)
    if report is not None and report.failed:
        for port, log in SERVER_LOG.items():
            sys.stderr.write(f"--- the web server on port {port}, the end of its log:\n{log_tail(log)}\n")


def log_tail(log: IO[bytes], size: int = 6000) -> str:
    """The end of a running server's log; pread, for the server writes through the same file
    offset, which a seek would move."""
    end = os.fstat(log.fileno()).st_size
    return os.pread(log.fileno(), size, max(0, end - size)).decode(errors="replace")


@pytest.mark.parametrize(
    "variable, value",
    # (gunicorn itself reads WEB_CONCURRENCY first, and a non-integer fails there, also named)
    [("WEB_CONCURRENCY", "0"), ("WEB_APP_CONCURRENCY", "0"), ("WEB_APP_CONCURRENCY", "four")],
)
def test_the_server_refuses_to_start_on_a_bad_concurrency_naming_it(variable, value):
    env = {**os.environ, variable: value, "PYTHONPATH": str(ROOT)}
    out = subprocess.run(
        [*rebound(image_command(), free_port()), "--check-config"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert f"ImproperlyConfigured: {variable}=" in out.stderr + out.stdout, out.stderr[-2000:]


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
    stay within its workers' pools (app_concurrency and /healthz's slots each; a persistent
    connection per request's thread reached 81 and PostgreSQL refused more)."""
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
    assert most <= WORKERS * (APP_CONCURRENCY + DEADLINES.health_slots) + 2, most  # + the test's own


def web_backends() -> set[int]:
    """The pids of the web server's PostgreSQL connections (its pools name them)."""
    import psycopg

    with psycopg.connect(database_url(), autocommit=True) as db:
        rows = db.execute(
            "SELECT pid FROM pg_stat_activity WHERE datname = current_database()"
            " AND application_name = 'controlplane-web'"
        ).fetchall()
    return {pid for (pid,) in rows}


def test_requests_take_their_database_connections_from_a_pool(server):
    """Requests one after the other are served on the connections the first ones opened, kept
    between requests (a connection per request costs PostgreSQL a process each time); one the
    database ended is replaced before a request gets it."""
    import psycopg

    for _ in range(6):
        assert get(server, "/healthz", 5.0)[0] == 200
    before = web_backends()
    assert before  # kept between requests
    for _ in range(20):
        assert get(server, "/healthz", 5.0)[0] == 200
    after = web_backends()
    # the same connections (a worker without a request yet opens its pool: its first and the
    # one that request asked for)
    assert before <= after and len(after - before) <= 2, (before, after)
    with psycopg.connect(database_url(), autocommit=True) as db:
        for pid in after:  # ended, not only signalled (5 s at most): as a restarted database's are
            db.execute("SELECT pg_terminate_backend(%s, 5000)", [pid])
    assert [get(server, "/healthz", 5.0)[0] for _ in range(6)] == [200] * 6
    assert not web_backends() & after


def test_workers_holding_many_connections_answer_at_once_after_the_database_ended_them(server):
    """A database restart ends every connection of each worker's pool at once: the first request
    to find one ended has the pool check the others, so no request waits past DATABASE_WAIT_S on
    the pool's back-off from one ended connection to the next (each worker held two or more here,
    and 503s followed)."""
    import psycopg

    with ThreadPoolExecutor(max_workers=12) as crowd:  # at once: each worker's pool grows
        assert set(crowd.map(lambda _: get(server, "/api/v1/", 5.0)[0], range(48))) == {200}
    held = web_backends()
    assert len(held) >= 6, held  # several per worker
    with psycopg.connect(database_url(), autocommit=True) as db:
        for pid in held:
            db.execute("SELECT pg_terminate_backend(%s, 5000)", [pid])
    answers = [get(server, "/healthz", 5.0) for _ in range(8)]
    assert [status for status, _ in answers] == [200] * 8, answers
    assert not web_backends() & held


def test_an_unreachable_database_gets_503_from_healthz_within_the_wait(django_db_setup):
    """The database's port closed: /healthz says 503 once a request has waited its most for a
    connection (DATABASE_WAIT_S), not after the kubelet gave up, and the server stays up."""
    from controlplane.webserver import DATABASE_WAIT_S

    closed = f"postgres://postgres@127.0.0.1:{free_port()}/nothing"
    with running_server(closed, lambda port: get(port, "/healthz", 10.0)[0] != 0) as port:
        for _ in range(2):
            status, took = get(port, "/healthz", DATABASE_WAIT_S + 5)
            assert status == 503 and took < DATABASE_WAIT_S + 1.5, (status, took)


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


def recv_response(s: socket.socket) -> tuple[bytes, bytes]:
    data = b""
    while b"\r\n\r\n" not in data:
        more = s.recv(4096)
        assert more, data
        data += more
    head, body = data.split(b"\r\n\r\n", 1)
    lines = head.lower().split(b"\r\n")
    length = int(next(line.split(b":")[1] for line in lines if line.startswith(b"content-length:")))
    while len(body) < length:
        more = s.recv(4096)
        assert more, body
        body += more
    return head, body


def test_a_body_over_the_limit_is_refused_before_it_is_sent(server):
    """10 MB declared: 413 (JSON under /api/) at once, the body never sent: Django never spools it."""
    with socket.create_connection(("127.0.0.1", server), timeout=2) as s:
        s.sendall(
            b"POST /api/v1/endpoints/ HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            b"Content-Length: 10485760\r\n\r\n"
        )
        head, body = recv_response(s)
    assert head.startswith(b"HTTP/1.1 413") and b"connection: close" in head.lower(), head
    assert json.loads(body)["error"] == "too_large"


def test_a_chunked_body_over_the_limit_is_refused_once_past_it(server):
    """A chunked 10 MB body: 413 once 2.5 MB are in, while the client has most of it still to send."""
    chunk = b"x" * 65536
    with socket.create_connection(("127.0.0.1", server), timeout=5) as s:
        s.sendall(
            b"POST /accounts/login/ HTTP/1.1\r\nHost: 127.0.0.1\r\nTransfer-Encoding: chunked\r\n"
            b"Content-Type: application/x-www-form-urlencoded\r\n\r\n"
        )
        for _ in range(41):  # 2.56 MB + 64 KiB of the 10 MB
            s.sendall(b"%x\r\n%s\r\n" % (len(chunk), chunk))
        head, body = recv_response(s)
    assert head.startswith(b"HTTP/1.1 413"), head
    assert body == b"The request body is larger than the server accepts.\n"


MAX_HEAD_BYTES = 65_536  # controlplane/gunicorn.conf.py's max_head_bytes


def closed(s: socket.socket) -> bool:
    """Whether the server ended the connection: end of stream, or a reset (it closes with the
    client's unread bytes in its socket)."""
    try:
        return s.recv(1) == b""
    except ConnectionResetError:
        return True


def test_a_long_url_reaches_the_api_and_a_head_over_the_limit_gets_431(server):
    """A 12 kB query (past the 4,094-byte request line a plain gunicorn answers 414 to, which the
    schema does not list) is the API's to answer; a head over 64 KiB gets the documented 431 before
    it is all read, JSON under /api/, and the connection is closed."""
    query = "&".join(f"page_size=x{i}" for i in range(1000))
    with socket.create_connection(("127.0.0.1", server), timeout=5) as s:
        s.sendall(f"GET /api/v1/endpoints/?{query} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n".encode())
        head, body = recv_response(s)
    assert len(query) > 12_000 and head.startswith(b"HTTP/1.1 401"), head
    assert json.loads(body)["error"] == "not_authenticated"

    fits = b"x" * (MAX_HEAD_BYTES - 1000)
    for path, pad, status in [("/api/v1/endpoints/", fits, 401), ("/api/v1/endpoints/", fits * 2, 431)]:
        with socket.create_connection(("127.0.0.1", server), timeout=5) as s:
            s.sendall(f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Pad: ".encode() + pad + b"\r\n\r\n")
            head, body = recv_response(s)
            assert head.startswith(b"HTTP/1.1 %d" % status), head
            if status == 431:
                assert b"connection: close" in head.lower() and closed(s), head
                assert json.loads(body)["error"] == "head_too_large"
    with socket.create_connection(("127.0.0.1", server), timeout=5) as s:
        s.sendall(
            b"GET /accounts/login/?q=" + b"y" * (2 * MAX_HEAD_BYTES) + b" HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
        )
        head, body = recv_response(s)
    assert head.startswith(b"HTTP/1.1 431") and body.startswith(b"The request line and headers"), head
    assert get(server, "/healthz", 2.0)[0] == 200


def refused_while_sending(port: int, start: bytes) -> None:
    """Send `start`, then 8 KiB of one header value at a time without end, until the server
    answers (at most 4 MB): that answer must be the 431."""
    sent = 0
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        s.sendall(start)
        try:
            while sent < 64 * MAX_HEAD_BYTES and not select.select([s], [], [], 0)[0]:
                s.sendall(b"x" * 8192)
                sent += 8192
        except (BrokenPipeError, ConnectionResetError):
            pass  # closed by the server, its answer already sent
        head, body = recv_response(s)
    assert head.startswith(b"HTTP/1.1 431"), (head, sent)
    assert json.loads(body)["error"] == "head_too_large"


def test_a_header_that_never_ends_is_cut_at_the_limit_not_held(server):
    """One header value sent 8 KiB at a time without end (httptools grows one header in memory
    until its line ends): 431 while the client is still sending, at most 4 MB in."""
    refused_while_sending(server, b"GET /api/v1/endpoints/ HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Pad: ")


def test_a_trailer_that_never_ends_is_cut_at_the_limit_not_held(server):
    """A chunked body's trailer is headers too, after the head: one trailer value sent without end
    gets 431 at most 4 MB in (unbounded, 80 MB of it blocked a worker past gunicorn's timeout)."""
    refused_while_sending(
        server,
        b"POST /api/v1/endpoints/ HTTP/1.1\r\nHost: 127.0.0.1\r\nTransfer-Encoding: chunked\r\n"
        b"Content-Type: application/json\r\n\r\n2\r\n{}\r\n0\r\nX-Trailer: ",
    )


def test_a_head_over_the_limit_behind_a_request_gets_431_after_its_answer(server):
    """A POST and its body, then a 200 kB head, in one write: the POST's answer (401), then the
    431 for the head (it reached the parser unbounded behind a body; counted, its 431 must not
    come first, where the client reads it as the POST's)."""
    body = b'{"x": "' + b"y" * 500_000 + b'"}'
    with socket.create_connection(("127.0.0.1", server), timeout=5) as s:
        s.sendall(
            b"POST /api/v1/endpoints/ HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\n\r\n%s"
            % (len(body), body)
            + b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Pad: "
            + b"z" * 200_000
            + b"\r\n\r\n"
        )
        answers = b""
        while more := s.recv(65536):  # both answers, then the server's close
            answers += more
    statuses = re.findall(rb"HTTP/1\.1 (\d{3}) ", answers)
    assert statuses == [b"401", b"431"], answers[:300]


def test_a_large_body_in_the_heads_read_and_a_chunked_one_with_a_trailer_pass(server):
    """The limit counts what carries no body: a 1 MB body sent with its head in one write, and a
    chunked body of 64 KiB chunks with a short trailer, reach the API (401 without a key)."""
    with socket.create_connection(("127.0.0.1", server), timeout=5) as s:
        body = b'{"x": "' + b"y" * 2**20 + b'"}'
        s.sendall(
            b"POST /api/v1/endpoints/ HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\n\r\n%s" % (len(body), body)
        )
        assert recv_response(s)[0].startswith(b"HTTP/1.1 401")
        chunk = b"y" * 65536
        s.sendall(
            b"POST /api/v1/endpoints/ HTTP/1.1\r\nHost: 127.0.0.1\r\nTransfer-Encoding: chunked\r\n"
            b"Content-Type: application/json\r\n\r\n"
            + b"".join(b"%x\r\n%s\r\n" % (len(chunk), chunk) for _ in range(8))
            + b"0\r\nX-Checksum: abc\r\n\r\n"
        )
        assert recv_response(s)[0].startswith(b"HTTP/1.1 401")


def test_a_client_that_pipelines_without_reading_is_not_read_on(server):
    """Requests pipelined without reading the answers: the server stops reading once 16 wait (the
    kernel's buffers take the rest), where it had taken 64 MB within 3 s and held it; read
    afterwards, the answers come in order."""
    pad = b"p" * 3000
    request = b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Pad: %s\r\n\r\n" % pad
    batch, sent = request * 100, 0
    with socket.create_connection(("127.0.0.1", server), timeout=5) as s:
        s.setblocking(False)
        deadline = time.monotonic() + 3
        while sent < 64 * 2**20 and time.monotonic() < deadline:
            if select.select([], [s], [], 0.5)[1]:
                try:
                    sent += s.send(batch)
                except BlockingIOError:
                    pass
        assert sent < 32 * 2**20, f"{sent >> 20} MB taken from a client that reads nothing"
        s.setblocking(True)
        answers = b""
        while answers.count(b"HTTP/1.1 ") < 50:  # /healthz's answers are short, without a length
            more = s.recv(65536)
            assert more, answers[-300:]
            answers += more
    assert answers.count(b"HTTP/1.1 200") >= 50 and answers.startswith(b"HTTP/1.1 200"), answers[:300]


BIG_STATIC = "/static/drf_spectacular_sidecar/swagger-ui-dist/swagger-ui-bundle.js"  # 1.6 MB
NON_READERS = 40  # more than the 2 x 4 requests Django runs at once
SEND_TIMEOUT_S = 10.0  # controlplane/gunicorn.conf.py's send_timeout_s


PIPELINED = 5  # 8 MB asked per connection: more than the kernel's buffers on loopback take


def non_reader(port: int, path: str) -> socket.socket:
    """A client with a tiny receive window that asks for `path` (pipelined, PIPELINED times) and
    reads nothing."""
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # before connect: the window offered
    s.settimeout(2)
    s.connect(("127.0.0.1", port))
    s.sendall(f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n".encode() * PIPELINED)
    return s


def drained(s: socket.socket) -> tuple[int, bool]:
    """(bytes it has been sent, whether the server ended the connection): what is there now,
    up to 256 KiB (one still being answered would go on)."""
    got = 0
    while got < 1 << 18:
        try:
            chunk = s.recv(1 << 16, socket.MSG_DONTWAIT)
        except BlockingIOError:
            return got, False
        except OSError:  # reset: the server aborted it
            return got, True
        if not chunk:
            return got, True
        got += len(chunk)
    return got, False


def test_clients_that_do_not_read_a_large_file_neither_starve_healthz_nor_stay(server):
    """40 clients that never read the 1.6 MB Swagger bundle: /healthz and the API still answer
    within 1 s (static files and /healthz have slots of their own), and the send deadline cuts
    the non-readers (unfixed, they held every slot with no end)."""
    port = server
    slow = [non_reader(port, BIG_STATIC) for _ in range(NON_READERS)]
    started = time.monotonic()
    try:
        time.sleep(1.0)  # their responses fill the buffers and stall
        probes = []
        while time.monotonic() - started < 4.0:
            probes.append(("/healthz", *get(port, "/healthz", 3.0)))
            probes.append(("/api/v1/whoami/", *get(port, "/api/v1/whoami/", 3.0)))
        assert all(status in (200, 401) for _, status, _ in probes), probes
        slowest = max(seconds for _, _, seconds in probes)
        assert slowest < PROBE_LIMIT_S, probes
        time.sleep(max(0.0, started + SEND_TIMEOUT_S + 2.5 - time.monotonic()))
        results = [drained(s) for s in slow]
    finally:
        for s in slow:
            s.close()
    # The first to stall (at least a worker's 16) were reset, having taken only their window;
    # the others' requests entered the slots they freed (a worker may have accepted more than
    # 16) and stall in turn, until their own deadline.
    cut = [got for got, ended in results if ended and 0 < got < 1 << 18]
    assert len(cut) >= 16, results
    assert get(port, "/healthz", 5.0)[0] == 200


def workers(port: int) -> list[int]:
    """The pids of the server's workers: its gunicorn master's children."""
    master = SERVER_PROCESS[port].pid
    with open(f"/proc/{master}/task/{master}/children") as children:
        return sorted(int(pid) for pid in children.read().split())


def holders(port: int, clients: list[http.client.HTTPConnection]) -> list[int | None]:
    """Per client, the worker that holds the server's end of its connection (None: closed)."""
    by_inode = {}
    for pid in workers(port):
        for fd in os.listdir(f"/proc/{pid}/fd"):
            with contextlib.suppress(OSError):  # closed since listed
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
                if target.startswith("socket:["):
                    by_inode[int(target[8:-1])] = pid
    by_client_port = {}
    with open("/proc/net/tcp") as table:
        for line in table.readlines()[1:]:
            local, remote, inode = (line.split()[i] for i in (1, 2, 9))
            if int(local.split(":")[1], 16) == port and int(inode) in by_inode:
                by_client_port[int(remote.split(":")[1], 16)] = by_inode[int(inode)]
    return [by_client_port.get(c.sock.getsockname()[1]) if c.sock else None for c in clients]


def test_kept_alive_connections_even_out_between_the_workers(server):
    """Twenty clients that keep their connections, all taken by one worker while the other is
    stopped, end up held ten and ten once it runs again: a worker that holds more than the
    workers' mean answers with `connection: close`, and its client reconnects (webserver.SHARE)."""
    first, second = workers(server)
    clients = [http.client.HTTPConnection("127.0.0.1", server, timeout=10) for _ in range(20)]

    def round_of_requests() -> int:
        """A request on each client (a new connection where the last answer closed it); how
        many answers closed their connection."""
        closed = 0
        for client in clients:
            client.request("GET", "/healthz")
            answer = client.getresponse()
            answer.read()
            assert answer.status == 200
            closed += answer.getheader("connection") == "close"
        return closed

    os.kill(second, signal.SIGSTOP)
    try:
        round_of_requests()
        held = holders(server, clients)
        assert {w for w in held if w is not None} == {first}, held
    finally:
        os.kill(second, signal.SIGCONT)
    try:
        for _ in range(10):
            closed = round_of_requests()
            held = holders(server, clients)
            reconnecting = held.count(None)  # handed back by the last answer
            if abs(held.count(first) - held.count(second)) <= 1 + reconnecting and reconnecting <= 1:
                break
        else:
            raise AssertionError(f"not even after 10 rounds: {held.count(first)} and {held.count(second)}")
        assert closed <= 20
        round_of_requests()
        counts = sorted(Counter(w for w in holders(server, clients) if w is not None).values())
        assert counts[-1] - counts[0] <= 2 and sum(counts) >= 19, counts  # even, one reconnecting at most
    finally:
        for client in clients:
            client.close()


def test_requests_pipelined_on_a_connection_handed_back_are_answered(server):
    """A worker over the mean hands a connection back only when nothing of a next request has
    come in on it: two requests sent at once are both answered."""
    _, second = workers(server)
    clients = [http.client.HTTPConnection("127.0.0.1", server, timeout=10) for _ in range(4)]
    os.kill(second, signal.SIGSTOP)  # every connection to the first: it holds more than the mean
    try:
        for client in clients:
            client.connect()
        with socket.create_connection(("127.0.0.1", server), timeout=10) as s:
            request = b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
            s.sendall(request * 2)
            answers = b""
            while answers.count(b"HTTP/1.1 200") < 2:
                chunk = s.recv(65536)
                if not chunk:
                    break
                answers += chunk
        assert answers.count(b"HTTP/1.1 200") == 2, answers
    finally:
        os.kill(second, signal.SIGCONT)
        for client in clients:
            client.close()
