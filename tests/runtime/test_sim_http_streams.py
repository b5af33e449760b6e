"""The simulated engine's HTTP as real clients see it (uvicorn's framing, as real vLLM's): streams
are chunked and complete for httpx (strict framing, h11) and curl, plain and streamed answers
share one kept-alive connection, and a client that leaves frees its engine slot."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.runtime.support import SimProcess, http, metric_value, sim_engine, wait_until

pytestmark = pytest.mark.stack  # a simulated engine as a subprocess

STREAM = {"model": "sim-tiny", "prompt": "Hello", "max_tokens": 8, "stream": True}
JSON_BODY = ["-H", "content-type: application/json", "-d"]  # curl options before a JSON body
LONG = 400  # output tokens: 11 ms each on tiny-test at time scale 1, so ~4.4 s in all


@pytest.fixture(scope="module")
def sim() -> Iterator[SimProcess]:
    with sim_engine("--profile", "tiny-test", "--time-scale", "1", "--enable-fault-injection") as engine:
        yield engine


def events(lines: list[str]) -> list[str]:
    return [line.removeprefix("data: ") for line in lines if line.startswith("data: ")]


@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions"])
def test_a_stream_is_chunked_and_complete_for_httpx(sim: SimProcess, path: str) -> None:
    body = dict(STREAM)
    if path.endswith("chat/completions"):
        body["messages"] = [{"role": "user", "content": body.pop("prompt")}]
    with httpx.Client(base_url=sim.url) as client, client.stream("POST", path, json=body) as response:
        lines = list(response.iter_lines())  # h11 raises on a stream cut short
        assert response.status_code == 200
        assert response.headers["transfer-encoding"] == "chunked"
        assert "content-length" not in response.headers
        assert response.headers["x-engine"] == "simulated"
    data = events(lines)
    assert data[-1] == "[DONE]"
    opening = 1 if path.endswith("chat/completions") else 0  # vLLM opens a chat with the role
    assert len(data) == opening + 8 + 1  # one event per token, then [DONE]
    assert json.loads(data[-2])["choices"][0]["finish_reason"] == "length"


def test_curl_reads_a_stream_to_done_and_exits_0(sim: SimProcess, tmp_path: Path) -> None:
    headers = tmp_path / "headers"
    done = subprocess.run(
        ["curl", "-sN", "-D", str(headers), *JSON_BODY, json.dumps(STREAM), sim.url + "/v1/completions"],
        capture_output=True,
        timeout=30,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.endswith(b"data: [DONE]\n\n")
    assert "transfer-encoding: chunked" in headers.read_text().lower()


def test_plain_and_streamed_answers_share_one_kept_alive_connection(sim: SimProcess) -> None:
    with httpx.Client(base_url=sim.url) as client:
        clients = []
        for _ in range(2):
            plain = client.get("/v1/models")
            assert plain.status_code == 200
            clients.append(plain.extensions["network_stream"].get_extra_info("client_addr"))
            with client.stream("POST", "/v1/completions", json=STREAM) as streamed:
                assert events(list(streamed.iter_lines()))[-1] == "[DONE]"
                clients.append(streamed.extensions["network_stream"].get_extra_info("client_addr"))
    assert len(set(clients)) == 1, clients  # one local address and port: one connection


def test_curl_sends_two_streams_on_one_connection(sim: SimProcess) -> None:
    # Each transfer prints its status and how many connections it opened.
    one = ["-sN", "-o", "/dev/null", "-w", "%{http_code} %{num_connects}\n", *JSON_BODY, json.dumps(STREAM)]
    done = subprocess.run(
        ["curl", *one, sim.url + "/v1/completions", "--next", *one, sim.url + "/v1/completions"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split("\n")[:2] == ["200 1", "200 0"]  # the second made no new connection


def running(sim: SimProcess) -> float:
    return metric_value(sim.url, "vllm:num_requests_running") + metric_value(
        sim.url, "vllm:num_requests_waiting"
    )


def test_a_client_that_leaves_mid_stream_frees_its_engine_slot(sim: SimProcess) -> None:
    body = {**STREAM, "max_tokens": LONG}
    try:
        with (
            httpx.Client(base_url=sim.url) as client,
            client.stream("POST", "/v1/completions", json=body) as r,
        ):
            lines = r.iter_lines()  # kept: a dropped iterator makes httpx close the connection
            assert next(lines).startswith("data: ")
            assert running(sim) == 1
            # Hung from here: no token is written again, so only the disconnect can free the slot.
            assert http("POST", sim.url + "/_sim/fault", {"mode": "hang"})[0] == 200
        wait_until(lambda: running(sim) == 0, timeout=2)
    finally:
        http("POST", sim.url + "/_sim/fault", {"mode": "none"})


def test_a_client_that_leaves_before_a_plain_answer_frees_its_engine_slot(sim: SimProcess) -> None:
    body = {"model": "sim-tiny", "prompt": "Hello", "max_tokens": LONG}
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(sim.url + "/v1/completions", json=body, timeout=0.3)
    wait_until(lambda: running(sim) == 0, timeout=2)  # long before its ~4.4 s of tokens
