"""Benchmarks run by the control plane: scheduling, claims, history, publishing and failures."""

import json
import subprocess
from datetime import timedelta
from io import StringIO

import pytest
from django.core.management import CommandError, call_command
from django.utils import timezone

from capacity import benchmarking
from capacity.benchmark import SweepConfig
from capacity.models import ModelProfile, ProfileFit
from controlplane.oncall.models import Event
from tests.runtime.support import http, sim_engine

SHAPES = ((16, 1), (16, 16), (64, 64), (256, 16), (16, 200), (200, 64))
QUICK = SweepConfig(shapes=SHAPES, requests_per_step=30, requests_per_concurrency=2)


@pytest.fixture
def tiny_sim():
    with sim_engine("--profile", "tiny-test", "--time-scale", "20") as sim:
        yield sim


def test_a_good_fit_is_published_with_its_history(small_model, tiny_sim, settings):
    settings.BENCHMARK_ENGINE_VERSION = "sim-1"
    assert benchmarking.claim(small_model.pk, timezone.now())
    record = benchmarking.run_benchmark(small_model, engine_url=tiny_sim.url, config=QUICK)
    assert record.status == "published", record.reason
    small_model.refresh_from_db()
    assert (small_model.alpha, small_model.beta, small_model.gamma) == (record.alpha, record.beta, record.gamma)
    assert small_model.source == "benchmark" and small_model.heldout_mape <= 0.10
    assert small_model.engine == tiny_sim.url and small_model.engine_version == "sim-1"
    assert small_model.benchmark_claimed_at is None  # released
    assert len(record.shapes) == len(SHAPES) and record.samples == len(SHAPES)
    assert record.beta > record.alpha  # decode costs more than prefill, as on a GPU
    event = Event.objects.get(kind="benchmark")
    assert event.severity == "info" and "published" in event.message


def test_a_poor_fit_is_refused_and_the_old_price_stays(small_model, tiny_sim, settings):
    settings.BENCHMARK_MAX_HELDOUT_MAPE = 0.0  # nothing real is that good
    record = benchmarking.run_benchmark(small_model, engine_url=tiny_sim.url, config=QUICK)
    assert record.status == "refused" and "exceeds the 0.0% threshold" in record.reason
    small_model.refresh_from_db()
    assert (small_model.alpha, small_model.source) == (0.0004, "manual")
    assert Event.objects.get(kind="benchmark").severity == "warning"


def test_a_failing_engine_is_reported_naming_the_shape_and_retried_later(small_model, tiny_sim, settings):
    settings.BENCHMARK_RETRY_BASE_S = 60
    http("POST", f"{tiny_sim.url}/_sim/fault", {"mode": "errors", "fraction": 1.0})
    before = timezone.now()
    record = benchmarking.run_benchmark(small_model, engine_url=tiny_sim.url, config=QUICK)
    assert record.status == "failed" and "shape (16 in, 1 out): engine answered 500" in record.reason
    small_model.refresh_from_db()
    assert small_model.alpha == 0.0004 and small_model.benchmark_failures == 1
    assert small_model.benchmark_retry_at >= before + timedelta(seconds=60)
    event = Event.objects.get(kind="benchmark")
    assert event.severity == "critical" and "shape (16 in, 1 out)" in event.message
    assert not benchmarking.due_profiles(timezone.now()).filter(pk=small_model.pk).exists()
    benchmarking.run_benchmark(small_model, engine_url=tiny_sim.url, config=QUICK)
    small_model.refresh_from_db()
    assert small_model.benchmark_failures == 2  # backs off: 120 s now
    assert small_model.benchmark_retry_at >= timezone.now() + timedelta(seconds=110)


def test_which_profiles_are_due(small_model, big_model, settings):
    now = timezone.now()
    assert set(benchmarking.due_profiles(now)) == {small_model, big_model}  # never benchmarked
    ModelProfile.objects.update(source="benchmark", fitted_at=now, engine_version="v1")
    settings.BENCHMARK_ENGINE_VERSION = "v1"
    assert not benchmarking.due_profiles(now).exists()
    ModelProfile.objects.filter(pk=small_model.pk).update(fitted_at=now - timedelta(days=8))  # stale
    ModelProfile.objects.filter(pk=big_model.pk).update(benchmark_requested_at=now)  # asked for
    assert set(benchmarking.due_profiles(now)) == {small_model, big_model}
    settings.BENCHMARK_ENGINE_VERSION = "v2"  # a new engine makes every fit stale
    ModelProfile.objects.update(fitted_at=now, benchmark_requested_at=None)
    assert benchmarking.due_profiles(now).count() == 2


def test_one_benchmark_per_pair_at_a_time(small_model, settings):
    now = timezone.now()
    assert benchmarking.claim(small_model.pk, now)
    assert not benchmarking.claim(small_model.pk, now)
    assert not benchmarking.due_profiles(now).filter(pk=small_model.pk).exists()
    # A worker that died holding the claim does not block the pair for ever.
    later = now + timedelta(seconds=settings.BENCHMARK_CLAIM_TTL_S + 1)
    assert benchmarking.claim(small_model.pk, later)


def test_a_local_simulated_pod_is_started_and_always_torn_down(small_model, settings):
    settings.BENCHMARK_ENGINE_URL = ""
    settings.BENCHMARK_SIMULATED_PROFILE = "tiny-test"
    settings.BENCHMARK_SIMULATED_TIME_SCALE = 20.0
    record = benchmarking.run_benchmark(small_model, config=QUICK)
    assert record.status == "published", record.reason
    assert record.engine.startswith("http://127.0.0.1:")
    port = record.engine.rsplit(":", 1)[1]
    running = subprocess.run(["pgrep", "-f", f"--port {port}"], capture_output=True, text=True).stdout
    assert running.strip() == "", "the benchmark pod must not outlive its benchmark"


def test_no_engine_configured_is_a_clear_failure(small_model, settings):
    settings.BENCHMARK_ENGINE_URL = ""
    settings.BENCHMARK_SIMULATED_PROFILE = ""
    record = benchmarking.run_benchmark(small_model, config=QUICK)
    assert record.status == "failed" and "no engine: set BENCHMARK_ENGINE_URL" in record.reason


def test_the_command_prints_the_table_and_a_json_last_line(h100, tiny_sim, settings):
    settings.BENCHMARK_SHAPES = ",".join(f"{i}x{o}" for i, o in SHAPES)
    out = StringIO()
    call_command("benchmark", "--model", "sim-tiny", "--gpu", "h100-80gb", "--engine-url", tiny_sim.url, "--json",
                 stdout=out, stderr=StringIO())
    lines = out.getvalue().strip().splitlines()
    summary = json.loads(lines[-1])
    assert {"alpha", "beta", "gamma", "r2", "heldout_mape", "samples", "published"} <= set(summary)
    assert summary["published"] is True and summary["samples"] == len(SHAPES)
    assert lines[0].split()[:3] == ["in", "out", "solo"]
    profile = ModelProfile.objects.get(model="sim-tiny", gpu_type=h100)  # a new pair gets its profile
    assert profile.fits.get().status == ProfileFit.Status.PUBLISHED


def test_the_command_refuses_an_unknown_gpu(db):
    with pytest.raises(CommandError, match="unknown GPU type 'tpu'"):
        call_command("benchmark", "--model", "m", "--gpu", "tpu", stdout=StringIO(), stderr=StringIO())
