"""The on-call paging contract, measured on the embedded default as `make run` starts it.

SQLite under a fresh var/ directory, a redis-server on a unix socket there as the Celery broker,
`celery -A controlplane worker --beat --pool=threads` and `manage.py runserver`, ONCALL_WEBHOOK_URL
pointing at a receiver on 127.0.0.1; then N critical events (each a new problem) are POSTed to
/api/v1/events/ and the seconds until each page reaches the webhook, with the event's message in
its body, are printed.
The contract: every one within 15 s.

    .venv/bin/python bench/oncall_webhook.py [--events 5] [--smoke]

--smoke: one event, and a page later than the contract is printed, not an exit status of 1: does
the stack still page at all (tests/test_bench_smoke.py), on a machine too busy to time it.
"""

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.oncall.receiver import Receiver  # noqa: E402

CONTRACT_S = 15.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_for(url: str, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url, timeout=1) as resp:
                if resp.status == 200:
                    return
        except OSError:
            time.sleep(0.2)
    raise SystemExit(f"{url} did not answer within {timeout_s:g} s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--events", type=int, default=5)
    parser.add_argument("--smoke", action="store_true", help="one event, no exit status for a late page")
    args = parser.parse_args()
    if args.smoke:  # again, with this as the default (an explicit argument still wins)
        parser.set_defaults(events=1)
        args = parser.parse_args()
    python = sys.executable
    with tempfile.TemporaryDirectory(prefix="oncall-bench-") as var, Receiver() as receiver:
        env = {
            k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "REDIS_URL", "CELERY_BROKER_URL")
        }
        env.update(CONTROLPLANE_VAR_DIR=var, DEBUG="1", ONCALL_WEBHOOK_URL=receiver.url, PYTHONPATH=str(ROOT))
        env["DJANGO_SETTINGS_MODULE"] = "controlplane.settings"
        subprocess.run([python, "manage.py", "migrate", "--noinput", "-v0"], cwd=ROOT, env=env, check=True)
        key = subprocess.run(
            [python, "manage.py", "create_operator_key", "bench"], cwd=ROOT, env=env, check=True,
            capture_output=True, text=True,
        ).stdout.strip().splitlines()[-1]  # fmt: skip
        port = free_port()
        logs = open(os.path.join(var, "stack.log"), "w")
        celery = [
            str(Path(python).with_name("celery")), "-A", "controlplane", "worker", "--beat", "--pool=threads",
            "--concurrency=4", "--loglevel=INFO", f"--schedule={var}/celerybeat-schedule",
        ]  # fmt: skip
        web = [python, "manage.py", "runserver", f"127.0.0.1:{port}", "--noreload"]
        started = [
            subprocess.Popen(command, cwd=ROOT, env=env, stdout=logs, stderr=subprocess.STDOUT)
            for command in (celery, web)
        ]
        redis = [
            "redis-server",
            "--port",
            "0",
            "--unixsocket",
            f"{var}/redis.sock",
            "--save",
            "",
            "--dir",
            var,
        ]
        started.insert(0, subprocess.Popen(redis, stdout=logs, stderr=subprocess.STDOUT))
        try:
            wait_for(f"http://127.0.0.1:{port}/healthz", 60)
            time.sleep(3)  # the worker connects to its broker
            took = []
            for i in range(args.events):
                message = f"engine hung: bench event {i} on pod bench-{i}-{time.time_ns()}"
                body = {
                    "kind": "hang",
                    "severity": "critical",
                    "pod": f"bench-pod-{chr(97 + i)}",
                    "message": message,
                }
                request = urllib.request.Request(
                    f"http://127.0.0.1:{port}/api/v1/events/", data=json.dumps(body).encode(), method="POST",
                    headers={"Content-Type": "application/json", "Authorization": f"Bearer {key}"},
                )  # fmt: skip
                seen = len(receiver.raw)
                sent = time.monotonic()
                with urllib.request.urlopen(request, timeout=10) as resp:
                    assert resp.status == 201, resp.status
                while len(receiver.raw) == seen and time.monotonic() - sent < 30:
                    time.sleep(0.01)
                if len(receiver.raw) == seen:
                    raise SystemExit(f"event {i}: no page within 30 s (see {var}/stack.log)")
                assert message.encode() in receiver.raw[-1], "the page does not carry the message"
                took.append(time.monotonic() - sent)
                print(f"event {i}: POST -> webhook {took[-1]:.2f} s")
            verdict = "ok" if max(took) <= CONTRACT_S else "MISSED"
            print(f"max {max(took):.2f} s, contract {CONTRACT_S:g} s: {verdict}")
            if max(took) > CONTRACT_S and not args.smoke:
                raise SystemExit(1)
        finally:
            for process in started:
                process.terminate()
            for process in started:
                try:
                    process.wait(20)
                except subprocess.TimeoutExpired:
                    process.kill()
            logs.close()


if __name__ == "__main__":
    main()
