"""The launcher runs the engine module with thread counts set and forwards SIGTERM to it.

A stand-in ``vllm.entrypoints.openai.api_server`` module (on PYTHONPATH) records its argv and
environment, then waits for SIGTERM and "drains"."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.runtime.support import wait_until

pytestmark = pytest.mark.stack  # a pod (launcher and engine) as subprocesses

FAKE_SERVER = textwrap.dedent("""
    import json, os, signal, sys, time
    out = os.environ["FAKE_VLLM_OUT"]
    def drain(signum, frame):
        with open(out + ".drained", "w") as f:
            f.write(str(signum))
        sys.exit(0)
    signal.signal(signal.SIGTERM, drain)
    with open(out, "w") as f:
        json.dump({"argv": sys.argv[1:], "omp": os.environ.get("OMP_NUM_THREADS")}, f)
    for _ in range(600):
        time.sleep(0.1)
    sys.exit(3)
""")


def test_launcher_starts_engine_and_forwards_sigterm(tmp_path: Path) -> None:
    package = tmp_path / "vllm" / "entrypoints" / "openai"
    package.mkdir(parents=True)
    for folder in (tmp_path / "vllm", tmp_path / "vllm" / "entrypoints", package):
        (folder / "__init__.py").write_text("")
    (package / "api_server.py").write_text(FAKE_SERVER)
    out = tmp_path / "started.json"
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(tmp_path), *sys.path]),
        "FAKE_VLLM_OUT": str(out),
        "OMP_NUM_THREADS": "999",
    }
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "dataplane.runtime.launcher",
            "--model",
            "/models/m",
            "--port",
            "8123",
            "--max-num-seqs",
            "4",
            "--",
            "--enable-prefix-caching",
        ],
        env=env,
    )
    try:
        wait_until(out.exists, timeout=15)
        wait_until(lambda: out.read_text().endswith("}"), timeout=5)
        started = json.loads(out.read_text())
        assert started["argv"][:2] == ["--model", "/models/m"]
        assert "--scheduling-policy" in started["argv"]
        assert started["argv"][-1] == "--enable-prefix-caching"
        # The host's 999 is replaced by the limit of this machine's cgroup, less one CPU.
        assert started["omp"] != "999" and int(started["omp"]) >= 1
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=10) == 0  # the engine drained and exited 0
        assert (tmp_path / "started.json.drained").read_text() == str(int(signal.SIGTERM))
    finally:
        proc.kill()
        proc.wait(timeout=10)
