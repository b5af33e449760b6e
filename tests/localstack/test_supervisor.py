"""The embedded stack's supervisor, for real: it runs a real Redis and a stand-in for the Celery
worker (a Python process that logs and waits), the test SIGKILLs the stand-in, and the death
becomes an on-call event with the end of its log, written by `manage.py record_stack_event` into
the test database, which the on-call page's attention panel counts."""

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from django.db import connection

from controlplane.oncall.models import Event
from tests.console.conftest import fast_password_hashing, operator_web

pytestmark = [pytest.mark.stack, pytest.mark.django_db(transaction=True)]  # its writes, from another process

__all__ = ["fast_password_hashing", "operator_web"]  # fixtures
ROOT = Path(__file__).resolve().parents[2]
BOUND_S = 60
LAST_WORDS = "worker: about to be killed, mid-task"

# A supervisor over Redis (its own command line from stack()) and the stand-in, as `make run` runs
# the stack: argv[1] is the var folder, argv[2] the parent's pid.
SUPERVISOR = f"""
import sys
from argparse import Namespace
from pathlib import Path
from controlplane.localstack.backoff import Policy
from controlplane.localstack.supervisor import Process, Supervisor, stack
var = Path(sys.argv[1])
args = Namespace(bin={str(Path(sys.executable).parent)!r}, var=str(var), parent=int(sys.argv[2]), cp_port=1,
                 router_port=1, agent_port=1, warm_pool=0, key_file="", agent_token_file="",
                 pod_key_file="", vllm_python=None, redis_server="redis-server")
worker = Process("celery", var / "celery.log", [sys.executable, "-u", "-c",
    "import os, time; print('worker: ready, pid', os.getpid()); print({LAST_WORDS!r}); time.sleep(600)"])
(var / "redis").mkdir(mode=0o700)
sys.exit(Supervisor(args, [stack(args)[0], worker], Policy()).run())
"""


def wait_for(condition, what: str, bound_s: float = BOUND_S):
    deadline = time.monotonic() + bound_s
    while time.monotonic() < deadline:
        if found := condition():
            return found
        time.sleep(0.1)
    raise AssertionError(f"not within {bound_s} s: {what}")


@pytest.fixture
def var():
    # Short: a unix socket's path must fit 108 bytes, and pytest's tmp_path can be longer.
    path = Path(tempfile.mkdtemp(prefix="sv-"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def test_a_killed_process_is_an_on_call_event_with_its_log_tail(var, operator_web):
    db = connection.settings_dict
    env = {
        **os.environ,
        # the recorder's database is the test's
        "DATABASE_URL": f"postgres://{db['USER']}@{db['HOST']}:{db['PORT']}/{db['NAME']}",
        "CONTROLPLANE_VAR_DIR": str(var),
        "DJANGO_SETTINGS_MODULE": "controlplane.settings",
    }
    with (var / "supervisor.out").open("wb") as out:
        supervisor = subprocess.Popen(
            [sys.executable, "-c", SUPERVISOR, str(var), str(os.getpid())],
            cwd=ROOT,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        log = var / "celery.log"
        ready = wait_for(lambda: log.exists() and LAST_WORDS in log.read_text(), "the worker's first lines")
        assert ready
        pid = int(log.read_text().split("pid ")[1].split()[0])
        os.kill(pid, signal.SIGKILL)
        event = wait_for(lambda: Event.objects.filter(pod="stack-celery").first(), "the on-call event")
        assert (event.kind, event.severity, event.tenant_id) == ("restart", "warning", None)
        assert event.message.startswith("celery of the embedded stack was killed by signal 9")
        assert event.detail["exit_code"] == -9 and event.detail["log"] == str(log)
        assert event.detail["log_tail"][-1] == LAST_WORDS
        # started again, in the same log
        wait_for(lambda: log.read_text().count(LAST_WORDS) == 2, "the worker started again")
        attention = operator_web.get("/console/oncall/attention/").content.decode().split("</section>")[0]
        assert 'class="attention alarm"' in attention and "stack-celery</a> \u00d71" in attention
    finally:
        supervisor.send_signal(signal.SIGTERM)
        try:
            supervisor.wait(timeout=40)
        except subprocess.TimeoutExpired:
            supervisor.kill()
            supervisor.wait()
    output = (var / "supervisor.out").read_text()
    assert f"    {LAST_WORDS}" in output  # the same tail on the terminal
    assert supervisor.returncode == 0 and "Stopped." in output
