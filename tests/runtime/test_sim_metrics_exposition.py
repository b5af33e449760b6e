"""The simulated engine's /metrics is valid Prometheus text: every family has HELP and TYPE, and
label values are escaped (a served model name is an endpoint's, quotes and backslashes included),
read by prometheus_client's parser and by ``promtool check metrics``."""

from __future__ import annotations

import shutil
import subprocess

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.runtime.support import SimProcess, http

PROMTOOL = shutil.which("promtool") or "/usr/bin/promtool"
MODEL = 'chat-"quoted"\\model'
COLON_LINT = "metric names should not contain ':'"  # vLLM's own names (vllm:...), kept as they are


def scraped(sim: SimProcess) -> bytes:
    status, _, _ = http(
        "POST", sim.url + "/v1/completions", {"model": MODEL, "prompt": "hi", "max_tokens": 3}
    )
    assert status == 200
    status, _, body = http("GET", sim.url + "/metrics")
    assert status == 200
    return body


def test_every_family_has_help_and_the_model_name_reads_back(start_sim) -> None:
    sim = start_sim("--profile", "tiny-test", "--time-scale", "100", "--served-model-name", MODEL)
    families = list(text_string_to_metric_families(scraped(sim).decode()))
    assert len(families) == 12  # with the prefix cache's queries and hits
    for family in families:
        assert family.documentation and family.type != "unknown", family.name
        assert {s.labels["model_name"] for s in family.samples} == {MODEL}, family.name
    success = next(f for f in families if f.name == "vllm:request_success")
    assert [s.labels["finished_reason"] for s in success.samples] == ["length"]


@pytest.mark.skipif(not shutil.which(PROMTOOL), reason="needs promtool (Debian's prometheus package)")
def test_promtool_parses_the_scrape(start_sim) -> None:
    sim = start_sim("--profile", "tiny-test", "--time-scale", "100", "--served-model-name", MODEL)
    checked = subprocess.run(
        [PROMTOOL, "check", "metrics"], input=scraped(sim), capture_output=True, timeout=30
    )
    # 3: lint findings only (a parse error is 1); the one finding left is vLLM's colon names
    problems = {
        line.split(" ", 1)[1]
        for line in checked.stdout.decode().splitlines() + checked.stderr.decode().splitlines()
        if line
    }
    assert checked.returncode in (0, 3) and problems <= {COLON_LINT}, checked
