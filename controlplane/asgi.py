"""ASGI entry point: the production web server's (controlplane/gunicorn.conf.py, uvicorn workers).

Django's app (``OneHopHandler``: the middleware chain and the view in one hop to the request's
thread) behind ``BoundedApp``: a bounded number of requests inside Django per worker, each
with its body already read, a body over DATA_UPLOAD_MAX_MEMORY_SIZE refused with 413 before
Django reads it, /healthz and static files on slots of their own (controlplane/webserver.py);
on PostgreSQL, their database connections from a pool per worker.
"""

import os
from collections.abc import Callable
from typing import Any, cast

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "controlplane.settings")

import django
from django.conf import settings  # after the settings module is named
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.backends.postgresql.base import DatabaseWrapper as PostgresWrapper
from django.db.backends.signals import connection_created
from psycopg import Connection
from psycopg_pool import ConnectionPool

from controlplane.webserver import DATABASE_WAIT_S, DEADLINES, BoundedApp, OneHopHandler

# Under ASGI each request's sync view runs in a thread of its own, which ends with the request:
# a persistent connection (CONN_MAX_AGE > 0) would outlive it unused, open until garbage
# collection, and 80 concurrent clients ran PostgreSQL out of connections. On PostgreSQL each
# request takes a connection from the worker's pool (psycopg's, through Django) and gives it
# back when it ends, so a request does not pay for a new connection: the pool holds as many as
# may run at once (the app's slots and /healthz's), checks one before handing it out (one the
# database ended is replaced, not given to a request), and a request waits at most
# DATABASE_WAIT_S for one (webserver.py; the database unreachable: /healthz then answers 503).
# Set before Django sets up its connections.
for database in settings.DATABASES.values():
    database["CONN_MAX_AGE"] = 0
    if database["ENGINE"] == "django.db.backends.postgresql":
        database["CONN_HEALTH_CHECKS"] = True  # with a pool: each checked before it is handed out
        options = cast(dict[str, Any], database.setdefault("OPTIONS", {}))
        options.setdefault("application_name", "controlplane-web")  # who holds them, in pg_stat_activity
        options["pool"] = {
            "min_size": 1,
            "max_size": DEADLINES.app_concurrency + DEADLINES.health_slots,
            "timeout": DATABASE_WAIT_S,
        }


def check_together(pool: ConnectionPool) -> Callable[[Connection[Any]], None]:
    """The pool's check of a connection before a request gets it, which, on one the database
    ended, checks every other idle one at once (replacing those ended too): a database restart
    ends them all, and the pool alone checks one per attempt, waiting 1 s then 2 s between
    attempts, so a worker that held two or more answered 503 past DATABASE_WAIT_S after each
    restart (tests/test_web_server.py)."""

    def check(conn: Connection[Any]) -> None:
        try:
            ConnectionPool.check_connection(conn)
        except Exception:
            pool.check()  # the idle ones, at once; this one is discarded by the caller
            raise

    return check


def checking_together(sender: Any, connection: BaseDatabaseWrapper, **kwargs: Any) -> None:
    """Django makes its pool on a first connection, with psycopg's check of one connection."""
    if connection.vendor != "postgresql" or not connection.settings_dict["OPTIONS"].get("pool"):
        return  # a connection of its own (SQLite, or one set up before the pool was configured)
    pool = cast(PostgresWrapper, connection).pool  # None for Django's own no-database connection
    if pool is not None and pool._check is ConnectionPool.check_connection:
        pool._check = check_together(pool)


connection_created.connect(checking_together)
django.setup(set_prefix=False)  # as django.core.asgi.get_asgi_application does
django_application = OneHopHandler()

application = BoundedApp(
    django_application,
    max_body_bytes=settings.DATA_UPLOAD_MAX_MEMORY_SIZE,
    static_prefix="/" + settings.STATIC_URL.lstrip("/"),
)
