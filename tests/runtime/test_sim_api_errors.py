"""The simulated engine answers bad requests with vLLM's statuses and error bodies."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from tests.runtime.support import SimProcess, http, sim_engine


@pytest.fixture(scope="module")
def sim() -> Iterator[SimProcess]:
    with sim_engine("--profile", "tiny-test", "--time-scale", "100") as engine:
        yield engine


def error_of(sim: SimProcess, path: str, body: object) -> tuple[int, dict[str, object]]:
    status, headers, raw = http("POST", sim.url + path, body)
    assert headers["x-engine"] == "simulated"
    return status, json.loads(raw)["error"]


def test_malformed_json_is_400(sim: SimProcess) -> None:
    status, err = error_of(sim, "/v1/completions", b"{not json")
    assert status == 400
    assert err == {"message": "JSON decode error", "type": "BadRequestError", "param": "body", "code": 400}


@pytest.mark.parametrize(
    ("path", "body", "param"),
    [
        ("/v1/completions", {"model": "sim-tiny"}, "prompt"),
        ("/v1/completions", {"prompt": ""}, "prompt"),
        ("/v1/chat/completions", {"model": "sim-tiny"}, "messages"),
        ("/v1/completions", {"prompt": "hi", "max_tokens": "ten"}, "max_tokens"),
        ("/v1/completions", {"prompt": "hi", "priority": 1.5}, "priority"),
    ],
)
def test_missing_or_bad_fields_are_400(sim: SimProcess, path: str, body: object, param: str) -> None:
    status, err = error_of(sim, path, body)
    assert (status, err["type"], err["param"], err["code"]) == (400, "BadRequestError", param, 400)


def test_unknown_model_is_404(sim: SimProcess) -> None:
    status, err = error_of(sim, "/v1/completions", {"model": "gpt-9", "prompt": "hi"})
    assert status == 404
    assert err == {
        "message": "The model `gpt-9` does not exist.",
        "type": "NotFoundError",
        "param": "model",
        "code": 404,
    }


def test_prompt_longer_than_max_model_len_is_400(sim: SimProcess) -> None:
    # tiny-test max_model_len is 512 tokens; 2,400 characters estimate to 600 tokens.
    status, err = error_of(sim, "/v1/completions", {"prompt": "x" * 2400})
    assert status == 400
    assert err["param"] == "input_tokens"
    assert err["message"] == (
        "This model's maximum context length is 512 tokens. However, your prompt contains "
        "600 input tokens, which exceeds this limit even without any output tokens. Please "
        "reduce the length of the input prompt."
    )
    # Token ids count one each: 512 ids leave no room for output either.
    assert error_of(sim, "/v1/completions", {"prompt": list(range(512))})[0] == 400


def test_max_tokens_is_clamped_to_the_context_left_as_vllm_does(sim: SimProcess) -> None:
    # 500 token ids leave 12 tokens of the 512-token context for output.
    status, _, raw = http(
        "POST", sim.url + "/v1/completions", {"prompt": list(range(500)), "max_tokens": 100}
    )
    assert status == 200
    assert json.loads(raw)["usage"] == {"prompt_tokens": 500, "completion_tokens": 12, "total_tokens": 512}


def test_unknown_path_is_404(sim: SimProcess) -> None:
    assert http("GET", sim.url + "/v2/nothing")[0] == 404


def test_bad_fault_request_is_400(sim: SimProcess) -> None:
    status, err = error_of(sim, "/_sim/fault", {"mode": "explode"})
    assert status == 400 and err["param"] == "mode"
