"""The embedded default is closed to everyone but the stack's user: var/ is 700 and everything
under it 600 (folders 700), the real stack (scripts/run-local.sh) runs with DEBUG off on a secret
key of its own made once under var/, serves the console's static files and error pages, and a
signed-in session outlives a restart.

Each stack runs on its own ports and var/ folder, in a process group this test owns; manage.py
runs as an operator would run it on a checkout, under the common umask 022."""

import os
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests
from django.core.exceptions import ImproperlyConfigured

from controlplane.localfiles import local_secret_key
from tests.runtime.support import free_ports

ROOT = Path(__file__).resolve().parents[1]
START_BOUND_S = 150  # migrations and the demo fleet on SQLite, on a busy 2-core machine
STOP_BOUND_S = 40
PASSWORD = "a-long-enough-password-for-alice"


def embedded_env(var: Path, **extra: str) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("DATABASE_URL", "REDIS_URL", "DJANGO_SETTINGS_MODULE", "DEBUG", "SECRET_KEY")
    }
    return {**env, "CONTROLPLANE_VAR_DIR": str(var), "PYTHONPATH": str(ROOT), **extra}


def manage(var: Path, *args: str) -> str:
    done = subprocess.run(
        [sys.executable, "manage.py", *args],
        cwd=ROOT,
        env=embedded_env(var),
        capture_output=True,
        text=True,
        timeout=120,
        umask=0o022,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def open_to_others(var: Path) -> list[str]:
    """Every path under var (var included) with a group or other permission bit."""
    found = []
    for path in [var, *var.rglob("*")]:
        try:
            mode = path.lstat().st_mode
        except FileNotFoundError:  # a broker message or a rotated log gone meanwhile
            continue
        if not stat.S_ISLNK(mode) and mode & 0o077:
            found.append(f"{stat.S_IMODE(mode):o} {path.relative_to(var)}")
    return found


@pytest.mark.stack
def test_manage_py_on_the_embedded_default_makes_only_private_files(tmp_path):
    var = tmp_path / "var"
    var.mkdir(mode=0o755)  # as an earlier run, or a `mkdir var`, left it
    var.chmod(0o755)
    manage(var, "migrate", "--noinput", "-v0")
    assert open_to_others(var) == []
    assert (var / "controlplane.sqlite3").exists() and (var / "secret_key").exists()
    key = (var / "secret_key").read_text()
    manage(var, "check")
    assert (var / "secret_key").read_text() == key  # made once, then read


def test_a_secret_key_file_left_readable_is_tightened_and_a_short_one_refused(tmp_path):
    key_file = tmp_path / "secret_key"
    key_file.write_text("k" * 60 + "\n")
    key_file.chmod(0o644)
    assert local_secret_key(tmp_path) == "k" * 60
    assert stat.S_IMODE(key_file.stat().st_mode) == 0o600
    key_file.write_text("short\n")
    with pytest.raises(ImproperlyConfigured, match=r"secret_key' is 5 characters \(50\+ needed\)"):
        local_secret_key(tmp_path)


class Stack:
    """scripts/run-local.sh on ports of its own, in its own process group."""

    def __init__(self, var: Path, terminal: Path):
        self.var, self.terminal = var, terminal
        self.cp, router, agent = free_ports(3)
        env = embedded_env(
            var,
            CP_PORT=str(self.cp),
            ROUTER_PORT=str(router),
            AGENT_PORT=str(agent),
            WARM_POOL="0",
            BIN=str(Path(sys.executable).parent),
        )
        with terminal.open("w") as out:
            self.process = subprocess.Popen(
                ["bash", "scripts/run-local.sh"],
                cwd=ROOT,
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                umask=0o022,
            )
        deadline = time.monotonic() + START_BOUND_S
        while "Drive traffic" not in terminal.read_text():
            assert self.process.poll() is None, terminal.read_text()
            assert time.monotonic() < deadline, f"not up in {START_BOUND_S} s:\n{terminal.read_text()}"
            time.sleep(0.3)
        self.url = f"http://127.0.0.1:{self.cp}"
        while True:  # the control plane's port opens after the script's last line
            try:
                requests.get(f"{self.url}/healthz", timeout=5)
                break
            except requests.ConnectionError:
                assert time.monotonic() < deadline, terminal.read_text()
                time.sleep(0.3)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=STOP_BOUND_S)
            except subprocess.TimeoutExpired:
                pass
        try:
            os.killpg(self.process.pid, signal.SIGKILL)  # anything the script left behind
        except ProcessLookupError:
            pass
        self.process.wait(timeout=10)


def sign_in(url: str, username: str) -> requests.Session:
    session = requests.Session()
    session.get(f"{url}/accounts/login/", timeout=30).raise_for_status()
    answer = session.post(
        f"{url}/accounts/login/",
        data={
            "username": username,
            "password": PASSWORD,
            "csrfmiddlewaretoken": session.cookies["csrftoken"],
        },
        timeout=30,
        allow_redirects=False,
    )
    assert answer.status_code == 302 and answer.headers["Location"] == "/console/", answer.text[:2000]
    return session


USERS = f"""
from django.contrib.auth.models import User
from controlplane.endpoints.models import Endpoint
from controlplane.tenants.models import Member, Tenant
for name, tenant in (("alice", "acme"), ("gabe", "globex")):
    user = User.objects.create_user(name, password={PASSWORD!r})
    Member.objects.create(user=user, tenant=Tenant.objects.get(name=tenant))
print(Endpoint.objects.filter(tenant__name="globex").order_by("pk").first().pk)
"""


@pytest.mark.stack
def test_the_embedded_stack_is_private_without_debug_and_keeps_sessions_across_a_restart(tmp_path):
    var = tmp_path / "var"
    var.mkdir(mode=0o755)
    var.chmod(0o755)
    (var / "controlplane.log").write_text("an earlier run's log, 644\n")
    (var / "controlplane.log").chmod(0o644)

    stack = Stack(var, tmp_path / "terminal-1.txt")
    try:
        globex_endpoint = int(manage(var, "shell", "-c", USERS).split()[-1])
        alice = sign_in(stack.url, "alice")
        assert "alice" in alice.get(f"{stack.url}/console/endpoints/", timeout=30, allow_redirects=False).text

        # Another tenant's endpoint: the console's 404, no URL patterns (DEBUG is off).
        answer = alice.get(f"{stack.url}/console/endpoints/{globex_endpoint}/", timeout=30)
        assert answer.status_code == 404
        assert "<h1>Not found</h1>" in answer.text, answer.text[:3000]
        assert "URLconf" not in answer.text and "urlpatterns" not in answer.text
        # Static files as in production: the console's CSS and script.
        for asset in ("console/console.css", "console/htmx-2.0.11.min.js"):
            got = requests.get(f"{stack.url}/static/{asset}", timeout=30)
            assert got.status_code == 200 and len(got.content) > 1000, asset
        assert (
            "text/css"
            in requests.get(f"{stack.url}/static/console/console.css", timeout=30).headers["Content-Type"]
        )
        key_file = var / "secret_key"
        assert stat.S_IMODE(key_file.stat().st_mode) == 0o600
        key = key_file.read_text()
        # The demo endpoints' pods start within seconds (the autoscaler's first passes): their
        # logs, written by the agent's supervisor, are walked too.
        deadline = time.monotonic() + START_BOUND_S
        while not list((var / "pods").glob("*.log")):
            assert time.monotonic() < deadline, (var / "agent.log").read_text()[-3000:]
            time.sleep(0.5)
        assert open_to_others(var) == [], open_to_others(var)
    finally:
        stack.stop()

    stack = Stack(var, tmp_path / "terminal-2.txt")
    try:
        assert key_file.read_text() == key  # reused, not remade
        page = alice.get(f"{stack.url}/console/endpoints/", timeout=30, allow_redirects=False)
        assert page.status_code == 200 and "alice" in page.text  # the session outlived the restart
        assert open_to_others(var) == [], open_to_others(var)  # the rotated logs included
    finally:
        stack.stop()
