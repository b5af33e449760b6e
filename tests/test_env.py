import pytest
from django.core.exceptions import ImproperlyConfigured

from controlplane.env import envbool, envdatabase, envfloat, envint, kombu_redis_url


def test_bad_values_name_the_variable(monkeypatch):
    monkeypatch.setenv("X_INT", "ten")
    monkeypatch.setenv("X_BOOL", "maybe")
    monkeypatch.setenv("X_FLOAT", "nan")
    monkeypatch.setenv("X_DB", "mysql://h/db")
    with pytest.raises(ImproperlyConfigured, match="X_INT='ten' is not an integer"):
        envint("X_INT", 1)
    with pytest.raises(ImproperlyConfigured, match="X_BOOL='maybe' is not a boolean"):
        envbool("X_BOOL", False)
    with pytest.raises(ImproperlyConfigured, match="X_FLOAT='nan' must be finite"):
        envfloat("X_FLOAT", 1.0)
    with pytest.raises(ImproperlyConfigured, match="X_DB='mysql://h/db': only postgres"):
        envdatabase("X_DB", "sqlite:///x")


def test_minimums_are_enforced(monkeypatch):
    monkeypatch.setenv("X_INT", "0")
    with pytest.raises(ImproperlyConfigured, match="X_INT=0 must be at least 1"):
        envint("X_INT", 5, minimum=1)


def test_defaults_and_good_values(monkeypatch):
    monkeypatch.delenv("X_UNSET", raising=False)
    monkeypatch.setenv("X_BOOL", "yes")
    monkeypatch.setenv("X_DB", "postgres://postgres@127.0.0.1:5432/cp")
    assert envint("X_UNSET", 7) == 7
    assert envbool("X_BOOL", False) is True
    db = envdatabase("X_DB", "sqlite:///x")
    assert db["ENGINE"] == "django.db.backends.postgresql" and db["NAME"] == "cp"
    assert envdatabase("X_UNSET", "sqlite:////tmp/a.db")["ENGINE"] == "django.db.backends.sqlite3"


def test_a_unix_socket_redis_url_is_named_for_kombu_and_others_pass_as_they_are():
    assert kombu_redis_url("unix:///srv/var/redis.sock") == "redis+socket:///srv/var/redis.sock"
    assert kombu_redis_url("redis://127.0.0.1:6379/3") == "redis://127.0.0.1:6379/3"
