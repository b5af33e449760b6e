"""Safe defaults, each in a fresh interpreter with exactly the environment a deployment gives it:
DEBUG only when set, no start without SECRET_KEY with a real database, ALLOWED_HOSTS never '*'
outside DEBUG, and BEHIND_TLS_PROXY=1's HSTS, Secure cookies and redirect."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.stack  # the control plane in fresh interpreters (manage.py, django.setup)

ROOT = Path(__file__).resolve().parent.parent
PRODUCTION_KEY = "k" * 10 + "9f8e7d6c5b4a39281706f5e4d3c2b1a0zyxwvutsrqponmlk"  # 58 characters

# Requests through Django's whole handler (middleware, error pages) in the child, no test set-up.
PROBE = r"""
import json, django
django.setup()
from django.conf import settings
from django.test import Client

def answer(path, **headers):
    r = Client(raise_request_exception=False).get(path, **headers)
    return {
        "status": r.status_code,
        "body": r.content.decode(errors="replace")[:4000],
        "hsts": r.headers.get("Strict-Transport-Security"),
        "location": r.headers.get("Location"),
        "cookies": {k: {"secure": bool(m["secure"])} for k, m in r.cookies.items()},
    }

print(json.dumps({
    "debug": settings.DEBUG,
    "session_cookie_secure": settings.SESSION_COOKIE_SECURE,
    "csrf_cookie_secure": settings.CSRF_COOKIE_SECURE,
    "evil": answer("/accounts/login/", HTTP_HOST="evil"),
    "https": answer("/accounts/login/", HTTP_HOST="cp.example.com", HTTP_X_FORWARDED_PROTO="https"),
    "http": answer("/accounts/login/", HTTP_HOST="cp.example.com"),
    "http_api": answer("/api/v1/whoami/", HTTP_HOST="cp.example.com"),
    "http_healthz": answer("/healthz", HTTP_HOST="cp.example.com"),
}))
"""


def run(tmp_path, env, *args):
    clean = {
        "PATH": os.environ["PATH"],
        "PYTHONPATH": str(ROOT),
        "DJANGO_SETTINGS_MODULE": "controlplane.settings",
        "CONTROLPLANE_VAR_DIR": str(tmp_path / "var"),
        **env,
    }
    return subprocess.run(
        [sys.executable, *args], cwd=ROOT, env=clean, capture_output=True, text=True, timeout=60
    )


def probe(tmp_path, env):
    done = run(tmp_path, env, "-c", PROBE)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def production(tmp_path, **extra):
    return {
        "DATABASE_URL": f"sqlite:///{tmp_path / 'cp.sqlite3'}",
        "SECRET_KEY": PRODUCTION_KEY,
        "ALLOWED_HOSTS": "cp.example.com",
        **extra,
    }


def assert_no_debug_page(answer):
    assert answer["status"] == 400
    assert "Traceback" not in answer["body"] and "DisallowedHost" not in answer["body"], answer["body"]


def test_the_image_default_is_not_debug(tmp_path):
    """No variable at all, as the image starts: the embedded default, DEBUG off."""
    seen = probe(tmp_path, {})
    assert seen["debug"] is False
    assert_no_debug_page(seen["evil"])


def test_production_without_debug_shows_no_debug_page(tmp_path):
    seen = probe(tmp_path, production(tmp_path))
    assert seen["debug"] is False
    assert_no_debug_page(seen["evil"])
    assert seen["https"]["hsts"] is None  # no TLS setting: no HSTS


def test_debug_only_when_set(tmp_path):
    seen = probe(tmp_path, {"DEBUG": "1"})
    assert seen["debug"] is True
    assert seen["evil"]["status"] == 400 and "DisallowedHost" in seen["evil"]["body"]


def test_a_real_database_without_secret_key_refuses_to_start(tmp_path):
    env = production(tmp_path)
    del env["SECRET_KEY"]
    for extra in ({}, {"SECRET_KEY": ""}):
        done = run(tmp_path, {**env, **extra}, "manage.py", "check")
        assert done.returncode != 0
        assert "ImproperlyConfigured: SECRET_KEY is not set" in done.stderr, done.stderr
    # DEBUG=1 is development: a key made under CONTROLPLANE_VAR_DIR is accepted there.
    assert run(tmp_path, {**env, "DEBUG": "1"}, "manage.py", "check").returncode == 0


def test_allowed_hosts_star_only_under_debug(tmp_path):
    done = run(tmp_path, production(tmp_path, ALLOWED_HOSTS="*"), "manage.py", "check")
    assert done.returncode != 0 and "ImproperlyConfigured: ALLOWED_HOSTS='*'" in done.stderr, done.stderr
    assert run(tmp_path, {"ALLOWED_HOSTS": "*", "DEBUG": "1"}, "manage.py", "check").returncode == 0


def test_behind_a_tls_proxy_hsts_secure_cookies_and_redirect(tmp_path):
    seen = probe(tmp_path, production(tmp_path, BEHIND_TLS_PROXY="1"))
    https = seen["https"]
    assert https["status"] == 200, https["body"]
    assert https["hsts"] == "max-age=31536000; includeSubDomains"
    assert https["cookies"]["csrftoken"]["secure"] is True
    assert seen["session_cookie_secure"] is True and seen["csrf_cookie_secure"] is True
    # A console page asked over plain HTTP goes to HTTPS, without HSTS (only HTTPS answers carry it).
    assert (
        seen["http"]["status"] == 301 and seen["http"]["location"] == "https://cp.example.com/accounts/login/"
    )
    assert seen["http"]["hsts"] is None
    # Routers and probes call the control plane's Service over HTTP inside the cluster.
    assert seen["http_api"]["status"] == 401 and seen["http_healthz"]["status"] != 301


def test_check_deploy_has_nothing_to_say_in_production(tmp_path):
    done = run(
        tmp_path,
        production(tmp_path, BEHIND_TLS_PROXY="1"),
        "manage.py",
        "check",
        "--deploy",
        "--fail-level",
        "WARNING",
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "System check identified no issues" in done.stdout, done.stdout


def test_the_rollout_hold_allowance_and_quota_settings_refuse_bad_values(tmp_path):
    """Each in a fresh interpreter, as a process starts: a bad value stops it naming the variable."""
    for name, value, said in [
        ("ROLLOUT_MAX_HOLD_S", "0", "ROLLOUT_MAX_HOLD_S=0.0 must be at least 1.0"),
        (
            "PROVISIONED_ALLOWANCE_DEFAULT_NODES",
            "-1",
            "PROVISIONED_ALLOWANCE_DEFAULT_NODES=-1 must be at least 0",
        ),
        ("TENANT_GPU_QUOTA_DEFAULT", "lots", "TENANT_GPU_QUOTA_DEFAULT='lots' is not an integer"),
        # vLLM arguments the local agent would refuse for every deployment (dataplane.cluster.pod_args)
        (
            "ENDPOINT_VLLM_ARGS",
            "-- --trust-remote-code",
            "args[1] '--trust-remote-code': not a vLLM argument",
        ),
        ("BENCHMARK_VLLM_ARGS", "--vllm-python /tmp/py", "args[0] '--vllm-python': not an argument"),
    ]:
        done = run(tmp_path, {name: value}, "manage.py", "check")
        assert done.returncode != 0 and said in done.stderr, done.stderr
