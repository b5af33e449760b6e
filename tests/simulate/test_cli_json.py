"""python -m capacity.simulate --json prints one JSON object with the agreed keys."""

import json
import subprocess
import sys

import pytest

pytestmark = pytest.mark.stack  # the simulator's command line as subprocesses

KEYS = {
    "gpu_hours",
    "static_peak_gpu_hours",
    "slo_attainment",
    "p99_latency_s",
    "rejected_fraction",
    "scale_events",
}


def _steps(tmp_path, minutes):
    """A generated steps trace: its path and the generator's run."""
    path = tmp_path / "steps.csv"
    gen = subprocess.run(
        [
            sys.executable,
            "-m",
            "capacity.simulate.traces",
            "--kind",
            "steps",
            "--seed",
            "2",
            "--out",
            str(path),
            "--minutes",
            str(minutes),
        ],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    return path, gen


def test_cli_generates_a_trace_and_prints_the_json_keys(tmp_path):
    path, gen = _steps(tmp_path, 4)
    assert "arrivals" in gen.stdout and "Warning" not in gen.stderr
    out = _run(path, "--compare-oracle", "--amplify", "0.5")
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert KEYS <= set(result)
    assert result["gpu_hours"] > 0 and 0 <= result["slo_attainment"] <= 1
    assert result["oracle_ratio"] >= 0.9


def test_cli_reports_a_bad_trace(tmp_path):
    path = tmp_path / "bad.csv"
    path.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\nyesterday,1,1\n")
    out = subprocess.run(
        [sys.executable, "-m", "capacity.simulate", "--trace", str(path), "--policy", "hpa"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 2 and "bad.csv:2" in out.stderr


def _csv(tmp_path, rows):
    path = tmp_path / "long.csv"
    lines = ["TIMESTAMP,ContextTokens,GeneratedTokens"]
    lines += [f"2024-01-01 00:00:{s:02d}.0000000,{p},{o}" for s, p, o in rows]
    path.write_text("\n".join(lines) + "\n")
    return path


def _run(path, *extra):
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "capacity.simulate",
            "--trace",
            str(path),
            "--policy",
            "apa",
            "--json",
            *extra,
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_cli_accepts_prompts_up_to_128k_and_keeps_its_json(tmp_path):
    out = _run(_csv(tmp_path, [(0, 131_000, 50), (1, 2_000, 50), (30, 100_000, 500)]))
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert KEYS <= set(result) and result["requests"] == 3
    assert result["rejected_fraction"] == 0.0


def test_cli_counts_the_minute_of_a_lone_arrival(tmp_path):
    # One replica (min 1) through minute 0: 1/60 GPU-hour, where rounding the last arrival's
    # 0 s up to whole minutes once counted no minute at all (0 GPU-hours, a free request).
    out = _run(_csv(tmp_path, [(0, 100, 10)]))
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert (result["duration_s"], result["gpu_hours"]) == (60.0, pytest.approx(1 / 60))


def test_cli_gives_a_long_prompt_its_own_prefill_end_to_end(tmp_path):
    # 131,000 tokens take 5.24 s to prefill alone (40 us each) on an idle replica: with a
    # one-token answer it is due end to end in 5 + 5.24 + 0.1 s, so its minute is met; a
    # deadline of 5 + 0.1 s (the prompt's prefill left out) is one no fleet meets.
    out = _run(_csv(tmp_path, [(0, 131_000, 1)]))
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["slo_attainment"] == 1.0 and 0.5 < result["p99_slo_ratio"] <= 1.0


def test_cli_refuses_a_prompt_beyond_the_context_naming_it(tmp_path):
    out = _run(_csv(tmp_path, [(0, 2_000, 50), (1, 131_072, 50)]))
    assert out.returncode == 2
    assert "131072 tokens" in out.stderr and "context length 131072" in out.stderr
    out = _run(_csv(tmp_path, [(0, 9_000, 50)]), "--max-model-len", "8192")
    assert out.returncode == 2 and "context length 8192" in out.stderr


def test_cli_deploys_vllm_s_long_prefill_threshold_and_refuses_one_past_the_context(tmp_path):
    trace = _csv(tmp_path, [(0, 100_000, 50), (0, 200, 50)])
    out = _run(trace, "--long-prefill-token-threshold", "512")
    assert out.returncode == 0, out.stderr
    assert KEYS <= set(json.loads(out.stdout.strip().splitlines()[-1]))
    out = _run(trace, "--long-prefill-token-threshold", "131073")
    assert out.returncode == 2
    assert "long_prefill_token_threshold must be in 0..max_model_len 131072, got 131073" in out.stderr


def test_cli_searches_the_oracle_and_bounds_it(tmp_path):
    path, _ = _steps(tmp_path, 3)
    out = _run(path, "--policy", "oracle", "--search-oracle", "--amplify", "0.5")  # the last --policy
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert KEYS <= set(result) and result["unmet_minutes"] == []
    assert result["slo_attainment_meetable"] == result["slo_attainment"] == 1.0
    assert 0 < result["oracle_bound_gpu_hours"] <= result["gpu_hours"]
    assert result["oracle_bound_gpu_hours"] <= result["causal_floor_gpu_hours"]
