"""Helpers for the runtime tests: free ports, HTTP calls, simulated engines as real
processes, real vLLM pods on the tiny model, and a stand-in for the control plane's event API.
Everything listens on 127.0.0.1 and every process a test starts is killed when it ends."""

from __future__ import annotations

import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from dataplane.wire.pod_events import PodEvent


def free_port() -> int:
    """A port nothing listens on (bound and released; connections to it are refused)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def free_ports(n: int) -> list[int]:
    """n distinct free ports: all held until all are chosen (two free_port() calls may return
    the same port)."""
    sockets = [socket.socket() for _ in range(n)]
    try:
        for s in sockets:
            s.bind(("127.0.0.1", 0))
        return [int(s.getsockname()[1]) for s in sockets]
    finally:
        for s in sockets:
            s.close()


def http(
    method: str, url: str, body: Any = None, timeout: float = 10.0, headers: dict[str, str] | None = None
) -> tuple[int, dict[str, str], bytes]:
    """(status, headers, body) of one request; HTTP errors are returned, not raised. ``headers``
    are added (e.g. a keyed pod's ``authorization``)."""
    data = body if isinstance(body, bytes) else (json.dumps(body).encode() if body is not None else None)
    req = urllib.request.Request(
        url, data=data, method=method, headers={"content-type": "application/json", **(headers or {})}
    )
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, {k.lower(): v for k, v in resp.headers.items()}, resp.read()
    except urllib.error.HTTPError as err:
        with err:
            return err.code, {k.lower(): v for k, v in err.headers.items()}, err.read()


def wait_until(predicate: Callable[[], bool], timeout: float, interval: float = 0.05) -> float:
    """Poll until ``predicate`` holds; returns seconds waited; fails the test on timeout."""
    start = time.monotonic()
    while time.monotonic() - start < timeout:
        if predicate():
            return time.monotonic() - start
        time.sleep(interval)
    raise AssertionError(f"condition not met within {timeout} s")


def answers(url: str) -> bool:
    try:
        return http("GET", url, timeout=1.0)[0] == 200
    except OSError:
        return False


def start_pod(*args: str, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    """``python -m dataplane.runtime.pod ARGS`` in its own process group (see stop_group), with
    ``env`` added to ours."""
    return subprocess.Popen(
        [sys.executable, "-m", "dataplane.runtime.pod", *args],
        stderr=subprocess.DEVNULL,
        start_new_session=True,
        env={**os.environ, **(env or {})},
    )


def stop_group(proc: subprocess.Popen[bytes]) -> None:
    """SIGKILL a process and everything in its group (a pod and its engine)."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait(timeout=10)


def pid_alive(pid: int) -> bool:
    """True while ``pid`` runs; a zombie (exited, not yet reaped by whoever adopted it) is dead."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")


def child_pids(pid: int) -> list[int]:
    """Live children of ``pid``, from /proc."""
    children = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            fields = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid and fields[0] not in ("Z", "X"):
            children.append(int(entry))
    return children


def descendant_pids(pid: int) -> list[int]:
    """Live descendants of ``pid``: its children, theirs, and so on, from /proc."""
    found, stack = [], [pid]
    while stack:
        children = child_pids(stack.pop())
        found += children
        stack += children
    return found


@dataclass
class SimProcess:
    port: int
    proc: subprocess.Popen[bytes]

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


@contextmanager
def sim_engine(*args: str) -> Iterator[SimProcess]:
    """A simulated engine process; when the test fails, the end of its log is printed with it."""
    port = free_port()
    with tempfile.TemporaryFile() as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "dataplane.runtime.sim", "--port", str(port), *args], stderr=log
        )
        try:
            wait_until(lambda: answers(f"http://127.0.0.1:{port}/health"), timeout=15)
            yield SimProcess(port, proc)
        except BaseException:
            log.seek(0)
            tail = log.read().decode(errors="replace")[-4000:]
            sys.stderr.write(f"--- simulated engine on port {port}, the end of its log:\n{tail}\n")
            raise
        finally:
            proc.kill()
            proc.wait(timeout=10)


@dataclass
class EventSink:
    """Stand-in for ``POST /api/v1/events/``: answers 503 to the first ``fail_first`` posts,
    then 201, recording what it accepted as the control plane reads it."""

    fail_first: int = 0
    received: list[PodEvent] = field(default_factory=list)
    auth: list[str] = field(default_factory=list)
    attempts: int = 0
    port: int = 0
    server: ThreadingHTTPServer | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def kinds(self) -> list[str]:
        return [e.kind for e in self.received]

    def start(self, port: int = 0) -> None:
        sink = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("content-length", 0)))
                sink.attempts += 1
                if self.path != "/api/v1/events/":
                    self.send_response(404)
                elif sink.attempts <= sink.fail_first:
                    self.send_response(503)
                else:
                    sink.received.append(PodEvent.from_json(json.loads(body)))
                    sink.auth.append(self.headers.get("authorization", ""))
                    self.send_response(201)
                self.send_header("content-length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self.port = int(self.server.server_address[1])
        # Polled every 50 ms, not socketserver's 0.5 s: stop()'s shutdown() waits for the next poll.
        threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True).start()

    def stop(self) -> None:
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()


def metric_value(base_url: str, name: str) -> float:
    """Sum of a metric's samples on an engine's /metrics (0 when absent)."""
    from dataplane.runtime.metrics import sample_sum

    return sample_sum(http("GET", base_url + "/metrics")[2].decode(), name) or 0.0


class CompletionRace:
    """Sends completions from threads and records the order in which they finish."""

    def __init__(self, base_url: str, timeout: float = 60.0):
        self.base_url = base_url
        self.timeout = timeout
        self._finished: list[str] = []
        self._failures: list[str] = []
        self._threads: list[threading.Thread] = []
        self._lock = threading.Lock()

    def send(self, name: str, body: dict[str, Any]) -> threading.Thread:
        def run() -> None:
            try:
                status, _, raw = http("POST", self.base_url + "/v1/completions", body, timeout=self.timeout)
            except OSError as err:
                status, raw = 0, str(err).encode()
            with self._lock:
                if status == 200:
                    self._finished.append(name)
                else:
                    self._failures.append(f"{name}: {status} {raw[:200]!r}")

        thread = threading.Thread(target=run)
        thread.start()
        self._threads.append(thread)
        return thread

    def finished(self) -> list[str]:
        with self._lock:
            return list(self._finished)

    def done(self) -> bool:
        """Every request answered (or failed): nothing of the race is in flight."""
        return not any(thread.is_alive() for thread in self._threads)

    def join(self) -> list[str]:
        """Wait for every request; fails the test if any did not answer 200."""
        for thread in self._threads:
            thread.join(timeout=self.timeout + 5)
        assert not self._failures, self._failures
        return self.finished()


# A tiny random Llama made on the spot (2 layers, hidden 128, a 2,000-token byte-level BPE
# tokenizer, a chat template; ~2 MB in seconds): real vLLM tests and benches need no download.
# Run it with the vLLM venv's python: `python -c MAKE_TINY_LLAMA <output dir>`.
MAKE_TINY_LLAMA = textwrap.dedent("""
    import random, sys
    from pathlib import Path
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast
    import torch
    out = Path(sys.argv[1])
    rng = random.Random(0)
    syllables = "ka lo mi ne ru sa ti vo pe da gu fi ze ho ba".split()
    words = ["".join(rng.choice(syllables) for _ in range(rng.randint(1, 4)))
             for _ in range(3000)]
    text = [" ".join(rng.choice(words) for _ in range(20)) for _ in range(2000)]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(text, trainers.BpeTrainer(
        vocab_size=2000, special_tokens=["<s>", "</s>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>")
    fast.chat_template = ("{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\\n"
                          "{% endfor %}{% if add_generation_prompt %}assistant: {% endif %}")
    fast.save_pretrained(out)
    config = LlamaConfig(vocab_size=len(fast), hidden_size=128, intermediate_size=256,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=512, bos_token_id=0, eos_token_id=1)
    torch.manual_seed(0)
    LlamaForCausalLM(config).save_pretrained(out)
""")


def make_tiny_vllm(folder: Path, python: str = sys.executable) -> tuple[Path, dict[str, str]]:
    """The tiny Llama made under ``folder`` with ``python`` (the vLLM venv's), and the environment
    a vLLM pod serving it needs: 1 GiB of KV cache, no hub, every cache inside ``folder``."""
    model = folder / "tiny-llama"
    subprocess.run(
        [python, "-W", "ignore", "-c", MAKE_TINY_LLAMA, str(model)],
        check=True,
        capture_output=True,
        timeout=300,
    )
    env = {
        "VLLM_CPU_KVCACHE_SPACE": "1",
        "HF_HUB_OFFLINE": "1",
        "VLLM_CACHE_ROOT": str(folder / "vllm-cache"),
        "TORCHINDUCTOR_CACHE_DIR": str(folder / "inductor"),
        "HF_HOME": str(folder / "hf"),
        "TMPDIR": str(folder),
    }
    return model, env


def tiny_vllm_args(model: Path, max_num_seqs: int) -> list[str]:
    """`python -m dataplane.runtime.pod --engine vllm` arguments serving the tiny model as "tiny"."""
    return [
        "--model",
        str(model),
        "--served-model-name",
        "tiny",
        "--dtype",
        os.environ.get("MU_VLLM_TEST_DTYPE", "float32"),
        "--max-model-len",
        "512",
        "--max-num-seqs",
        str(max_num_seqs),
        "--enforce-eager",
    ]


def tree_rss_mib(root_pid: int) -> float:
    """Resident memory of a process and all its descendants, MiB."""
    total_kib = 0
    for pid in (root_pid, *descendant_pids(root_pid)):
        try:
            for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total_kib += int(line.split()[1])
        except OSError:
            continue
    return total_kib / 1024


@dataclass(frozen=True)
class TinyModel:
    path: Path
    env: dict[str, str]  # what a vLLM pod serving it needs (make_tiny_vllm)
    made_s: float  # time to make it, s


@dataclass
class RealPod:
    proc: subprocess.Popen[bytes]
    engine: str  # engine base URL
    probe: str  # prober base URL
    measurements: dict[str, float]


ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts"


# The pod runner's flags for the tests' pods: a prober that probes after 1 s without progress
# and scrapes every 0.5 s (tests see it act within seconds), a 30-s probe completion deadline
# and 30 s to drain on SIGTERM.
TEST_POD_FLAGS = (
    "--idle-interval", "1", "--completion-deadline", "30", "--scrape-interval", "0.5", "--grace", "30",
)  # fmt: skip


@contextmanager
def tiny_vllm_pod(
    folder: Path, model: Path, model_env: dict[str, str], *args: str, name: str, max_num_seqs: int
) -> Iterator[RealPod]:
    """``python -m dataplane.runtime.pod --engine vllm`` serving the tiny model (``make_tiny_vllm``:
    its path and ``model_env``) as "tiny", ``args`` after its own flags; yielded ready (its
    prober's /readyz is 200, ``measurements["ready_s"]`` after the start). On the way out it gets
    SIGTERM (exit code in ``measurements``), then its group SIGKILL. ``folder`` takes its log
    (pod.log) and is its TMPDIR, where vLLM puts its temporary files."""
    env = {**os.environ, **model_env, "TMPDIR": str(folder)}
    port, probe_port = free_ports(2)
    log_path = folder / "pod.log"
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            [
                sys.executable, "-m", "dataplane.runtime.pod", "--engine", "vllm",
                "--port", str(port), "--probe-port", str(probe_port), "--name", name,
                *tiny_vllm_args(model, max_num_seqs), *args,
            ],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip
        pod = RealPod(proc, f"http://127.0.0.1:{port}", f"http://127.0.0.1:{probe_port}", {})
        try:
            start = time.monotonic()

            def ready() -> bool:
                assert proc.poll() is None, log_path.read_text()[-3000:]
                try:
                    return http("GET", pod.probe + "/readyz", timeout=2)[0] == 200
                except OSError:
                    return False

            wait_until(ready, timeout=300, interval=0.5)
            pod.measurements["ready_s"] = time.monotonic() - start
            yield pod
        finally:
            try:
                proc.send_signal(signal.SIGTERM)  # the pod forwards it to vLLM, which stops
                pod.measurements["exit_code"] = proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                pod.measurements["exit_code"] = -9
            finally:
                stop_group(proc)


def running_pod(folder: Path, model: TinyModel, *args: str) -> AbstractContextManager[RealPod]:
    """The tests' vLLM pod: the tiny model, ``--max-num-seqs 2``, TEST_POD_FLAGS, then ``args``."""
    return tiny_vllm_pod(
        folder, model.path, model.env, *TEST_POD_FLAGS, *args, name="vllm-test", max_num_seqs=2
    )


def save_measurements(name: str, measurements: dict[str, float]) -> None:
    ARTIFACTS.mkdir(exist_ok=True)
    (ARTIFACTS / name).write_text(json.dumps(measurements, indent=1))
    print(f"\n{name}:", json.dumps(measurements))


@contextmanager
def router_process(*args: str, env: dict[str, str] | None = None) -> Iterator[str]:
    """`python -m dataplane.router` on a free port, with ``env`` added to this environment (keys
    go there, never on its command line); its base URL once it answers /health."""
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "dataplane.router", "--listen", f"127.0.0.1:{port}", *args],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env={**os.environ, **(env or {})},
    )
    try:
        wait_until(lambda: answers(f"http://127.0.0.1:{port}/health"), timeout=30)
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def agent_token_file(directory: Path) -> str:
    """A new cluster agent token in a mode-600 file under ``directory``, as scripts/run-local.sh
    writes it: the agent's --token-file and the control plane's CLUSTER_AGENT_TOKEN_FILE."""
    path = directory / "agent.token"
    path.write_text(secrets.token_urlsafe(32) + "\n")
    path.chmod(0o600)
    return str(path)
