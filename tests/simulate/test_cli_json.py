"""python -m capacity.simulate --json prints one JSON object with the agreed keys."""

import json
import subprocess
import sys

KEYS = {
    "gpu_hours",
    "static_peak_gpu_hours",
    "slo_attainment",
    "p99_latency_s",
    "rejected_fraction",
    "scale_events",
}


def test_cli_generates_a_trace_and_prints_the_json_keys(tmp_path):
    path = tmp_path / "bursty.csv"
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
            "4",
        ],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    assert "arrivals" in gen.stdout and "Warning" not in gen.stderr
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "capacity.simulate",
            "--trace",
            str(path),
            "--policy",
            "apa",
            "--json",
            "--compare-oracle",
            "--amplify",
            "0.5",
        ],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
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
