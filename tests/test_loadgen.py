"""The load generator and the locustfile as a user runs them, over real sockets: against a
SIMULATED engine (``python -m dataplane.runtime.sim``) and through a router in static mode in
front of it, each a process started here on a free port. What they print is checked against
what the engine counted."""

from __future__ import annotations

import csv
import os
import re
import select
import signal
import socket
import socketserver
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from dataplane.loadgen.__main__ import main
from tests.runtime.support import SimProcess, answers, free_port, metric_value, sim_engine, wait_until

pytestmark = pytest.mark.stack  # an engine, a router, the load generator and locust as subprocesses

MODEL = "sim-tiny"  # what the tiny-test profile serves
SUMMARY = re.compile(
    r"^total (?P<elapsed>\d+)s\s+sent\s+(?P<sent>\d+)\s+ok\s+(?P<ok>\d+)\s+errors (?P<errors>.+?)"
    r"\s+req/s .*\s+ttft (?P<ttft>-|p50 \S+ p99 \S+)\s+itl (?P<itl>-|p50 \S+ p99 \S+)$",
    re.MULTILINE,
)


@pytest.fixture(scope="module")
def engine() -> Iterator[SimProcess]:
    with sim_engine("--profile", "tiny-test", "--time-scale", "20") as sim:
        yield sim


@pytest.fixture(scope="module")
def router(engine: SimProcess) -> Iterator[str]:
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "dataplane.router", "--listen", f"127.0.0.1:{port}", "--backends", engine.url],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until(lambda: answers(url + "/health"), timeout=15)
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def loadgen(url: str, *args: str) -> subprocess.CompletedProcess[str]:
    """`python -m dataplane.loadgen` as a user runs it (static mode needs no real key)."""
    return subprocess.run(
        [sys.executable, "-m", "dataplane.loadgen", "--url", url, "--model", MODEL, *args],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "MU_API_KEY": "test"},
    )


def summary(run: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    """The total line's figures: sent, ok, errors by what failed, ttft and itl ("-" when none)."""
    assert "Traceback" not in run.stderr, run.stderr
    found = SUMMARY.search(run.stdout)
    assert found, run.stdout + run.stderr
    errors = found["errors"]
    return {
        "sent": int(found["sent"]),
        "ok": int(found["ok"]),
        "errors": {} if errors == "-" else dict(e.rsplit(":", 1) for e in errors.split()),
        "ttft": found["ttft"],
        "itl": found["itl"],
    }


def engine_counts(engine: SimProcess) -> tuple[float, float, float]:
    """Requests finished, prompt tokens and generated tokens, as the engine counted them."""
    return tuple(  # type: ignore[return-value]
        metric_value(engine.url, name)
        for name in ("vllm:request_success_total", "vllm:prompt_tokens_total", "vllm:generation_tokens_total")
    )


def test_a_run_against_the_engine_streams_and_reports_ttft_and_itl(engine):
    before = engine_counts(engine)
    run = loadgen(engine.url, "--stages", "2x3", "--max-tokens", "16")
    after = engine_counts(engine)
    total = summary(run)
    assert run.returncode == 0
    assert total["errors"] == {} and total["sent"] == total["ok"] > 10
    assert total["sent"] == after[0] - before[0]  # each request sent was one the engine finished
    assert total["ttft"].startswith("p50 ") and total["itl"].startswith("p50 ")
    assert re.search(r"^\s+\d+s clients   3  sent ", run.stdout, re.MULTILINE)  # the 5-s lines


def test_a_stage_of_no_clients_is_a_pause(engine):
    started = time.monotonic()
    total = summary(loadgen(engine.url, "--stages", "0.5x1,2x0", "--max-tokens", "4"))
    assert time.monotonic() - started >= 2.5 and total["sent"] == total["ok"] > 0


def test_ctrl_c_ends_the_run_with_its_total(engine):
    # SIGINT as a terminal sends it; the handler is set explicitly, since a background job's
    # shell may have left SIGINT ignored for its children.
    run = subprocess.Popen(
        [sys.executable, "-c", "import signal, sys; signal.signal(signal.SIGINT, signal.default_int_handler);"
         " from dataplane.loadgen.__main__ import main; sys.exit(main())",
         "--url", engine.url, "--model", MODEL, "--stages", "60x2"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "MU_API_KEY": "test"},
    )  # fmt: skip
    try:
        assert run.stdout is not None and re.match(r"\s+5s clients   2  sent", run.stdout.readline())
        run.send_signal(signal.SIGINT)
        out, err = run.communicate(timeout=10)
    finally:
        run.kill()
    assert run.returncode == 130 and "Traceback" not in err, err
    assert SUMMARY.search(out) and int(SUMMARY.search(out)["ok"]) > 0, out


@pytest.fixture(scope="module")
def router_run(router: str, engine: SimProcess) -> tuple[subprocess.CompletedProcess[str], float]:
    """One streamed run through the router, and how many requests the engine finished meanwhile."""
    before = engine_counts(engine)[0]
    run = loadgen(router, "--stages", "2x3", "--max-tokens", "16")
    return run, engine_counts(engine)[0] - before


def test_a_run_through_the_router_counts_every_request_it_sent(router_run):
    run, finished = router_run
    total = summary(run)
    assert total["sent"] == finished > 10
    assert total["ok"] + sum(int(n) for n in total["errors"].values()) == total["sent"]


def test_streams_through_the_router_end_cleanly_with_ttft_and_itl(router_run):
    run, _ = router_run
    total = summary(run)
    assert total["errors"] == {} and total["ok"] == total["sent"]
    assert total["ttft"].startswith("p50 ") and total["itl"].startswith("p50 ")


class CountingForwarder(socketserver.ThreadingTCPServer):
    """A TCP forwarder to 127.0.0.1:target_port that counts the connections clients open."""

    daemon_threads = True

    def __init__(self, target_port: int):
        self.target_port = target_port
        self.connections = 0
        super().__init__(("127.0.0.1", 0), Pipe)

    def process_request(self, request: Any, client_address: Any) -> None:
        self.connections += 1  # the serving thread alone runs this
        super().process_request(request, client_address)


class Pipe(socketserver.BaseRequestHandler):
    server: CountingForwarder

    def handle(self) -> None:
        with socket.create_connection(("127.0.0.1", self.server.target_port)) as upstream:
            peer = {self.request: upstream, upstream: self.request}
            while True:
                readable, _, _ = select.select(list(peer), [], [], 30)
                for sock in readable:
                    data = sock.recv(65536)
                    if not data:
                        return
                    peer[sock].sendall(data)


def test_connections_are_kept_alive(engine):
    # Whole answers: the simulated engine closes the connection after every stream (for now).
    forwarder = CountingForwarder(engine.port)
    threading.Thread(target=forwarder.serve_forever, daemon=True).start()
    try:
        run = loadgen(f"http://127.0.0.1:{forwarder.server_address[1]}", "--no-stream", "--stages", "2x3")
    finally:
        forwarder.shutdown()
        forwarder.server_close()
    total = summary(run)
    assert total["errors"] == {} and total["sent"] > 10
    assert forwarder.connections <= 3  # one per client at most, the first check's included


def write_trace(path: Path, rows: int) -> list[tuple[int, int]]:
    """A trace of `rows` requests 1 s apart; returns their (ContextTokens, GeneratedTokens)."""
    shapes = [(20 + 7 * i, 3 + i % 5) for i in range(rows)]
    with path.open("w", newline="") as f:
        out = csv.writer(f)
        out.writerow(["TIMESTAMP", "ContextTokens", "GeneratedTokens"])
        for i, (context, generated) in enumerate(shapes):
            out.writerow([f"2023-11-16 18:{15 + i // 60:02d}:{i % 60:02d}.5000000", context, generated])
    return shapes


def test_a_trace_replay_sends_the_trace_at_the_rate_multiple_through_the_router(router, engine, tmp_path):
    shapes = write_trace(tmp_path / "trace.csv", 20)
    before = engine_counts(engine)
    started = time.monotonic()
    run = loadgen(router, "--trace", str(tmp_path / "trace.csv"), "--rate-multiple", "10")
    took = time.monotonic() - started
    after = engine_counts(engine)
    assert "replaying 20 requests" in run.stdout, run.stdout + run.stderr
    assert summary(run)["sent"] == 20
    # 20 requests 1 s apart at 10x: the last goes 1.9 s in (an hour-long replay at 1x would not end).
    assert 1.9 <= took < 15
    # The engine saw each request as the trace sized it: its prompt tokens and max_tokens.
    assert after[0] - before[0] == 20
    assert after[1] - before[1] == sum(context for context, _ in shapes)
    assert after[2] - before[2] == sum(generated for _, generated in shapes)


def test_a_trace_replay_stops_sending_at_the_duration(engine, tmp_path):
    write_trace(tmp_path / "trace.csv", 20)
    run = loadgen(
        engine.url, "--trace", str(tmp_path / "trace.csv"), "--rate-multiple", "10", "--duration", "0.95"
    )
    total = summary(run)
    # At 10x the rows fall 0.1 s apart: those at 0.0 .. 0.9 s go, the other 10 do not.
    assert total["sent"] == total["ok"] == 10 and total["ttft"].startswith("p50 ")


@pytest.fixture(scope="module")
def locust_run(
    router, tmp_path_factory
) -> tuple[subprocess.CompletedProcess[str], dict[str, dict[str, str]]]:
    """bench/locustfile.py headless through the router for 5 s: its run and its CSV stats by name."""
    folder = tmp_path_factory.mktemp("locust")
    locust = Path(sys.executable).with_name("locust")
    bench = Path(__file__).resolve().parent.parent / "bench" / "locustfile.py"
    run = subprocess.run(
        [
            *(
                str(locust),
                "-f",
                str(bench),
                "--headless",
                "-u",
                "4",
                "-r",
                "4",
                "-t",
                "5s",
                "--only-summary",
            ),
            *("--host", router, "--model", MODEL, "--csv", str(folder / "locust")),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=folder,
    )
    with (folder / "locust_stats.csv").open() as f:
        return run, {row["Name"]: row for row in csv.DictReader(f)}


def test_locust_streams_completions_through_the_router(locust_run):
    run, rows = locust_run
    assert int(rows["/v1/completions"]["Request Count"]) > 0, run.stderr[-3000:]


def test_locust_streams_through_the_router_without_failures(locust_run):
    run, rows = locust_run
    assert int(rows["/v1/completions"]["Failure Count"]) == 0, run.stderr[-3000:]
    assert int(rows["time to first token"]["Request Count"]) > 0


def test_nothing_answering_is_a_clear_error():
    url = f"http://127.0.0.1:{free_port()}"
    run = loadgen(url, "--stages", "1x1")
    assert run.returncode == 2 and run.stdout == ""
    assert run.stderr.startswith(
        f"python -m dataplane.loadgen: nothing answers at {url} (Connection refused)"
    )
    assert "is the router running?" in run.stderr and "Traceback" not in run.stderr


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--stages", "30s"], "stage '30s': write SECONDSxCLIENTS, e.g. 30x4"),
        (["--url", "127.0.0.1:8080"], "--url '127.0.0.1:8080': write http://HOST:PORT"),
        (["--rate-multiple", "0"], "--rate-multiple must be a finite number > 0, got 0"),
        (["--max-concurrency", "0"], "--max-concurrency must be from 1 to 10000, got 0"),
        (["--trace", "/nonexistent/trace.csv"], "--trace /nonexistent/trace.csv: No such file or directory"),
    ],
)
def test_bad_arguments_name_what_was_wrong(args, message, capsys, monkeypatch):
    monkeypatch.setenv("MU_API_KEY", "k")
    with pytest.raises(SystemExit) as exit:
        main(["--model", MODEL, *args])
    assert exit.value.code == 2
    assert capsys.readouterr().err.rstrip().endswith("error: " + message)


def test_a_bad_trace_names_its_line(tmp_path, capsys, monkeypatch):
    (tmp_path / "t.csv").write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46,x,4\n")
    monkeypatch.setenv("MU_API_KEY", "k")
    with pytest.raises(SystemExit):
        main(["--model", MODEL, "--trace", str(tmp_path / "t.csv")])
    assert f"{tmp_path / 't.csv'}: line 2: ContextTokens 'x' is not a whole number" in capsys.readouterr().err


HEADER = b"TIMESTAMP,ContextTokens,GeneratedTokens\n"


@pytest.mark.parametrize(
    ("args", "trace", "message"),
    [
        (["--rate-multiple", "nan"], None, "--rate-multiple must be a finite number > 0, got nan"),
        (["--rate-multiple", "inf"], None, "--rate-multiple must be a finite number > 0, got inf"),
        (["--rate-multiple", "-2"], None, "--rate-multiple must be a finite number > 0, got -2"),
        (["--duration", "nan"], None, "--duration must be a finite number > 0, got nan"),
        (["--timeout=-inf"], None, "--timeout must be a finite number > 0, got -inf"),
        (["--stages", "nanx2"], None, "stage 'nanx2': write SECONDSxCLIENTS, e.g. 30x4"),
        (["--stages", "infx2"], None, "stage 'infx2': write SECONDSxCLIENTS, e.g. 30x4"),
        (
            ["--max-tokens", "1000000000000"],
            None,
            "--max-tokens must be from 1 to 2097152, got 1000000000000",
        ),
        (["--prompt-words", "-1"], None, "--prompt-words must be from 1 to 2097152, got -1"),
        (
            [],
            HEADER + b"2023-11-16 18:15:46,3,4\n2023-11-16 18:15:47+00:00,3,4\n",
            "line 3: TIMESTAMP '2023-11-16 18:15:47+00:00' has a UTC offset, line 2's has none",
        ),
        (
            [],
            HEADER + b"2023-11-16T18:15:46Z,3,4\n2023-11-16 18:15:47,3,4\n",
            "line 3: TIMESTAMP '2023-11-16 18:15:47' has no UTC offset, line 2's has one",
        ),
        (
            [],
            HEADER + b"2023-11-16 18:15:46,3,4\n2023-11-16 18:15:47,\xff\xfe,4\n",
            "line 3: byte 0xff at column 21",
        ),
        (
            [],
            HEADER + b"2023-11-16 18:15:46,99999999999999999999,4\n",
            "line 2: ContextTokens '99999999999999999999' is not a whole number from 0 to 2097152",
        ),
        ([], HEADER + b"2023-11-16 18:15:46,3,1e9\n", "line 2: GeneratedTokens '1e9' is not a whole number"),
        ([], b"TIMESTAMP,ContextTokens\n2023-11-16 18:15:46,3\n", "line 1 must be the header"),
        (
            [],
            HEADER + b'2023-11-16 18:15:46,"' + b"9" * 200_000 + b'",4\n',
            "line 2: field larger than field limit",
        ),
    ],
    ids=lambda v: None if isinstance(v, list | bytes) else str(v)[:40],
)
def test_the_command_refuses_bad_numbers_and_files_in_one_line(tmp_path, args, trace, message):
    if trace is not None:
        (tmp_path / "t.csv").write_bytes(trace)
        args = [*args, "--trace", str(tmp_path / "t.csv")]
    run = loadgen(f"http://127.0.0.1:{free_port()}", *args)
    assert run.returncode == 2 and run.stdout == "", run.stderr
    assert "Traceback" not in run.stderr
    last = run.stderr.strip().splitlines()[-1]
    assert last.startswith("python -m dataplane.loadgen: error: ") and message in last, run.stderr
