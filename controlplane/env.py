"""Typed readers for settings from the environment.

Each one fails loudly: a bad value raises ImproperlyConfigured naming the variable and the
value, so a typo in a deployment stops the process at start instead of running with a default.
"""

import os

import dj_database_url
from django.core.exceptions import ImproperlyConfigured

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}


def envstr(name: str, default: str) -> str:
    return os.environ.get(name, default)


def envbool(name: str, default: bool) -> bool:
    raw = os.environ.get(name)
    if raw is None:
        return default
    if raw.strip().lower() in _TRUE:
        return True
    if raw.strip().lower() in _FALSE:
        return False
    raise ImproperlyConfigured(f"{name}={raw!r} is not a boolean (use 1/0, true/false, yes/no)")


def envint(name: str, default: int, *, minimum: int | None = None) -> int:
    raw = os.environ.get(name)
    if raw is None:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ImproperlyConfigured(f"{name}={raw!r} is not an integer") from None
    if minimum is not None and value < minimum:
        raise ImproperlyConfigured(f"{name}={value} must be at least {minimum}")
    return value


def envfloat(name: str, default: float, *, minimum: float | None = None) -> float:
    raw = os.environ.get(name)
    if raw is None:
        return default
    try:
        value = float(raw)
    except ValueError:
        raise ImproperlyConfigured(f"{name}={raw!r} is not a number") from None
    if value != value or value in (float("inf"), float("-inf")):
        raise ImproperlyConfigured(f"{name}={raw!r} must be finite")
    if minimum is not None and value < minimum:
        raise ImproperlyConfigured(f"{name}={value} must be at least {minimum}")
    return value


def envlist(name: str, default: list[str]) -> list[str]:
    raw = os.environ.get(name)
    if raw is None:
        return default
    return [item.strip() for item in raw.split(",") if item.strip()]


def envdatabase(name: str, default: str) -> dict[str, object]:
    """A database config from a URL: postgres://user@host:port/db or sqlite:///path."""
    raw = os.environ.get(name) or default
    if not raw.startswith(("postgres://", "postgresql://", "sqlite://")):
        raise ImproperlyConfigured(
            f"{name}={raw!r}: only postgres://... and sqlite:///... URLs are supported"
        )
    try:
        config = dict(dj_database_url.parse(raw, conn_max_age=60, conn_health_checks=True))
    except ValueError as exc:
        raise ImproperlyConfigured(f"{name}={raw!r} is not a database URL: {exc}") from None
    if raw.startswith("sqlite://"):
        # The embedded stack writes from several processes and threads (web, worker, beat): take
        # the write lock when a transaction begins (a deferred one that upgrades fails at once
        # with "database is locked"), wait for it, and let readers run beside the writer (WAL).
        config["OPTIONS"] = {
            "transaction_mode": "IMMEDIATE",
            "timeout": 20,
            "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
        }
    return config


def kombu_redis_url(redis_url: str) -> str:
    """A Redis URL as Celery's broker names it: redis-py's unix://PATH is kombu's redis+socket://PATH.

    >>> kombu_redis_url("unix:///srv/var/redis.sock")
    'redis+socket:///srv/var/redis.sock'
    >>> kombu_redis_url("redis://127.0.0.1:6379/0")
    'redis://127.0.0.1:6379/0'
    """
    if redis_url.startswith("unix://"):
        return "redis+socket://" + redis_url.removeprefix("unix://")
    return redis_url
