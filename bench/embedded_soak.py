"""`make run` and `make load` together for a long while: does every process of the stack stay up?

Starts scripts/run-local.sh on its own ports and var/ folder (as `make run` does), then runs the
load generator against its router with `make load`'s stages, over and over, for --minutes; then
counts the deaths the stack's supervisor reported (expected: 0), greps every log for a fatal
broker error, and prints each process's CPU seconds and memory at the start of the load and at
the end, and how the load generator's rounds fared. Not part of `make test` (30 minutes).

    .venv/bin/python bench/embedded_soak.py [--minutes 30] [--stages 30x2,90x24,120x2] [--smoke]

--smoke: the stack started and one round of 2 seconds' load (--minutes 0.05 --stages 2x2): does
it still run, not what it gives.
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FATAL = re.compile(r"Unrecoverable error|JSONDecodeError|Traceback \(most recent call last\)")
STARTED = re.compile(r"started (.+?)\s+pid (\d+)")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def usage(pid: int) -> tuple[float, int]:
    """CPU seconds and resident MiB of one process (0s once it is gone)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        rss = int(stat[21]) * os.sysconf("SC_PAGE_SIZE") // 2**20
        return (int(stat[11]) + int(stat[12])) / os.sysconf("SC_CLK_TCK"), rss
    except OSError:
        return 0.0, 0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--minutes", type=float, default=30.0)
    ap.add_argument("--stages", default="30x2,90x24,120x2", help="`make load`'s, repeated")
    ap.add_argument("--smoke", action="store_true", help="tiny sizes, seconds: one round of 2 s")
    args = ap.parse_args()
    if args.smoke:  # again, with these as the defaults (an explicit argument still wins)
        ap.set_defaults(minutes=0.05, stages="2x2")
        args = ap.parse_args()
    bin_dir = Path(sys.executable).parent
    with tempfile.TemporaryDirectory(prefix="soak-") as tmp:
        var = Path(tmp) / "var"
        ports = {"CP_PORT": free_port(), "ROUTER_PORT": free_port(), "AGENT_PORT": free_port()}
        env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "REDIS_URL")}
        env.update({k: str(v) for k, v in ports.items()}, CONTROLPLANE_VAR_DIR=str(var), BIN=str(bin_dir))
        terminal = Path(tmp) / "terminal.txt"
        with terminal.open("w") as out:
            stack = subprocess.Popen(
                ["bash", "scripts/run-local.sh"], cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT,
                start_new_session=True,
            )  # fmt: skip
        try:
            deadline = time.monotonic() + 180
            while "Stop: Ctrl-C" not in terminal.read_text():
                if time.monotonic() > deadline or stack.poll() is not None:
                    raise SystemExit(f"the stack did not start:\n{terminal.read_text()}")
                time.sleep(1)
            while socket.socket().connect_ex(("127.0.0.1", ports["ROUTER_PORT"])) != 0:
                if time.monotonic() > deadline:  # it listens once it has its first routing table
                    raise SystemExit(f"the router did not listen:\n{terminal.read_text()}")
                time.sleep(1)
            pids = {name: int(pid) for name, pid in STARTED.findall(terminal.read_text())}
            before = {name: usage(pid) for name, pid in pids.items()}
            end = time.monotonic() + args.minutes * 60
            rounds: list[str] = []
            while time.monotonic() < end:
                left = end - time.monotonic()
                load = subprocess.run(
                    [str(bin_dir / "python"), "-m", "dataplane.loadgen", "--url",
                     f"http://127.0.0.1:{ports['ROUTER_PORT']}", "--key-file", str(var / "keys" / "acme.key"),
                     "--model", "summarize", "--stages", args.stages],
                    cwd=ROOT, capture_output=True, text=True, timeout=left + 600,
                )  # fmt: skip
                said = (load.stdout + load.stderr).strip().splitlines() or ["(no output)"]
                rounds.append(said[-1])
                print(f"round {len(rounds)} (exit {load.returncode}): {rounds[-1]}", flush=True)
                if load.returncode != 0:
                    time.sleep(5)  # not a spin when the router does not answer
            text = terminal.read_text()
            after = {name: usage(pid) for name, pid in pids.items()}
        finally:
            stack.send_signal(signal.SIGINT)
            try:
                stack.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(stack.pid, signal.SIGKILL)
        deaths = text.count(" exited with code ")
        fatal = [f"{log.name}: {line.strip()[:120]}" for log in var.glob("*.log")
                 for line in log.read_text(errors="replace").splitlines() if FATAL.search(line)]  # fmt: skip
        print(f"\n{args.minutes:g} minutes of `make load` ({args.stages}, repeated) on `make run`:")
        print(f"  process deaths: {deaths} (expected 0); fatal lines in the logs: {len(fatal)}")
        for line in fatal[:10]:
            print(f"    {line}")
        print(f"  {'process':<14} {'CPU s':>8} {'RSS MiB start':>14} {'RSS MiB end':>12}")
        for name in pids:
            cpu = after[name][0] - before[name][0]
            print(f"  {name:<14} {cpu:>8.0f} {before[name][1]:>14} {after[name][1]:>12}")
        print(f"  load rounds: {len(rounds)}; the last: {rounds[-1] if rounds else '-'}")


if __name__ == "__main__":
    main()
