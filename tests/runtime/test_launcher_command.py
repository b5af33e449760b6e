"""The launcher builds the vLLM server command line from the declarative spec."""

from __future__ import annotations

import importlib.util

import pytest

from dataplane.runtime import launcher, pod
from dataplane.runtime.launcher import SERVE_MODULE, VLLM_MODULE, VllmSpec, build_command


def test_minimal_spec_uses_module_entrypoint_and_priority_scheduling() -> None:
    cmd = build_command(VllmSpec(model="/models/llama", python="/venv/bin/python"))
    assert cmd == [
        "/venv/bin/python",
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        "/models/llama",
        "--host",
        "0.0.0.0",
        "--port",
        "8000",
        "--dtype",
        "auto",
        "--kv-cache-dtype",
        "auto",
        "--scheduling-policy",
        "priority",
        "--enable-prompt-tokens-details",  # cached and image tokens in usage, for the price
    ]
    assert VLLM_MODULE == "vllm.entrypoints.openai.api_server"  # no `vllm` console script


def test_full_spec() -> None:
    spec = VllmSpec(
        model="/m",
        port=9000,
        host="127.0.0.1",
        served_model_name="llama-8b",
        dtype="bfloat16",
        quantization="fp8",
        max_model_len=8192,
        max_num_seqs=64,
        enforce_eager=True,
        extra_args=("--gpu-memory-utilization", "0.9"),
        python="py",
    )
    cmd = build_command(spec)
    assert cmd[:3] == ["py", "-m", VLLM_MODULE]
    args = cmd[3:]
    pairs = dict(zip(args[::2], args[1::2], strict=False))
    assert pairs["--served-model-name"] == "llama-8b"
    assert pairs["--quantization"] == "fp8"
    assert pairs["--kv-cache-dtype"] == "auto"  # fp8 weights, KV cache not quantized
    assert pairs["--max-model-len"] == "8192" and pairs["--max-num-seqs"] == "64"
    assert pairs["--scheduling-policy"] == "priority"
    assert "--enforce-eager" in args
    assert args[-2:] == ["--gpu-memory-utilization", "0.9"]  # extra args last, verbatim


def test_kv_cache_quantization_is_opt_in() -> None:
    cmd = build_command(VllmSpec(model="/m", kv_cache_dtype="fp8", python="py"))
    assert cmd[cmd.index("--kv-cache-dtype") + 1] == "fp8"


def test_one_api_server_is_the_api_server_module_without_the_flag() -> None:
    default = build_command(VllmSpec(model="/m", python="py"))
    assert build_command(VllmSpec(model="/m", api_server_count=1, python="py")) == default
    assert "--api-server-count" not in default


def test_several_api_servers_run_under_vllm_serve_with_the_model_first() -> None:
    cmd = build_command(VllmSpec(model="/m", api_server_count=4, extra_args=("--seed", "1"), python="py"))
    assert cmd == [
        "py",
        "-m",
        "dataplane.runtime.vllm_serve",
        "/m",  # `vllm serve MODEL`: positional (its parser warns on --model)
        "--host",
        "0.0.0.0",
        "--port",
        "8000",
        "--dtype",
        "auto",
        "--kv-cache-dtype",
        "auto",
        "--scheduling-policy",
        "priority",
        "--enable-prompt-tokens-details",
        "--api-server-count",
        "4",
        "--seed",
        "1",
    ]
    assert SERVE_MODULE == "dataplane.runtime.vllm_serve" and importlib.util.find_spec(SERVE_MODULE)


@pytest.mark.parametrize("count", [0, -2, True, 1.5])
def test_an_api_server_count_below_one_or_not_an_integer_is_refused(count: object) -> None:
    with pytest.raises(ValueError, match=rf"--api-server-count must be an integer >= 1, got {count!r}"):
        VllmSpec(model="/m", api_server_count=count)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "arg", ["--api-server-count", "-asc", "--api-server-count=2", "--api_server_count", "--api-server"]
)
def test_api_server_count_among_vllms_own_arguments_is_refused(arg: str) -> None:
    # After `--`, vllm.entrypoints.openai.api_server would parse it and run one server all the same.
    with pytest.raises(ValueError, match=r"after --\): give --api-server-count N to the launcher"):
        VllmSpec(model="/m", extra_args=(arg, "2"))


def test_other_api_flags_pass_through() -> None:
    # (but --api-key, refused: the fleet key goes in the environment, test_pod_fleet_key)
    cmd = build_command(VllmSpec(model="/m", extra_args=("--root-path", "/api"), python="py"))
    assert cmd[-2:] == ["--root-path", "/api"]


def test_the_launcher_flag_names_itself_and_the_bad_value(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit, match=r"--api-server-count must be an integer >= 1, got 0"):
        launcher.main(["--model", "/m", "--api-server-count", "0"])
    with pytest.raises(SystemExit):
        launcher.main(["--model", "/m", "--api-server-count", "two"])
    assert "argument --api-server-count: invalid int value: 'two'" in capsys.readouterr().err


def test_the_pod_flag_reaches_the_vllm_command() -> None:
    args, extra = pod.parse_args(
        [
            "--engine",
            "vllm",
            "--port",
            "8000",
            "--probe-port",
            "8001",
            "--model",
            "/m",
            "--api-server-count",
            "2",
        ]
    )
    cmd, _ = pod.engine_command(args, extra)
    assert cmd[1:4] == ["-m", SERVE_MODULE, "/m"]
    assert cmd[cmd.index("--api-server-count") + 1] == "2"


def test_the_simulated_engine_refuses_several_api_servers() -> None:
    args, extra = pod.parse_args(
        ["--engine", "sim", "--port", "8000", "--probe-port", "8001", "--api-server-count", "2"]
    )
    with pytest.raises(SystemExit, match=r"--api-server-count 2: the simulated engine is one process"):
        pod.engine_command(args, extra)
