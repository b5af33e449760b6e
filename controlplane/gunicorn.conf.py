"""The production web server's configuration, the one place for it (docker/controlplane.Dockerfile:
`gunicorn -c controlplane/gunicorn.conf.py --bind 0.0.0.0:8000`).

gunicorn manages the processes; each worker is uvicorn on asyncio serving Django's ASGI app
(controlplane.webserver.Worker), so a slow client costs a coroutine, not a thread: 200 clients
that send a header line a second leave /healthz answering in milliseconds
(tests/test_web_server.py), where 3 sync workers, or 2 gthread workers of 8 threads, answered
none of its probes within 5 s. Header and body deadlines disconnect such clients in the end.
At most workers x app_concurrency requests run inside Django at once (threads and PostgreSQL
connections: 80 concurrent clients held at most 16 connections), each entering with its body
read, so 50 clients sending bodies a byte a second do not starve it either. 40 clients that ask for
the 1.6 MB Swagger bundle and read nothing leave /healthz and the API answering, and are cut at the
send deadline; a body over 2.5 MB gets 413 before it is read. A worker holding more kept-alive
connections than the workers' mean hands one back after its answer (``webserver.SHARE``), so
clients that keep their connections spread over the workers evenly.
"""

import gc
from typing import Any

from controlplane import webserver
from controlplane.env import envint

wsgi_app = "controlplane.asgi:application"
worker_class = "controlplane.webserver.Worker"
# Processes; each serves many connections. WEB_CONCURRENCY is gunicorn's usual variable.
workers = envint("WEB_CONCURRENCY", 2, minimum=1)
# Seconds: a worker silent this long is restarted; a stopping one finishes requests this long.
timeout = 30
graceful_timeout = 20
# An idle kept-alive connection is closed after this many seconds.
keepalive = 5
webserver.configure(
    header_timeout_s=10.0,  # from connection (or first byte of a kept-alive request) to headers
    body_timeout_s=60.0,  # from headers to the end of the body (the API takes at most 2.5 MB)
    limit_concurrency=1000,  # connections + requests per worker; beyond it 503 at once
    # Requests inside Django at once per worker (threads, database connections). Each worker runs
    # Python on one core at a time: beyond the few that hide one another's waits, threads only
    # share that core, and every request in the worker is slower together. 4, not 2 (as good or
    # better on the benches' loads, bench/web_concurrency.py), for views that wait on more than
    # the cores: a wake on the cluster, a sale on its pool's lock.
    app_concurrency=envint("WEB_APP_CONCURRENCY", 4, minimum=1),
    prefetch_body_bytes=2_621_440,  # bodies read before entering Django (Django's 2.5 MB limit)
    prefetch_budget_bytes=64 * 2**20,  # all bodies read ahead at once per worker; the rest wait
    health_slots=2,  # /healthz's own slots: a crowd on the API or the static files never delays it
    static_slots=16,  # static files' own slots (whitenoise, no database connection)
    send_timeout_s=10.0,  # a response the client does not take for this long is aborted
    response_timeout_s=60.0,  # ... or stalled this long in all (a trickle reader)
    max_head_bytes=65_536,  # request line and headers in all; a longer head gets 431
    max_pipelined_requests=16,  # requests queued on a connection behind the running one; then reads pause
)
accesslog = "-"
# Slots for the workers' connection counts: more than `workers`, for those added by TTIN.
webserver.SHARE.allocate(max(64, 4 * workers))


def pre_fork(server: Any, worker: Any) -> None:
    """In the master: the new worker's slot among the connection counts."""
    worker.share_slot = webserver.SHARE.free_slot(w.share_slot for w in server.WORKERS.values())


def child_exit(server: Any, worker: Any) -> None:
    """In the master, a worker gone (ended, killed or replaced): its connections with it."""
    webserver.SHARE.leave(worker.share_slot)


def post_worker_init(worker: Any) -> None:
    """Once a worker has imported the app, move what it allocated (Django, our modules, their
    caches: long-lived) out of the garbage collector's reach: a full collection no longer walks
    it, which was most of an API list's p99 (85-93 ms against a p50 of 17 at 10,000 endpoints;
    28-33 ms frozen). Then it joins the connection counts: from now on it accepts (counted
    while it boots, holding none, the others would hand back what only they can take)."""
    gc.collect()
    gc.freeze()
    webserver.SHARE.join(worker.share_slot)
