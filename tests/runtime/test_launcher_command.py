"""The launcher builds the vLLM server command line from the declarative spec."""

from __future__ import annotations

from dataplane.runtime.launcher import VLLM_MODULE, VllmSpec, build_command


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
